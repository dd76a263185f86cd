"""A node's DRA ResourceSlices: its GPUs, and its good GPU sets as devices over shared counters.

Why this shape (issue 21). With Dynamic Resource Allocation kube-scheduler's own allocator picks
the devices and no plugin is asked for a preferred allocation. Its rule, for a claim asking for
one device of a class, is first fit: the first device, in slice order, that matches the class and
whose counters are still available. So the ranking has to be *in the slices*: every good GPU set
is one device that consumes its member GPUs' counters (partitionable devices), and the set
devices of one size are listed in the exact allocator's order (ring bandwidth, then least
disruption of what stays free, then the allocator's remaining keys). A claim for one
`set` device of size k then gets the first set in that order whose GPUs are all free.

The slice format (`resource.k8s.io/v1`), one pool per node (pool name = node name):

* slice `counters`: `spec.sharedCounters = [{name: "gpus", counters: {"gpu-<i>": {value: "1"}}}]`,
  one counter per GPU of the topology (healthy or not: capacity is static) and no devices —
  1.36 wants shared counters in a slice of their own.
* slice `gpus`: one device `gpu-<i>` per GPU, consuming `gpu-<i>`, the free healthy ones first
  in the allocator's order for one GPU (least disruption), then the rest by index; attributes
  `type="gpu"`, `healthy` (bool), `index`, `uuid`, `productName`,
  `resource.kubernetes.io/pciBusID` (`dddd:bb:dd.f`), `resource.kubernetes.io/pcieRoot`
  (`pci<domain>:<bus>`, when the daemon could read it from sysfs),
  `resource.kubernetes.io/numaNode` (when known), and per published size k the scalar group
  attribute `group<k>`: which set of a best-first partition of the node into k-sets this GPU is
  in (for hand-written `matchAttribute` claims); and its links (`link<j>`: the `topo -m` code
  to GPU j, `nvlinkMBps`: one NVLink's MB/s), from which the scheduler sidecar rebuilds the
  node's Topology where no annotation exists (`link_attributes`; left out when they would pass
  the 32-attribute limit).
* slices `set<k>`, `set<k>-001`, `set<k>-002`, … for each published size k, 64 devices a slice
  (the API's limit for devices with counters): devices `set-<i>-<j>-…` (sorted indices), each
  consuming its members' counters (the counter set lives in slice `counters`; devices of any
  slice of the pool may consume it), attributes `type="set"`, `healthy` (all members healthy),
  `size`, `ringMBps` (the set's ring bandwidth in MB/s), `gpus` (comma-joined indices) and
  `resource.kubernetes.io/numaNode` when every member shares one. kube-scheduler walks a pool's
  slices in name order and each slice's devices in list order (`set_parts`: the upstream file),
  so the slices of one size, read in name order, are the publication order.

The DeviceClasses select `healthy` devices only. Devices are never dropped for health or use:
kube-scheduler counts a pool's consumed counters from the allocated devices it still finds in
the slices, so a device that left them while allocated would hand its GPUs to a second claim.
Which devices exist depends on the topology alone; health and use change attributes and order.

Which sets (issue 30): every set of each size, ring-bandwidth levels best first. Any k GPUs can
be the free ones (single-GPU claims take any GPU), and then the only set device that fits is
those k, so a set left out is a claim that waits while device-plugin mode would place it (the
64-device cap of one slice did that until issue 30: DGX-1's 6 GB/s level has 62 4-sets for the
56 places left). Within a level, sets whose GPUs are all free and healthy come first in the
allocator's order for the current free set, then the others in its order for the whole node.
Hence however stale the slices are, a claim finds a set whenever k healthy GPUs are free, and it
is a best-ring set of them; right after a republication it is the allocator's own choice.

`max_sets` caps the sets of one size (`MAX_SETS_PER_SIZE` by default: every set of a node of up
to 16 GPUs, C(16, 8) = 12,870 8-sets in 202 slices). Below the number of sets, levels stay whole
while they fit and the first that does not is cut to a spread-out sample of itself (the node's
first set of that level, then sets overlapping the kept ones least; measured in docs/dra.md,
bench/bench_dra_slices.py): the best-ring guarantee stays, availability does not.

Pure: a function of the topology, the healthy and free GPU indices and the pool generation; the
daemon does the I/O (sysfs for PCIe roots, the API for publishing).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np

from gputopo.node.allocator import Allocator
from gputopo.node.topology import Topology

API_VERSION = "resource.k8s.io/v1"
DRIVER = "gputopo.io"
COUNTER_SET = "gpus"
STANDARD = "resource.kubernetes.io/"
#: Set sizes published by default (those that fit the node).
DEFAULT_SIZES: tuple[int, ...] = (2, 4, 8, 16)

# Limits the API server enforces (resource.k8s.io/v1 validation, seen on 1.36.2, issue 21).
MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_WITH_COUNTERS_PER_SLICE = 64
MAX_COUNTER_SETS_PER_SLICE = 8
MAX_COUNTERS_PER_SET = 32
MAX_CONSUMES_PER_DEVICE = 2
MAX_COUNTERS_PER_DEVICE = 32
MAX_CONSUMED_COUNTERS_PER_SLICE = 1024
MAX_ATTRIBUTES_PER_DEVICE = 32
MAX_NAME_CHARS = 63  # device and counter names are DNS labels
MAX_STRING_ATTRIBUTE_CHARS = 64
MAX_OBJECT_NAME_CHARS = 253

#: Set devices per slice: the API's limit for devices that consume counters.
SETS_PER_SLICE = MAX_DEVICES_WITH_COUNTERS_PER_SLICE
#: Most set devices published per size (ours, not the API's: a pool may hold any number of
#: slices). Every set of a 16-GPU node fits (C(16, 8) = 12,870 8-sets in 202 slices); a larger
#: node, or a smaller `--max-sets`, cuts the last level published (see `choose_sets`).
MAX_SETS_PER_SIZE = 16384


class SliceError(ValueError):
    """Slices that cannot be built or that break a limit; the message says which."""


@dataclass(frozen=True, slots=True)
class SetDevice:
    """One published GPU set: its device name, members and ring bandwidth."""

    name: str
    gpus: tuple[int, ...]
    ring_mbps: int


def gpu_device_name(index: int) -> str:
    return f"gpu-{index}"


def set_device_name(gpus: Sequence[int]) -> str:
    return "set-" + "-".join(str(i) for i in sorted(gpus))


def counter_name(index: int) -> str:
    return f"gpu-{index}"


def expand(device: str, n: int) -> tuple[int, ...]:
    """The GPU indices a published device name stands for (prepare time), else SliceError.

    Strict: only names this module writes (`gpu-<i>`, `set-<i>-<j>-…` with sorted distinct
    indices below n); a claim result naming anything else is refused, never guessed at."""
    parts = device.split("-")
    if (
        len(parts) < 2
        or parts[0] not in ("gpu", "set")
        or not all(p.isdigit() and p == str(int(p)) for p in parts[1:])
    ):
        raise SliceError(f"device {device!r} is not a gputopo device name")
    idx = tuple(int(p) for p in parts[1:])
    if parts[0] == "gpu" and len(idx) != 1:
        raise SliceError(f"device {device!r}: a gpu device names one GPU")
    if parts[0] == "set" and (len(idx) < 2 or list(idx) != sorted(set(idx))):
        raise SliceError(f"device {device!r}: a set names two or more sorted distinct GPUs")
    if any(i >= n for i in idx):
        raise SliceError(f"device {device!r} names a GPU outside 0..{n - 1}")
    return idx


def pci_bus_id(raw: str) -> str | None:
    """NVML's `00000000:07:00.0` as the standard attribute's extended BDF `0000:07:00.0`."""
    parts = raw.strip().lower().split(":")
    if len(parts) != 3 or "." not in parts[2]:
        return None
    domain, bus, devfn = parts
    dev, _, fn = devfn.partition(".")
    try:
        d, b, dv, f = int(domain, 16), int(bus, 16), int(dev, 16), int(fn, 16)
    except ValueError:
        return None
    if d > 0xFFFF or b > 0xFF or dv > 0x1F or f > 0x7:
        return None
    return f"{d:04x}:{b:02x}:{dv:02x}.{f:x}"


def choose_sets(
    alloc: Allocator,
    healthy: Iterable[int],
    free: Iterable[int],
    size: int,
    max_sets: int,
    *,
    fill: bool = True,
) -> list[SetDevice]:
    """The set devices of one size, in publication order (see the module docstring).

    Which sets are published depends on the topology alone, never on health or use: kube-
    scheduler counts a pool's used counters from the allocated devices it still finds in the
    slices, so a set that left the slices while allocated would free its GPUs for a second
    claim. Health and use only reorder: sets whose GPUs are all free and healthy first, in the
    allocator's order for the free set, then the others in its order for the whole node.

    `max_sets` at least the number of `size`-sets publishes every one (the default of
    `build_slices`); fewer cuts the last level kept (module docstring). `fill=False` stops
    after the last whole level that fits (a measured alternative, bench/bench_dra_slices.py: it
    halves availability on a DGX-1 for no gain in ring)."""
    n = alloc.n
    if size < 2 or size > n:
        return []
    usable = sorted(set(free) & set(healthy))
    static = alloc.rank(range(n), size, top=1 << 16)  # ring first, then the allocator's keys
    levels: list[list[SetDevice]] = []
    for c in static:
        dev = SetDevice(set_device_name(c.indices), c.indices, c.ring_mbps)
        if levels and levels[-1][0].ring_mbps == c.ring_mbps:
            levels[-1].append(dev)
        else:
            levels.append([dev])
    members: list[SetDevice] = []
    for level in levels:
        room = max_sets - len(members)
        if room <= 0 or (not fill and members and len(level) > room):
            break
        members += level if len(level) <= room else _spread(level, room)
    free_rank = alloc.rank(usable, size, top=1 << 16) if size <= len(usable) else []
    pos_free = {c.indices: i for i, c in enumerate(free_rank)}
    pos_static = {c.indices: i for i, c in enumerate(static)}
    members.sort(
        key=lambda s: (-s.ring_mbps, s.gpus not in pos_free, pos_free.get(s.gpus, pos_static[s.gpus]))
    )
    return members


def _spread(level: list[SetDevice], keep: int) -> list[SetDevice]:
    """`keep` sets of one ring level, kept in their order, chosen to overlap little.

    A cut level (uniform NVSwitch nodes: 1,820 equal 4-sets on 16 GPUs) must still offer a free
    set after the scheduler has allocated a few claims the publication has not caught up with;
    the ranking's own first 64 all crowd onto the lowest GPUs. So the first set (the allocator's
    choice) stays, and each next one is the earliest set with the least summed squared overlap
    with those already kept — a greedy spread over the GPUs."""
    masks = np.array([sum(1 << i for i in s.gpus) for s in level], dtype=np.int64)
    cost = np.zeros(len(level), dtype=np.int64)
    taken = np.zeros(len(level), dtype=bool)
    chosen = [0]
    for _ in range(keep - 1):
        taken[chosen[-1]] = True
        cost += _popcount(masks & masks[chosen[-1]]) ** 2
        nxt = int(np.argmin(np.where(taken, np.iinfo(np.int64).max, cost)))
        chosen.append(nxt)
    return [level[i] for i in sorted(chosen)]


def _popcount(x: np.ndarray) -> np.ndarray:
    out = np.zeros_like(x)
    for b in range(16):
        out += (x >> b) & 1
    return out


def gpu_order(alloc: Allocator, every: Iterable[int], free: Sequence[int]) -> list[int]:
    """Single GPUs in publication order: the free healthy ones as the allocator ranks them for a
    1-GPU request (least disruption of what stays free), then the others by index. A claim for
    one `gpu` device then takes the GPU the exact allocator would give."""
    ranked = [c.indices[0] for c in alloc.rank(free, 1, top=len(free))] if free else []
    return ranked + [i for i in every if i not in set(ranked)]


def group_partition(alloc: Allocator, healthy: Iterable[int], size: int) -> dict[int, int]:
    """GPU index -> group number of a best-first partition of the healthy GPUs into `size`-sets
    (the allocator's choice, repeatedly); GPUs left over get none."""
    left = sorted(set(healthy))
    out: dict[int, int] = {}
    g = 0
    while len(left) >= size:
        chosen = alloc.choose(left, size).indices
        for i in chosen:
            out[i] = g
        left = [i for i in left if i not in chosen]
        g += 1
    return out


def build_slices(
    topology: Topology,
    alloc: Allocator,
    node_name: str,
    *,
    healthy: Iterable[int],
    free: Iterable[int],
    generation: int = 1,
    sizes: Sequence[int] = DEFAULT_SIZES,
    max_sets: int = MAX_SETS_PER_SIZE,
    pcie_roots: Mapping[int, str] | None = None,
    driver: str = DRIVER,
) -> list[dict[str, Any]]:
    """The node's ResourceSlices as `resource.k8s.io/v1` dicts (module docstring: the format).

    `max_sets` caps the set devices of one size (all of them by default on nodes of up to 16
    GPUs); they are cut into slices of `SETS_PER_SLICE`, named so that name order is
    publication order (`set_parts`)."""
    if not node_name:
        raise SliceError("node name is required")
    if not 1 <= max_sets <= MAX_SETS_PER_SIZE:
        raise SliceError(f"max_sets must be 1..{MAX_SETS_PER_SIZE}")
    n = topology.n
    h = sorted(i for i in set(healthy) if 0 <= i < n)
    f = sorted(i for i in set(free) if i in set(h))
    roots = pcie_roots or {}
    used_sizes = [k for k in sorted(set(sizes)) if 2 <= k <= n]
    groups = {k: group_partition(alloc, range(n), k) for k in used_sizes}
    ok = set(h)

    gpu_devices = [
        _gpu_device(topology, i, roots.get(i), groups, i in ok) for i in gpu_order(alloc, range(n), f)
    ]
    parts: list[tuple[str, str, dict[str, Any]]] = [
        (
            "counters",
            "counters",
            {
                "sharedCounters": [
                    {"name": COUNTER_SET, "counters": {counter_name(i): {"value": "1"} for i in range(n)}}
                ]
            },
        ),
        ("gpus", "gpus", {"devices": gpu_devices}),
    ]
    for k in used_sizes:
        devices = [_set_device(topology, s, ok) for s in choose_sets(alloc, h, f, k, max_sets)]
        chunks = [devices[i : i + SETS_PER_SLICE] for i in range(0, len(devices), SETS_PER_SLICE)]
        for name, chunk in zip(set_parts(k, len(chunks)), chunks, strict=True):
            parts.append((name, f"set{k}", {"devices": chunk}))
    pool = {"name": node_name, "generation": generation, "resourceSliceCount": len(parts)}
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {"name": slice_name(node_name, name), "labels": {"gputopo.io/part": part}},
            "spec": {"driver": driver, "nodeName": node_name, "pool": dict(pool), **body},
        }
        for name, part, body in parts
    ]


def set_parts(size: int, count: int) -> list[str]:
    """The name parts of the `count` slices holding the set devices of one size, in
    publication order: `set<k>`, then `set<k>-001`, `set<k>-002`, ….

    kube-scheduler's allocator walks a pool's slices sorted by name (byte order) and each
    slice's devices in list order: `buildPool` → `sortSlicesByName` in
    k8s.io/dynamic-resource-allocation/structured/internal/{incubating,experimental}/pools_*.go
    (v0.36.3, v0.37.2; the variant kube-scheduler runs while any beta DRA gate is on, as by
    default from 1.36). A name is a prefix of its successors and the suffixes have equal width,
    so name order is this order. The first name is the one a size that fits one slice always
    had, so such nodes republish under the same names."""
    if count > 999:
        raise SliceError(f"{count} slices for size {size}: more than the 3-digit suffix names")
    return [f"set{size}" if i == 0 else f"set{size}-{i:03d}" for i in range(count)]


def slice_name(node_name: str, part: str) -> str:
    """`<node>-gputopo-<part>`, cut (with a stable checksum) to the object-name limit."""
    name = f"{node_name}-gputopo-{part}"
    if len(name) <= MAX_OBJECT_NAME_CHARS:
        return name
    digest = 0
    for ch in node_name.encode():
        digest = (digest * 131 + ch) % (1 << 32)
    tail = f"-{digest:08x}-gputopo-{part}"
    return node_name[: MAX_OBJECT_NAME_CHARS - len(tail)].rstrip("-.") + tail


def _consumes(gpus: Iterable[int]) -> list[dict[str, Any]]:
    return [{"counterSet": COUNTER_SET, "counters": {counter_name(i): {"value": "1"} for i in gpus}}]


def _gpu_device(
    topology: Topology, i: int, root: str | None, groups: Mapping[int, Mapping[int, int]], healthy: bool
) -> dict[str, Any]:
    gpu = topology.gpus[i]
    attrs: dict[str, dict[str, Any]] = {
        "type": {"string": "gpu"},
        "healthy": {"bool": healthy},
        "index": {"int": i},
        "uuid": {"string": gpu.uuid[:MAX_STRING_ATTRIBUTE_CHARS]},
    }
    if gpu.model:
        attrs["productName"] = {"string": gpu.model[:MAX_STRING_ATTRIBUTE_CHARS]}
    bdf = pci_bus_id(gpu.pci_bus_id)
    if bdf:
        attrs[STANDARD + "pciBusID"] = {"string": bdf}
    if root:
        attrs[STANDARD + "pcieRoot"] = {"string": root}
    if gpu.numa is not None:
        attrs[STANDARD + "numaNode"] = {"int": gpu.numa}
    for k, part in groups.items():
        if i in part:
            attrs[f"group{k}"] = {"int": part[i]}
    attrs.update(link_attributes(topology, i, room=MAX_ATTRIBUTES_PER_DEVICE - len(attrs)))
    return {"name": gpu_device_name(i), "attributes": attrs, "consumesCounters": _consumes((i,))}


def link_attributes(topology: Topology, i: int, *, room: int) -> dict[str, dict[str, Any]]:
    """GPU i's links, for readers of the slices that must rebuild the node's Topology (the
    scheduler sidecar on a DRA cluster, where no annotation exists): `link<j>` = the `nvidia-smi
    topo -m` code of the pair (i, j) for every other GPU j, and `nvlinkMBps` = one NVLink's MB/s
    on this node (its BandwidthSettings). Empty when they do not fit in `room` attributes (a
    node of more than ~21 GPUs): that node is then read as of unknown topology, never guessed."""
    n = topology.n
    if n - 1 + 1 > room:
        return {}
    out: dict[str, dict[str, Any]] = {
        "nvlinkMBps": {"int": round(topology.settings.nvlink_gbps_per_link * 1000)}
    }
    for j in range(n):
        if j != i:
            out[f"link{j}"] = {"string": topology.code(i, j)}
    return out


def _set_device(topology: Topology, s: SetDevice, healthy: set[int]) -> dict[str, Any]:
    attrs: dict[str, dict[str, Any]] = {
        "type": {"string": "set"},
        "healthy": {"bool": all(i in healthy for i in s.gpus)},
        "size": {"int": len(s.gpus)},
        "ringMBps": {"int": s.ring_mbps},
        "gpus": {"string": ",".join(str(i) for i in s.gpus)},
    }
    numas = {topology.gpus[i].numa for i in s.gpus}
    if len(numas) == 1 and None not in numas:
        attrs[STANDARD + "numaNode"] = {"int": numas.pop()}
    return {"name": s.name, "attributes": attrs, "consumesCounters": _consumes(s.gpus)}


# --------------------------------------------------------------------------- checks and first fit


def check_limits(slices: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every way `slices` break the API's limits or shape rules this module relies on (empty: ok).

    Used by the daemon before it publishes and by the tests; the limits are the module's
    constants (resource.k8s.io/v1 validation as of 1.36)."""
    problems: list[str] = []
    names: set[str] = set()
    pools: set[tuple[str, int, int]] = set()
    counter_sets: dict[str, set[str]] = {}
    for s in slices:
        spec = s.get("spec", {})
        meta_name = str(s.get("metadata", {}).get("name", ""))
        where = meta_name or "<unnamed>"
        if s.get("apiVersion") != API_VERSION or s.get("kind") != "ResourceSlice":
            problems.append(f"{where}: not a {API_VERSION} ResourceSlice")
        if not meta_name or len(meta_name) > MAX_OBJECT_NAME_CHARS:
            problems.append(f"{where}: bad object name")
        pool = spec.get("pool", {})
        pools.add(
            (str(pool.get("name")), int(pool.get("generation", -1)), int(pool.get("resourceSliceCount", -1)))
        )
        if not spec.get("nodeName"):
            problems.append(f"{where}: nodeName missing")
        devices = spec.get("devices") or []
        shared = spec.get("sharedCounters") or []
        if shared and devices:
            problems.append(f"{where}: sharedCounters must be in a slice of their own")
        if len(shared) > MAX_COUNTER_SETS_PER_SLICE:
            problems.append(f"{where}: {len(shared)} counter sets > {MAX_COUNTER_SETS_PER_SLICE}")
        for cs in shared:
            counters = cs.get("counters", {})
            if len(counters) > MAX_COUNTERS_PER_SET:
                problems.append(
                    f"{where}: counter set {cs.get('name')} has {len(counters)} > {MAX_COUNTERS_PER_SET}"
                )
            counter_sets[str(cs.get("name"))] = set(counters)
        if len(devices) > MAX_DEVICES_PER_SLICE:
            problems.append(f"{where}: {len(devices)} devices > {MAX_DEVICES_PER_SLICE}")
        with_counters = [d for d in devices if d.get("consumesCounters")]
        if len(with_counters) > MAX_DEVICES_WITH_COUNTERS_PER_SLICE:
            problems.append(
                f"{where}: {len(with_counters)} devices with counters > {MAX_DEVICES_WITH_COUNTERS_PER_SLICE}"
            )
        total = 0
        for d in devices:
            dn = str(d.get("name", ""))
            if not dn or len(dn) > MAX_NAME_CHARS:
                problems.append(f"{where}: bad device name {dn!r}")
            if dn in names:
                problems.append(f"{where}: duplicate device {dn}")
            names.add(dn)
            attrs = d.get("attributes", {})
            if len(attrs) + len(d.get("capacity", {})) > MAX_ATTRIBUTES_PER_DEVICE:
                problems.append(f"{where}/{dn}: more than {MAX_ATTRIBUTES_PER_DEVICE} attributes")
            for an, av in attrs.items():
                if (
                    not isinstance(av, Mapping)
                    or len(av) != 1
                    or next(iter(av)) not in ("int", "bool", "string", "version")
                ):
                    problems.append(
                        f"{where}/{dn}: attribute {an} must hold exactly one of int/bool/string/version"
                    )
                elif "string" in av and len(str(av["string"])) > MAX_STRING_ATTRIBUTE_CHARS:
                    problems.append(f"{where}/{dn}: attribute {an} longer than {MAX_STRING_ATTRIBUTE_CHARS}")
            consumes = d.get("consumesCounters") or []
            if len(consumes) > MAX_CONSUMES_PER_DEVICE:
                problems.append(f"{where}/{dn}: {len(consumes)} consumesCounters > {MAX_CONSUMES_PER_DEVICE}")
            per_device = sum(len(c.get("counters", {})) for c in consumes)
            if per_device > MAX_COUNTERS_PER_DEVICE:
                problems.append(f"{where}/{dn}: {per_device} counters > {MAX_COUNTERS_PER_DEVICE}")
            total += per_device
        if total > MAX_CONSUMED_COUNTERS_PER_SLICE:
            problems.append(f"{where}: {total} consumed counters > {MAX_CONSUMED_COUNTERS_PER_SLICE}")
    if len(pools) > 1:
        problems.append(f"slices disagree on pool name/generation/count: {sorted(pools)}")
    elif pools and next(iter(pools))[2] != len(slices):
        problems.append("resourceSliceCount differs from the number of slices")
    for s in slices:
        for d in s.get("spec", {}).get("devices") or []:
            for c in d.get("consumesCounters") or []:
                known = counter_sets.get(str(c.get("counterSet")))
                if known is None or not set(c.get("counters", {})) <= known:
                    problems.append(f"{d.get('name')}: consumes a counter no slice declares")
    return problems


def first_fit(
    slices: Sequence[Mapping[str, Any]], size: int, used: Iterable[int] = ()
) -> tuple[str, tuple[int, ...]] | None:
    """What kube-scheduler's allocator gives a claim for one device of the size-`size` class
    (size 1: the single-GPU class; the classes select `healthy` devices only): the first
    matching device, in slice order, none of whose
    counters is consumed already (`used`: the GPUs that allocated claims hold; every counter is
    one GPU). None when no device fits.

    The stock allocator's rule for a one-device request (KEP-4815 counters); the tests and the
    simulator use it as the peer that is not gputopo."""
    consumed = {counter_name(i) for i in used}
    want_type = "gpu" if size == 1 else "set"
    for s in slices:
        for d in s.get("spec", {}).get("devices") or []:
            attrs = d.get("attributes", {})
            if (
                attrs.get("type", {}).get("string") != want_type
                or attrs.get("healthy", {}).get("bool") is False
            ):
                continue
            if size > 1 and attrs.get("size", {}).get("int") != size:
                continue
            mine = {name for c in d.get("consumesCounters") or [] for name in c.get("counters", {})}
            if mine & consumed:
                continue
            return str(d["name"]), tuple(sorted(int(x.split("-")[1]) for x in mine))
    return None


def summary(slices: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Counts for docs and logs: slices, devices per part (a size's slices summed), counters."""
    parts: dict[str, int] = {}
    counters = 0
    consumed = 0
    for s in slices:
        spec = s.get("spec", {})
        part = str(s.get("metadata", {}).get("labels", {}).get("gputopo.io/part", "?"))
        parts[part] = parts.get(part, 0) + len(spec.get("devices") or [])
        counters += sum(len(cs.get("counters", {})) for cs in spec.get("sharedCounters") or [])
        consumed += sum(
            len(c.get("counters", {}))
            for d in spec.get("devices") or []
            for c in d.get("consumesCounters") or []
        )
    return {
        "slices": len(slices),
        "devices": sum(parts.values()),
        "per_part": parts,
        "counters": counters,
        "consumed_counters": consumed,
    }


def all_subsets(n: int, size: int) -> Iterable[tuple[int, ...]]:
    """Every `size`-subset of range(n) (the brute-force side of the tests and measurements)."""
    return combinations(range(n), size)
