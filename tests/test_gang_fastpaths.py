"""The gang planner's fast paths must not change a plan.

Each one is checked against the path it short-cuts: skipping tied domains whose bound on the
worst member (`gang.domain.worst_cap`) is below a plan already found, and pricing only the
candidates still level on (2)-(3b) (`gang.domain.contenders`), against working out and pricing
every tied domain; the bound itself against its definition and the evaluated plans; the node
kinds memoised across gangs of other sizes against a fresh pass; the objective's `take_cost`
memo against a fresh objective; `packing.equal_bounds` on a list against it on an array; the
single-offer path (`gang.singleoffer`, no node takes two members) against the general search.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gputopo.gang import domain as gangdomain
from gputopo.gang import packing
from gputopo.gang import planner as gang
from gputopo.gang import singleoffer as gangsingle
from gputopo.gang.cost import plan_cost
from gputopo.gang.memo import PlanMemo
from gputopo.gang.planner import GangPlan, GangSpec, Member, plan_gang
from gputopo.gang.spread import lower_levels
from gputopo.network.levels import LevelIndex, NetworkIndex
from gputopo.network.nodeview import UNKNOWN_QUALITY, NodeView, member_quality
from gputopo.node.allocator import Allocator, AllocatorPool
from gputopo.pod.objective import ClusterObjective, DemandMix
from gputopo.sim.clusters import preset_cluster


def _every_tied_domain(
    pb: gangdomain.Problem,
    level: str,
    tied: list[tuple[int, int, list[tuple[int, list[int]]]]],
    lx: LevelIndex,
    dfree: np.ndarray,
    lower: Sequence[LevelIndex],
) -> list[gangdomain.Candidate]:
    return [gangdomain.evaluate(pb, level, d, k, p, lx.members[d], int(dfree[d]), lower) for d, k, p in tied]


@contextmanager
def slow_paths() -> Iterator[None]:
    """Every tied domain worked out and every candidate priced, as before the fast paths."""
    with (
        mock.patch.object(gang, "evaluate_promising", _every_tied_domain),
        mock.patch.object(gang, "contenders", lambda cands, lead: cands),
    ):
        yield


@contextmanager
def general_path() -> Iterator[None]:
    """The single-offer path off: every level through `gang.domain`'s search."""
    with mock.patch.object(gangsingle, "applies", lambda pb: False):
        yield


def _cluster_views(
    preset: str, rng: random.Random, steps: int
) -> Iterator[tuple[list[NodeView], NetworkIndex, tuple[str, ...], list[Allocator]]]:
    """Free sets that change a few nodes at a time (one view object per node and free set, as
    the simulator keeps them), on a preset cluster."""
    cluster = preset_cluster(preset)
    pool = AllocatorPool()
    allocators = [pool.get(t) for t in cluster.topologies]
    index = NetworkIndex.build(((n.name, n.labels) for n in cluster.nodes), cluster.levels)
    sizes = [cluster.topologies[n.topology].n for n in cluster.nodes]
    masks = [(1 << s) - 1 for s in sizes]
    made: dict[tuple[int, int], NodeView] = {}
    for _ in range(steps):
        for i in rng.sample(range(len(masks)), 6):
            r = rng.random()
            masks[i] = (1 << sizes[i]) - 1 if r < 0.3 else 0 if r < 0.5 else rng.getrandbits(sizes[i])
        views = []
        for i, node in enumerate(cluster.nodes):
            if (i, masks[i]) not in made:
                free = frozenset(g for g in range(sizes[i]) if masks[i] >> g & 1)
                made[(i, masks[i])] = NodeView(
                    node.name, node.labels, sizes[i], free, allocators[node.topology]
                )
            views.append(made[(i, masks[i])])
        yield views, index, cluster.levels, list(allocators)


def _gang(rng: random.Random, step: int) -> GangSpec:
    g = rng.choice([1, 2, 4, 8, 8, 8])
    sizes = [g] * rng.randint(1, 14) if rng.random() < 0.85 else [rng.choice([1, 2, 4, 8]) for _ in range(4)]
    return GangSpec(f"ns/g{step}", tuple(Member(f"ns/p{k}", s) for k, s in enumerate(sizes)))


@pytest.mark.parametrize("preset", ["default", "mixed-leaf", "gb200-nvl"])
@pytest.mark.parametrize("seed", range(3))
def test_skipped_domains_and_unpriced_candidates_change_no_plan(preset: str, seed: int) -> None:
    """With a cluster objective whose demand mix moves (so costs order the candidates), and a
    memo shared across gangs as the tracker shares one: the plan equals the one made working
    out and pricing every tied domain with a fresh memo and a fresh objective, and the one of
    the unpruned planner (`prune=False`, every domain in full)."""
    rng = random.Random(seed)
    mix = DemandMix(refresh=8)
    kept = ClusterObjective(mix)
    shared = PlanMemo()
    planned = 0
    for step, (views, index, levels, allocators) in enumerate(_cluster_views(preset, rng, 40)):
        for _ in range(rng.randint(1, 12)):
            mix.observe(rng.choice([1, 1, 2, 4, 8]), gang=rng.random() < 0.3)
        spec = _gang(rng, step)
        got = plan_gang(spec, views, levels, index=index, memo=shared, objective=kept)
        fresh = ClusterObjective(mix)
        fresh.learn(allocators)
        with slow_paths():
            assert got == plan_gang(spec, views, levels, index=index, objective=fresh)
        unpruned = ClusterObjective(mix)
        unpruned.learn(allocators)
        assert got == plan_gang(spec, views, levels, index=index, prune=False, objective=unpruned)
        planned += isinstance(got, GangPlan)
    assert planned > 10


def test_the_fast_paths_skip_work_on_the_default_cluster() -> None:
    """Not a speed assertion: the bound does skip tied domains here (whole-node gangs on a
    cluster of mixed servers, through the general search: the single-offer path takes them
    otherwise), so the agreement above is not vacuous."""
    rng = random.Random(5)
    evaluated = {"fast": 0, "slow": 0}
    real = gangdomain.evaluate

    def counting(which: str):  # type: ignore[no-untyped-def]
        def run(*args: object, **kwargs: object) -> gangdomain.Candidate:
            evaluated[which] += 1
            return real(*args, **kwargs)  # type: ignore[arg-type]

        return run

    for step, (views, index, levels, _) in enumerate(_cluster_views("default", rng, 30)):
        spec = GangSpec(f"ns/g{step}", tuple(Member(f"ns/p{k}", 8) for k in range(rng.randint(2, 4))))
        with general_path(), mock.patch.object(gangdomain, "evaluate", counting("fast")):
            got = plan_gang(spec, views, levels, index=index)
        with general_path(), slow_paths(), mock.patch.object(gangdomain, "evaluate", counting("slow")):
            assert plan_gang(spec, views, levels, index=index) == got
    assert evaluated["fast"] < evaluated["slow"]


def _random_views(
    rng: random.Random, free_of: Callable[[int], frozenset[int]]
) -> tuple[NetworkIndex, list[NodeView | None], list[Allocator]]:
    """A random preset cluster's index, one view per node (in the index's order) with the
    free set `free_of(gpu count)`, now and then a node of unknown topology (its members rank
    below every measured set), and the allocator of each of the cluster's servers."""
    pool = AllocatorPool()
    cluster = preset_cluster(rng.choice(["default", "mixed-leaf", "gb200-nvl"]))
    index = NetworkIndex.build(((n.name, n.labels) for n in cluster.nodes), cluster.levels)
    views: list[NodeView | None] = [None] * len(index.nodes)
    for node in cluster.nodes:
        topo = cluster.topologies[node.topology]
        free = free_of(topo.n)
        alloc = pool.get(topo) if rng.random() < 0.9 else None
        views[index.position[node.name]] = NodeView(node.name, node.labels, topo.n, free, alloc)
    return index, views, [pool.get(t) for t in cluster.topologies]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_worst_cap_is_the_k_th_best_first_set_and_bounds_every_plan(seed: int) -> None:
    """Per domain with a plan on its fewest nodes k: the bound is the k-th best quality of a
    first member's set over the nodes with room (worked out here from the allocator), and the
    domain's plan has no better worst member."""
    rng = random.Random(seed)
    index, views, _ = _random_views(rng, lambda n: frozenset(g for g in range(n) if rng.random() < 0.6))
    counts = [len(v.free) if v is not None else 0 for v in views]
    g, n = rng.choice([1, 2, 4, 8]), rng.randint(1, 10)
    memo = PlanMemo()
    pb = gangdomain.Problem(index, views, np.array(counts), counts, [g] * n, memo, max(counts))
    level = rng.choice([lv for lv in index.levels if lv != "kubernetes.io/hostname"])
    lx = index.level(level)
    dfree, passing, bound = packing.equal_bounds(lx.domain_id, lx.count, counts, g, n)
    for d in passing:
        k = int(bound[d])
        positions = lx.members[d].tolist()
        held = tuple(views[p] for p in positions)
        _, firsts = gangdomain._domain_kinds(pb, held, positions)
        cap = gangdomain.worst_cap(firsts, k)
        qualities = []
        for p in positions:
            v = views[p]
            if v is not None and len(v.free) >= g:
                first = None if v.allocator is None else v.allocator.choose(sorted(v.free), g)
                qualities.append(member_quality(first) if first is not None else UNKNOWN_QUALITY)
        assert cap == sorted(qualities, reverse=True)[k - 1]
        got = gangdomain.evaluate(
            pb, level, d, k, [], lx.members[d], int(dfree[d]), lower_levels(index, level)
        )
        assert got.worst <= cap


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_node_kinds_kept_for_a_larger_gang_equal_a_fresh_pass(seed: int) -> None:
    """The kinds memo worked out for n members, read by a gang of fewer (cut down) or more
    (worked out again), gives the lists a fresh memo does."""
    rng = random.Random(seed)
    pool = AllocatorPool()
    cluster = preset_cluster(rng.choice(["default", "gb200-nvl"]))
    index = NetworkIndex.build(((n.name, n.labels) for n in cluster.nodes), cluster.levels)
    views: list[NodeView | None] = [None] * len(index.nodes)
    for node in cluster.nodes:
        topo = cluster.topologies[node.topology]
        free = frozenset(g for g in range(topo.n) if rng.random() < 0.7)
        views[index.position[node.name]] = NodeView(node.name, node.labels, topo.n, free, pool.get(topo))
    counts = [len(v.free) if v is not None else 0 for v in views]
    g = rng.choice([1, 2, 4])
    lx = index.level(rng.choice([lv for lv in index.levels if lv != "kubernetes.io/hostname"]))
    positions = lx.members[rng.randrange(lx.count)].tolist()
    held = tuple(views[p] for p in positions)
    shared = PlanMemo()
    for n in [rng.randint(1, 9) for _ in range(4)]:
        with_shared = gangdomain._domain_kinds(
            gangdomain.Problem(index, views, np.array(counts), counts, [g] * n, shared), held, positions
        )
        fresh = gangdomain._domain_kinds(
            gangdomain.Problem(index, views, np.array(counts), counts, [g] * n, PlanMemo()), held, positions
        )
        assert with_shared == fresh


def test_take_cost_memo_answers_as_a_fresh_objective() -> None:
    """take_cost kept across calls, demand mix versions and a changed weight equals that of a
    fresh objective over the same mix."""
    cluster = preset_cluster("default")
    pool = AllocatorPool()
    allocators = [pool.get(t) for t in cluster.topologies]
    mix = DemandMix(refresh=16)
    kept = ClusterObjective(mix)
    kept.learn(allocators)
    rng = random.Random(3)
    for step in range(600):
        for _ in range(rng.randint(0, 6)):
            mix.observe(rng.choice([1, 1, 2, 4, 8]), gang=rng.random() < 0.2)
        if step == 300:
            kept.frag_weight = 0.5
        a = rng.choice(allocators)
        free = frozenset(i for i in range(a.n) if rng.random() < 0.7)
        taken = rng.sample(sorted(free), rng.randint(0, len(free)))
        fresh = ClusterObjective(mix, frag_weight=kept.frag_weight)
        fresh.learn(allocators)
        assert kept.take_cost(a, free, taken) == fresh.take_cost(a, free, taken)
    assert mix.version > 10


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 6).flatmap(
        lambda count: st.tuples(
            st.just(count),
            st.lists(st.tuples(st.integers(0, count - 1), st.integers(0, 8)), min_size=1, max_size=40),
            st.sampled_from([1, 2, 4, 8]),
            st.integers(1, 12),
        )
    )
)
def test_equal_bounds_on_a_list_equal_those_on_an_array(
    case: tuple[int, list[tuple[int, int]], int, int],
) -> None:
    count, nodes, g, n = case
    domain_id = np.array([d for d, _ in nodes], dtype=np.int64)
    free = [f for _, f in nodes]
    a = packing.equal_bounds(domain_id, count, free, g, n)
    b = packing.equal_bounds(domain_id, count, np.array(free, dtype=np.int64), g, n)
    assert a[0].tolist() == b[0].tolist() and a[1] == b[1] and a[2].tolist() == b[2].tolist()


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_level_bounds_memoised_per_domain_equal_equal_bounds(seed: int) -> None:
    """`gang.domain.level_bounds` with one memo across changing free counts, member sizes and
    counts, on every level of a preset (single-node domains too), equals `packing.equal_bounds`."""
    rng = random.Random(seed)
    cluster = preset_cluster(rng.choice(["default", "mixed-leaf", "gb200-nvl"]))
    index = NetworkIndex.build(((n.name, n.labels) for n in cluster.nodes), cluster.levels)
    sizes = [cluster.topologies[n.topology].n for n in cluster.nodes]
    counts = [0] * len(index.nodes)
    memo = PlanMemo()
    for _ in range(20):
        for node, size in rng.sample(list(zip(cluster.nodes, sizes, strict=True)), 8):
            counts[index.position[node.name]] = rng.choice([0, size, rng.randint(0, size)])
        g, n = rng.choice([1, 2, 4, 8]), rng.randint(1, 12)
        pb = gangdomain.Problem(index, [None] * len(counts), np.array(counts), list(counts), [g] * n, memo)
        for level in (*index.levels, "*"):
            lx = index.level(level)
            got = gangdomain.level_bounds(pb, lx)
            want = packing.equal_bounds(lx.domain_id, lx.count, counts, g, n)
            assert (
                got[0].tolist() == want[0].tolist()
                and got[1] == want[1]
                and got[2].tolist() == want[2].tolist()
            )


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_threshold_read_off_single_offers_equals_the_binary_search(seed: int) -> None:
    """Where no node offers a second member (whole-node members, or one member per node), the
    threshold taken as the n-th best first set equals the binary search's, for every feasible
    k; elsewhere `_threshold` is the search itself."""
    rng = random.Random(seed)
    index, views, _ = _random_views(
        rng, lambda n: frozenset(range(n)) if rng.random() < 0.5 else frozenset(rng.sample(range(n), 2))
    )
    counts = [len(v.free) if v is not None else 0 for v in views]
    g = rng.choice([2, 4, 8])
    lx = index.level(rng.choice([lv for lv in index.levels if lv != "kubernetes.io/hostname"]))
    positions = lx.members[rng.randrange(lx.count)].tolist()
    held = tuple(views[p] for p in positions)
    room = sum(1 for p in positions if counts[p] >= g)
    for n in range(1, room + 1):
        pb = gangdomain.Problem(index, views, np.array(counts), counts, [g] * n, PlanMemo())
        kinds, _ = gangdomain._domain_kinds(pb, held, positions)
        bound = packing.equal_bounds(lx.domain_id, lx.count, counts, g, n)[2]
        k = int(bound[lx.domain_id[positions[0]]])
        assert gangdomain._threshold(kinds, k, n) == gangdomain._searched_threshold(kinds, k, n)


@pytest.mark.parametrize("preset", ["default", "mixed-leaf", "gb200-nvl"])
@pytest.mark.parametrize("seed", range(4))
def test_single_offer_path_plans_as_the_general_search(preset: str, seed: int) -> None:
    """Members too big for two to share a node (whole-node gangs and any size over half the
    roomiest node), with a moving demand mix, a memo and an objective kept across gangs, now
    and then a node of unknown topology or one missing from the list: the plan (or the NoPlan
    and its reason) equals the general search's with a fresh memo and objective, and the
    unpruned planner's."""
    rng = random.Random(100 + seed)
    mix = DemandMix(refresh=8)
    kept = ClusterObjective(mix)
    shared = PlanMemo()
    taken = {"single": 0, "planned": 0, "missed": 0}
    real = gangsingle.candidates

    def counting(*args: object) -> list[gangdomain.Candidate]:
        taken["single"] += 1
        return real(*args)  # type: ignore[arg-type]

    for step, (views, index, levels, allocators) in enumerate(_cluster_views(preset, rng, 40)):
        for _ in range(rng.randint(1, 12)):
            mix.observe(rng.choice([1, 1, 2, 4, 8]), gang=rng.random() < 0.3)
        if rng.random() < 0.2:  # unknown topology on a few nodes
            views = [
                v if rng.random() < 0.9 else NodeView(v.name, v.labels, v.gpu_count, v.free) for v in views
            ]
        if rng.random() < 0.2:  # a few nodes not offered (they count as full)
            views = [v for v in views if rng.random() < 0.9]
        roomiest = max(len(v.free) for v in views)
        largest = max(v.gpu_count for v in views)
        g = rng.randint(roomiest // 2 + 1, largest) if roomiest else largest
        # large ones too; every fifth fits nowhere (no node takes two members)
        n = (
            len(views) + 1
            if step % 5 == 4
            else rng.randint(1, 12)
            if rng.random() < 0.8
            else rng.randint(13, 70)
        )
        spec = GangSpec(f"ns/g{step}", tuple(Member(f"ns/p{k}", g) for k in range(n)))
        objective = kept if rng.random() < 0.8 else None
        with mock.patch.object(gangsingle, "candidates", counting):
            got = plan_gang(spec, views, levels, index=index, memo=shared, objective=objective)
        fresh = None if objective is None else ClusterObjective(mix)
        unpruned = None if objective is None else ClusterObjective(mix)
        for o in (fresh, unpruned):
            if o is not None:
                o.learn(allocators)
        with general_path():
            assert got == plan_gang(spec, views, levels, index=index, objective=fresh)
        assert got == plan_gang(spec, views, levels, index=index, prune=False, objective=unpruned)
        taken["planned" if isinstance(got, GangPlan) else "missed"] += 1
    assert taken["single"] > 20 and taken["planned"] > 10 and taken["missed"] > 0


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_single_offer_candidates_are_the_general_evaluations(seed: int) -> None:
    """Per level, the single-offer path's one candidate is the general evaluation
    (`gang.domain.evaluate`) of every passing domain that ranks first, (4)'s cost included,
    and the cost it carries is `plan_cost` of its assignment."""
    rng = random.Random(seed)
    index, views, allocators = _random_views(
        rng, lambda n: frozenset(range(n)) if rng.random() < 0.5 else frozenset(rng.sample(range(n), n // 2))
    )
    counts = [len(v.free) if v is not None else 0 for v in views]
    g = rng.randint(max(counts) // 2 + 1, max(counts))
    n = rng.randint(1, 10)
    mix = DemandMix(refresh=4)
    for _ in range(rng.randint(0, 20)):
        mix.observe(rng.choice([1, 2, 4, 8]), gang=rng.random() < 0.3)
    objective = ClusterObjective(mix) if rng.random() < 0.7 else None
    if objective is not None:  # as plan_gang does before any cost
        objective.learn([a.exact for a in allocators])
    pb = gangdomain.Problem(
        index, views, np.array(counts), counts, [g] * n, PlanMemo(), max(counts), objective
    )
    assert gangsingle.applies(pb)
    level = rng.choice([*index.levels, "*"])
    lx = index.level(level)
    lower = lower_levels(index, level)
    got = gangsingle.candidates(pb, lx, lower)
    dfree, passing, bound = packing.equal_bounds(lx.domain_id, lx.count, counts, g, n)
    general = [
        gangdomain.evaluate(pb, level, d, int(bound[d]), [], lx.members[d], int(dfree[d]), lower)
        for d in sorted(passing)
    ]
    if not general:
        assert got == []
        return
    priced = {
        c.domain: 0.0 if objective is None else plan_cost(objective, views, c.assignment) for c in general
    }
    assert got == [min(general, key=lambda c: c.rank(priced[c.domain]))]
    assert got[0].nodes_used == n
    assert got[0].cost == (None if objective is None else priced[got[0].domain])


@pytest.mark.parametrize("preset", ["default", "gb200-nvl"])
@pytest.mark.parametrize("seed", range(3))
def test_answers_kept_from_the_last_call_plan_as_a_fresh_memo(preset: str, seed: int) -> None:
    """What a shared memo keeps from one plan to the next (`planner._layout`'s node layout,
    `gang.singleoffer`'s per-node offers, domain rooms and picks), against a fresh memo each time,
    while the node list changes between calls as no simulator changes it: a few nodes left
    out, the list reversed, a name given twice (its last view counts), the objective switched
    between two (other weights) and none, now and then a gang too big for every node (a NoPlan
    before anything is learned). Every objective has learned every listed node's allocator
    once it planned over them."""
    rng = random.Random(300 + seed)
    mix = DemandMix(refresh=8)
    objectives = [ClusterObjective(mix), ClusterObjective(mix, frag_weight=0.25), None]
    shared = PlanMemo()
    planned = 0
    for step, (views, index, levels, allocators) in enumerate(_cluster_views(preset, rng, 60)):
        for _ in range(rng.randint(0, 6)):
            mix.observe(rng.choice([1, 2, 4, 8]), gang=rng.random() < 0.3)
        r = rng.random()
        if r < 0.15:
            views = [v for v in views if rng.random() < 0.9]
        elif r < 0.25:
            views = list(reversed(views))
        elif r < 0.3:
            v = views[rng.randrange(len(views))]
            views = [*views, NodeView(v.name, v.labels, v.gpu_count, frozenset(), v.allocator)]
        objective = rng.choice(objectives)
        largest = max(v.gpu_count for v in views)
        g = largest + 1 if step % 9 == 8 else rng.choice([largest, largest, largest // 2 + 1, 2, 1])
        spec = GangSpec(f"ns/g{step}", tuple(Member(f"ns/p{k}", g) for k in range(rng.randint(1, 10))))
        got = plan_gang(spec, views, levels, index=index, memo=shared, objective=objective)
        oracle = None
        if objective is not None:
            oracle = ClusterObjective(mix, frag_weight=objective.frag_weight)
            oracle.learn(allocators)
            if g <= largest:  # the shared objective folded in every listed node's server
                before = objective.learned
                objective.learn({v.allocator.exact for v in views if v.allocator is not None})
                assert objective.learned == before
        assert got == plan_gang(spec, views, levels, index=index, memo=PlanMemo(), objective=oracle)
        planned += isinstance(got, GangPlan)
    assert planned > 20
