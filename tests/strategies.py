"""Hypothesis strategies for random but realistic node topologies."""

from __future__ import annotations

from hypothesis import strategies as st

from gputopo.node.topology import Topology, make_topology

_PCIE_SAME_NUMA = ("PIX", "PXB", "PHB", "NODE")


@st.composite
def topologies(draw: st.DrawFn, min_gpus: int = 1, max_gpus: int = 8) -> Topology:
    """GPUs split over NUMA nodes; PCIe levels inside a NUMA node, SYS across; random NVLink
    bonds (possibly everywhere, like an NVSwitch box)."""
    n = draw(st.integers(min_gpus, max_gpus))
    numa_nodes = draw(st.integers(1, min(4, n)))
    numa = sorted(draw(st.lists(st.integers(0, numa_nodes - 1), min_size=n, max_size=n)))
    codes = [["X"] * n for _ in range(n)]
    nvswitch = draw(st.booleans()) and n > 1
    switch_links = draw(st.integers(1, 18))
    for i in range(n):
        for j in range(i + 1, n):
            if nvswitch:
                code = f"NV{switch_links}"
            elif draw(st.integers(0, 3)) == 0:
                code = f"NV{draw(st.integers(1, 4))}"
            elif numa[i] == numa[j]:
                code = draw(st.sampled_from(_PCIE_SAME_NUMA))
            else:
                code = "SYS"
            codes[i][j] = codes[j][i] = code
    return make_topology(codes, name="random", numa=numa, nvswitch=nvswitch)


@st.composite
def requests(draw: st.DrawFn, topology: Topology) -> tuple[tuple[int, ...], int, tuple[int, ...]]:
    """(free, size, must) valid for the topology."""
    n = topology.n
    free = tuple(sorted(draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n))))
    size = draw(st.integers(1, len(free)))
    must_count = draw(st.integers(0, min(size, 2)))
    must = tuple(sorted(draw(st.permutations(free))[:must_count]))
    return free, size, must
