"""A node's GPUs as DRA objects describe them: its Topology from ResourceSlices, its GPUs in use
from allocated ResourceClaims (`resource.k8s.io/v1`).

Why. On a DRA cluster no device plugin writes the `gputopo.io/topology` annotation: the node's
driver publishes ResourceSlices and kube-scheduler's allocator records what it gave in each
ResourceClaim's `status.allocation`. The scheduler sidecar still has to filter, score and plan
gangs, so it rebuilds what the annotation would have said from those objects, here, in the
core (pure: the sidecar does the watching).

Two drivers are read:

* gputopo's own (`gputopo.io`, gputopo/node/draslices.py): the counter set `gpus` names every GPU of
  the node (`gpu-<i>`, healthy or not); each healthy GPU's device carries `index`, `uuid`,
  `productName`, `healthy`, `link<j>` (the `topo -m` code to GPU j) and `nvlinkMBps`. The
  Topology is the node's own, exactly as the annotation carries it (PCIe levels under NVLink
  aside). GPUs published `healthy: false`, or not published, are unhealthy. Devices of every
  other layout (gputopo.node.draslices.LAYOUTS: the sets, `set-<i>-<j>-…`) stand for their
  member GPUs, named in their `gpus` attribute.
* NVIDIA's (`gpu.nvidia.com`): one device per GPU with `index`, `uuid`, `productName` and, on
  recent versions, `resource.kubernetes.io/pcieRoot`, and nothing about NVLink. The view is
  conservative: GPUs under one PCIe root are linked at PHB, all others at SYS; no NVLink is
  assumed. Devices of another type (MIG partitions) are not GPUs here; a claim result naming one
  makes the node unknown rather than guess which GPU it uses.

Every object is untrusted: `read_pool` raises DraViewError for anything malformed and the caller
turns that into "this node's topology is unknown", never more.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gputopo.node.draslices import GPU_LAYOUT, SliceError, expand, layout_of_type
from gputopo.node.links import BandwidthSettings, Link, LinkError, parse_code
from gputopo.node.topology import GPU, Topology, TopologyError

GPUTOPO_DRIVER = "gputopo.io"
NVIDIA_DRIVER = "gpu.nvidia.com"
DRIVERS: tuple[str, ...] = (GPUTOPO_DRIVER, NVIDIA_DRIVER)
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
#: GPUs one node may have here (the sidecar's allocator handles 16; 64 as the annotation).
MAX_GPUS = 64
#: Devices one pool may list before it is refused as absurd. gputopo's own pool lists every GPU
#: set of its sizes (issue 30): 14,827 devices on a 16-GPU DGX-2, at most 16,384 per size.
MAX_POOL_DEVICES = 1 << 17
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class DraViewError(ValueError):
    """Slices or claims of one node that cannot be read; the message says why."""


@dataclass(frozen=True)
class DraNode:
    """What one node's pool says: its GPUs and links, which are unhealthy, and which GPUs each
    device name stands for (GPU devices one, set devices their members)."""

    node: str
    driver: str
    pool: str
    generation: int
    topology: Topology
    unhealthy: frozenset[int]
    devices: Mapping[str, tuple[int, ...]]


def _attr(attrs: Mapping[str, Any], name: str, kind: str, driver: str) -> Any:
    """An attribute's value of one type, by its short or driver-qualified name (None if absent)."""
    raw = attrs.get(name)
    if raw is None:
        raw = attrs.get(f"{driver}/{name}")
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or len(raw) != 1 or kind not in raw:
        raise DraViewError(f"attribute {name} must hold one {kind}")
    value = raw[kind]
    if kind == "int" and (not isinstance(value, int) or isinstance(value, bool)):
        raise DraViewError(f"attribute {name} is not an integer")
    if kind == "bool" and not isinstance(value, bool):
        raise DraViewError(f"attribute {name} is not a boolean")
    if kind == "string" and not isinstance(value, str):
        raise DraViewError(f"attribute {name} is not a string")
    return value


def _devices(slices: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    out: list[Mapping[str, Any]] = []
    for s in slices:
        spec = s.get("spec")
        if not isinstance(spec, Mapping):
            raise DraViewError("a slice without spec")
        devs = spec.get("devices") or []
        if not isinstance(devs, list):
            raise DraViewError("spec.devices must be a list")
        for d in devs:
            if not isinstance(d, Mapping) or not isinstance(d.get("name"), str) or not _NAME.match(d["name"]):
                raise DraViewError("a device without a valid name")
            if not isinstance(d.get("attributes") or {}, Mapping):
                raise DraViewError(f"device {d['name']}: attributes must be an object")
            out.append(d)
    if len(out) > MAX_POOL_DEVICES:
        raise DraViewError(f"{len(out)} devices in one pool, more than {MAX_POOL_DEVICES}")
    names = [str(d["name"]) for d in out]
    if len(set(names)) != len(names):
        raise DraViewError("a device name appears twice in the pool")
    return out


def read_pool(node: str, driver: str, slices: Sequence[Mapping[str, Any]]) -> DraNode:
    """One node's pool (the slices of its newest generation, all of them: the caller checks
    `resourceSliceCount`) as a DraNode; DraViewError for anything unreadable."""
    if driver not in DRIVERS:
        raise DraViewError(f"driver {driver!r} is not one gputopo reads")
    pool = slices[0].get("spec", {}).get("pool", {}) if slices else {}
    name = pool.get("name") if isinstance(pool, Mapping) else None
    gen = pool.get("generation") if isinstance(pool, Mapping) else None
    if not isinstance(name, str) or not isinstance(gen, int) or isinstance(gen, bool):
        raise DraViewError("pool name and generation are required")
    devices = _devices(slices)
    if driver == GPUTOPO_DRIVER:
        topo, unhealthy, names = _gputopo(node, slices, devices)
    else:
        topo, unhealthy, names = _nvidia(node, devices)
    return DraNode(node, driver, name, gen, topo, unhealthy, names)


def _gputopo(
    node: str, slices: Sequence[Mapping[str, Any]], devices: Sequence[Mapping[str, Any]]
) -> tuple[Topology, frozenset[int], dict[str, tuple[int, ...]]]:
    counters: set[str] = set()
    for s in slices:
        for cs in s.get("spec", {}).get("sharedCounters") or []:
            if (
                isinstance(cs, Mapping)
                and cs.get("name") == "gpus"
                and isinstance(cs.get("counters"), Mapping)
            ):
                counters |= set(cs["counters"])
    n = len(counters)
    if not 1 <= n <= MAX_GPUS or counters != {f"gpu-{i}" for i in range(n)}:
        raise DraViewError("the counter set 'gpus' must name gpu-0..gpu-<n-1> (1..64 GPUs)")
    gpus: dict[int, GPU] = {}
    codes: dict[tuple[int, int], str] = {}
    nvlink_mbps: set[int] = set()
    names: dict[str, tuple[int, ...]] = {}
    sick: set[int] = set()  # published with healthy=false
    for d in devices:
        attrs = d.get("attributes") or {}
        layout = layout_of_type(str(_attr(attrs, "type", "string", GPUTOPO_DRIVER)))
        if layout is None:
            continue
        if layout is not GPU_LAYOUT:  # a device standing for its member GPUs
            raw = _attr(attrs, "gpus", "string", GPUTOPO_DRIVER) or ""
            members = tuple(int(x) for x in raw.split(",") if x.isdigit())
            if (
                not layout.min_gpus <= len(members) <= layout.max_gpus
                or any(not 0 <= i < n for i in members)
                or layout.device_name(members) != str(d["name"])
                or list(members) != sorted(set(members))
            ):
                raise DraViewError(
                    f"{layout.type} device {d['name']}: its gpus attribute disagrees with its name"
                )
            names[str(d["name"])] = members
            continue
        i = _attr(attrs, "index", "int", GPUTOPO_DRIVER)
        if not isinstance(i, int) or not 0 <= i < n or str(d["name"]) != f"gpu-{i}":
            raise DraViewError(f"device {d['name']}: index missing or not its name's")
        uuid = _attr(attrs, "uuid", "string", GPUTOPO_DRIVER) or ""
        model = _attr(attrs, "productName", "string", GPUTOPO_DRIVER) or ""
        gpus[i] = GPU(i, uuid, model)
        names[str(d["name"])] = (i,)
        if _attr(attrs, "healthy", "bool", GPUTOPO_DRIVER) is False:
            sick.add(i)
        speed = _attr(attrs, "nvlinkMBps", "int", GPUTOPO_DRIVER)
        if speed is None:
            raise DraViewError(
                f"device {d['name']}: no link attributes (an older publisher, or too many GPUs)"
            )
        nvlink_mbps.add(speed)
        for j in range(n):
            if j == i:
                continue
            code = _attr(attrs, f"link{j}", "string", GPUTOPO_DRIVER)
            if code is None:
                raise DraViewError(f"device {d['name']}: link{j} missing")
            codes[(min(i, j), max(i, j))] = codes.get((min(i, j), max(i, j)), code)
            if codes[(min(i, j), max(i, j))] != code:
                raise DraViewError(f"GPUs {i} and {j} disagree on their link")
    if not gpus:
        raise DraViewError("no GPU device")
    if len(nvlink_mbps) != 1:
        raise DraViewError("GPU devices disagree on nvlinkMBps")
    speed = nvlink_mbps.pop()
    unhealthy = frozenset(range(n)) - set(gpus) | sick
    for i in range(n):
        for j in range(i + 1, n):
            if (i, j) not in codes:  # two unhealthy GPUs: neither is ever chosen, any link does
                if i not in unhealthy or j not in unhealthy:
                    raise DraViewError(f"the link of GPUs {i} and {j} is missing")
                codes[(i, j)] = "SYS"
    try:
        settings = BandwidthSettings(nvlink_gbps_per_link=speed / 1000)
        links = [
            [None if i == j else parse_code(codes[(min(i, j), max(i, j))]) for j in range(n)]
            for i in range(n)
        ]
    except LinkError as e:
        raise DraViewError(str(e)) from None
    full = [gpus.get(i) or GPU(i, f"unpublished-{node}-{i}") for i in range(n)]
    return _topology(node, full, links, settings), unhealthy, names


def _nvidia(
    node: str, devices: Sequence[Mapping[str, Any]]
) -> tuple[Topology, frozenset[int], dict[str, tuple[int, ...]]]:
    gpus: dict[int, tuple[GPU, str]] = {}
    names: dict[str, tuple[int, ...]] = {}
    for d in devices:
        attrs = d.get("attributes") or {}
        if _attr(attrs, "type", "string", NVIDIA_DRIVER) not in ("gpu", None):
            continue
        i = _attr(attrs, "index", "int", NVIDIA_DRIVER)
        if not isinstance(i, int) or not 0 <= i < MAX_GPUS or i in gpus:
            raise DraViewError(f"device {d['name']}: index missing, out of range or repeated")
        uuid = _attr(attrs, "uuid", "string", NVIDIA_DRIVER) or f"{node}-{d['name']}"
        model = _attr(attrs, "productName", "string", NVIDIA_DRIVER) or ""
        root = _attr(attrs, PCIE_ROOT, "string", NVIDIA_DRIVER) or ""
        gpus[i] = (GPU(i, uuid, model), root)
        names[str(d["name"])] = (i,)
    if not gpus:
        raise DraViewError("no GPU device")
    n = max(gpus) + 1
    unhealthy = frozenset(range(n)) - set(gpus)
    full = [gpus[i][0] if i in gpus else GPU(i, f"unpublished-{node}-{i}") for i in range(n)]
    root_of = {i: gpus[i][1] if i in gpus else "" for i in range(n)}
    links: list[list[Link | None]] = [
        [
            None if i == j else Link(pcie="PHB" if root_of[i] and root_of[i] == root_of[j] else "SYS")
            for j in range(n)
        ]
        for i in range(n)
    ]
    return _topology(node, full, links, BandwidthSettings()), unhealthy, names


def _topology(
    node: str, gpus: Sequence[GPU], links: Sequence[Sequence[Link | None]], settings: BandwidthSettings
) -> Topology:
    try:
        return Topology(
            name=f"dra:{node}",
            gpus=tuple(gpus),
            links=tuple(tuple(row) for row in links),
            settings=settings,
        )
    except TopologyError as e:
        raise DraViewError(str(e)) from None


def allocated_devices(claim: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(driver, pool, device) of every device a ResourceClaim's allocation holds ([] when it is
    not allocated); DraViewError for a malformed status."""
    status = claim.get("status")
    if status is None:
        return []
    if not isinstance(status, Mapping):
        raise DraViewError("status must be an object")
    alloc = status.get("allocation")
    if alloc is None:
        return []
    devices = alloc.get("devices") if isinstance(alloc, Mapping) else None
    results = devices.get("results") if isinstance(devices, Mapping) else None
    if results is None:
        return []
    if not isinstance(results, list):
        raise DraViewError("status.allocation.devices.results must be a list")
    out = []
    for r in results:
        if not isinstance(r, Mapping) or not all(
            isinstance(r.get(k), str) for k in ("driver", "pool", "device")
        ):
            raise DraViewError("an allocation result without driver, pool and device")
        out.append((str(r["driver"]), str(r["pool"]), str(r["device"])))
    return out


def gpus_in_use(node: DraNode, held: Iterable[str]) -> frozenset[int]:
    """The node's GPUs that the named devices (allocation results for its pool) hold: a set
    device counts as all its member GPUs. DraViewError for a device the pool does not list."""
    out: set[int] = set()
    for device in held:
        gpus = node.devices.get(device)
        if gpus is None and node.driver == GPUTOPO_DRIVER:
            # a set the node's newer publication lists (claims may run ahead of the slices we
            # read): gputopo's device names say their GPUs (draslices.expand, strict)
            try:
                gpus = expand(device, node.topology.n)
            except SliceError:
                gpus = None
        if gpus is None:
            raise DraViewError(f"an allocated claim holds device {device!r}, which the pool does not list")
        out.update(gpus)
    return frozenset(out)
