"""Hand-checked gang plans: each test is a small cluster whose right answer is argued in it."""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache

import pytest

from gputopo.gang.memo import PlanMemo
from gputopo.gang.planner import GangPlan, GangSpec, Member, NoPlan, plan_gang
from gputopo.network.cluster import generate_cluster
from gputopo.network.levels import CLUSTER, DEFAULT_LEVELS, HOSTNAME, LEAF, SPINE, NetworkIndex
from gputopo.network.nodeview import NodeView
from gputopo.node.allocator import Allocator
from gputopo.node.topofile import load_preset
from gputopo.pod.placement import NEUTRAL_SCORE, node_scores, place_pod

LEVELS = (HOSTNAME, LEAF, SPINE)


@cache
def alloc(preset: str) -> Allocator:
    return Allocator(load_preset(preset))


def node(
    name: str,
    leaf: str | None = None,
    spine: str | None = None,
    *,
    preset: str | None = "dgx-a100",
    gpus: int = 8,
    busy: Iterable[int] = (),
) -> NodeView:
    labels = {}
    if leaf:
        labels[LEAF] = leaf
    if spine:
        labels[SPINE] = spine
    a = alloc(preset) if preset else None
    n = a.n if a else gpus
    busy = set(busy)
    return NodeView(name, labels, n, frozenset(i for i in range(n) if i not in busy), a)


def gang(count: int, gpus: int, **kw: str) -> GangSpec:
    return GangSpec("ml/g", tuple(Member(f"ml/w{i}", gpus) for i in range(count)), **kw)


def plan(spec: GangSpec, nodes: list[NodeView], levels: tuple[str, ...] = LEVELS) -> GangPlan:
    out = plan_gang(spec, nodes, levels)
    assert isinstance(out, GangPlan), out
    check_plan(spec, nodes, out)
    return out


def check_plan(spec: GangSpec, nodes: list[NodeView], out: GangPlan) -> None:
    """Every member once, in spec order; GPU sets the node allocator's, disjoint, free.

    Members sharing a node choose one after the other, biggest first (then spec order)."""
    by_name = {n.name: n for n in nodes}
    assert [p.pod for p in out.placements] == [m.pod for m in spec.members]
    taken: dict[str, set[int]] = {}
    order = sorted(range(len(spec.members)), key=lambda i: (-spec.members[i].gpus, i))
    for i in order:
        m, p = spec.members[i], out.placements[i]
        v = by_name[p.node]
        if v.allocator is None:
            assert p.gpus == () and p.choice is None
            continue
        assert len(p.gpus) == m.gpus
        used = taken.setdefault(p.node, set())
        assert not used & set(p.gpus), "GPU promised twice"
        assert set(p.gpus) <= v.free
        assert p.choice == v.allocator.choose(sorted(v.free - used), m.gpus)
        used |= set(p.gpus)
    per_node: dict[str, int] = {}
    for m, p in zip(spec.members, out.placements, strict=True):
        per_node[p.node] = per_node.get(p.node, 0) + m.gpus
    assert all(per_node[n] <= len(by_name[n].free) for n in per_node)
    assert out.nodes_used == len(per_node)


# --------------------------------------------------------------------------- objective (1)


def test_two_members_share_one_node_at_the_hostname_level() -> None:
    nodes = [node("a", "l1"), node("b", "l1")]
    out = plan(gang(2, 4), nodes)
    assert (out.level, out.nodes_used) == (HOSTNAME, 1)
    assert out.placements[0].node == out.placements[1].node
    assert set(out.placements[0].gpus) | set(out.placements[1].gpus) == set(range(8))


def test_smallest_level_that_holds_the_gang() -> None:
    # 3 x 8 GPUs: leaf l1 has only two empty nodes, l2 has three, so the answer is l2.
    nodes = [
        node("a1", "l1", "s1"),
        node("a2", "l1", "s1"),
        node("a3", "l1", "s1", busy=[0]),
        node("b1", "l2", "s1"),
        node("b2", "l2", "s1"),
        node("b3", "l2", "s1"),
    ]
    out = plan(gang(3, 8), nodes)
    assert (out.level, out.domain, out.nodes_used) == (LEAF, "l2", 3)


def test_spine_when_no_leaf_is_big_enough() -> None:
    nodes = [
        node("a1", "l1", "s1"),
        node("a2", "l1", "s1"),
        node("b1", "l2", "s1"),
        node("c1", "l3", "s2"),
        node("c2", "l3", "s2"),
    ]
    out = plan(gang(3, 8), nodes)
    assert (out.level, out.domain) == (SPINE, "s1")


# --------------------------------------------------------------------------- objective (2)


def test_fewest_nodes_beats_best_fit() -> None:
    # 3 x 4 GPUs. l1 (12 free, fuller) needs 3 nodes; l2 (16 free) needs only 2: (2) before (4).
    nodes = [
        node("a1", "l1", busy=range(4)),
        node("a2", "l1", busy=range(4)),
        node("a3", "l1", busy=range(4)),
        node("b1", "l2"),
        node("b2", "l2", busy=range(4)),
        node("b3", "l2", busy=range(4)),
    ]
    out = plan(gang(3, 4), nodes)
    assert (out.level, out.domain, out.nodes_used) == (LEAF, "l2", 2)
    assert sorted(p.node for p in out.placements).count("b1") == 2


# --------------------------------------------------------------------------- objective (3)


def test_better_gpu_sets_beat_best_fit() -> None:
    # 2 x 8. l1: NVSwitch boxes (300 GB/s rings); l2: PCIe boxes, fuller (best fit would pick it).
    nodes = [
        node("a1", "l1"),
        node("a2", "l1"),
        node("a3", "l1"),
        node("b1", "l2", preset="pcie8-plx"),
        node("b2", "l2", preset="pcie8-plx"),
    ]
    out = plan(gang(2, 8), nodes)
    assert out.domain == "l1"
    assert out.worst[0] == alloc("dgx-a100").best_ring_mbps(8)


def test_within_a_domain_the_worst_member_decides_which_nodes() -> None:
    # Two of the three nodes are needed; the PCIe box would be the worst member, so it is left out
    # even though its name sorts first and it is the fullest.
    nodes = [node("a0", "l1", preset="pcie8-plx"), node("a1", "l1"), node("a2", "l1")]
    out = plan(gang(2, 8), nodes)
    assert sorted(p.node for p in out.placements) == ["a1", "a2"]


def test_threshold_search_skips_a_roomy_node_that_would_be_the_worst_member() -> None:
    # 3 x 4 GPUs need 2 nodes. Filling by room alone takes a (2 members) and the PCIe box b
    # (room for 2, sorts before c); c has room for only 1 but an NVSwitch set, so a + c is better.
    nodes = [node("a", "l1"), node("b", "l1", preset="pcie8-plx"), node("c", "l1", busy=range(4))]
    out = plan(gang(3, 4), nodes)
    assert out.nodes_used == 2
    assert sorted(p.node for p in out.placements) == ["a", "a", "c"]
    assert out.worst[0] == alloc("dgx-a100").best_ring_mbps(4)


# --------------------------------------------------------------------------- objective (4), (5)


def test_best_fit_keeps_the_large_empty_leaf_whole() -> None:
    nodes = [
        node("a1", "l1"),
        node("a2", "l1"),
        node("a3", "l1", busy=range(4)),
        node("b1", "l2"),
        node("b2", "l2"),
        node("b3", "l2"),
        node("b4", "l2"),
    ]
    out = plan(gang(2, 8), nodes)
    assert out.domain == "l1" and out.domain_free == 20
    assert {p.node for p in out.placements} == {"a1", "a2"}


def test_name_order_breaks_full_ties() -> None:
    nodes = [node("b1", "l2"), node("b2", "l2"), node("a1", "l1"), node("a2", "l1")]
    assert plan(gang(2, 8), nodes).domain == "l1"
    assert [p.node for p in plan(gang(1, 8), nodes).placements] == ["a1"]


def test_best_fit_between_nodes_inside_a_domain() -> None:
    # One 4-GPU member fits on both; the node with 4 free is used, the empty one stays whole.
    nodes = [node("a1", "l1"), node("a2", "l1", busy=range(4, 8))]
    out = plan(gang(1, 4), nodes)
    assert out.placements[0].node == "a2"


# --------------------------------------------------------------------------- constraints


def test_required_level_gives_a_readable_reason() -> None:
    nodes = [node("a1", "l1"), node("a2", "l1", busy=range(4)), node("b1", "l2"), node("b2", "l2", busy=[0])]
    out = plan_gang(gang(2, 8, required_level=LEAF), nodes, LEVELS)
    assert isinstance(out, NoPlan)
    assert out.reason.startswith("no leaf domain can hold gang ml/g (2 pods x 8 GPUs = 16 GPUs)")
    assert "best network.topology.nvidia.com/leaf=l2 has 15 free GPUs, room for 1 of the 2 pods" in out.reason


def test_required_level_never_falls_back_but_preferred_does() -> None:
    nodes = [node("a1", "l1", "s1"), node("b1", "l2", "s1")]
    assert isinstance(plan_gang(gang(2, 8, required_level=LEAF), nodes, LEVELS), NoPlan)
    out = plan(gang(2, 8, preferred_level=LEAF), nodes)
    assert (out.level, out.domain) == (SPINE, "s1")


def test_required_level_holds_even_when_one_node_would_do() -> None:
    nodes = [node("a1", "l1"), node("a2", "l1"), node("b1", "l2")]
    out = plan(gang(2, 4, required_level=LEAF), nodes)
    assert (out.level, out.domain, out.nodes_used) == (LEAF, "l2", 1)  # best fit among leaves


def test_preferred_falls_back_to_the_whole_cluster() -> None:
    nodes = [node("a1", "l1", "s1"), node("b1", "l2", "s2")]
    out = plan(gang(2, 8, preferred_level=LEAF), nodes)
    assert (out.level, out.domain, out.nodes_used) == (CLUSTER, CLUSTER, 2)


def test_nothing_fits_anywhere() -> None:
    nodes = [node("a1", "l1", busy=[0]), node("b1", "l2", busy=[0])]
    out = plan_gang(gang(2, 8), nodes, LEVELS)
    assert isinstance(out, NoPlan)
    assert out.reason == (
        "the whole cluster cannot hold gang ml/g (2 pods x 8 GPUs = 16 GPUs): "
        "14 free GPUs, room for 0 of the 2 pods"
    )


def test_fragmented_mixed_sizes_say_so() -> None:
    # 2 x 3 GPUs + 1 x 2 on nodes with 4 + 4 free: 8 GPUs and enough 3-slots in aggregate, but no
    # packing exists (3+3 do not share a node, and the 2 has no room left).
    nodes = [node("a1", "l1", preset=None, gpus=4), node("a2", "l1", preset=None, gpus=4)]
    spec = GangSpec("ml/g", (Member("ml/a", 3), Member("ml/b", 3), Member("ml/c", 2)), required_level=LEAF)
    out = plan_gang(spec, nodes, LEVELS)
    assert isinstance(out, NoPlan) and "too fragmented" in out.reason


@pytest.mark.parametrize(
    ("spec", "text"),
    [
        (GangSpec("ml/g", ()), "no pending members"),
        (GangSpec("ml/g", (Member("ml/a", 0),)), "asks for 0 GPUs"),
        (GangSpec("ml/g", (Member("ml/a", 1), Member("ml/a", 1))), "listed twice"),
        (GangSpec("ml/g", (Member("ml/a", 9),)), "asks for 9 GPUs; the largest node has 8"),
        (gang(1, 1, required_level="example.com/rack"), "required topology 'example.com/rack' is not one"),
        (gang(1, 1, preferred_level="example.com/rack"), "preferred topology 'example.com/rack' is not one"),
    ],
)
def test_bad_gangs_get_a_reason_not_an_exception(spec: GangSpec, text: str) -> None:
    out = plan_gang(spec, [node("a1", "l1")], LEVELS)
    assert isinstance(out, NoPlan) and text in out.reason


def test_caller_mistakes_raise() -> None:
    nodes = [node("a1", "l1")]
    with pytest.raises(ValueError, match="not a valid node-label key"):
        plan_gang(gang(1, 1), nodes, ["not a key"])
    other = NetworkIndex.build([("a1", {})], DEFAULT_LEVELS)
    with pytest.raises(ValueError, match="built for levels"):
        plan_gang(gang(1, 1), nodes, LEVELS, index=other)
    small = NetworkIndex.build([("zz", {})], LEVELS)
    with pytest.raises(ValueError, match="not in the network index"):
        plan_gang(gang(1, 1), nodes, LEVELS, index=small)


# --------------------------------------------------------------------------- unknown topology


def test_unknown_topology_nodes_hold_gangs_without_gpu_sets() -> None:
    nodes = [node("u1", "l1", preset=None), node("u2", "l1", preset=None, busy=range(5))]
    out = plan(gang(3, 3), nodes)
    assert out.nodes_used == 2
    assert sorted(p.node for p in out.placements) == ["u1", "u1", "u2"]
    assert all(p.gpus == () and p.choice is None for p in out.placements)


def test_measured_topology_ranks_above_unknown_on_ties() -> None:
    # Same node count either way; the unknown leaf is fuller (best fit) but (3) prefers evidence.
    nodes = [
        node("a1", "l1"),
        node("a2", "l1"),
        node("a3", "l1"),
        node("u1", "l2", preset=None),
        node("u2", "l2", preset=None),
    ]
    assert plan(gang(2, 8), nodes).domain == "l1"


def test_mixed_known_and_unknown_nodes_in_one_domain() -> None:
    nodes = [node("a1", "l1"), node("u1", "l1", preset=None)]
    out = plan(gang(2, 8), nodes)
    by_node = {p.node: p for p in out.placements}
    assert by_node["a1"].gpus == tuple(range(8)) and by_node["u1"].gpus == ()


# --------------------------------------------------------------------------- mixed sizes


def test_mixed_sizes_pack_biggest_first_onto_the_roomiest_nodes() -> None:
    nodes = [node("a1", "l1"), node("a2", "l1", busy=range(4)), node("a3", "l1", busy=range(6))]
    spec = GangSpec("ml/g", (Member("ml/s", 2), Member("ml/b", 8), Member("ml/m", 4)))
    out = plan(spec, nodes)
    where = {p.pod: p.node for p in out.placements}
    assert where == {"ml/b": "a1", "ml/m": "a2", "ml/s": "a3"}
    assert out.nodes_used == 3


# --------------------------------------------------------------------------- pruning is exact


@pytest.mark.parametrize(("count", "gpus"), [(1, 1), (3, 2), (5, 4), (12, 8), (40, 8)])
def test_pruned_and_unpruned_planning_agree(count: int, gpus: int) -> None:
    c = generate_cluster(3, 4, 5, {"dgx-a100": 2, "pcie8-plx": 1, "rtx8000-4": 1}, seed=7, busy_fraction=0.5)
    views = list(c.node_views())
    spec = gang(count, gpus)
    fast = plan_gang(spec, views, c.levels, index=c.index)
    slow = plan_gang(spec, views, c.levels, prune=False)
    assert fast == slow
    if isinstance(fast, GangPlan):
        check_plan(spec, views, fast)


@pytest.mark.parametrize("sizes", [(2, 8, 8), (1, 2, 4, 8, 8, 8), (3, 3, 2)])
def test_pruned_and_unpruned_planning_agree_for_mixed_sizes(sizes: tuple[int, ...]) -> None:
    c = generate_cluster(3, 4, 5, {"dgx-a100": 2, "pcie8-plx": 1, "rtx8000-4": 1}, seed=9, busy_fraction=0.6)
    views = list(c.node_views())
    spec = GangSpec("ml/g", tuple(Member(f"ml/w{i}", g) for i, g in enumerate(sizes)))
    fast = plan_gang(spec, views, c.levels, index=c.index)
    assert fast == plan_gang(spec, views, c.levels, prune=False)
    assert isinstance(fast, GangPlan)
    check_plan(spec, views, fast)


def test_a_plain_set_of_free_gpus_is_accepted() -> None:
    v = NodeView("a1", {LEAF: "l1"}, 8, {0, 1, 2, 3}, alloc("dgx-a100"))  # type: ignore[arg-type]
    assert isinstance(v.free, frozenset)
    assert isinstance(plan_gang(gang(2, 2), [v], LEVELS), GangPlan)


def test_memo_is_reused_across_calls() -> None:
    c = generate_cluster(2, 2, 4, seed=1, busy_fraction=0.5)
    views = list(c.node_views())
    memo = PlanMemo()
    first = plan_gang(gang(4, 2), views, c.levels, memo=memo)
    size = len(memo)
    assert size > 0
    assert plan_gang(gang(4, 2), views, c.levels, memo=memo) == first
    assert len(memo) == size


# --------------------------------------------------------------------------- single pods


def test_node_scores_order_and_scale() -> None:
    nodes = [
        node("nv-empty", "l1"),  # NVSwitch, 8 free
        node("nv-tight", "l1", busy=range(2, 8)),  # NVSwitch, exactly 2 free: best fit
        node("pcie", "l1", preset="pcie8-plx"),  # PCIe only: worst ring
        node("full", "l1", busy=range(7)),  # 1 free: cannot fit 2
        node("unknown", "l1", preset=None),
    ]
    scores = node_scores(2, nodes)
    assert scores == {
        "nv-tight": 10,
        "nv-empty": scores["nv-empty"],
        "pcie": 1,
        "full": 0,
        "unknown": NEUTRAL_SCORE,
    }
    assert 1 < scores["nv-empty"] < 10
    assert node_scores(2, [node("x", "l1"), node("y", "l1")]) == {"x": 10, "y": 10}
    with pytest.raises(ValueError, match="at least 1 GPU"):
        node_scores(0, nodes)


def test_place_pod_prefers_ring_then_best_fit_then_name() -> None:
    nodes = [
        node("pcie", "l1", preset="pcie8-plx", busy=range(6)),
        node("nv-b", "l1"),
        node("nv-a", "l1"),
        node("u", "l1", preset=None, busy=range(6)),
    ]
    got = place_pod("ml/p", 2, nodes)
    assert got is not None and got.node == "nv-a" and len(got.gpus) == 2
    assert place_pod("ml/p", 2, [nodes[3]]) == place_pod("ml/p", 2, [nodes[3]])
    unknown = place_pod("ml/p", 2, [nodes[3]])
    assert unknown is not None and unknown.node == "u" and unknown.gpus == ()
    assert place_pod("ml/p", 9, nodes) is None
    with pytest.raises(ValueError):
        place_pod("ml/p", -1, nodes)
