"""The planner against a brute-force oracle of the gang objective on tiny clusters.

The oracle tries every assignment of members to nodes (at most 6^4), keeps those whose nodes
share one domain of a level, and applies the objective literally: smallest level, fewest
nodes, best worst member (members on a node choose one after the other, biggest first, with
the node allocator), fewest free GPUs in the domain, domain name. For equal member sizes the
planner is exact, so every part of its answer must match; for mixed sizes it packs
with an exact search (small gangs), so level and node count must match, and its worst member
(not searched over packings) can only be as good as the oracle's.
"""

from __future__ import annotations

from functools import cache
from itertools import product

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gputopo.gang.planner import GangPlan, GangSpec, Member, NoPlan, plan_gang
from gputopo.network.levels import CLUSTER, HOSTNAME, LEAF
from gputopo.network.nodeview import NodeView, Quality
from gputopo.node.allocator import Allocator
from gputopo.node.topofile import load_preset
from tests.test_gang import check_plan

LEVELS = (HOSTNAME, LEAF)
PRESETS = ("dgx-a100", "dgx1-v100", "pcie8-plx", "rtx8000-4", None)


@cache
def alloc(preset: str) -> Allocator:
    return Allocator(load_preset(preset))


@st.composite
def clusters(draw: st.DrawFn) -> list[NodeView]:
    nodes = []
    for i in range(draw(st.integers(1, 6))):
        preset = draw(st.sampled_from(PRESETS))
        a = alloc(preset) if preset else None
        n = a.n if a else draw(st.sampled_from([4, 8]))
        free = draw(st.sets(st.integers(0, n - 1)))
        leaf = draw(st.sampled_from(["l1", "l2", "l3", None]))
        nodes.append(NodeView(f"n{i}", {LEAF: leaf} if leaf else {}, n, frozenset(free), a))
    return nodes


@st.composite
def gangs(draw: st.DrawFn, equal: bool) -> GangSpec:
    count = draw(st.integers(1, 4))
    if equal:
        sizes = [draw(st.sampled_from([1, 2, 3, 4, 8]))] * count
    else:
        sizes = draw(st.lists(st.sampled_from([1, 2, 3, 4, 8]), min_size=count, max_size=count))
    kind, level = draw(
        st.sampled_from([(None, None), ("required", LEAF), ("preferred", LEAF), ("required", HOSTNAME)])
    )
    return GangSpec(
        "ml/g",
        tuple(Member(f"ml/w{i}", g) for i, g in enumerate(sizes)),
        required_level=level if kind == "required" else None,
        preferred_level=level if kind == "preferred" else None,
    )


def domain(v: NodeView, level: str) -> str:
    if level == CLUSTER:
        return CLUSTER
    if level == HOSTNAME:
        return v.name
    return v.labels.get(level) or f"node/{v.name}"


def worst_member(spec: GangSpec, nodes: list[NodeView], assign: tuple[int, ...]) -> Quality:
    worst: Quality | None = None
    for k, v in enumerate(nodes):
        members = sorted(
            (i for i, a in enumerate(assign) if a == k), key=lambda i: (-spec.members[i].gpus, i)
        )
        free = set(v.free)
        for i in members:
            if v.allocator is None:
                q: Quality = ()
            else:
                c = v.allocator.choose(sorted(free), spec.members[i].gpus)
                free -= set(c.indices)
                q = (c.ring_mbps, c.pair_sum_mbps)
            worst = q if worst is None or q < worst else worst
    assert worst is not None
    return worst


def oracle(spec: GangSpec, nodes: list[NodeView]) -> tuple[str, int, Quality, int, str] | None:
    """(level, nodes used, worst member, domain free GPUs, domain) of the best plan, or None."""
    if spec.required_level:
        tried = [spec.required_level]
    else:
        start = LEVELS.index(spec.preferred_level) if spec.preferred_level else 0
        tried = [*LEVELS[start:], CLUSTER]
    sizes = [m.gpus for m in spec.members]
    feasible = [
        a
        for a in product(range(len(nodes)), repeat=len(sizes))
        if all(
            sum(g for g, k in zip(sizes, a, strict=True) if k == j) <= len(v.free)
            for j, v in enumerate(nodes)
        )
    ]
    for level in tried:
        found = []
        for a in feasible:
            doms = {domain(nodes[k], level) for k in a}
            if len(doms) != 1:
                continue
            d = doms.pop()
            dfree = sum(len(v.free) for v in nodes if domain(v, level) == d)
            found.append((len(set(a)), worst_member(spec, nodes, a), dfree, d))
        if found:
            k = min(f[0] for f in found)
            found = [f for f in found if f[0] == k]
            w = max(f[1] for f in found)
            found = [f for f in found if f[1] == w]
            best = min(found, key=lambda f: (f[2], f[3]))
            return (level, *best)
    return None


def level_rank(level: str) -> int:
    return [*LEVELS, CLUSTER].index(level)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=clusters(), spec=gangs(equal=True))
def test_equal_sizes_match_the_oracle_exactly(nodes: list[NodeView], spec: GangSpec) -> None:
    want = oracle(spec, nodes)
    got = plan_gang(spec, nodes, LEVELS)
    if want is None:
        assert isinstance(got, NoPlan) and got.reason
        return
    assert isinstance(got, GangPlan), got
    check_plan(spec, nodes, got)
    assert (got.level, got.nodes_used, got.worst, got.domain_free, got.domain) == want
    assert plan_gang(spec, nodes, LEVELS, prune=False) == got


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=clusters(), spec=gangs(equal=False))
def test_mixed_sizes_match_the_oracle_on_level_and_nodes(nodes: list[NodeView], spec: GangSpec) -> None:
    want = oracle(spec, nodes)
    got = plan_gang(spec, nodes, LEVELS)
    if want is None:
        assert isinstance(got, NoPlan) and got.reason
        return
    assert isinstance(got, GangPlan), got
    check_plan(spec, nodes, got)
    assert (got.level, got.nodes_used) == want[:2]
    assert got.worst <= want[2]  # the packing is not searched for the best worst member
    in_domain = {domain(v, got.level) for v in nodes if v.name in {p.node for p in got.placements}}
    assert in_domain == {got.domain}
    assert plan_gang(spec, nodes, LEVELS, prune=False) == got
