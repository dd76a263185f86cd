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

Device layouts (issue 30): the kinds of device above (`gpu`, `set`) are the entries of
`LAYOUTS`, one `DeviceLayout` each: its `type` (the attribute and the device-name prefix), its
slices' name part, its DeviceClass name, whether it has one class per set size, and the function
that lists its devices in publication order. Everything else follows from the table: building
the slices, reading a device name back into GPUs (`expand`, at prepare time), kube-scheduler's
first fit (`first_fit`), the DeviceClasses (`device_class`; deploy/ and the chart are generated
from it by tools/dra_layouts.py), how many GPUs a claim's class asks for (`class_gpus`, the
scheduler sidecar) and the sidecar's reading of the slices (gputopo.network.draview). A new
layout is one entry plus its test (docs/dra.md, "Adding a device layout").

Pure: a function of the topology, the healthy and free GPU indices and the pool generation; the
daemon does the I/O (sysfs for PCIe roots, the API for publishing).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
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

    Strict: only names this module writes (`<type>-<i>-<j>-…` of a layout in `LAYOUTS`, sorted
    distinct indices below n, as many as the layout's devices hold); a claim result naming
    anything else is refused, never guessed at."""
    parts = device.split("-")
    layout = layout_of_type(parts[0]) if len(parts) >= 2 else None
    if layout is None or not all(p.isdigit() and p == str(int(p)) for p in parts[1:]):
        raise SliceError(f"device {device!r} is not a gputopo device name")
    idx = tuple(int(p) for p in parts[1:])
    if list(idx) != sorted(set(idx)) or not layout.min_gpus <= len(idx) <= layout.max_gpus:
        raise SliceError(f"device {device!r}: {layout.holds}")
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


# --------------------------------------------------------------------------- device layouts


@dataclass(frozen=True, slots=True)
class LayoutInput:
    """What a layout chooses and describes its devices from: the node, its exact allocator, the
    healthy GPUs, the free ones among them (healthy and in no prepared claim), the cap on set
    devices per size, the PCIe roots the daemon read and the `group<k>` partitions."""

    topology: Topology
    alloc: Allocator
    healthy: Sequence[int]
    free: Sequence[int]
    max_sets: int
    pcie_roots: Mapping[int, str]
    groups: Mapping[int, Mapping[int, int]]


@dataclass(frozen=True, slots=True)
class Device:
    """One device a layout publishes: its GPUs and its own attributes (the common ones, `type`
    and `healthy`, and `size` and `gpus` for multi-GPU layouts, are added by `build_slices`)."""

    gpus: tuple[int, ...]
    attributes: Mapping[str, Mapping[str, Any]]


#: Attributes `build_slices` gives every device: `type` and `healthy`.
COMMON_ATTRIBUTES = 2


@dataclass(frozen=True, slots=True)
class DeviceLayout:
    """One kind of device a node publishes (see `LAYOUTS`).

    `type`: the `type` attribute and the device-name prefix (`<type>-<i>-<j>-…`, sorted GPU
    indices); no dash, unique. `part`: the slices' name part (`<part>` or, sized, `<part><k>`,
    then `-001`, `-002`, … when one slice does not hold them) and their `gputopo.io/part` label.
    `class_name`: the DeviceClass `<class_name>.<domain>`, sized `<class_name>-<k>.<domain>`, and
    the same extended resource name. `sized`: one class, and slices, per published set size k
    (`--set-sizes`), each device then has `size == k`. `min_gpus`/`max_gpus`: how many GPUs one
    device holds. `devices(input, k)`: the devices of size k (sized) or all of them (k = 0), in
    publication order: kube-scheduler's first fit takes the first free one. `summary`: one line
    for the class's comment and the docs."""

    type: str
    part: str
    class_name: str
    sized: bool
    min_gpus: int
    max_gpus: int
    devices: Callable[[LayoutInput, int], list[Device]]
    summary: str

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9]*", self.type) or not re.fullmatch(r"[a-z][a-z0-9]*", self.part):
            raise ValueError(f"layout {self.type!r}: type and part must be lower-case words without a dash")
        if not 1 <= self.min_gpus <= self.max_gpus:
            raise ValueError(f"layout {self.type!r}: 1 <= min_gpus <= max_gpus")

    @property
    def holds(self) -> str:
        """What a device name of this layout must name, for errors."""
        count = (
            f"{self.min_gpus}"
            if self.min_gpus == self.max_gpus
            else f"{self.min_gpus} or more"
            if self.max_gpus >= MAX_GPUS_PER_DEVICE
            else f"{self.min_gpus} to {self.max_gpus}"
        )
        return f"a {self.type} device names {count} sorted distinct GPU{'' if count == '1' else 's'}"

    def device_name(self, gpus: Sequence[int]) -> str:
        return f"{self.type}-" + "-".join(str(i) for i in sorted(gpus))

    def sizes(self, published: Sequence[int], n: int) -> list[int]:
        """The sizes this layout publishes on an n-GPU node: each of `published` that fits (sized),
        else [0] (one group of devices)."""
        if not self.sized:
            return [0]
        return [k for k in sorted(set(published)) if self.min_gpus <= k <= min(n, self.max_gpus)]

    def class_stem(self, size: int = 0) -> str:
        """`<class_name>` or, sized, `<class_name>-<size>`: the class's first label and resource."""
        return f"{self.class_name}-{size}" if self.sized else self.class_name


#: Most GPUs one device may name (a node's most GPUs in the counter set).
MAX_GPUS_PER_DEVICE = MAX_COUNTERS_PER_SET


def _gpu_layout_devices(inp: LayoutInput, _size: int) -> list[Device]:
    n = inp.topology.n
    return [
        Device((i,), _gpu_attributes(inp.topology, i, inp.pcie_roots.get(i), inp.groups))
        for i in gpu_order(inp.alloc, range(n), inp.free)
    ]


def _set_layout_devices(inp: LayoutInput, size: int) -> list[Device]:
    out = []
    for s in choose_sets(inp.alloc, inp.healthy, inp.free, size, inp.max_sets):
        attrs: dict[str, dict[str, Any]] = {"ringMBps": {"int": s.ring_mbps}}
        numas = {inp.topology.gpus[i].numa for i in s.gpus}
        if len(numas) == 1 and None not in numas:
            attrs[STANDARD + "numaNode"] = {"int": numas.pop()}
        out.append(Device(s.gpus, attrs))
    return out


#: The device layouts a node publishes, in slice order (after the counters slice). A new one is
#: one entry here plus its test (docs/dra.md, "Adding a device layout"); the DeviceClasses of
#: deploy/ and the chart are generated from this table (tools/dra_layouts.py).
LAYOUTS: tuple[DeviceLayout, ...] = (
    DeviceLayout(
        type="gpu",
        part="gpus",
        class_name="gpu",
        sized=False,
        min_gpus=1,
        max_gpus=1,
        devices=_gpu_layout_devices,
        summary="single GPUs, the free healthy ones in the allocator's order for one GPU; they "
        "carry each GPU's identity and links (the GPU layout)",
    ),
    DeviceLayout(
        type="set",
        part="set",
        class_name="nvlink",
        sized=True,
        min_gpus=2,
        max_gpus=MAX_GPUS_PER_DEVICE,
        devices=_set_layout_devices,
        summary="every k-GPU set, ring-bandwidth levels best first, the free healthy sets of a "
        "level in the allocator's order: one claim for one device gets the best free ring",
    ),
)
#: The layout whose devices are the node's GPUs themselves: the one readers learn GPUs from.
GPU_LAYOUT = LAYOUTS[0]


def layout_of_type(type_: str) -> DeviceLayout | None:
    """The layout whose devices have this `type` attribute (and name prefix), None if none."""
    return next((layout for layout in LAYOUTS if layout.type == type_), None)


def check_layouts(layouts: Sequence[DeviceLayout]) -> list[str]:
    """What makes a table of layouts unusable (empty: fine): types, parts or class names twice,
    or the GPU layout not first."""
    problems = []
    for what in ("type", "part", "class_name"):
        values = [getattr(layout, what) for layout in layouts]
        if len(set(values)) != len(values):
            problems.append(f"two layouts share a {what}: {values}")
    if not layouts or (layouts[0].min_gpus, layouts[0].max_gpus, layouts[0].sized) != (1, 1, False):
        problems.append("the first layout must be one device per GPU, unsized (the GPU layout)")
    return problems


def layout_of_class(class_name: str, domain: str = DRIVER) -> tuple[DeviceLayout, int] | None:
    """The layout and size (0 when unsized) of a DeviceClass named as `device_class` names it:
    `<stem>.<domain>`, or `<stem>.<subdomain>.<domain>` for a Helm release's own classes
    (the chart's gputopo.draClassDomain). None for any other class."""
    stem, _, rest = class_name.partition(".")
    if not (rest == domain or rest.endswith("." + domain)) or not _CLASS_DOMAIN.fullmatch(rest):
        return None
    for layout in LAYOUTS:
        if not layout.sized and stem == layout.class_name:
            return layout, 0
        prefix = layout.class_name + "-"
        if layout.sized and stem.startswith(prefix) and stem[len(prefix) :].isdigit():
            size = int(stem[len(prefix) :])
            if str(size) == stem[len(prefix) :] and layout.min_gpus <= size <= layout.max_gpus:
                return layout, size
    return None


_CLASS_DOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def class_gpus(class_name: str, domain: str = DRIVER) -> int:
    """GPUs one device of a gputopo DeviceClass holds (the sidecar sizes a claim by it); 0 for a
    class that is not ours or whose devices vary in size."""
    found = layout_of_class(class_name, domain)
    if found is None:
        return 0
    layout, size = found
    return size if layout.sized else layout.min_gpus if layout.min_gpus == layout.max_gpus else 0


def device_class(
    layout: DeviceLayout, driver: str = DRIVER, domain: str | None = None, size: int = 0
) -> dict[str, Any]:
    """The DeviceClass selecting the healthy devices of `layout` (of `size`, when sized), named
    `<stem>.<domain>` with the extended resource `<domain>/<stem>` (the DRAExtendedResource
    gate: a container's `resources.limits: {gputopo.io/nvlink-4: 1}` needs no claim)."""
    domain = domain or driver
    stem = layout.class_stem(size)
    attr = f'device.attributes["{driver}"]'
    sized = f" && {attr}.size == {size}" if layout.sized else ""
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": f"{stem}.{domain}"},
        "spec": {
            "selectors": [
                {
                    "cel": {
                        "expression": f'device.driver == "{driver}" && {attr}.type == "{layout.type}"{sized} && {attr}.healthy'
                    }
                }
            ],
            "extendedResourceName": f"{domain}/{stem}",
        },
    }


def device_classes(
    driver: str = DRIVER, domain: str | None = None, sizes: Sequence[int] = DEFAULT_SIZES
) -> list[dict[str, Any]]:
    """One DeviceClass per layout, and per published size of each sized layout, in table order."""
    return [
        device_class(layout, driver, domain, k)
        for layout in LAYOUTS
        for k in layout.sizes(sizes, MAX_GPUS_PER_DEVICE)
    ]


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
    set_sizes = [k for k in sorted(set(sizes)) if 2 <= k <= n]
    inp = LayoutInput(
        topology=topology,
        alloc=alloc,
        healthy=h,
        free=f,
        max_sets=max_sets,
        pcie_roots=pcie_roots or {},
        groups={k: group_partition(alloc, range(n), k) for k in set_sizes},
    )
    ok = set(h)
    parts: list[tuple[str, str, dict[str, Any]]] = [
        (
            "counters",
            "counters",
            {
                "sharedCounters": [
                    {"name": COUNTER_SET, "counters": {counter_name(i): {"value": "1"} for i in range(n)}}
                ]
            },
        )
    ]
    for layout in LAYOUTS:
        for k in layout.sizes(set_sizes, n):
            devices = [_device(layout, d, ok) for d in layout.devices(inp, k)]
            part = f"{layout.part}{k}" if layout.sized else layout.part
            chunks = [devices[i : i + SETS_PER_SLICE] for i in range(0, len(devices), SETS_PER_SLICE)]
            for name, chunk in zip(set_parts(part, len(chunks)), chunks, strict=True):
                parts.append((name, part, {"devices": chunk}))
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


def set_parts(part: str, count: int) -> list[str]:
    """The name parts of the `count` slices holding one group of devices (a layout's, or a
    sized layout's of one size: `set4`), in publication order: `<part>`, then `<part>-001`,
    `<part>-002`, ….

    kube-scheduler's allocator walks a pool's slices sorted by name (byte order) and each
    slice's devices in list order: `buildPool` → `sortSlicesByName` in
    k8s.io/dynamic-resource-allocation/structured/internal/{incubating,experimental}/pools_*.go
    (v0.36.3, v0.37.2; the variant kube-scheduler runs while any beta DRA gate is on, as by
    default from 1.36). A name is a prefix of its successors and the suffixes have equal width,
    so name order is this order. The first name is the one a group that fits one slice always
    had, so such nodes republish under the same names."""
    if count > 999:
        raise SliceError(f"{count} slices for {part}: more than the 3-digit suffix names")
    return [part if i == 0 else f"{part}-{i:03d}" for i in range(count)]


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


def _device(layout: DeviceLayout, device: Device, healthy: set[int]) -> dict[str, Any]:
    """A layout's device as the API takes it: the common attributes first, then its own."""
    attrs: dict[str, Any] = {
        "type": {"string": layout.type},
        "healthy": {"bool": all(i in healthy for i in device.gpus)},
    }
    if layout is not GPU_LAYOUT:  # readers learn a multi-GPU device's members from these two
        attrs["size"] = {"int": len(device.gpus)}
        attrs["gpus"] = {"string": ",".join(str(i) for i in device.gpus)}
    attrs.update(device.attributes)
    return {
        "name": layout.device_name(device.gpus),
        "attributes": attrs,
        "consumesCounters": _consumes(device.gpus),
    }


def _gpu_attributes(
    topology: Topology, i: int, root: str | None, groups: Mapping[int, Mapping[int, int]]
) -> dict[str, dict[str, Any]]:
    gpu = topology.gpus[i]
    attrs: dict[str, dict[str, Any]] = {
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
    room = MAX_ATTRIBUTES_PER_DEVICE - COMMON_ATTRIBUTES - len(attrs)
    attrs.update(link_attributes(topology, i, room=room))
    return attrs


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
    slices: Sequence[Mapping[str, Any]],
    size: int,
    used: Iterable[int] = (),
    layout: DeviceLayout | None = None,
) -> tuple[str, tuple[int, ...]] | None:
    """What kube-scheduler's allocator gives a claim for one device of a class: the class of
    `layout`, of size `size` when the layout is sized (by default the single-GPU class for size
    1, the `set` class of size `size` otherwise; the classes select `healthy` devices only): the
    first matching device, in slice order, none of whose counters is consumed already (`used`:
    the GPUs that allocated claims hold; every counter is one GPU). None when no device fits.

    The stock allocator's rule for a one-device request (KEP-4815 counters); the tests and the
    simulator use it as the peer that is not gputopo."""
    consumed = {counter_name(i) for i in used}
    layout = layout or (GPU_LAYOUT if size == 1 else layout_of_type("set"))
    assert layout is not None
    for s in slices:
        for d in s.get("spec", {}).get("devices") or []:
            attrs = d.get("attributes", {})
            if (
                attrs.get("type", {}).get("string") != layout.type
                or attrs.get("healthy", {}).get("bool") is False
            ):
                continue
            if layout.sized and attrs.get("size", {}).get("int") != size:
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
