"""The view builder's common-case path (no own binds, reservations or ended pods) must give the
views and offers the general path gives: property-tested against `node_view` / `offered`, the
general functions, on random annotations, bound-pod counts and policies. Sets are compared
exactly under deterministic policies; the baselines break ties at random (standing in for
kubelet's map order), so under them the builder may draw another of the equally good sets
and only the counts and the policy object must agree."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gputopo.network.annotation import NodeTopology
from gputopo.node.policy import POLICY_NAMES
from gputopo.node.topofile import load_preset
from scheduler.model import NodeInfo, Snapshot
from scheduler.picture.views import ViewBuilder, node_view, offered

TOPOLOGIES = {name: load_preset(name) for name in ("dgx-a100", "dgx1-v100", "pcie8-plx", "rtx8000-4")}
POLICIES = POLICY_NAMES
DETERMINISTIC = ("gputopo",)


@st.composite
def nodes(draw: st.DrawFn, name: str) -> tuple[NodeInfo, int]:
    if draw(st.booleans()) and draw(st.booleans()):  # unknown topology: a GPU count only
        return NodeInfo(name, {}, draw(st.integers(0, 16)), None, "no annotation"), draw(st.integers(0, 20))
    kind = draw(st.sampled_from(sorted(TOPOLOGIES)))
    topo = TOPOLOGIES[kind]
    gpus = st.frozensets(st.integers(0, topo.n - 1))
    published = NodeTopology(
        name, topo, draw(gpus), draw(gpus), 100.0, "test", draw(st.sampled_from(POLICIES))
    )
    info = NodeInfo(name, {"zone": "a"}, topo.n, published, pods_know_allocations=draw(st.booleans()))
    return info, draw(st.integers(0, topo.n + 2))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(nodes("a"), nodes("b"), nodes("c")), min_size=1, max_size=4))
def test_the_common_case_views_match_the_general_functions(rounds: list) -> None:
    builder = ViewBuilder()
    for drawn in rounds:  # successive snapshots: changed nodes rebuilt, the same ones reused
        infos = {info.name: info for info, _ in drawn}
        pod_gpus = {info.name: count for info, count in drawn}
        views = builder.build(Snapshot(infos, {}, {}, 1, pod_gpus), {}, 0, {}, 0)
        for info, count in drawn:
            alloc = None
            if info.topology is not None:
                alloc = builder.policies.get(info.topology.policy, info.topology.topology)
            want = node_view(info, alloc, count, (), ())
            got = views[info.name]
            assert (got.name, got.gpu_count, len(got.free), got.allocator) == (
                want.name,
                want.gpu_count,
                len(want.free),
                want.allocator,
            )
            offer = frozenset(offered(info, alloc, count, ()))
            if info.topology is None or info.topology.policy in DETERMINISTIC:
                assert got.free == want.free
                assert builder.offered.get(info.name, frozenset()) == offer
        assert builder.conflicts == {}
