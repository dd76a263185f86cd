"""Tie-break (3b): a gang that needs a large domain spans as few of its sub-domains as it can.

Hand-checked cases first, then a brute-force check on tiny fat trees (levels hostname, leaf,
spine; every leaf inside one spine). The brute force lists every assignment of members to
nodes, keeps those with the planner's (level, nodes used, worst member) — the plans that tie
on objectives (1) to (3) — and counts the spines and leaves each touches. What the planner
promises (docs/gang.md):

* when every node that can take a member at the plan's worst quality takes the same number
  (always so for whole-node members), the first level below the plan's level is touched the
  fewest times possible, across all domains of the plan's level; at the cluster level, the
  leaves are then the fewest possible inside the spines chosen;
* otherwise the count is a heuristic, but no touched sub-domain can be left out: every plan
  that ties on (1) to (3) inside the same domain needs at least one node of each.
"""

from __future__ import annotations

from functools import cache
from itertools import combinations_with_replacement

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gputopo.gang.planner import GangPlan, GangSpec, Member, plan_gang
from gputopo.network.levels import CLUSTER, HOSTNAME, LEAF, SPINE
from gputopo.network.nodeview import NodeView, Quality
from gputopo.node.allocator import Allocator
from gputopo.node.topofile import load_preset
from tests.test_gang import check_plan, gang, node, plan
from tests.test_gang_oracle import domain, worst_member

LEVELS = (HOSTNAME, LEAF, SPINE)
SPINE_OF = {"l1": "s1", "l2": "s1", "l3": "s1", "l4": "s2", "l5": "s2", "l6": "s2"}


@cache
def alloc(preset: str) -> Allocator:
    return Allocator(load_preset(preset))


def leaves(out: GangPlan, nodes: list[NodeView]) -> set[str]:
    by_name = {v.name: v for v in nodes}
    return {domain(by_name[p.node], LEAF) for p in out.placements}


def spines(out: GangPlan, nodes: list[NodeView]) -> set[str]:
    by_name = {v.name: v for v in nodes}
    return {domain(by_name[p.node], SPINE) for p in out.placements}


# --------------------------------------------------------------------------- hand-checked


def test_across_spines_the_gang_uses_the_fewest_leaves() -> None:
    # 6 x 8 GPUs; each spine has 4 empty nodes, so only the whole cluster holds the gang, and
    # it must touch both spines. Empty nodes per leaf: l1 3, l2 1, l3 2, l4 2. Name order
    # interleaves the leaves: the old choice (n1..n6) touched l4, l1, l3, l2: 4 leaves.
    # Fewest leaves is 3: l1 (the largest) + one 2-node leaf + the 1-node leaf. Largest first
    # takes l1 and l3 (5 nodes, l3 before l4 by name), and the tightest leaf that completes
    # the gang is l2 (1 node), not l4: l4 stays whole for the next 2-node gang.
    nodes = [
        node("n1", "l4", "s2"),
        node("n2", "l1", "s1"),
        node("n3", "l3", "s2"),
        node("n4", "l2", "s1"),
        node("n5", "l1", "s1"),
        node("n6", "l4", "s2"),
        node("n7", "l3", "s2"),
        node("n8", "l1", "s1"),
        node("n9", "l2", "s1", busy=[0]),  # 7 free: no room for an 8-GPU member
    ]
    out = plan(gang(6, 8), nodes)
    assert (out.level, out.nodes_used) == (CLUSTER, 6)
    assert sorted(p.node for p in out.placements) == ["n2", "n3", "n4", "n5", "n7", "n8"]
    assert leaves(out, nodes) == {"l1", "l2", "l3"}
    assert out.spans == (2, 3)


def test_inside_a_spine_the_last_leaf_is_the_tightest_fit() -> None:
    # 5 x 8 GPUs in spine s1 (no leaf holds 5). l1 has 4 empty nodes, l2 2, l3 1. Two leaves
    # are needed: l1 and then the tightest that completes, l3, so l2 stays whole.
    nodes = [
        *(node(f"a{i}", "l1", "s1") for i in range(4)),
        node("b0", "l2", "s1"),
        node("b1", "l2", "s1"),
        node("c0", "l3", "s1"),
    ]
    out = plan(gang(5, 8), nodes)
    assert (out.level, out.domain, out.spans) == (SPINE, "s1", (2,))
    assert leaves(out, nodes) == {"l1", "l3"}


def test_fewer_leaves_beat_best_fit_between_spines() -> None:
    # 4 x 8 GPUs, no leaf holds 4. s1 is fuller (best fit (4) alone would pick it) but its
    # empty nodes sit 2 + 1 + 1 in three leaves; s2 has them 2 + 2: (3b) comes before (4).
    nodes = [
        node("a1", "l1", "s1"),
        node("a2", "l1", "s1"),
        node("b1", "l2", "s1"),
        node("c1", "l3", "s1"),
        node("d1", "l4", "s2"),
        node("d2", "l4", "s2"),
        node("e1", "l5", "s2"),
        node("e2", "l5", "s2"),
        node("e3", "l5", "s2", busy=range(4)),
    ]
    out = plan(gang(4, 8), nodes)
    assert (out.level, out.domain, out.spans) == (SPINE, "s2", (2,))


def test_worst_member_still_comes_before_fewer_leaves() -> None:
    # 3 x 8 GPUs; no leaf has 3 empty nodes, so spine s1. l1 holds a PCIe box and an NVSwitch
    # box, l2 and l3 one NVSwitch box each. Two leaves would do (l1 + one more) but make the
    # PCIe box the worst member: (3) comes first, so the three NVSwitch boxes, three leaves.
    nodes = [
        node("a1", "l1", "s1", preset="pcie8-plx"),
        node("a2", "l1", "s1"),
        node("b1", "l2", "s1"),
        node("c1", "l3", "s1"),
    ]
    out = plan(gang(3, 8), nodes)
    assert sorted(p.node for p in out.placements) == ["a2", "b1", "c1"]
    assert out.worst[0] == alloc("dgx-a100").best_ring_mbps(8)
    assert out.spans == (3,)


def test_mixed_known_and_unlabelled_nodes_count_as_their_own_leaves() -> None:
    # An unlabelled node is a leaf of its own: 3 x 8 across the cluster prefers the 2-node
    # leaf plus one more over three loners.
    nodes = [
        node("u1", None, "s1"),
        node("u2", None, "s1"),
        node("x1", "l3", "s2"),
        node("x2", "l3", "s2"),
        node("u3", None, "s2", busy=[0]),
    ]
    out = plan(gang(3, 8, preferred_level=LEAF), nodes)
    assert out.level == CLUSTER
    assert {"x1", "x2"} <= {p.node for p in out.placements}
    assert out.spans == (2, 2)


# --------------------------------------------------------------------------- brute force

PRESETS = ("dgx-a100", "dgx1-v100", "pcie8-plx", "rtx8000-4", None)


@st.composite
def fat_trees(draw: st.DrawFn) -> list[NodeView]:
    nodes = []
    for i in range(draw(st.integers(3, 9))):
        preset = draw(st.sampled_from(PRESETS))
        a = alloc(preset) if preset else None
        n = a.n if a else draw(st.sampled_from([4, 8]))
        free = draw(st.one_of(st.just(set(range(n))), st.sets(st.integers(0, n - 1), min_size=n // 2)))
        leaf = draw(st.sampled_from([*SPINE_OF, None]))
        labels = {LEAF: leaf, SPINE: SPINE_OF[leaf]} if leaf else {}
        if not leaf and draw(st.booleans()):
            labels[SPINE] = draw(st.sampled_from(sorted(set(SPINE_OF.values()))))
        nodes.append(NodeView(f"n{i}", labels, n, frozenset(free), a))
    return nodes


@st.composite
def gangs(draw: st.DrawFn) -> GangSpec:
    g = draw(st.sampled_from([2, 4, 8, 8]))  # mostly whole nodes: those gangs span domains
    count = draw(st.integers(2, 4))
    return GangSpec(
        "ml/g",
        tuple(Member(f"ml/w{i}", g) for i in range(count)),
        preferred_level=draw(st.sampled_from([LEAF, SPINE])),  # past one node
    )


def below(level: str, nodes: list[NodeView]) -> tuple[str, ...]:
    """The levels the planner counts for a plan at `level`, largest first: those inside it
    that group at least two nodes somewhere (elsewhere every node counts alone, like (2))."""
    inside = {CLUSTER: (SPINE, LEAF), SPINE: (LEAF,)}.get(level, ())
    return tuple(lv for lv in inside if len({domain(v, lv) for v in nodes}) < len(nodes))


def ties(spec: GangSpec, nodes: list[NodeView], out: GangPlan) -> list[tuple[int, ...]]:
    """Every assignment that ties with the plan on (1) to (3), as node indices per member
    (members are of one size, so one assignment per multiset of nodes is enough); none with
    the plan's level and node count may have a better worst member."""
    found, best = [], out.worst
    sizes = [m.gpus for m in spec.members]
    for a in combinations_with_replacement(range(len(nodes)), len(sizes)):
        if len(set(a)) != out.nodes_used or len({domain(nodes[j], out.level) for j in a}) != 1:
            continue
        if any(
            sum(g for g, k in zip(sizes, a, strict=True) if k == j) > len(v.free) for j, v in enumerate(nodes)
        ):
            continue
        worst = worst_member(spec, nodes, a)
        best = max(best, worst)
        if worst == out.worst:
            found.append(a)
    assert best == out.worst, "(3) is the best worst member"
    return found


def touched(nodes: list[NodeView], a: tuple[int, ...], level: str) -> frozenset[str]:
    return frozenset(domain(nodes[j], level) for j in a)


def offers(v: NodeView, g: int, n: int, worst: Quality) -> int:
    """Members of g GPUs the node takes one after the other, each at least `worst`."""
    if v.allocator is None:  # unknown topology: quality (), below every measured set
        return min(len(v.free) // g, n) if worst == () else 0
    free, count = set(v.free), 0
    while count < n and len(free) >= g:
        c = v.allocator.choose(sorted(free), g)
        if (c.ring_mbps, c.pair_sum_mbps) < worst:
            break
        free -= set(c.indices)
        count += 1
    return count


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=fat_trees(), spec=gangs())
def test_sub_domains_touched_against_brute_force(nodes: list[NodeView], spec: GangSpec) -> None:
    out = plan_gang(spec, nodes, LEVELS)
    if not isinstance(out, GangPlan):
        event("no plan")
        return
    check_plan(spec, nodes, out)
    lower = below(out.level, nodes)
    event(f"plan at {out.level}, counting {len(lower)} lower levels")
    mine = {p.node for p in out.placements}
    assignment = tuple(j for j, v in enumerate(nodes) if v.name in mine)
    assert out.spans == tuple(len(touched(nodes, assignment, lv)) for lv in lower)
    if not lower:
        return
    found = ties(spec, nodes, out)
    assert found, "the plan itself ties with itself"
    top = lower[0]
    mine_top = touched(nodes, assignment, top)
    g, n = spec.members[0].gpus, len(spec.members)
    counts = {offers(v, g, n, out.worst) for v in nodes} - {0}
    event("equal offers: exact" if len(counts) == 1 else "unequal offers: irredundant only")
    if len(counts) == 1:
        assert out.spans[0] == min(len(touched(nodes, a, top)) for a in found)
        if len(lower) > 1:
            inside = [a for a in found if touched(nodes, a, top) <= mine_top]
            assert out.spans[1] == min(len(touched(nodes, a, lower[1])) for a in inside)
    same_domain = [a for a in found if domain(nodes[a[0]], out.level) == out.domain]
    for d in mine_top:
        assert not any(touched(nodes, a, top) <= mine_top - {d} for a in same_domain), d
