"""The simulator's speed-ups must not change a decision.

Each fast path is checked against the path it short-cuts: the plain-Python small-cluster paths
of the planner (`packing.min_nodes_small`, `spread.select_equal`, `packing.equal_bounds`)
against the vectorised numpy ones, the objective's memos against a fresh objective, the
reservation table's early exit against a full scan, and the simulated sidecar with all its
caches against the same sidecar with every cache emptied before each pod.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gputopo.gang import asks, packing, spread
from gputopo.gang import planner as gang
from gputopo.gang import tracker as gangs
from gputopo.gang.memo import PlanMemo
from gputopo.gang.planner import GangPlan, GangSpec, Member, plan_gang
from gputopo.gang.reservations import Reservation, Reservations
from gputopo.network.levels import NetworkIndex
from gputopo.network.nodeview import ChoiceMemo, NodeView
from gputopo.node.allocator import AllocatorPool, Choice
from gputopo.node.policy import GpuPolicy
from gputopo.pod import objective as clusterobjective
from gputopo.pod.objective import ClusterObjective, DemandMix
from gputopo.sim.clusters import default_cluster, preset_cluster
from gputopo.sim.engine import RunConfig
from gputopo.sim.policies import sidecar
from gputopo.sim.policies.base import Failure, Slot
from gputopo.sim.run import simulate
from gputopo.sim.state import ClusterState, SimCluster
from gputopo.sim.workload import Job, generate


@contextmanager
def vectorised() -> Iterator[None]:
    """Every small-cluster path switched off: the numpy code answers."""
    with (
        mock.patch.object(packing, "SMALL_NODES", -1),
        mock.patch.object(gang, "SMALL_NODES", -1),
        mock.patch.object(spread, "SMALL_CANDIDATES", -1),
    ):
        yield


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 6).flatmap(
        lambda count: st.tuples(
            st.just(count),
            st.lists(st.tuples(st.integers(0, count - 1), st.integers(0, 4)), min_size=1, max_size=40),
            st.integers(-1, 12),
        )
    )
)
def test_min_nodes_on_lists_equals_the_vectorised_answer(
    case: tuple[int, list[tuple[int, int]], int],
) -> None:
    count, nodes, need = case
    domain_id = np.array([d for d, _ in nodes], dtype=np.int64)
    amount = np.array([a for _, a in nodes], dtype=np.int64)
    small = packing.min_nodes(domain_id, count, amount, need)
    with vectorised():
        big = packing.min_nodes(domain_id, count, amount, need)
    assert small.dtype == big.dtype and small.tolist() == big.tolist()


def _index(rng: random.Random, nodes: int) -> NetworkIndex:
    leaves, spines = rng.randint(1, 6), rng.randint(1, 3)
    names = [f"n{i:03d}" for i in range(nodes)]
    labels = [{"leaf": f"l{rng.randrange(leaves)}", "spine": f"s{rng.randrange(spines)}"} for _ in names]
    return NetworkIndex.build(zip(names, labels, strict=True), ("kubernetes.io/hostname", "leaf", "spine"))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_select_nodes_on_lists_equals_the_vectorised_answer(seed: int) -> None:
    rng = random.Random(seed)
    nodes = rng.randint(2, 40)
    index = _index(rng, nodes)
    lower = [index.level("spine"), index.level("leaf")]
    m = rng.randint(1, nodes)
    pos = np.array(sorted(rng.sample(range(nodes), m)), dtype=np.int64)
    w = rng.randint(1, 3)  # every candidate offers the same number of members
    weight = np.full(m, w, dtype=np.int64)
    free = np.array([rng.randint(0, 8) for _ in range(m)], dtype=np.int64)
    kind = np.array([rng.randrange(5) for _ in range(m)], dtype=np.int64)
    k = rng.randint(1, m)
    n = rng.randint(1, k * w)
    # the gang planner's cost to future demand orders the nodes when it has an objective:
    # few distinct values, so the ties behind it are exercised too
    cost = np.array([float(rng.randint(0, 2)) for _ in range(m)]) if seed % 2 else None
    small = spread.select_nodes(pos, weight, free, kind, k, n, lower, cost)
    with vectorised():
        assert small == spread.select_nodes(pos, weight, free, kind, k, n, lower, cost)
    # the single-offer planner calls the list path itself, with the levels' domain ids it keeps
    ids = [lx.domain_id.tolist() for lx in lower]
    costs = None if cost is None else cost.tolist()
    args = (pos.tolist(), w, free.tolist(), kind.tolist(), k, n, lower, costs)
    assert spread.select_equal(*args, ids) == small


@pytest.mark.parametrize("preset", ["default", "mixed-leaf", "gb200-nvl"])
@pytest.mark.parametrize("seed", range(3))
def test_plans_on_lists_equal_plans_on_arrays(preset: str, seed: int) -> None:
    """Random free sets that change a few nodes at a time, as in the simulator; gangs of equal
    (whole-node and partial) and mixed sizes; with a memo shared across gangs, as the tracker."""
    cluster = preset_cluster(preset)
    pool = AllocatorPool()
    allocators = [pool.get(t) for t in cluster.topologies]
    index = NetworkIndex.build(((n.name, n.labels) for n in cluster.nodes), cluster.levels)
    sizes = [cluster.topologies[n.topology].n for n in cluster.nodes]
    masks = [(1 << s) - 1 for s in sizes]
    rng = random.Random(seed)
    shared, shared_np = PlanMemo(), PlanMemo()
    planned = 0
    for step in range(60):
        for i in rng.sample(range(len(masks)), 8):
            masks[i] = rng.getrandbits(sizes[i]) if rng.random() < 0.7 else 0
        views = [
            NodeView(
                node.name,
                node.labels,
                sizes[i],
                frozenset(g for g in range(sizes[i]) if masks[i] >> g & 1),
                allocators[node.topology],
            )
            for i, node in enumerate(cluster.nodes)
        ]
        g = rng.choice([1, 2, 4, 8])
        members = (
            [g] * rng.randint(2, 16) if rng.random() < 0.8 else [rng.choice([1, 2, 4]) for _ in range(5)]
        )
        spec = GangSpec(f"ns/g{step}", tuple(Member(f"ns/p{k}", s) for k, s in enumerate(members)))
        got = plan_gang(spec, views, cluster.levels, index=index, memo=shared)
        with vectorised():
            want = plan_gang(spec, views, cluster.levels, index=index, memo=shared_np)
        assert got == want
        planned += isinstance(got, GangPlan)
    assert planned > 10


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("arxe"), st.integers(0, 5), st.integers(0, 9)), max_size=40))
@example([("a", 0, 8), ("r", 0, 2), ("e", 0, 5)])  # a renewal may bring an expiry forward
def test_expired_equals_a_full_scan(ops: list[tuple[str, int, int]]) -> None:
    """add / renew / release / expired in any order (time need not be monotone)."""
    table = Reservations()
    for op, who, t in ops:
        gang, pod = f"g{who % 3}", f"p{who}"
        if op == "a":
            table.add([Reservation(pod, gang, "node", (0,), 1, float(t))])
        elif op == "r":
            table.renew_gang(gang, float(t))
        elif op == "x":
            table.release_pod(pod)
        else:
            scan = {r.gang for r in table if r.expires_at <= t}
            assert not scan or table.earliest <= t  # `GangTracker.expire` returns below it
            assert table.expired(float(t)) == scan


def test_objective_memos_answer_as_a_fresh_objective() -> None:
    """Keys from one objective kept across pods and demand mix versions equal those of a fresh
    objective over the same mix."""
    cluster = default_cluster()
    pool = AllocatorPool()
    allocators = [pool.get(t) for t in cluster.topologies]
    mix = DemandMix(refresh=16)
    kept = ClusterObjective(mix)
    kept.learn(allocators)
    rng = random.Random(7)
    memo = ChoiceMemo()
    for _ in range(400):
        for _ in range(rng.randint(1, 8)):
            mix.observe(rng.choice([1, 1, 2, 4, 8]), gang=rng.random() < 0.2)
        gpus = rng.choice([1, 2, 4, 8])
        kinds: dict[tuple[GpuPolicy, frozenset[int]], Choice] = {}
        for _ in range(rng.randint(1, 6)):
            a = rng.choice(allocators)
            free = frozenset(i for i in range(a.n) if rng.random() < 0.6)
            if len(free) >= gpus:
                kinds[(a, free)] = memo.choose(a, free, gpus)
        fresh = ClusterObjective(mix)
        fresh.learn(allocators)
        assert kept.keys(gpus, kinds) == fresh.keys(gpus, kinds)
    assert mix.version > 10


def _decisions(cluster: SimCluster, seed: int, cold: bool) -> list[object]:
    """Every placement of a gputopo run; `cold` empties the sidecar's and the objective's caches
    before each single pod (the planner's memo is covered above)."""
    jobs = generate(
        1500,
        capacity_gpus=cluster.capacity,
        load=0.8,
        rng=np.random.default_rng(seed),
        max_gpus=cluster.capacity,
    )
    log: list[object] = []
    place_pod, place = sidecar.SidecarPolicy.place_pod, sidecar.SidecarPolicy.place

    def recorded(self: sidecar.SidecarPolicy, state: ClusterState, job: Job) -> list[Slot] | Failure:
        got = place(self, state, job)
        log.append((job.id, got))
        return got

    def emptied(
        self: sidecar.SidecarPolicy, state: ClusterState, size: int, waiting: int | None = None
    ) -> Slot | Failure:
        for cache in (
            self._tops,
            self._by_room,
            self._static,
            self._fixed,
            self._frames,
            self._parts,
            self._good,
            self._views,
            self._rings,
            self._ring_ok,
        ):
            cache.clear()
        self.ring_wait._good.clear()
        self.objective = ClusterObjective(self.objective.mix)
        self.objective.learn(self.allocators)
        return place_pod(self, state, size, waiting)

    with (
        mock.patch.object(sidecar.SidecarPolicy, "place", recorded),
        mock.patch.object(sidecar.SidecarPolicy, "place_pod", emptied if cold else place_pod),
    ):
        simulate(cluster, jobs, "gputopo", RunConfig(seed=seed), pool=AllocatorPool())
    return log


@pytest.mark.parametrize(("preset", "seed"), [("default", 0), ("mixed-leaf", 1)])
def test_the_sidecar_with_its_caches_places_as_without_them(preset: str, seed: int) -> None:
    cluster = preset_cluster(preset)
    warm = _decisions(cluster, seed, cold=False)
    assert len(warm) > 1000
    assert warm == _decisions(cluster, seed, cold=True)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_fits_now_for_equal_members_equals_a_plain_domain_sum(seed: int) -> None:
    """The waiting gang's check (`gang.levelwait.fits_now`, plain Python for members of one size)
    against its definition on the index's arrays: per level, some domain whose nodes' slots of
    the member size (free GPUs // size) reach the member count; nodes missing from the index
    or offered twice change nothing."""
    from gputopo.gang import levelwait as gangwait
    from gputopo.network.levels import CLUSTER

    rng = random.Random(seed)
    nodes = rng.randint(1, 30)
    index = _index(rng, nodes)
    size, count = rng.choice([1, 2, 4, 8]), rng.randint(1, 6)
    spec = GangSpec("g", tuple(Member(f"p{i}", size) for i in range(count)))
    views = [
        NodeView(name, {}, 8, frozenset(rng.sample(range(8), rng.randint(0, 8))))
        for name in rng.sample(list(index.nodes), rng.randint(1, nodes))
    ]
    offered = views + views[:2] + [NodeView("not-in-index", {}, 8, frozenset(range(8)))]
    levels = ("kubernetes.io/hostname", "leaf", "spine", CLUSTER)
    free = np.zeros(len(index.nodes), dtype=np.int64)
    for v in views:
        free[index.position[v.name]] = len(v.free)
    want = [bool((index.free_per_domain(level, free // size) >= count).any()) for level in levels]
    assert gangwait.fits_now(spec, offered, index, levels) == want


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_slot_count_kept_across_calls_equals_a_fresh_count(seed: int) -> None:
    """`gang.levelwait.SlotCount` (the waiting gang's check, kept from one call to the next and
    brought up to date by the nodes that are another object) answers as a fresh
    `_fits_now_equal` over a run of calls: a few nodes changing their free GPUs at a time, a
    node renamed at its position, a name given twice, a node missing from the index, another
    index, other member sizes and counts, and levels asked for the first time later on."""
    from gputopo.gang import levelwait as gangwait
    from gputopo.network.levels import CLUSTER

    rng = random.Random(seed)
    nodes = rng.randint(1, 24)
    indexes = [_index(rng, nodes), _index(rng, nodes)]
    names = list(indexes[0].nodes)
    views = [NodeView(name, {}, 8, frozenset(rng.sample(range(8), rng.randint(0, 8)))) for name in names]
    kept = gangwait.SlotCount()
    levels_all = ("kubernetes.io/hostname", "leaf", "spine", CLUSTER)
    for _ in range(30):
        for i in rng.sample(range(len(views)), min(len(views), rng.randint(0, 3))):
            views[i] = NodeView(views[i].name, {}, 8, frozenset(rng.sample(range(8), rng.randint(0, 8))))
        offered = list(views)
        twist = rng.random()
        if twist < 0.1 and len(offered) > 1:  # a name given twice: the full pass decides
            offered[0] = NodeView(offered[1].name, {}, 8, frozenset(range(rng.randint(0, 8))))
        elif twist < 0.2:  # a node the index does not know
            offered.append(NodeView("not-in-index", {}, 8, frozenset(range(8))))
        elif twist < 0.3 and len(offered) > 1:  # two nodes swap places in the list
            offered[0], offered[-1] = offered[-1], offered[0]
        index = indexes[rng.random() < 0.2]
        size, count = rng.choice([1, 2, 4, 8]), rng.randint(1, 8)
        levels = tuple(rng.sample(levels_all, rng.randint(1, len(levels_all))))
        want = gangwait._fits_now_equal(size, count, offered, index, levels)
        assert kept.fits(size, count, offered, index, levels) == want


def test_spec_check_gives_the_reason_of_the_member_by_member_check() -> None:
    """`planner._spec_problem`'s one-pass check of the common case answers as its definition,
    member by member in spec order (the first bad size or repeated pod names the reason)."""

    def definition(spec: GangSpec) -> str:
        if not spec.members:
            return f"gang {spec.key} has no pending members to place"
        seen: set[str] = set()
        for m in spec.members:
            if not isinstance(m.gpus, int) or isinstance(m.gpus, bool) or m.gpus < 1:
                return f"pod {m.pod} asks for {m.gpus!r} GPUs; gang members must ask for at least 1"
            if m.pod in seen:
                return f"pod {m.pod} is listed twice in gang {spec.key}"
            seen.add(m.pod)
        return ""

    class Sized(int):
        pass

    rng = random.Random(7)
    odd: list[object] = [1, 2, 8, 0, -1, True, False, 1.0, "2", None, Sized(2)]
    for _ in range(500):
        members = tuple(
            Member(f"p{rng.randrange(4)}", rng.choice(odd))  # type: ignore[arg-type]
            for _ in range(rng.randint(0, 4))
        )
        spec = GangSpec("ns/g", members)
        assert gang._spec_problem(spec) == definition(spec)


def test_problem_free_array_is_made_from_the_counts_when_first_read() -> None:
    """`plan_gang` hands `Problem` no free GPU array (the single-offer path reads lists): the
    general path reads the same array as it was given before."""
    from gputopo.gang import domain as gangdomain

    index = NetworkIndex.build([("a", {}), ("b", {})], ("kubernetes.io/hostname",))
    pb = gangdomain.Problem(index, [None, None], None, [3, 5], [1], PlanMemo())
    assert pb.free.tolist() == [3, 5] and pb.free.dtype == np.int64
    assert pb.free is pb.free  # made once


def _gang_run(seed: int, every_quorum_filter: bool) -> tuple[list[object], Counter[str]]:
    """Every placement of a gputopo run with arriving members, and the tracker's events by kind;
    with `every_quorum_filter`, each member before the last is filtered as it appears (after
    the first, which the sidecar asks), as the simulator did before it asked only the first."""
    cluster = default_cluster()
    jobs = generate(
        1200, capacity_gpus=cluster.capacity, load=0.8, rng=np.random.default_rng(seed), max_gpus=64
    )
    log: list[object] = []
    kinds: Counter[str] = Counter()
    place, filt, drain = sidecar.SidecarPolicy.place, gangs.GangTracker.filter, gangs.GangTracker.drain

    def recorded(self: sidecar.SidecarPolicy, state: ClusterState, job: Job) -> list[Slot] | Failure:
        got = place(self, state, job)
        log.append((job.id, got))
        return got

    def every(self: gangs.GangTracker, ask: asks.GangAsk, offer, views, index, now):  # type: ignore[no-untyped-def]
        got = filt(self, ask, offer, views, index, now)
        need = ask.min_member or 0
        if every_quorum_filter and len(ask.members) == 1 and need > 1:
            assert isinstance(got, asks.Wait) and "waiting for members" in got.reason
            for k in range(2, need):  # the members up to the last, later on
                members = tuple(asks.GangMember(f"{ask.gang}-{i}", ask.members[0].gpus) for i in range(k))
                more = asks.GangAsk(ask.gang, members[-1].pod, members, need)
                again = filt(self, more, offer, views, index, now + k)
                assert isinstance(again, asks.Wait) and "waiting for members" in again.reason
        return got

    def counted(self: gangs.GangTracker) -> list[asks.Event]:
        out = drain(self)
        kinds.update(e.kind for e in out)
        return out

    with (
        mock.patch.object(sidecar.SidecarPolicy, "place", recorded),
        mock.patch.object(gangs.GangTracker, "filter", every),
        mock.patch.object(gangs.GangTracker, "drain", counted),
    ):
        simulate(cluster, jobs, "gputopo", RunConfig(seed=seed), pool=AllocatorPool())
    return log, kinds


@pytest.mark.parametrize("seed", [0, 3])
def test_asking_only_the_first_member_for_quorum_places_as_asking_each(seed: int) -> None:
    """The simulated sidecar filters only the first of a gang's members before the last (the
    others' answer is the same quorum wait, with nothing kept but its event): a run that
    filters each of them places every job the same, and differs only in quorum events."""
    fast, fast_kinds = _gang_run(seed, every_quorum_filter=False)
    slow, slow_kinds = _gang_run(seed, every_quorum_filter=True)
    assert len(fast) > 500 and fast_kinds["plan"] > 50
    assert fast == slow
    assert slow_kinds["quorum_wait"] > fast_kinds["quorum_wait"] > 0
    assert {k: v for k, v in fast_kinds.items() if k != "quorum_wait"} == {
        k: v for k, v in slow_kinds.items() if k != "quorum_wait"
    }


def _bind_run(
    preset: str, seed: int, lifecycle: sidecar.Lifecycle
) -> tuple[list[object], list[object], dict[str, float], list[object], int]:
    """Every placement of a gputopo run, every tracker event, the lifecycle's figures, after
    each placement the tracker's state a later placement can read (plans, reservations, first
    filters, back-offs, the reservation table's version), and how many plans were bound at once."""
    cluster = default_cluster() if preset == "default" else preset_cluster(preset)
    jobs = generate(
        900, capacity_gpus=cluster.capacity, load=0.8, rng=np.random.default_rng(seed), max_gpus=64
    )
    log: list[object] = []
    events: list[object] = []
    after: list[object] = []
    place, drain = sidecar.SidecarPolicy.place, gangs.GangTracker.drain
    at_once = sidecar.SidecarPolicy._bound_at_once
    figures: dict[str, float] = {}
    shortcuts = [0]

    def counted(self: sidecar.SidecarPolicy, *args: object) -> object:
        got = at_once(self, *args)  # type: ignore[arg-type]
        shortcuts[0] += got is not None
        return got

    def recorded(self: sidecar.SidecarPolicy, state: ClusterState, job: Job) -> list[Slot] | Failure:
        got = place(self, state, job)
        t = self.tracker
        log.append((job.id, got))
        after.append(
            (
                dict(t.plans),
                sorted(r.pod for r in t.reservations),
                dict(t._first_seen),
                sorted(t._backoff),
                t.reservations.version,
            )
        )
        figures.update(self.figures())
        return got

    def kept(self: gangs.GangTracker) -> list[asks.Event]:
        out = drain(self)
        events.extend(out)
        return out

    with (
        mock.patch.object(sidecar.SidecarPolicy, "place", recorded),
        mock.patch.object(gangs.GangTracker, "drain", kept),
        mock.patch.object(sidecar.SidecarPolicy, "_bound_at_once", counted),
    ):
        simulate(cluster, jobs, "gputopo", RunConfig(seed=seed, lifecycle=lifecycle), pool=AllocatorPool())
    return log, events, figures, after, shortcuts[0]


@pytest.mark.parametrize(
    ("preset", "seed", "life", "shortcut"),
    [
        ("default", 0, sidecar.Lifecycle(), True),
        ("mixed-leaf", 1, sidecar.Lifecycle(arrival_spread_s=0.0), True),
        ("gb200-nvl", 2, sidecar.Lifecycle(reservation_ttl_s=5.0, spill_after_s=30.0), True),
        ("default", 3, sidecar.Lifecycle(reservation_ttl_s=1.0), False),  # would lapse: the loop
        ("default", 4, sidecar.Lifecycle(bind_failure_rate=0.2), False),  # failures: the loop
    ],
)
def test_binding_a_plan_at_once_places_as_binding_member_by_member(
    preset: str, seed: int, life: sidecar.Lifecycle, shortcut: bool
) -> None:
    """Where no bind can fail and no reservation lapse, the simulated sidecar binds a new plan's
    members without a filter per member (`SidecarPolicy._bound_at_once`): a run that binds each
    through the tracker's verbs places every job the same, with the same events and figures,
    the same bind draws (later arrivals read the same stream) and the same tracker state after
    every placement."""
    from dataclasses import replace

    fast = _bind_run(preset, seed, life)
    slow = _bind_run(preset, seed, replace(life, bind_one_by_one=True))
    gangs_placed = sum(1 for _, got in fast[0] if isinstance(got, list) and len(got) > 1)
    assert gangs_placed > 50
    assert fast[4] == (gangs_placed if shortcut else 0) and slow[4] == 0
    assert fast[:4] == slow[:4]


def test_the_tracker_learns_every_new_server_once() -> None:
    """`GangTracker._learn` asks the objective only for policies it has not seen: the objective
    ends up as one that learned every view's server at every plan."""
    from gputopo.network.levels import HOSTNAME
    from gputopo.node.topofile import load_preset

    pool = AllocatorPool()
    small, big = pool.get(load_preset("pcie8-plx")), pool.get(load_preset("dgx-a100"))
    objective = ClusterObjective(DemandMix())
    tracker = gangs.GangTracker((HOSTNAME,), objective=objective)
    index = NetworkIndex.build([("a", {}), ("b", {})], (HOSTNAME,))
    want = ClusterObjective(DemandMix())
    for k, (first, second) in enumerate([(small, small), (small, big), (big, small)]):
        views = {
            "a": NodeView("a", {}, 8, frozenset(range(8)), first),
            "b": NodeView("b", {}, 8, frozenset(range(8)), second),
        }
        members = (asks.GangMember(f"g{k}-0", 8), asks.GangMember(f"g{k}-1", 8))
        got = tracker.filter(asks.GangAsk(f"g{k}", f"g{k}-0", members, 2), ["a", "b"], views, index, 0.0)
        assert isinstance(got, asks.Planned)
        want.learn({v.allocator.exact for v in views.values() if v.allocator is not None})
        assert objective.learned == want.learned
        for a in {v.allocator.exact for v in views.values() if v.allocator is not None}:
            for g in (2, 4, 8):
                assert objective.efficiency(a, g, 1000) == want.efficiency(a, g, 1000)
                assert objective.efficiency(a, g, a.best_ring_mbps(g)) == want.efficiency(
                    a, g, a.best_ring_mbps(g)
                )
    assert objective.learned == 2


# --------------------------------------------------------------------------- the objective's costs


class _PlainMix:
    """`DemandMix` as written before its singles became a list and its decay steps were kept:
    the oracle of `test_demand_mix_observes_as_the_plain_mix`."""

    def __init__(self, prior: dict[int, float], half_life: float, refresh: int) -> None:
        total = sum(prior.get(m, 0.0) for m in (1, 2, 4, 8))
        self.decay = 0.5 ** (1.0 / half_life)
        self.single = {m: 100.0 * prior.get(m, 0.0) / total for m in (1, 2, 4, 8)}
        self.gang, self.version, self.refresh, self.pending = 0.0, 0, max(1, refresh), 0
        self.frozen = self.shares()

    def observe(self, gpus: int, gang: bool) -> None:
        if gpus < 1:
            return
        factor = self.decay**gpus
        for m in (1, 2, 4, 8):
            self.single[m] *= factor
        self.gang *= factor
        if gang:
            self.gang += gpus
        else:
            self.single[next((m for m in (1, 2, 4) if gpus <= m), 8)] += gpus
        self.pending += 1
        if self.pending >= self.refresh or self.version == 0:
            self.pending = 0
            self.frozen = self.shares()
            self.version += 1

    def shares(self) -> tuple[dict[int, float], dict[int, float]]:
        total = sum(self.single.values()) + self.gang
        single = {m: v / total for m, v in self.single.items()}
        whole = dict(single)
        whole[8] = single.get(8, 0.0) + self.gang / total
        return single, whole


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.sampled_from([1, 2, 4, 8]), st.floats(0.01, 5.0), min_size=1),
    st.floats(1.0, 50_000.0),
    st.integers(1, 40),
    st.lists(st.tuples(st.integers(-1, 70), st.booleans()), max_size=300),
)
def test_demand_mix_observes_as_the_plain_mix(
    prior: dict[int, float], half_life: float, refresh: int, pods: list[tuple[int, bool]]
) -> None:
    """`DemandMix.observe` keeps its decay per size and its singles in a list: the same shares,
    bit for bit, and the same version bumps as the plain dict code after every pod."""
    mix, plain = DemandMix(prior, half_life, refresh), _PlainMix(prior, half_life, refresh)
    for gpus, gang_member in pods:
        mix.observe(gpus, gang=gang_member)
        plain.observe(gpus, gang_member)
        assert mix.version == plain.version
        for m in (1, 2, 3, 4, 8, 16):
            assert mix.single(m) == plain.frozen[0].get(m, 0.0)
            assert mix.whole(m) == plain.frozen[1].get(m, 0.0)


def _plain_cost(
    obj: ClusterObjective, alloc: GpuPolicy, free: frozenset[int], choice: Choice, exact: bool = False
) -> float:
    """`ClusterObjective._cost` as written before the mix-free parts were kept across versions:
    `_value` of both sets from the groups, `_frag_growth` from the worths, nothing memoised."""
    a = alloc.exact
    mix = obj.mix

    def value(mask: int) -> float:
        groups = a.groups([i for i in range(a.n) if mask >> i & 1])
        terms = [(m, obj.efficiency(a, m, best), count) for m, best, count in groups]
        return sum(mix.single(m) * m * eff * count for m, eff, count in terms)

    f_mask = sum(1 << i for i in free)
    r_mask = f_mask & ~sum(1 << i for i in choice.indices)
    before, after = f_mask.bit_count(), r_mask.bit_count()
    cost = value(f_mask) - value(r_mask)
    growth = 0.0
    for m in (2, 4, 8):
        worth = obj.efficiency(a, m, a.best_ring_mbps(m)) if a.n >= m else 0.0
        growth += mix.whole(m) * worth * ((after % m) - (before % m))
    cost += obj.frag_weight * growth
    return -cost if exact else -round(cost, 6)


@pytest.mark.parametrize(
    ("preset", "frag_weight", "exact"),
    [
        ("default", 1.0, False),
        ("mixed-leaf", 0.3, False),
        ("gb200-nvl", 2.5, False),
        ("mixed-leaf", 1.0, True),
    ],
)
def test_costs_kept_across_mix_versions_equal_the_plain_costs(
    preset: str, frag_weight: float, exact: bool
) -> None:
    """A cost asked again after many mix versions weighs what it kept (`_recipes`, `_weights`):
    the same float as the plain computation, for good-enough keys (`key`, `cost`) and for the
    planner's `take_cost`; a new weight is followed too. `exact`: with the rounding taken out
    of both, so that a difference in the last bit shows."""
    with mock.patch.object(clusterobjective, "round", (lambda x, n: x) if exact else round, create=True):
        _costs_across_versions(preset, frag_weight, exact)


def _costs_across_versions(preset: str, frag_weight: float, exact: bool) -> None:
    cluster = preset_cluster(preset)
    pool = AllocatorPool()
    allocators = [pool.get(t) for t in cluster.topologies]
    obj = ClusterObjective(DemandMix(refresh=3), frag_weight=frag_weight)
    obj.learn(allocators)
    rng = random.Random(5)
    memo = ChoiceMemo()
    asked: list[tuple[GpuPolicy, frozenset[int], Choice, int]] = []
    for step in range(600):
        if step == 400:
            obj.frag_weight = frag_weight / 2
        obj.mix.observe(rng.choice([1, 1, 2, 4, 8]), gang=rng.random() < 0.3)
        if len(asked) < 60 or rng.random() < 0.2:
            a = rng.choice(allocators)
            free = frozenset(i for i in range(a.n) if rng.random() < 0.7)
            gpus = rng.choice([g for g in (1, 2, 3, 4, 8) if g <= max(len(free), 1)])
            if len(free) >= gpus:
                asked.append((a, free, memo.choose(a, free, gpus), gpus))
        for a, free, choice, gpus in rng.sample(asked, min(len(asked), 8)):
            want = _plain_cost(obj, a, free, choice, exact)
            assert obj.cost(a, free, choice) == want
            eff = obj.efficiency(a.exact, gpus, choice.ring_mbps)
            assert obj.key(gpus, a, free, choice, eff, True)[1] == want
            taken = obj.take_cost(a, free, choice.indices)  # the same cost, unrounded, the other sign
            assert (-taken if exact else -round(taken, 6)) == want
    assert obj.mix.version > 100
