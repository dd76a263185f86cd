"""Clusters for the simulator: the embedded default and design.md §4 snapshot files.

Parsing a snapshot is gputopo.cluster's job (one parser for the scheduler and the simulator);
this module only turns its result into the simulator's compact SimCluster, sharing one
Topology object per distinct server model.
"""

from __future__ import annotations

import json

from gputopo.cluster import ClusterSnapshot, generate_cluster, load_cluster
from gputopo.network import HOSTNAME
from gputopo.sim.state import SimCluster, SimNode
from gputopo.topology import Topology

#: Server models of the default cluster, drawn node by node.
DEFAULT_PRESETS: tuple[str, ...] = ("dgx1-v100", "hgx-h100", "pcie8-plx")


def default_cluster(
    spines: int = 2, leaves_per_spine: int = 4, nodes_per_leaf: int = 8, seed: int = 0
) -> SimCluster:
    """spines x leaves x nodes, each node drawn from DGX-1 V100, HGX H100 and PCIe-only servers
    (gputopo.cluster.generate_cluster, equal weights, fixed seed)."""
    return from_snapshot(generate_cluster(spines, leaves_per_spine, nodes_per_leaf, DEFAULT_PRESETS, seed))


def load_cluster_file(path: str) -> SimCluster:
    """A design.md §4 snapshot file, parsed by gputopo.cluster."""
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
