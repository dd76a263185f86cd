"""The simulated sidecar's single-pod fast path must decide as the plain path it replaced.

`SidecarPolicy.place_pod` keeps, per class of identical nodes, what its score is made of
(efficiency, choice, keys, totals) and, per set of classes, which classes are at the best total.
The plain path asks `placement.node_scores` (with the cluster objective) of one node per class
on every pod, adds kube-scheduler's LeastAllocated (`kubesched.total_score`), picks with
`kubesched.select_host` and then a member at random: the oracle here, run with its own fresh
objective and memo over the same demand mix and a copy of the random stream. The pieces the
fast path is built from (`ClusterObjective.floor`/`key`, `placement.scores_in_order`) are checked
against the code `keys` and `node_scores` had before they were split.
"""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gputopo.network.levels import NetworkIndex
from gputopo.network.nodeview import ChoiceMemo, NodeView
from gputopo.node.allocator import AllocatorPool, Choice
from gputopo.node.policy import GpuPolicy
from gputopo.pod import kubesched
from gputopo.pod.leafpack import Leaves
from gputopo.pod.objective import ClusterObjective, DemandMix, single_key
from gputopo.pod.placement import MAX_SCORE, node_scores, rank_scores, scores_in_order
from gputopo.sim.clusters import default_cluster, preset_cluster
from gputopo.sim.policies import podclasses
from gputopo.sim.policies.base import Failure, Slot
from gputopo.sim.policies.sidecar import SidecarPolicy
from gputopo.sim.state import ClusterState, SimCluster

_keys = st.lists(
    st.tuples(st.booleans(), st.sampled_from([0.0, -0.0, 0.5, -1.25, 2.0]), st.integers(-2, 2)), max_size=12
)


def _old_scores(keys: list[tuple[object, ...]]) -> dict[tuple[object, ...], int]:
    """`node_scores`' ranking as it was written before `rank_scores` was split out."""
    distinct = sorted(set(keys), reverse=True)
    span = len(distinct) - 1
    rank = {key: r for r, key in enumerate(distinct)}
    return {k: MAX_SCORE if span == 0 else 1 + round((MAX_SCORE - 1) * (span - rank[k]) / span) for k in keys}


@settings(max_examples=400, deadline=None)
@given(_keys)
def test_scores_in_order_equal_the_ranking_of_node_scores(keys: list[tuple[object, ...]]) -> None:
    old = _old_scores(keys)
    assert rank_scores(keys) == old
    assert scores_in_order(keys) == [old[k] for k in keys]


def test_scores_in_order_past_the_table() -> None:
    keys = [(i,) for i in range(100)] + [(7,), (99,)]
    old = _old_scores(keys)  # type: ignore[arg-type]
    assert scores_in_order(keys) == [old[k] for k in keys]
    assert scores_in_order(keys)[:3] == [1, 1, 1] and scores_in_order(keys)[99] == MAX_SCORE


def _old_keys(
    obj: ClusterObjective, gpus: int, candidates: dict[tuple[GpuPolicy, frozenset[int]], Choice]
) -> dict[tuple[GpuPolicy, frozenset[int]], tuple[object, ...]]:
    """`ClusterObjective.keys` as it was written before `floor` and `key` were split out."""
    eff = {kind: obj.efficiency(kind[0].exact, gpus, c.ring_mbps) for kind, c in candidates.items()}
    top = max(eff.values(), default=1.0)
    out: dict[tuple[GpuPolicy, frozenset[int]], tuple[object, ...]] = {}
    for (policy, free), choice in candidates.items():
        e = eff[(policy, free)]
        ok = e >= (1 - obj.band) * top
        second = obj._cost(policy.exact, free, choice) if ok else round(e, 6)
        out[(policy, free)] = (ok, second, single_key(free, choice, gpus))
    return out


@pytest.mark.parametrize("preset", ["default", "mixed-leaf"])
def test_objective_keys_equal_the_unsplit_keys(preset: str) -> None:
    cluster = preset_cluster(preset)
    pool = AllocatorPool()
    allocators = [pool.get(t) for t in cluster.topologies]
    mix = DemandMix(refresh=8)
    rng = random.Random(11)
    memo = ChoiceMemo()
    for band in (0.0, 0.05, 0.5):
        obj, oracle = ClusterObjective(mix, band=band), ClusterObjective(mix, band=band)
        obj.learn(allocators)
        oracle.learn(allocators)
        for _ in range(150):
            mix.observe(rng.choice([1, 2, 4, 8]), gang=rng.random() < 0.2)
            gpus = rng.choice([1, 2, 3, 4, 8])
            kinds: dict[tuple[GpuPolicy, frozenset[int]], Choice] = {}
            for _ in range(rng.randint(0, 7)):
                a = rng.choice(allocators)
                free = frozenset(i for i in range(a.n) if rng.random() < 0.7)
                if len(free) >= gpus:
                    kinds[(a, free)] = memo.choose(a, free, gpus)
            assert obj.keys(gpus, kinds) == _old_keys(oracle, gpus, kinds)


def _slow_place(
    pol: SidecarPolicy, state: ClusterState, size: int, rng: random.Random
) -> tuple[Slot | Failure, dict[tuple[int, int], int]]:
    """The plain path: node_scores over one node per class with a fresh objective and memo,
    kube-scheduler's totals and choice, a member at random. Also returns the totals."""
    classes = state.classes
    room = [key for key in classes if key[1].bit_count() >= size]
    if not room:
        return Failure(f"no node has {size} free GPUs"), {}
    objective = ClusterObjective(pol.objective.mix)
    objective.learn(pol.objective._keep)
    memo = ChoiceMemo()
    views = [_view(pol.cluster, pol, min(classes[c]), c[1]) for c in room]
    scores = node_scores(size, views, memo=memo, objective=objective)
    totals = {
        c: kubesched.total_score(scores[v.name], len(v.free) - size, v.gpu_count)
        for c, v in zip(room, views, strict=True)
    }
    # every node of a class scores as the class's node does: node_scores over all of them agrees
    every = {n: c for c in room for n in classes[c]}
    by_node = node_scores(
        size, [_view(pol.cluster, pol, n, c[1]) for n, c in every.items()], objective=objective
    )
    rep = {c: v.name for c, v in zip(room, views, strict=True)}
    assert {pol.cluster.nodes[n].name: scores[rep[c]] for n, c in every.items()} == by_node
    # the sidecar's leaf packing over every node's score (gputopo.pod.leafpack), free GPUs
    # counted over every node of a leaf
    net = NetworkIndex.build(((n.name, n.labels) for n in pol.cluster.nodes), pol.cluster.levels)
    at = {net.position[node.name]: i for i, node in enumerate(pol.cluster.nodes)}
    packed = Leaves.of(net).pack_scores(by_node, net.position, lambda p: state.mask[at[p]].bit_count())
    entries: list[tuple[int, tuple[int, int], list[int]]] = []  # (total, class, its nodes at that score)
    for c, v in zip(room, views, strict=True):
        by_score: dict[int, list[int]] = {}
        for n in sorted(classes[c]):
            by_score.setdefault(packed[pol.cluster.nodes[n].name], []).append(n)
        for score, nodes in by_score.items():
            entries.append((kubesched.total_score(score, len(v.free) - size, v.gpu_count), c, nodes))
    k = kubesched.select_host([(t, len(nodes)) for t, _, nodes in entries], rng)
    _, chosen, members = entries[k]
    node = members[rng.randrange(len(members))] if len(members) > 1 else members[0]
    v = views[room.index(chosen)]
    assert v.allocator is not None
    return (node, tuple(sorted(memo.choose(v.allocator, v.free, size).indices))), totals


def _view(cluster: SimCluster, pol: SidecarPolicy, node: int, mask: int) -> NodeView:
    spec = cluster.nodes[node]
    n = cluster.topologies[spec.topology].n
    free = frozenset(i for i in range(n) if mask >> i & 1)
    return NodeView(spec.name, spec.labels, n, free, pol.allocators[spec.topology])


def _policy(cluster: SimCluster, pool: AllocatorPool, seed: int, refresh: int) -> SidecarPolicy:
    allocators = [pool.get(t) for t in cluster.topologies]
    pol = SidecarPolicy("gputopo", cluster, allocators, random.Random(seed), planner=True)
    pol.objective = ClusterObjective(DemandMix(refresh=refresh))  # versions change often
    pol.objective.learn(allocators)
    return pol


@pytest.mark.parametrize(
    ("preset", "seed"), [("default", 0), ("mixed-leaf", 1), ("gb200-nvl", 2), ("default", 3)]
)
def test_place_pod_decides_as_node_scores_per_class(preset: str, seed: int) -> None:
    """Pods placed, freed and observed at random: every answer, every total and the random
    stream equal the plain path's (ties among classes included: the state's order and the
    classes' sizes decide); a server learned midway renews the classes' parts."""
    cluster = preset_cluster(preset)
    pool = AllocatorPool()
    pol = _policy(cluster, pool, seed, refresh=5)
    oracle_rng = random.Random()
    oracle_rng.setstate(pol.rng.getstate())
    state = ClusterState(cluster)
    rng = random.Random(seed)
    placed: list[Slot] = []
    sizes = [1, 1, 1, 2, 2, 3, 4, 4, 8] + ([16] if max(state.size) >= 16 else [])
    failures = ties = 0
    for step in range(500):
        if step == 250:  # a server of another cluster: the best rings change for some sizes
            pol.objective.learn([pool.get(t) for t in preset_cluster("gb200-nvl").topologies])
            pol.objective.learn([pool.get(t) for t in default_cluster().topologies])
        if step % 37 == 36:  # as the bound on the classes' parts does, answers kept
            pol._parts.clear()
        size = rng.choice(sizes)
        pol.objective.mix.observe(size, gang=rng.random() < 0.1)
        want, totals = _slow_place(pol, state, size, oracle_rng)
        got = pol.place_pod(state, size)
        assert got == want
        assert pol.rng.getstate() == oracle_rng.getstate()
        ties += len(pol._tops[(size, frozenset(state.classes))]) > 1
        if totals:
            room = [c for c in state.classes if c[1].bit_count() >= size]
            assert pol._class_totals(room, size)[0] == [totals[c] for c in room]
        if isinstance(got, Failure):
            failures += 1
        else:
            state.take(*got)
            placed.append(got)
        while placed and rng.random() < 0.3:
            state.give(*placed.pop(rng.randrange(len(placed))))
    assert pol.objective.mix.version > 50
    assert 0 < failures < 400
    assert ties > 0  # classes at the top score: the choice among them is kube-scheduler's


@pytest.mark.parametrize("seed", [1, 3])
def test_the_same_classes_follow_the_demand_mix(seed: int) -> None:
    """States drawn at random, the demand mix swung between small pods and whole-node gangs on
    each: the answers follow it as the plain path's do (an answer is kept across mix versions
    only where no cost decides a rank), and for some set of classes the best ones do change
    with the mix (seeds where that happens on mixed-leaf)."""
    cluster = preset_cluster("mixed-leaf")
    pol = _policy(cluster, AllocatorPool(), seed, refresh=1)
    oracle_rng = random.Random()
    oracle_rng.setstate(pol.rng.getstate())
    rng = random.Random(seed)
    tops: dict[tuple[int, frozenset[tuple[int, int]]], set[tuple[tuple[int, int], ...]]] = {}
    for _ in range(20):
        state = ClusterState(cluster)
        for _ in range(rng.randint(10, 80)):
            node = rng.randrange(len(cluster.nodes))
            free = state.free(node)
            if len(free) > 1:
                state.take(node, rng.sample(free, rng.randint(1, len(free) - 1)))
        for _ in range(10):
            size, gang = rng.choice([(1, False), (2, False), (8, True), (8, False), (4, False)])
            for _ in range(rng.randint(1, 300)):
                pol.objective.mix.observe(size, gang=gang)
            for gpus in (1, 2, 4):
                want, _ = _slow_place(pol, state, gpus, oracle_rng)
                assert pol.place_pod(state, gpus) == want
                assert pol.rng.getstate() == oracle_rng.getstate()
                key = (gpus, frozenset(state.classes))
                tops.setdefault(key, set()).add(pol._tops[key])
    assert any(len(seen) > 1 for seen in tops.values())


def _random_state(cluster: SimCluster, rng: random.Random) -> ClusterState:
    """The cluster with a random share of its GPUs taken, node by node."""
    state = ClusterState(cluster)
    for _ in range(rng.randint(0, 3 * len(cluster.nodes))):
        node = rng.randrange(len(cluster.nodes))
        free = state.free(node)
        if free:
            state.take(node, rng.sample(free, rng.randint(1, len(free))))
    return state


@pytest.mark.parametrize(("preset", "seed"), [("default", 4), ("mixed-leaf", 5), ("gb200-nvl", 6)])
def test_best_classes_by_the_best_key_equal_the_full_totals(preset: str, seed: int) -> None:
    """`_best_classes` looks only at the classes with the best key (only it scores MAX_SCORE
    among up to `_ALONE_AT_TOP` classes): the same classes, in the same order, as those whose
    total (`_class_totals`) is at the top score, on random states and mix versions."""
    assert sorted(scores_in_order([(i,) for i in range(podclasses._ALONE_AT_TOP)]))[-2] < MAX_SCORE
    cluster = preset_cluster(preset)
    pol = _policy(cluster, AllocatorPool(), seed, refresh=3)
    rng = random.Random(seed)
    shortcut = costs = 0
    for _ in range(300):
        state = _random_state(cluster, rng)
        size = rng.choice([1, 2, 3, 4, 8])
        pol.objective.mix.observe(size, gang=rng.random() < 0.2)
        pol._renew()
        room = [c for c in state.classes if c[1].bit_count() >= size]
        if not room:
            continue
        for c in room:  # totals grow with the extender score (what the shortcut relies on)
            totals = pol._part(c, size)[4]
            assert all(a < b for a, b in itertools.pairwise(totals))
        totals, good = pol._class_totals(room, size)
        want = tuple(c for c, t in zip(room, totals, strict=True) if t >= podclasses._TOP_TOTAL)
        assert pol._best_classes(room, size) == (want, good <= 1)
        shortcut += len(room) <= podclasses._ALONE_AT_TOP
        costs += good >= 2  # the mix's costs decide among the good-enough classes
    assert shortcut > 50 and costs > 10


@pytest.mark.parametrize(("preset", "seed"), [("default", 7), ("mixed-leaf", 8)])
def test_a_kept_frame_answers_every_order_of_its_classes(preset: str, seed: int) -> None:
    """`_best_classes` keeps what no mix changes per set of classes with room (`_frame`, in the
    order first asked) across mix versions: asked in another order, after new versions, the
    answer is the full totals' in that order; a server learned empties the frames."""
    cluster = preset_cluster(preset)
    pool = AllocatorPool()
    pol = _policy(cluster, pool, seed, refresh=1)
    rng = random.Random(seed)
    reused = 0
    for step in range(300):
        if step == 150:
            assert pol._frames
            pol.objective.learn([pool.get(t) for t in preset_cluster("gb200-nvl").topologies])
            pol._renew()
            assert not pol._frames and not pol._fixed
        state = _random_state(cluster, rng)
        size = rng.choice([1, 2, 4])
        room = [c for c in state.classes if c[1].bit_count() >= size]
        for _ in range(3):
            pol.objective.mix.observe(rng.choice([1, 2, 4, 8]), gang=rng.random() < 0.3)
            pol._renew()
            rng.shuffle(room)
            reused += (size, frozenset(room)) in pol._frames
            totals, good = pol._class_totals(room, size)
            want = tuple(c for c, t in zip(room, totals, strict=True) if t >= podclasses._TOP_TOTAL)
            assert pol._best_classes(room, size) == (want, good <= 1)
    assert reused > 50
