"""Reading a node back from its DRA slices (gputopo/network/draview.py): what gputopo's publisher writes
is read as the same Topology, health and device map, for every preset and any unhealthy GPUs."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gputopo.network.draview import gpus_in_use, read_pool
from gputopo.node.allocator import AllocatorPool
from gputopo.node.draslices import build_slices, check_limits
from gputopo.node.topofile import load_preset

#: one exact allocator per preset for every example (a 16-GPU table takes seconds to build)
POOL = AllocatorPool()

PRESETS = ("dgx1-v100", "dgx-a100", "hgx-h100", "dgx2-v100", "pcie8-plx", "l40s-nv4-pairs-4numa", "rtx8000-4")


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(PRESETS), st.data())
def test_published_slices_read_back_as_the_node(preset: str, data: st.DataObject) -> None:
    topo = load_preset(preset)
    n = topo.n
    unhealthy = data.draw(st.sets(st.integers(0, n - 1), max_size=n - 1))
    healthy = [i for i in range(n) if i not in unhealthy]
    slices = build_slices(topo, POOL.get(topo), "node-a", healthy=healthy, free=healthy)
    assert check_limits(slices) == []  # the link attributes keep every device within 32
    view = read_pool("node-a", "gputopo.io", slices)
    assert view.unhealthy == unhealthy
    assert view.topology.n == n
    for i in healthy:
        assert view.topology.gpus[i].uuid == topo.gpus[i].uuid
        for j in range(n):
            if j != i:
                assert view.topology.code(i, j) == topo.code(i, j)
                assert view.topology.bandwidth_mbps[i, j] == topo.bandwidth_mbps[i, j]
    for name, gpus in view.devices.items():
        assert gpus_in_use(view, [name]) == set(gpus)
        assert all(0 <= i < n for i in gpus)
