"""The cluster objective inside gang planning (gputopo.gang.cost) and the wait for a gang's own
level (gputopo.gang.levelwait), in the core.

The oracle: for every domain of the level the planner chose, the planner's own best plan
inside that domain alone (a required level, the domain's nodes only) priced by the literal
key — fewest nodes, best worst member, fewest sub-domains, least cost to future demand (the
objective's `take_cost` summed over the GPUs each node gives, worked out here from the
placements), fewest free GPUs, name. The planner with the objective must answer the minimum of
that key over the domains, whole gang or nothing; test_gang_oracle.py already shows each
domain's plan is the exact optimum of (1)-(3) by brute force over assignments.
"""

from __future__ import annotations

import math
from functools import cache

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gputopo.gang.asks import GangAsk, GangMember, Planned, Wait
from gputopo.gang.levelwait import carried, own_level
from gputopo.gang.planner import GangPlan, GangSpec, Member, NoPlan, plan_gang
from gputopo.gang.tracker import GangTracker
from gputopo.network.levels import CLUSTER, HOSTNAME, LEAF, SPINE, NetworkIndex, short_name
from gputopo.network.nodeview import NodeView
from gputopo.node.allocator import Allocator
from gputopo.node.topofile import load_preset
from gputopo.pod.objective import ClusterObjective, DemandMix
from tests.test_gang import check_plan

LEVELS = (HOSTNAME, LEAF)
PRESETS = ("dgx-a100", "dgx1-v100", "pcie8-plx", "rtx8000-4")


@cache
def alloc(preset: str) -> Allocator:
    return Allocator(load_preset(preset))


def objective() -> ClusterObjective:
    mix = DemandMix()
    for g in (1, 2, 2, 4, 8):
        mix.observe(g)
    return ClusterObjective(mix)


@st.composite
def clusters(draw: st.DrawFn) -> list[NodeView]:
    nodes = []
    for i in range(draw(st.integers(1, 7))):
        a = alloc(draw(st.sampled_from(PRESETS)))
        free = draw(st.sets(st.integers(0, a.n - 1)))
        leaf = draw(st.sampled_from(["l1", "l2", "l3", None]))
        nodes.append(NodeView(f"n{i}", {LEAF: leaf} if leaf else {}, a.n, frozenset(free), a))
    return nodes


@st.composite
def gangs(draw: st.DrawFn) -> GangSpec:
    size = draw(st.sampled_from([1, 2, 4, 8]))
    count = draw(st.integers(1, 4))
    return GangSpec("ml/g", tuple(Member(f"ml/w{i}", size) for i in range(count)))


def domain_of(v: NodeView, level: str) -> str:
    if level == CLUSTER:
        return CLUSTER
    if level == HOSTNAME:
        return v.name
    return v.labels.get(level) or f"node/{v.name}"


def cost_of(obj: ClusterObjective, nodes: list[NodeView], plan: GangPlan) -> float:
    """The key's cost, from the placements alone (not from the planner's internals)."""
    by_name = {v.name: v for v in nodes}
    taken: dict[str, list[int]] = {}
    for p in plan.placements:
        taken.setdefault(p.node, []).extend(p.gpus)
    total = 0.0
    for name, gpus in taken.items():
        v = by_name[name]
        assert v.allocator is not None
        total += obj.take_cost(v.allocator, v.free, gpus)
    return round(total, 6)


def key(obj: ClusterObjective, nodes: list[NodeView], plan: GangPlan) -> tuple[object, ...]:
    return (
        plan.nodes_used,
        tuple(-q for q in plan.worst),
        plan.spans,
        cost_of(obj, nodes, plan),
        plan.domain_free,
        plan.domain,
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=clusters(), spec=gangs())
def test_the_domain_chosen_is_the_minimum_of_the_documented_key(
    nodes: list[NodeView], spec: GangSpec
) -> None:
    obj = objective()
    # the objective inside one level (the level rule first): the job-time choice between levels
    # is checked below and in tests/test_gang_predict.py
    got = plan_gang(spec, nodes, LEVELS, objective=obj, level_first=True)
    plain = plan_gang(spec, nodes, LEVELS)
    by_time = plan_gang(spec, nodes, LEVELS, objective=obj)
    if isinstance(plain, NoPlan):
        assert isinstance(got, NoPlan) and got.reason, "the objective never makes a gang fit or not"
        assert isinstance(by_time, NoPlan)
        return
    assert isinstance(got, GangPlan), got
    assert isinstance(by_time, GangPlan), by_time
    check_plan(spec, nodes, got)
    check_plan(spec, nodes, by_time)
    assert got.level == plain.level, "the objective orders domains of the level (1) chose"
    order = [*LEVELS, CLUSTER]
    assert order.index(by_time.level) >= order.index(plain.level), "never a level that cannot hold it"
    if by_time.level != plain.level:  # a larger level only when the model predicts it faster
        assert "predicted efficiency" in by_time.why, by_time.why
    candidates = []
    for d in sorted({domain_of(v, got.level) for v in nodes}):
        inside = [v for v in nodes if domain_of(v, got.level) == d]
        alone = plan_gang(
            GangSpec(spec.key, spec.members, required_level=got.level) if got.level != CLUSTER else spec,
            inside,
            LEVELS,
            objective=obj,
        )
        if isinstance(alone, GangPlan) and alone.level == got.level:
            # the domain's free GPUs as the whole cluster sees them (the same nodes)
            candidates.append(key(obj, nodes, alone))
    assert candidates, "the planner's own domain is a candidate"
    assert key(obj, nodes, got) == min(candidates)


def test_equal_domains_go_by_the_cost_to_future_demand_not_by_best_fit() -> None:
    """Two 1-GPU members fit one node (the node level), and every node gives a 1-GPU member the
    same set quality, so (1)-(3b) tie. Best fit takes the DGX-1 with 4 GPUs free (fewer free
    than the PCIe box's 6); those 4 are one NVLink quad the 4-GPU jobs of the mix want, and
    taking 2 leaves neither a 4 nor a clean pair. The objective takes the PCIe box instead:
    6 - 2 leaves it 4 free, a whole group for a 4-GPU job, and PCIe GPUs are worth less."""
    dgx1, pcie = alloc("dgx1-v100"), alloc("pcie8-plx")
    nodes = [
        NodeView("a-dgx1", {LEAF: "a"}, 8, frozenset(range(4)), dgx1),
        NodeView("b-pcie", {LEAF: "b"}, 8, frozenset(range(6)), pcie),
    ]
    spec = GangSpec("ml/g", (Member("ml/w0", 1), Member("ml/w1", 1)))
    plain = plan_gang(spec, nodes, LEVELS)
    obj = objective()
    got = plan_gang(spec, nodes, LEVELS, objective=obj)
    assert isinstance(plain, GangPlan) and isinstance(got, GangPlan)
    assert (plain.level, plain.domain, plain.domain_free) == (HOSTNAME, "a-dgx1", 4), "best fit alone"
    assert (got.level, got.domain) == (HOSTNAME, "b-pcie")
    assert cost_of(obj, nodes, got) < cost_of(obj, nodes, plain)
    assert plain.worst == got.worst and plain.nodes_used == got.nodes_used == 1


def test_without_ties_the_objective_changes_nothing() -> None:
    """(1)-(3) still come first: a better ring beats a cheaper node."""
    a100, pcie = alloc("dgx-a100"), alloc("pcie8-plx")
    nodes = [
        NodeView("a-a100", {LEAF: "a"}, 8, frozenset(range(8)), a100),
        NodeView("b-pcie", {LEAF: "b"}, 8, frozenset(range(8)), pcie),
    ]
    spec = GangSpec("ml/g", (Member("ml/w0", 4), Member("ml/w1", 4)))
    got = plan_gang(spec, nodes, LEVELS, objective=objective())
    assert isinstance(got, GangPlan) and got.domain == "a-a100"


# --------------------------------------------------------------------------- waiting for a level

TLEVELS = (HOSTNAME, LEAF, SPINE)
NAMES = [f"{leaf}{i}" for leaf in "ab" for i in range(2)]
A100 = alloc("dgx-a100")


def views(busy: set[str]) -> dict[str, NodeView]:
    """Leaves a and b of two 8-GPU nodes under one spine; `busy` nodes have no GPU free."""
    return {
        n: NodeView(n, {LEAF: n[0], SPINE: "s"}, 8, frozenset() if n in busy else frozenset(range(8)), A100)
        for n in NAMES
    }


INDEX = NetworkIndex.build(((n, v.labels) for n, v in views(set()).items()), TLEVELS)


def ask(bound: dict[int, str] | None = None) -> GangAsk:
    bound = bound or {}
    members = tuple(GangMember(f"ml/w-{i}", 8, bound.get(i, "")) for i in range(2))
    return GangAsk("ml/g", "ml/w-1", members, 2)


def test_a_gang_waits_for_its_own_leaf_then_takes_the_spine_after_spill_after_s() -> None:
    t = GangTracker(TLEVELS, spill_after_s=600.0, objective=objective())
    busy = views({"a1", "b1"})  # one node free per leaf: only the spine holds both members
    got = t.filter(ask(), NAMES, busy, INDEX, 1000.0)
    assert isinstance(got, Wait) and got.event == "GangUnschedulable"
    assert "waiting for one leaf domain to hold all 2 members" in got.reason and "room now" in got.reason
    assert not t.reservations
    failed = [e for e in t.drain() if e.kind == "plan_failed"]
    assert failed and "waiting for one leaf" in failed[0].reason
    # a node frees up in leaf a: the next filter plans there at once
    freed = views({"b1"})
    got = t.filter(ask(), NAMES, freed, INDEX, 1100.0)
    assert isinstance(got, Planned) and got.node.startswith("a")
    assert t.plans["ml/g"].level == LEAF


def test_past_spill_after_s_the_gang_takes_the_larger_level() -> None:
    t = GangTracker(TLEVELS, spill_after_s=600.0)
    busy = views({"a1", "b1"})
    assert isinstance(t.filter(ask(), NAMES, busy, INDEX, 1000.0), Wait)
    got = t.filter(ask(), NAMES, views({"a1", "b1"}), INDEX, 1600.0)  # first seen at 1000
    assert isinstance(got, Planned)
    assert t.plans["ml/g"].level == SPINE


def test_spill_after_zero_spills_at_once_and_bound_members_are_never_held() -> None:
    t = GangTracker(TLEVELS, spill_after_s=0.0)
    assert isinstance(t.filter(ask(), NAMES, views({"a1", "b1"}), INDEX, 0.0), Planned)
    assert t.plans["ml/g"].level == SPINE
    held = GangTracker(TLEVELS, spill_after_s=1e9)
    # w-0 is bound on a0 already: w-1 joins it wherever it can, at once
    got = held.filter(ask({0: "a0"}), NAMES, views({"a0", "a1"}), INDEX, 0.0)
    assert isinstance(got, Planned) and got.node == "b0"


def test_a_gangs_own_spill_after_overrides_the_trackers() -> None:
    """gputopo.io/topology-wait reaches the tracker as GangAsk.spill_after_s: one gang spills
    at once, another waits longer than the tracker's default, and an invalid value is refused."""
    busy = views({"a1", "b1"})
    t = GangTracker(TLEVELS, spill_after_s=1e9)
    members = ask().members
    at_once = GangAsk("ml/g", "ml/w-1", members, 2, spill_after_s=0.0)
    assert isinstance(t.filter(at_once, NAMES, busy, INDEX, 0.0), Planned)
    assert t.plans["ml/g"].level == SPINE
    patient = GangTracker(TLEVELS, spill_after_s=600.0)
    longer = GangAsk("ml/g", "ml/w-1", members, 2, spill_after_s=3600.0)
    assert isinstance(patient.filter(longer, NAMES, busy, INDEX, 1000.0), Wait)
    got = patient.filter(longer, NAMES, views({"a1", "b1"}), INDEX, 1700.0)  # past 600, not 3600
    assert isinstance(got, Wait) and "after 3600s of waiting" in got.reason
    assert isinstance(patient.filter(longer, NAMES, views({"a1", "b1"}), INDEX, 4600.0), Planned)
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="spill_after_s"):
            GangAsk("ml/g", "ml/w-1", members, 2, spill_after_s=bad)


def test_a_gang_too_big_for_any_leaf_does_not_wait() -> None:
    """Its own level is what it could get on an empty cluster: three 8-GPU members never fit
    one leaf of two nodes, so the spine is its own level and it is planned there."""
    t = GangTracker(TLEVELS, spill_after_s=1e9)
    members = tuple(GangMember(f"ml/w-{i}", 8) for i in range(3))
    got = t.filter(GangAsk("ml/g", "ml/w-2", members, 3), NAMES, views(set()), INDEX, 0.0)
    assert isinstance(got, Planned) and t.plans["ml/g"].level == SPINE


def test_own_level_counts_only_the_levels_the_plan_carries() -> None:
    """Two label families: n0,n1 share an accelerator domain X, n2,n3 only a clique C. A plan
    on n2,n3 is at the clique level, which is as good a domain for them; X's level is not theirs."""
    x, c = "accelerator.topograph.run/domain", "nvidia.com/gpu.clique"
    levels = (HOSTNAME, x, c)
    labels = {"n0": {x: "X"}, "n1": {x: "X"}, "n2": {c: "C"}, "n3": {c: "C"}}
    vs = {n: NodeView(n, lab, 8, frozenset(range(8)), A100) for n, lab in labels.items()}
    index = NetworkIndex.build(((n, lab) for n, lab in labels.items()), levels)
    spec = GangSpec("ml/g", (Member("ml/w0", 8), Member("ml/w1", 8)))
    assert own_level(spec, list(vs.values()), index) == x
    plan = plan_gang(spec, [vs["n2"], vs["n3"]], levels, index=index)
    assert isinstance(plan, GangPlan) and plan.level == c
    among = carried(plan, vs, index)
    assert x not in among and c in among
    assert own_level(spec, list(vs.values()), index, among) == c


@st.composite
def whole_node_cases(draw: st.DrawFn) -> tuple[list[NodeView], GangSpec]:
    """8-GPU nodes of three kinds, each whole or busy, and a gang of whole-node members."""
    nodes = []
    for i in range(draw(st.integers(1, 7))):
        a = alloc(draw(st.sampled_from(("dgx-a100", "dgx1-v100", "pcie8-plx"))))
        free = (
            frozenset(range(8))
            if draw(st.booleans())
            else frozenset(draw(st.sets(st.integers(0, 7), max_size=7)))
        )
        leaf = draw(st.sampled_from(["l1", "l2", "l3", None]))
        nodes.append(NodeView(f"n{i}", {LEAF: leaf} if leaf else {}, 8, free, a))
    count = draw(st.integers(1, 3))
    return nodes, GangSpec("ml/g", tuple(Member(f"ml/w{i}", 8) for i in range(count)))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=whole_node_cases())
def test_whole_node_gangs_match_a_brute_force_over_every_node_set(
    case: tuple[list[NodeView], GangSpec],
) -> None:
    """Every set of whole nodes that could take the members, at every level: the planner's
    answer has the least (level, nodes, worst member, leaves touched, cost, free GPUs, domain):
    the objective orders the nodes of a domain as well as the domains."""
    from itertools import combinations

    nodes, spec = case
    obj = objective()
    got = plan_gang(spec, nodes, LEVELS, objective=obj)
    whole = [v for v in nodes if len(v.free) == 8]
    n = len(spec.members)
    # the leaf level counts for (3b) only where it groups two nodes or more (gputopo.gang.spread)
    grouped = len({domain_of(v, LEAF) for v in nodes}) < len(nodes)
    best: tuple[object, ...] | None = None
    for rank, level in enumerate((*LEVELS, CLUSTER)):
        for chosen in combinations(whole, n):
            doms = {domain_of(v, level) for v in chosen}
            if len(doms) != 1:
                continue
            (d,) = doms
            worst = min(
                (
                    v.allocator.choose(sorted(v.free), 8).ring_mbps,
                    v.allocator.choose(sorted(v.free), 8).pair_sum_mbps,
                )
                for v in chosen
            )  # type: ignore[union-attr]
            spans = (len({domain_of(v, LEAF) for v in chosen}),) if level == CLUSTER and grouped else ()
            cost = round(sum(obj.take_cost(v.allocator, v.free, range(8)) for v in chosen), 6)  # type: ignore[arg-type]
            dfree = sum(len(v.free) for v in nodes if domain_of(v, level) == d)
            k = (rank, n, tuple(-q for q in worst), spans, cost, dfree, d)
            best = k if best is None or k < best else best
        if best is not None:
            break
    if best is None:
        assert isinstance(got, NoPlan) and got.reason
        return
    assert isinstance(got, GangPlan), got
    check_plan(spec, nodes, got)
    # (3b) picks the leaves of a cluster-level plan by best fit over leaves (gputopo.gang.spread,
    # tests/test_gang_spread.py); the cost orders nodes within them, so the literal key over
    # every node set holds where no leaf is chosen
    assume(got.level != CLUSTER or not grouped)
    rank = (*LEVELS, CLUSTER).index(got.level)
    assert (rank, *key(obj, nodes, got)) == best


def test_a_gang_of_mixed_sizes_waits_alike() -> None:
    """8 + 4 GPUs need two nodes; one free node per leaf: only the spine holds them now."""
    t = GangTracker(TLEVELS, spill_after_s=600.0)
    members = (GangMember("ml/w-0", 8), GangMember("ml/w-1", 4))
    got = t.filter(GangAsk("ml/g", "ml/w-1", members, 2), NAMES, views({"a1", "b1"}), INDEX, 0.0)
    assert isinstance(got, Wait) and "waiting for one leaf domain to hold all 2 members" in got.reason


@settings(max_examples=150, deadline=None)
@given(
    busy=st.sets(st.sampled_from(NAMES)),
    half=st.sets(st.sampled_from(NAMES)),
    size=st.sampled_from([4, 8]),
    count=st.integers(1, 4),
)
def test_the_tracker_waits_exactly_when_the_plan_is_above_the_gangs_own_level(
    busy: set[str], half: set[str], size: int, count: int
) -> None:
    """Oracle: the planner's smallest level now against the smallest level that could hold the
    gang on the empty cluster; the tracker plans iff the first is not above the second."""
    free = {
        n: frozenset() if n in busy else frozenset(range(4)) if n in half else frozenset(range(8))
        for n in NAMES
    }
    vs = {n: NodeView(n, {LEAF: n[0], SPINE: "s"}, 8, free[n], A100) for n in NAMES}
    spec = GangSpec("ml/g", tuple(Member(f"ml/w-{i}", size) for i in range(count)))
    t = GangTracker(TLEVELS, spill_after_s=600.0)
    members = tuple(GangMember(f"ml/w-{i}", size) for i in range(count))
    got = t.filter(GangAsk("ml/g", f"ml/w-{count - 1}", members, count), NAMES, vs, INDEX, 0.0)
    plan = plan_gang(spec, list(vs.values()), TLEVELS)
    own = own_level(spec, list(vs.values()), INDEX)
    order = [*TLEVELS, CLUSTER]
    if isinstance(plan, NoPlan):
        assert isinstance(got, Wait) and "does not fit" in got.reason and "waiting" not in got.reason
    elif own is not None and order.index(plan.level) > order.index(own):
        assert isinstance(got, Wait) and f"waiting for one {short_name(own)} domain" in got.reason
    else:
        assert isinstance(got, Planned) and t.plans["ml/g"].level == plan.level
