"""The measured job-time model: how long one data-parallel training step takes in a placement.

Every placement decision trades waiting against running slower, so "how much slower" has to be
a measurement, not a guess. This module turns a placement into the all-reduce bus bandwidth
NCCL reaches there (nccl-tests' busbw: t = 2(n-1)/n * S / busbw) and the step time of a
workload profile (gputopo.jobtime.profiles), with every constant taken from a published measurement
(docs/jobtime.md lists each source and puts every published point beside the model's answer).

The parts, in the order a ring all-reduce meets them:

* **inside a node** (`intra_busbw_gbps`): NVLink and NVSwitch reach `NVLINK_EFFICIENCY` of
  their line rate. On a direct-NVLink mesh (DGX-1) NCCL runs one ring per outgoing link at once
  (channels), so a set of GPUs reaches the NVLink bandwidth each GPU has to the others of the
  set, not its weakest single ring. A ring that crosses PCIe runs at the measured bus bandwidth
  of the farthest PCIe level it has to cross (`PCIE_BUSBW_GBPS`), not at the link table's
  nominal figure.
* **across nodes** (`inter_busbw_gbps`): NCCL spreads a cross-node ring over the NICs near the
  job's GPUs, so a node whose job has g of its G GPUs drives ceil(g * nics / G) of its NICs;
  their line rate times the fabric's efficiency (`FABRICS`) is the node's share, divided by the
  oversubscription of the level the job spans (`DEFAULT_OVERSUBSCRIPTION`). The node that
  drives the fewest NICs (the least-populated one) sets the pace. Inside a multi-node NVLink
  domain (the accelerator level) the hop is NVLink, not a NIC.
* **overlap** (`step_s`): data-parallel frameworks start reducing gradients while the backward
  pass still runs (PyTorch DDP's buckets); a profile's `overlap` is the share of its compute
  that can hide communication: step = compute + max(0, comm - overlap * compute). Pollux
  (OSDI '21, §3.2) fits a smooth version of the same idea; the linear one is kept here because
  each of its two numbers has a direct reading (docs/jobtime.md).

Pure: functions of their arguments only, so the simulator, the CLI (`gputopo step-time`) and
the sidecar read the same numbers.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from gputopo.network.levels import ACCELERATOR, CORE, HOSTNAME, LEAF, SPINE, ZONE
from gputopo.node.allocator import Allocator
from gputopo.node.links import PCIE_LEVELS
from gputopo.node.topology import Topology

#: Share of NVLink / NVSwitch line rate NCCL's ring reaches (nccl-tests#212: ~20 % protocol
#: overhead, 370 of 450 GB/s on H100; nccl-tests#175: 232.5 of 300 GB/s on DGX A100).
NVLINK_EFFICIENCY = 0.8

#: Measured all-reduce busbw (GB/s) of a ring whose farthest hop crosses this PCIe level, on
#: PCIe Gen4 x16 servers (nccl-tests#178: 20 GB/s across NODE on A100 PCIe; nccl#1639: 28 GB/s
#: over 8 Gen5 GPUs across both sockets, i.e. 14 at Gen4 for SYS).
PCIE_BUSBW_GBPS: Mapping[str, float] = MappingProxyType(
    {"PIX": 20.0, "PXB": 20.0, "PHB": 20.0, "NODE": 20.0, "SYS": 14.0}
)


@dataclass(frozen=True)
class Fabric:
    """A network transport and the share of NIC line rate NCCL's ring reaches over it."""

    name: str
    efficiency: float
    source: str


#: Fabrics by the name a node label gives (`NIC_FABRIC_LABEL`); docs/jobtime.md has the sources.
FABRICS: Mapping[str, Fabric] = MappingProxyType(
    {
        "ib": Fabric(
            "ib", 0.92, "NVIDIA/nccl#812 (192 of 200 GB/s), nccl-tests#175 (86 of 100), nccl-tests#290"
        ),
        "roce": Fabric("roce", 0.7, "nccl-tests#169 (8 x 100 Gb RoCE, 3 nodes: 70 of 100 GB/s)"),
        "efa": Fabric("efa", 0.62, "NVIDIA/nccl#527 (p4dn, 4 x 100 Gb EFA, 3 / 4 nodes: 31.8 / 29.6 of 50)"),
        "tcp": Fabric("tcp", 0.26, "Pollux/adaptdl bert placements.csv sync times (50 Gb TCP: 0.23-0.35)"),
    }
)
DEFAULT_FABRIC = "ib"

#: Node labels an operator sets to say a node's NICs (docs/operator.md).
NIC_COUNT_LABEL = "gputopo.io/nics"
NIC_GBPS_LABEL = "gputopo.io/nic-gbps"
NIC_FABRIC_LABEL = "gputopo.io/nic-fabric"

#: Oversubscription of the fabric above each level (downlink : uplink bandwidth). GPU fabrics
#: are built non-blocking up to the spine (NVIDIA DGX SuperPOD reference architecture; Huawei
#: AI Fabric: "1:1 (recommended)"); above it 2:1, the most oversubscribed option those guides
#: offer (Huawei AI Fabric 4:3 / 2:1 / 1:1, Juniper's AI JVD 2:1). An operator overrides it.
DEFAULT_OVERSUBSCRIPTION: Mapping[str, float] = MappingProxyType(
    {ACCELERATOR: 1.0, LEAF: 1.0, SPINE: 1.0, CORE: 2.0, ZONE: 2.0}
)
#: Members with no common domain at any level: as across zones.
CLUSTER_OVERSUBSCRIPTION = 2.0

#: Largest NIC count and rate a label may claim (bounds for untrusted input).
MAX_NICS = 64
MAX_NIC_GBPS = 3200.0


class JobTimeError(ValueError):
    """An input the model cannot use; the message names it."""


@dataclass(frozen=True)
class Nics:
    """A node's network interfaces for collective traffic: count, line rate (Gb/s), fabric."""

    count: int = 1
    gbps: float = 100.0
    fabric: str = DEFAULT_FABRIC

    def __post_init__(self) -> None:
        if not (isinstance(self.count, int) and 1 <= self.count <= MAX_NICS):
            raise JobTimeError(f"NIC count must be 1..{MAX_NICS}, got {self.count!r}")
        if not (math.isfinite(self.gbps) and 0 < self.gbps <= MAX_NIC_GBPS):
            raise JobTimeError(f"NIC rate must be > 0 and at most {MAX_NIC_GBPS:g} Gb/s, got {self.gbps!r}")
        if self.fabric not in FABRICS:
            raise JobTimeError(f"unknown fabric {self.fabric!r} (known: {', '.join(FABRICS)})")

    def node_gbytes(self, used: int) -> float:
        """GB/s one direction of `used` of these NICs at the fabric's efficiency."""
        return used * self.gbps / 8.0 * FABRICS[self.fabric].efficiency

    def to_dict(self) -> dict[str, object]:
        return {"count": self.count, "gbps": self.gbps, "fabric": self.fabric}


#: NICs of the preset server models (vendor data sheets; docs/jobtime.md). A model not listed
#: gets `FALLBACK_NICS` until its nodes are labelled.
PRESET_NICS: Mapping[str, Nics] = MappingProxyType(
    {
        "dgx-a100": Nics(8, 200.0, "ib"),  # DGX A100: 8 x ConnectX-6 HDR 200 Gb/s
        "hgx-h100": Nics(8, 400.0, "ib"),  # DGX/HGX H100: 8 x ConnectX-7 NDR 400 Gb/s
        "dgx1-v100": Nics(4, 100.0, "ib"),  # DGX-1 V100: 4 x EDR 100 Gb/s
        "dgx2-v100": Nics(8, 100.0, "ib"),  # DGX-2: 8 x EDR 100 Gb/s
        "gb200-tray": Nics(4, 400.0, "ib"),  # GB200 NVL72 compute tray: 4 x ConnectX-7 400 Gb/s
    }
)
#: A PCIe server with one 100 Gb/s RDMA NIC: no vendor default exists for these boxes.
FALLBACK_NICS = Nics(1, 100.0, "ib")


def nics_for(topology_name: str, labels: Mapping[str, str] | None = None) -> Nics:
    """A node's NICs: its labels (`NIC_*_LABEL`) where set and valid, else the preset's
    default. A bad label (untrusted input) costs only that node: it falls back, never raises."""
    base = PRESET_NICS.get(topology_name, FALLBACK_NICS)
    if not labels:
        return base
    count, gbps, fabric = base.count, base.gbps, base.fabric
    raw = labels.get(NIC_COUNT_LABEL)
    if raw is not None and raw.isdigit() and len(raw) <= 3:
        count = int(raw)
    raw = labels.get(NIC_GBPS_LABEL)
    if raw is not None and len(raw) <= 16:
        try:
            gbps = float(raw)
        except ValueError:
            pass
    raw = labels.get(NIC_FABRIC_LABEL)
    if raw is not None and raw.lower() in FABRICS:
        fabric = raw.lower()
    try:
        return Nics(count, gbps, fabric)
    except JobTimeError:
        return base


# ----------------------------------------------------------------------- inside a node


def _pcie_level(topology: Topology, ring_mbps: int) -> str:
    """The PCIe level whose nominal figure is the ring's bottleneck (farthest first)."""
    for level in reversed(PCIE_LEVELS):
        if round(topology.settings.pcie_gbps[level] * 1000) == ring_mbps:
            return level
    return "SYS"


def intra_busbw_gbps(topology: Topology, gpus: Sequence[int], ring_mbps: int) -> float:
    """All-reduce busbw of `gpus` of one node (inf for one GPU: nothing to reduce).

    `ring_mbps` is the allocator's ring bandwidth of the set (its weakest hop, link table MB/s);
    the caller has it already (gputopo.node.allocator.Allocator.ring_mbps)."""
    k = len(gpus)
    if k < 2:
        return math.inf
    links = topology.links
    per_link = topology.settings.nvlink_gbps_per_link
    if topology.nvswitch:
        return ring_mbps / 1000.0 * NVLINK_EFFICIENCY
    # A ring over NVLink alone runs as several rings at once: each GPU sends on every link it
    # has to the set (channels); the GPU with the least NVLink to the others sets the pace.
    nv_out = []
    for i in gpus:
        total = 0
        for j in gpus:
            lk = links[i][j]
            if lk is not None and lk.nvlinks > 0:
                total += lk.nvlinks
        nv_out.append(total)
    ring_gbps = ring_mbps / 1000.0
    if _nvlink_only(topology, ring_mbps) and min(nv_out) > 0:
        return max(ring_gbps, min(nv_out) * per_link) * NVLINK_EFFICIENCY
    return _pcie_busbw(topology, ring_mbps)


def _nvlink_only(topology: Topology, ring_mbps: int) -> bool:
    """Whether a ring of this weakest hop runs over NVLink alone: faster than every PCIe figure
    of the node (a PCIe hop would cap it at that figure). A ring that ties a PCIe figure (only
    with unusual --pcie-gbps settings) is read as PCIe, the slower reading."""
    ring_gbps = ring_mbps / 1000.0
    per_link = topology.settings.nvlink_gbps_per_link
    return ring_gbps >= per_link and ring_gbps > max(topology.settings.pcie_gbps.values())


def _pcie_busbw(topology: Topology, ring_mbps: int) -> float:
    return PCIE_BUSBW_GBPS[_pcie_level(topology, ring_mbps)] if ring_mbps > 0 else PCIE_BUSBW_GBPS["SYS"]


#: Largest node on which `ring_busbw_gbps` reads a mesh's sets one by one (C(12, 6) = 924).
RING_BUSBW_ENUMERATE_MAX = 12


def ring_busbw_gbps(allocator: Allocator, size: int, ring_mbps: int) -> float:
    """All-reduce busbw of `size` GPUs of the allocator's server whose ring's weakest hop is
    `ring_mbps`, for a caller that knows a set only by that figure (the single-pod objective
    ranks nodes by their allocator's ring and prices the groups a free set keeps by their best
    ring, gputopo.node.allocator.Allocator.groups).

    On NVSwitch and on any ring that crosses PCIe the figure decides the busbw. On a
    direct-NVLink mesh NCCL's channels make it depend on the set (DGX-1 V100: 4 GPUs whose
    weakest hop is one 25 GB/s link reach 40, 60 or 80 GB/s): this reads the best set of that
    size and ring, what the server offers at that ring. Beyond `RING_BUSBW_ENUMERATE_MAX` GPUs
    a mesh is read as one ring (the lower bound). Uncached: callers keep the answers."""
    if size < 2:
        return math.inf
    topology = allocator.topology
    if topology.nvswitch:
        return ring_mbps / 1000.0 * NVLINK_EFFICIENCY
    if not _nvlink_only(topology, ring_mbps):
        return _pcie_busbw(topology, ring_mbps)
    if topology.n > RING_BUSBW_ENUMERATE_MAX:
        return ring_mbps / 1000.0 * NVLINK_EFFICIENCY
    best = 0.0
    for gpus in itertools.combinations(range(topology.n), size):
        if allocator.ring_mbps(gpus) == ring_mbps:
            best = max(best, intra_busbw_gbps(topology, gpus, ring_mbps))
    return best if best > 0 else ring_mbps / 1000.0 * NVLINK_EFFICIENCY


# ----------------------------------------------------------------------- across nodes


def nics_used(gpus_on_node: int, node_gpus: int, nics: Nics) -> int:
    """NICs a job's ring drives on a node where it has `gpus_on_node` of `node_gpus` GPUs: the
    NICs near its GPUs, at least one."""
    if node_gpus <= 0:
        return 1
    return max(1, min(nics.count, math.ceil(gpus_on_node * nics.count / node_gpus)))


def oversubscription(level: str | None, table: Mapping[str, float] | None = None) -> float:
    """Oversubscription above `level` (None: no common level); 1 inside one node."""
    if level == HOSTNAME:
        return 1.0
    if level is None:
        return CLUSTER_OVERSUBSCRIPTION
    return (table or DEFAULT_OVERSUBSCRIPTION).get(level, CLUSTER_OVERSUBSCRIPTION)


def inter_busbw_gbps(
    members: Sequence[tuple[int, int, Nics]],
    level: str | None,
    *,
    nodes: int | None = None,
    algorithm: str = "ring",
    table: Mapping[str, float] | None = None,
) -> float:
    """Busbw of the network part of a multi-node ring. `members` has one (GPUs of the job on
    the node, GPUs of the node, the node's NICs) per node.

    `algorithm="tree"` is NCCL's double binary tree on exactly two nodes, which sends S per node
    each way instead of 2(k-1)/k * S; nccl-tests then reports a busbw above the NICs' line rate
    (nccl#527's 2-node point). Training jobs' rings are modelled with "ring" (the default)."""
    if not members:
        return math.inf
    per_node = min(n.node_gbytes(nics_used(g, total, n)) for g, total, n in members)
    bw = per_node / oversubscription(level, table)
    if algorithm == "tree":
        if (nodes or len(members)) != 2:
            raise JobTimeError("the tree reading applies to exactly two nodes")
        k = sum(g for g, _, _ in members)
        bw *= 2.0 * (k - 1) / k
    elif algorithm != "ring":
        raise JobTimeError(f"unknown algorithm {algorithm!r} (ring or tree)")
    return bw


# ----------------------------------------------------------------------- one step


def comm_s(grad_bytes: float, gpus: int, busbw_gbps: float) -> float:
    """Seconds of one all-reduce of `grad_bytes` over `gpus` GPUs at `busbw_gbps` (nccl-tests)."""
    if gpus < 2 or math.isinf(busbw_gbps) or grad_bytes <= 0:
        return 0.0
    if busbw_gbps <= 0:
        raise JobTimeError("a multi-GPU all-reduce needs a positive bandwidth")
    return 2.0 * (gpus - 1) / gpus * grad_bytes / (busbw_gbps * 1e9)


def step_s(compute_s: float, overlap: float, comm: float) -> float:
    """One step: compute, plus the communication that the backward pass could not hide."""
    return compute_s + max(0.0, comm - overlap * compute_s)


@dataclass(frozen=True)
class StepTime:
    """The model's answer for one job in one placement (what `gputopo step-time` prints)."""

    busbw_gbps: float
    comm_s: float
    step_s: float
    ideal_step_s: float
    ideal_busbw_gbps: float = math.inf

    @property
    def slowdown(self) -> float:
        return self.step_s / self.ideal_step_s if self.ideal_step_s > 0 else 1.0

    def to_dict(self) -> dict[str, float | None]:
        return {
            "busbw_gbps": None if math.isinf(self.busbw_gbps) else round(self.busbw_gbps, 3),
            "comm_s": self.comm_s,
            "step_s": self.step_s,
            "slowdown": self.slowdown,
        }


def step_time(
    grad_bytes: float, compute_s: float, overlap: float, gpus: int, busbw_gbps: float, ideal_busbw_gbps: float
) -> StepTime:
    """Step time at `busbw_gbps` and against the same job at `ideal_busbw_gbps`."""
    validate_workload(grad_bytes, compute_s, overlap)
    comm = comm_s(grad_bytes, gpus, busbw_gbps)
    ideal = step_s(compute_s, overlap, comm_s(grad_bytes, gpus, ideal_busbw_gbps))
    return StepTime(busbw_gbps, comm, step_s(compute_s, overlap, comm), ideal, ideal_busbw_gbps)


def placement_step_time(
    topology: Topology,
    gpus_per_node: Sequence[int],
    level: str | None,
    nics: Nics,
    grad_bytes: float,
    compute_s: float,
    overlap: float,
    *,
    allocator: Allocator | None = None,
    table: Mapping[str, float] | None = None,
) -> StepTime:
    """One job on nodes of one server model: `gpus_per_node[i]` GPUs on node i (inside a node
    the allocator's best set of that size), the nodes spanning `level` (HOSTNAME for one node),
    each with `nics`. The ideal is the same job with every GPU in one NVLink domain at the best
    ring the server offers. What `gputopo step-time` prints, and what the sidecar can ask.

    Raises JobTimeError for a count the server cannot hold or a workload the model refuses."""
    if not gpus_per_node or any(not 1 <= g <= topology.n for g in gpus_per_node):
        raise JobTimeError(
            f"GPUs per node must be 1..{topology.n} on {topology.name}, got {list(gpus_per_node)}"
        )
    alloc = allocator if allocator is not None else Allocator(topology)

    def best(size: int) -> float:
        return best_busbw_gbps(alloc, size)

    bw = min(best(g) for g in gpus_per_node)
    if len(gpus_per_node) > 1:
        if level == HOSTNAME:
            raise JobTimeError("a job on several nodes spans more than one node's level")
        if level == ACCELERATOR:
            bw = min(bw, best(2) if topology.n >= 2 else math.inf)
        else:
            bw = min(bw, inter_busbw_gbps([(g, topology.n, nics) for g in gpus_per_node], level, table=table))
    ideal = best(max(2, max(gpus_per_node))) if topology.n >= 2 else math.inf
    return step_time(grad_bytes, compute_s, overlap, sum(gpus_per_node), bw, ideal)


def best_busbw_gbps(allocator: Allocator, size: int) -> float:
    """All-reduce busbw of the allocator's best set of `size` GPUs of its server (inf below 2):
    what a job gets inside one node when the device plugin hands it out."""
    if size < 2:
        return math.inf
    topology = allocator.topology
    chosen = allocator.choose(range(topology.n), min(size, topology.n)).indices
    return intra_busbw_gbps(topology, chosen, allocator.ring_mbps(chosen))


def validate_workload(grad_bytes: float, compute_s: float, overlap: float) -> None:
    """Refuse numbers the model cannot use (negative, infinite, overlap outside 0..1)."""
    if not (math.isfinite(grad_bytes) and 0 <= grad_bytes <= 1e15):
        raise JobTimeError(f"gradient bytes must be between 0 and 1e15, got {grad_bytes!r}")
    if not (math.isfinite(compute_s) and 0 <= compute_s <= 1e6):
        raise JobTimeError(f"compute seconds must be between 0 and 1e6, got {compute_s!r}")
    if not (math.isfinite(overlap) and 0 <= overlap <= 1):
        raise JobTimeError(f"overlap must be between 0 and 1, got {overlap!r}")
