"""Pair points of the allocators people run today (go-gpuallocator, copied by HAMi).

Those allocators never look at bandwidth; they add up points per link entry of a pair: one
entry for the PCIe path (10/20/30/40/50/60 for SYS/NODE/PHB/PXB/PIX/same board) plus 100 per
NVLink. Reproducing their scale is what lets the simulator show where it misleads them.

A topology file stores only the `topo -m` code per pair, and `NV#` hides the PCIe level
beneath. When `Link.pcie` is known it is used; otherwise it is inferred: GPUs on the same NUMA
node score as PHB (one host bridge), GPUs on different NUMA nodes (or unknown NUMA) as SYS.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import numpy as np

from gputopo.node.links import Link
from gputopo.node.topology import Topology

#: Points of one PCIe link entry (node-anchors.md §2.2).
PCIE_POINTS: Mapping[str, int] = MappingProxyType(
    {"SYS": 10, "NODE": 20, "PHB": 30, "PXB": 40, "PIX": 50, "BOARD": 60}
)
#: Points per bonded NVLink.
NVLINK_POINTS = 100


def pcie_level(topology: Topology, i: int, j: int) -> str:
    """The PCIe level under a pair, inferred from NUMA when `topo -m` printed NV# instead."""
    link = topology.links[i][j]
    assert link is not None
    if link.pcie is not None:
        return link.pcie
    ni, nj = topology.gpus[i].numa, topology.gpus[j].numa
    return "PHB" if ni is not None and ni == nj else "SYS"


def pair_points(topology: Topology, *, nvswitch_visible: bool) -> np.ndarray:
    """n x n int matrix of pair points, 0 on the diagonal.

    `nvswitch_visible=False` models go-gpuallocator's NVML discovery, which counts an NVLink
    only when its remote end is the peer GPU: behind NVSwitches every remote end is a switch,
    so such nodes look PCIe-only. HAMi v2.10 counts switch links (`nvswitch_visible=True`)."""
    n = topology.n
    out = np.zeros((n, n), dtype=np.int64)
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            link: Link | None = topology.links[i][j]
            assert link is not None
            points = PCIE_POINTS[pcie_level(topology, i, j)]
            if link.nvlinks and (nvswitch_visible or not topology.nvswitch):
                points += NVLINK_POINTS * link.nvlinks
            out[i, j] = points
    out.setflags(write=False)
    return out
