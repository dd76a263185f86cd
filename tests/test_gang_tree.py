"""Hierarchical gangs (gputopo.gang.tree): sub-groups with their own levels, all or nothing.

The cases: a JobSet-shaped job on NVL72-like racks (tensor-parallel groups that must each stay
inside one NVLink domain), required and preferred levels per sub-group, bound members pinning a
re-plan, malformed trees; and, on random small clusters and trees, every plan checked against
the rules it must keep (each sub-group inside one domain of its required level, no GPU given
twice, only free GPUs), with a brute-force oracle saying whether a tree fits at all.
"""

from __future__ import annotations

import itertools
from functools import cache

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gputopo.gang.asks import GangAsk, GangMember
from gputopo.gang.planner import GangPlan, GangSpec, Member, NoPlan, SubGroup, plan_gang
from gputopo.gang.tracker import GangTracker
from gputopo.network.levels import ACCELERATOR, HOSTNAME, LEAF, SPINE, NetworkIndex
from gputopo.network.nodeview import NodeView
from gputopo.node.allocator import Allocator
from gputopo.node.topofile import load_preset

LEVELS = (HOSTNAME, ACCELERATOR, LEAF, SPINE)


@cache
def alloc(preset: str) -> Allocator:
    return Allocator(load_preset(preset))


def tray(name: str, rack: str, leaf: str, busy: int = 0) -> NodeView:
    a = alloc("gb200-tray")
    labels = {ACCELERATOR: rack, LEAF: leaf, SPINE: "s1"}
    return NodeView(name, labels, a.n, frozenset(range(busy, a.n)), a)


def racks(free_trays: dict[str, int], trays: int = 6) -> list[NodeView]:
    """Racks of `trays` GB200 trays (4 GPUs each), `free_trays[rack]` of them empty, the rest busy."""
    out = []
    for r, (rack, free) in enumerate(sorted(free_trays.items())):
        for t in range(trays):
            out.append(tray(f"{rack}-t{t}", rack, f"leaf-{r // 2}", busy=0 if t < free else 4))
    return out


def tp_job(groups: int, trays_per_group: int, level: str = ACCELERATOR, **kw: object) -> GangSpec:
    """A JobSet-shaped job: `groups` tensor-parallel groups of `trays_per_group` 4-GPU pods,
    each group required inside one domain of `level`."""
    members = tuple(
        Member(f"ml/tp{g}-{i}", 4, f"tp{g}") for g in range(groups) for i in range(trays_per_group)
    )
    subs = tuple(SubGroup(f"tp{g}", required_level=level) for g in range(groups))
    return GangSpec("ml/job", members, groups=subs, **kw)  # type: ignore[arg-type]


def domain_of(v: NodeView, level: str) -> str:
    return v.name if level == HOSTNAME else v.labels.get(level) or f"node/{v.name}"


def check(plan: GangPlan, spec: GangSpec, nodes: list[NodeView]) -> None:
    """The rules every tree plan keeps."""
    by = {v.name: v for v in nodes}
    assert [p.pod for p in plan.placements] == [m.pod for m in spec.members]
    used: set[tuple[str, int]] = set()
    for p, m in zip(plan.placements, spec.members, strict=True):
        assert len(p.gpus) == m.gpus and set(p.gpus) <= by[p.node].free
        for g in p.gpus:
            assert (p.node, g) not in used, "a GPU given twice"
            used.add((p.node, g))
    for g in spec.groups:
        if g.required_level is None:
            continue
        subtree = {g.name}
        grew = True
        while grew:
            more = {s.name for s in spec.groups if s.parent in subtree} - subtree
            grew, subtree = bool(more), subtree | more
        nodes_of = {p.node for p, m in zip(plan.placements, spec.members, strict=True) if m.group in subtree}
        assert len({domain_of(by[n], g.required_level) for n in nodes_of}) <= 1, f"{g.name} straddles"
    if spec.required_level is not None:
        assert len({domain_of(by[p.node], spec.required_level) for p in plan.placements}) == 1


def test_each_tensor_parallel_group_stays_inside_one_nvlink_domain() -> None:
    nodes = racks({"rackA": 5, "rackB": 4, "rackC": 3})
    spec = tp_job(2, 4)
    plan = plan_gang(spec, nodes, LEVELS)
    assert isinstance(plan, GangPlan), plan
    check(plan, spec, nodes)
    racks_of = {}
    for p, m in zip(plan.placements, spec.members, strict=True):
        racks_of.setdefault(m.group, set()).add(p.node.split("-")[0])
    assert racks_of == {"tp0": {"rackA"}, "tp1": {"rackB"}} or racks_of == {
        "tp0": {"rackB"},
        "tp1": {"rackA"},
    }
    assert (
        "sub-groups: tp0 → rack" in plan.why
        and "tp1 → rack" in plan.why
        and "(accelerator, required)" in plan.why
    )


def test_a_tree_that_only_fits_by_straddling_a_rack_waits_all_or_nothing() -> None:
    """Twelve free trays in all, but no rack holds a group of five: nothing is placed, although
    a flat gang of the same ten pods would fit."""
    nodes = racks({"rackA": 4, "rackB": 4, "rackC": 4})
    spec = tp_job(2, 5)
    plan = plan_gang(spec, nodes, LEVELS)
    assert isinstance(plan, NoPlan)
    assert "does not fit as a tree" in plan.reason
    flat = GangSpec("ml/flat", tuple(Member(m.pod, m.gpus) for m in spec.members))
    assert isinstance(plan_gang(flat, nodes, LEVELS), GangPlan)


def test_the_root_level_binds_the_whole_tree_and_a_preferred_sub_group_falls_back() -> None:
    nodes = racks({"rackA": 3, "rackB": 3, "rackC": 6, "rackD": 6})  # leaf-0: A, B; leaf-1: C, D
    spec = tp_job(2, 4, level=ACCELERATOR, required_level=LEAF)
    plan = plan_gang(spec, nodes, LEVELS)
    assert isinstance(plan, GangPlan) and plan.level == LEAF and plan.domain == "leaf-1"
    check(plan, spec, nodes)
    # preferred NVLink domain for groups of 7 trays: no rack has 7 free, so each falls back to
    # the leaf, and the root (no constraint) takes the smallest level that holds all 14
    members = tuple(Member(f"ml/p{g}-{i}", 4, f"g{g}") for g in range(2) for i in range(7))
    loose = GangSpec(
        "ml/loose",
        members,
        groups=(SubGroup("g0", preferred_level=ACCELERATOR), SubGroup("g1", preferred_level=ACCELERATOR)),
    )
    plan = plan_gang(loose, racks({"rackA": 6, "rackB": 6, "rackC": 6, "rackD": 6}), LEVELS)
    assert isinstance(plan, GangPlan)
    assert "g0 → leaf-" in plan.why and "g1 → leaf-" in plan.why


def test_nested_sub_groups_keep_replicas_in_a_leaf_and_tp_groups_in_a_rack() -> None:
    """replica-r (required leaf) > tp-r-k (required NVLink domain): a 2-level JobSet."""
    subs = [SubGroup(f"replica{r}", required_level=LEAF) for r in range(2)]
    subs += [
        SubGroup(f"tp{r}{k}", parent=f"replica{r}", required_level=ACCELERATOR)
        for r in range(2)
        for k in range(2)
    ]
    members = tuple(
        Member(f"ml/w{r}{k}{i}", 4, f"tp{r}{k}") for r in range(2) for k in range(2) for i in range(3)
    )
    spec = GangSpec("ml/nested", members, groups=tuple(subs))
    nodes = racks({"rackA": 4, "rackB": 3, "rackC": 6, "rackD": 2})  # leaf-0: A, B; leaf-1: C, D
    plan = plan_gang(spec, nodes, LEVELS)
    assert isinstance(plan, GangPlan), plan
    check(plan, spec, nodes)
    leaves = {
        r: {p.node for p, m in zip(plan.placements, members, strict=True) if m.group.startswith(f"tp{r}")}
        for r in range(2)
    }
    for names in leaves.values():
        assert len(names) == 6
    # replica 1's two groups need two racks with 3 free trays in one leaf: only leaf-0 (A, B)
    # or C alone can give a group 3 trays; C holds both groups of a replica (6 trays)
    assert "replica0 → leaf-" in plan.why and "replica1 → leaf-" in plan.why


def test_bound_members_pin_their_sub_groups_domain_on_a_re_plan() -> None:
    nodes = racks({"rackA": 6, "rackB": 6})
    spec = tp_job(1, 4)
    pending = GangSpec(
        spec.key, spec.members[2:], groups=spec.groups, bound=(("tp0", "rackB-t0"), ("tp0", "rackB-t1"))
    )
    left = [v for v in nodes if v.name not in ("rackB-t0", "rackB-t1")]
    plan = plan_gang(
        pending, left, LEVELS, index=NetworkIndex.build(((v.name, v.labels) for v in nodes), LEVELS)
    )
    assert isinstance(plan, GangPlan)
    assert {p.node.split("-")[0] for p in plan.placements} == {"rackB"}


def test_a_malformed_tree_is_a_no_plan_naming_what_is_wrong() -> None:
    nodes = racks({"rackA": 6})
    m = (Member("ml/a", 4, "x"),)
    cases = [
        (GangSpec("g", m, groups=(SubGroup("x", parent="nope"),)), "parent 'nope'"),
        (GangSpec("g", m, groups=(SubGroup("x", parent="y"), SubGroup("y", parent="x"))), "cycle"),
        (GangSpec("g", (Member("ml/a", 4, "z"),), groups=(SubGroup("x"),)), "sub-group 'z'"),
        (GangSpec("g", m, groups=(SubGroup("x", required_level="rack"),)), "not one of the network levels"),
        (GangSpec("g", m, groups=(SubGroup("x"), SubGroup("x"))), "distinct"),
    ]
    for spec, message in cases:
        plan = plan_gang(spec, nodes, LEVELS)
        assert isinstance(plan, NoPlan) and message in plan.reason, (plan, message)


def test_the_tracker_plans_a_tree_and_says_where_each_sub_group_went() -> None:
    nodes = racks({"rackA": 5, "rackB": 4})
    spec = tp_job(2, 4)
    tracker = GangTracker(LEVELS)
    views = {v.name: v for v in nodes}
    index = NetworkIndex.build(((v.name, v.labels) for v in nodes), LEVELS)
    members = tuple(GangMember(m.pod, m.gpus, "", m.group) for m in spec.members)
    ask = GangAsk("ml/job", members[0].pod, members, len(members), groups=spec.groups)
    got = tracker.filter(ask, frozenset(views), views, index, 0.0)
    plan = tracker.plans.get("ml/job")
    assert plan is not None, got
    check(plan, spec, nodes)
    events = [e for e in tracker.drain() if e.kind == "plan"]
    assert events and "sub-groups: tp0 → rack" in events[-1].reason


PRESETS = ("dgx-a100", "rtx8000-4", "gb200-tray")


@st.composite
def cases(draw: st.DrawFn) -> tuple[GangSpec, list[NodeView]]:
    nodes = []
    for i in range(draw(st.integers(1, 5))):
        a = alloc(draw(st.sampled_from(PRESETS)))
        free = frozenset(draw(st.sets(st.integers(0, a.n - 1))))
        labels = {
            LEAF: draw(st.sampled_from(["l1", "l2"])),
            ACCELERATOR: draw(st.sampled_from(["r1", "r2", "r3"])),
        }
        nodes.append(NodeView(f"n{i}", labels, a.n, free, a))
    count = draw(st.integers(1, 3))
    subs = tuple(
        SubGroup(f"s{k}", required_level=draw(st.sampled_from([None, HOSTNAME, ACCELERATOR, LEAF])))
        for k in range(count)
    )
    members = []
    for k in range(count):
        for i in range(draw(st.integers(1, 2))):
            members.append(Member(f"ml/s{k}-{i}", draw(st.sampled_from([1, 2, 4])), f"s{k}"))
    root = draw(st.sampled_from([None, LEAF]))
    return GangSpec("ml/t", tuple(members), required_level=root, groups=subs), nodes


def fits(spec: GangSpec, nodes: list[NodeView]) -> bool:
    """Brute force: is there an assignment of members to nodes (GPU counts only) that keeps
    every required level and capacity? (Sets inside a node are not at stake: any k free GPUs
    of a node can be given.)"""
    for assign in itertools.product(range(len(nodes)), repeat=len(spec.members)):
        need = [0] * len(nodes)
        for i, m in zip(assign, spec.members, strict=True):
            need[i] += m.gpus
        if any(need[i] > len(nodes[i].free) for i in range(len(nodes))):
            continue
        ok = True
        for g in spec.groups:
            if g.required_level is not None:
                at = {
                    domain_of(nodes[i], g.required_level)
                    for i, m in zip(assign, spec.members, strict=True)
                    if m.group == g.name
                }
                ok &= len(at) <= 1
        if spec.required_level is not None:
            ok &= len({domain_of(nodes[i], spec.required_level) for i in assign}) == 1
        if ok:
            return True
    return False


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_random_trees_keep_every_rule_and_never_plan_what_cannot_fit(
    case: tuple[GangSpec, list[NodeView]],
) -> None:
    spec, nodes = case
    plan = plan_gang(spec, nodes, LEVELS)
    if isinstance(plan, GangPlan):
        check(plan, spec, nodes)
        assert fits(spec, nodes)


def test_a_tree_is_planned_over_every_placement_kube_scheduler_offered_and_kept_across_them() -> None:
    """kube-scheduler 1.37's workload scheduling offers one domain per pod group at a time (seen
    with the real kube-scheduler: tests/test_realk8s_scheduler.py). A tree that needs two racks
    waits on the first rack's offer, is planned once the second rack was offered too, and a
    member asked about under the other rack's offer keeps its plan."""
    from gputopo.gang.asks import Planned, Wait

    nodes = racks({"rackA": 2, "rackB": 2}, trays=2)
    spec = tp_job(2, 2)
    tracker = GangTracker(LEVELS)
    views = {v.name: v for v in nodes}
    index = NetworkIndex.build(((v.name, v.labels) for v in nodes), LEVELS)
    members = tuple(GangMember(m.pod, m.gpus, "", m.group) for m in spec.members)
    rack = {r: frozenset(n for n in views if n.startswith(r)) for r in ("rackA", "rackB")}

    def ask(i: int) -> GangAsk:
        return GangAsk("ml/job", members[i].pod, members, len(members), groups=spec.groups)

    assert isinstance(tracker.filter(ask(0), rack["rackA"], views, index, 0.0), Wait)
    second = tracker.filter(ask(2), rack["rackB"], views, index, 1.0)
    assert isinstance(second, Planned), second
    plan = tracker.plans["ml/job"]
    check(plan, spec, nodes)
    first = next(p.node for p in plan.placements if p.pod == members[0].pod)
    other = "rackB" if first.startswith("rackA") else "rackA"
    kept = tracker.filter(ask(0), rack[other], views, index, 2.0)
    assert isinstance(kept, Wait) and "outside this offer" in kept.reason
    assert tracker.plans["ml/job"] is plan
    mine = tracker.filter(ask(0), rack[first[:5]], views, index, 3.0)
    assert isinstance(mine, Planned) and mine.node == first
