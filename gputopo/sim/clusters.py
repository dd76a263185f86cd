"""Clusters for the simulator: named shapes (presets) and design.md §4 snapshot files.

Parsing a snapshot is gputopo.network.cluster's job (one parser for the scheduler and the simulator);
this module only turns its result into the simulator's compact SimCluster, sharing one
Topology object per distinct server model.

The presets are the cluster shapes issue 10's targets are measured on: the default 64-node
fat tree of three server kinds drawn at random, a 96-node one with seven kinds in every leaf
(which kind of server a job gets becomes a choice inside each leaf, not only between leaves),
and GB200 trays in NVL72-style NVLink domains beside HGX H100 leaves (a gang then has a level
faster than its leaf). Each builds a ClusterSnapshot through gputopo.network.cluster.parse_cluster, so
`preset_snapshot(name).to_dict()` is a snapshot file the scheduler's file mode reads as well.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from gputopo.network.cluster import ClusterSnapshot, generate_cluster, load_cluster, parse_cluster
from gputopo.network.levels import ACCELERATOR, DEFAULT_LEVELS, HOSTNAME, LEAF, SPINE
from gputopo.node.topology import Topology
from gputopo.sim.state import SimCluster, SimNode

#: Server models of the default cluster, drawn node by node.
DEFAULT_PRESETS: tuple[str, ...] = ("dgx1-v100", "hgx-h100", "pcie8-plx")


def default_cluster(
    spines: int = 2, leaves_per_spine: int = 4, nodes_per_leaf: int = 8, seed: int = 0
) -> SimCluster:
    """spines x leaves x nodes, each node drawn from DGX-1 V100, HGX H100 and PCIe-only servers
    (gputopo.network.cluster.generate_cluster, equal weights, fixed seed)."""
    return from_snapshot(generate_cluster(spines, leaves_per_spine, nodes_per_leaf, DEFAULT_PRESETS, seed))


#: The seven server kinds of `mixed-leaf`, every one in every leaf: NVSwitch (DGX A100, HGX
#: H100), hybrid cube mesh (DGX-1 V100), NVLink pairs over PCIe (A100 PCIe, L40S on 4 NUMA
#: nodes) and PCIe only (behind PLX switches, RTX 4090 across the CPU sockets).
MIXED_KINDS: tuple[str, ...] = (
    "dgx-a100",
    "hgx-h100",
    "dgx1-v100",
    "pcie8-plx",
    "a100-pcie-nvlink-pairs",
    "l40s-nv4-pairs-4numa",
    "rtx4090-8-allsys",
)
#: GB200 trays (4 GPUs each) per NVL72 NVLink domain.
NVL_TRAYS = 18


def _default_snapshot() -> ClusterSnapshot:
    return generate_cluster(2, 4, 8, DEFAULT_PRESETS, 0)


def _mixed_leaf_snapshot() -> ClusterSnapshot:
    """2 spines x 6 leaves x 8 nodes. Leaf k holds the seven kinds in an order rotated by k
    (so no kind always has the lowest node name, which decides ties) plus an eighth node of
    kind k mod 7: 14 nodes each of the first five kinds, 13 of the last two."""
    nodes: list[dict[str, Any]] = []
    for s in range(2):
        for lf in range(6):
            k = s * 6 + lf
            kinds = [*MIXED_KINDS[k % 7 :], *MIXED_KINDS[: k % 7], MIXED_KINDS[k % 7]]
            for n, kind in enumerate(kinds):
                nodes.append(_node(f"s{s}-l{lf}-n{n}", kind, leaf=f"leaf-{s}-{lf}", spine=f"spine-{s}"))
    return parse_cluster({"levels": list(DEFAULT_LEVELS), "nodes": nodes})


def _gb200_nvl_snapshot() -> ClusterSnapshot:
    """4 NVL72 racks of 18 GB200 trays (each rack one NVLink domain under its own leaf) and
    3 leaves of 8 HGX H100 nodes; spine 0 has racks 0-1 and H100 leaf 0, spine 1 the rest.
    The H100 nodes are there because a job of 8 GPUs is one 8-GPU pod (and a larger job a gang
    of them), which no 4-GPU tray can hold: without them a third of the Helios jobs could
    never run."""
    nodes: list[dict[str, Any]] = []
    for r in range(4):
        for t in range(NVL_TRAYS):
            name = f"nvl{r}-t{t:02d}"
            nodes.append(
                _node(name, "gb200-tray", leaf=f"leaf-nvl{r}", spine=f"spine-{r // 2}", nvl=f"nvl72-{r}")
            )
    for h in range(3):
        for n in range(8):
            nodes.append(
                _node(f"h100-l{h}-n{n}", "hgx-h100", leaf=f"leaf-h100-{h}", spine=f"spine-{min(h, 1)}")
            )
    return parse_cluster({"levels": list(DEFAULT_LEVELS), "nodes": nodes})


#: NVL72 racks, leaves and spines of the `nvl72` preset (issue 29 item 5).
NVL72_RACKS, NVL72_LEAVES, NVL72_SPINES = 8, 4, 2
#: HGX H100 leaves (one per spine) and nodes per leaf of the `nvl72` preset.
NVL72_HGX_LEAVES, NVL72_HGX_NODES = 2, 8


def _nvl72_snapshot() -> ClusterSnapshot:
    """8 NVL72 racks of 18 GB200 trays (each rack one NVLink domain, label `nvl72-<r>` at the
    accelerator level) two to a leaf, 4 leaves under 2 spines, and beside them one leaf of 8
    HGX H100 nodes under each spine. Unlike `gb200-nvl` (one rack per leaf) a leaf holds two
    NVLink domains, so "inside one leaf" and "inside one NVLink domain" are different
    questions: a tensor-parallel group must not straddle racks, its data-parallel replicas
    should share a leaf (docs/simulator.md "Jobs as trees on NVL72"). The HGX nodes are the
    8-GPU servers such clusters keep for jobs that do not need a rack; a tree of two 4-GPU pods
    fits one of them (its own NVLink domain)."""
    nodes: list[dict[str, Any]] = []
    per_leaf = NVL72_RACKS // NVL72_LEAVES
    leaves_per_spine = NVL72_LEAVES // NVL72_SPINES
    for r in range(NVL72_RACKS):
        leaf = r // per_leaf
        for t in range(NVL_TRAYS):
            nodes.append(
                _node(
                    f"nvl{r}-t{t:02d}",
                    "gb200-tray",
                    leaf=f"leaf-{leaf}",
                    spine=f"spine-{leaf // leaves_per_spine}",
                    nvl=f"nvl72-{r}",
                )
            )
    for h in range(NVL72_HGX_LEAVES):
        for n in range(NVL72_HGX_NODES):
            nodes.append(_node(f"h100-l{h}-n{n}", "hgx-h100", leaf=f"leaf-h100-{h}", spine=f"spine-{h}"))
    return parse_cluster({"levels": list(DEFAULT_LEVELS), "nodes": nodes})


def _node(name: str, kind: str, *, leaf: str, spine: str, nvl: str | None = None) -> dict[str, Any]:
    """One snapshot node; `nvl` is its multi-node NVLink domain (the accelerator level)."""
    labels = {HOSTNAME: name, LEAF: leaf, SPINE: spine}
    if nvl is not None:
        labels[ACCELERATOR] = nvl
    return {"name": name, "labels": labels, "gpus": kind}


#: Cluster presets by name, with the one line `gputopo simulate --help` and docs show.
CLUSTER_PRESETS: Mapping[str, tuple[Callable[[], ClusterSnapshot], str]] = MappingProxyType(
    {
        "default": (
            _default_snapshot,
            "64 nodes / 512 GPUs, 2 spines x 4 leaves x 8, DGX-1 V100 / HGX H100 / PCIe PLX drawn at random",
        ),
        "mixed-leaf": (
            _mixed_leaf_snapshot,
            "96 nodes / 768 GPUs, 2 spines x 6 leaves x 8, all 7 server kinds in every leaf",
        ),
        "gb200-nvl": (
            _gb200_nvl_snapshot,
            "96 nodes / 480 GPUs: 4 NVL72 NVLink domains of 18 GB200 trays + 3 leaves of 8 HGX H100",
        ),
        "nvl72": (
            _nvl72_snapshot,
            "160 nodes / 704 GPUs: 8 NVL72 racks of 18 GB200 trays, 2 per leaf, 4 leaves under 2 "
            "spines + 2 leaves of 8 HGX H100 (for --jobs tree)",
        ),
    }
)


#: The presets issue 10's targets are measured on (bench/bench_targets.py's matrix): every
#: preset but `nvl72`, which is the cluster of `simulate --jobs tree` (issue 29 item 5) and
#: would add a cell no target names.
TARGET_PRESETS: tuple[str, ...] = ("default", "mixed-leaf", "gb200-nvl")


def preset_snapshot(name: str) -> ClusterSnapshot:
    """The named preset as a snapshot; KeyError for an unknown name (callers list the known)."""
    return CLUSTER_PRESETS[name][0]()


def preset_cluster(name: str) -> SimCluster:
    """The named preset in the simulator's form; KeyError for an unknown name."""
    return from_snapshot(preset_snapshot(name))


def load_cluster_file(path: str) -> SimCluster:
    """A design.md §4 snapshot file, parsed by gputopo.network.cluster."""
    return from_snapshot(load_cluster(path))


def from_snapshot(snapshot: ClusterSnapshot) -> SimCluster:
    """The simulator's compact form; nodes of equal server model share one Topology.

    Raises ValueError for a node whose topology is unknown (a bare GPU count): the simulator
    measures ring bandwidth, which needs the links."""
    topologies: list[Topology] = []
    index: dict[str, int] = {}
    out: list[SimNode] = []
    for node in sorted(snapshot.nodes, key=lambda n: n.name):
        topo = node.topology
        if topo is None:
            raise ValueError(f"node {node.name}: only a GPU count is given; the simulator needs a topology")
        key = json.dumps({**topo.to_dict(), "gpus": [g.numa for g in topo.gpus]}, sort_keys=True)
        if key not in index:
            index[key] = len(topologies)
            topologies.append(topo)
        out.append(
            SimNode(name=node.name, topology=index[key], labels=dict(node.labels), allocated=node.allocated)
        )
    levels = tuple(snapshot.levels)
    if HOSTNAME not in levels:
        levels = (HOSTNAME, *levels)
    return SimCluster(topologies=tuple(topologies), nodes=tuple(out), levels=levels)
