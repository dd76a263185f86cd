"""A gang waiting for its own level is asked again only when the answer could differ.

The simulated sidecar skips the tracker's full pass for a gang whose last answer was "wait
for a domain of your own level" while no domain of that level can hold it yet
(`gputopo.sim.policies.levelwaits`) and the tracker's `repeat_wait` finds nothing else changed (spill
time, first filter, plan, offer). Checked three ways: the incremental domain count against a
count from scratch (`gang.levelwait.fits_now` on fresh views) over random takes and frees; the
tracker's repeated answer against a real filter (same Wait, same back-off and events); and
whole simulator runs with and without the skip (same placements, failures, events, figures).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gputopo.gang.asks import Event, GangAsk, GangMember, Planned, Wait
from gputopo.gang.levelwait import LevelWait, fits_now
from gputopo.gang.planner import GangSpec, Member
from gputopo.gang.tracker import GangTracker
from gputopo.network.levels import CLUSTER, HOSTNAME, LEAF, SPINE, NetworkIndex
from gputopo.network.nodeview import NodeView
from gputopo.node.allocator import AllocatorPool
from gputopo.sim.cli import add_arguments, prepare
from gputopo.sim.clusters import preset_cluster
from gputopo.sim.metrics import Recorder
from gputopo.sim.policies import sidecar
from gputopo.sim.policies.base import Failure, Slot
from gputopo.sim.policies.levelwaits import LevelWaits
from gputopo.sim.run import simulate
from gputopo.sim.state import ClusterState
from gputopo.sim.workload import Job
from tests.test_gang_objective import A100, INDEX, NAMES, TLEVELS, views

# --------------------------------------------------------------------------- the domain count


def _still_waits(state: ClusterState, index: NetworkIndex, wait: LevelWait) -> bool:
    """From scratch: no domain of the level holds the gang's count of slots, the cluster does."""
    cluster = state.cluster
    offered = [
        NodeView(n.name, n.labels, state.size[i], frozenset(state.free(i)))
        for i, n in enumerate(cluster.nodes)
    ]
    here, anywhere = fits_now(wait.spec, offered, index, (wait.level, CLUSTER))
    return anywhere and not here


@pytest.mark.parametrize("preset", ["default", "mixed-leaf", "gb200-nvl"])
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_the_parked_count_equals_a_count_from_scratch(preset: str, seed: int) -> None:
    """Random takes and frees a few nodes at a time; at every step a parked answer is kept
    exactly while the definition holds (parked again, as the sidecar does after a real ask,
    when it holds anew)."""
    rng = random.Random(seed)
    cluster = preset_cluster(preset)
    index = NetworkIndex.build(((n.name, n.labels) for n in cluster.nodes), cluster.levels)
    state = ClusterState(cluster)
    for i in range(len(state.mask)):  # a busy start: most nodes mostly taken
        taken = [g for g in state.free(i) if rng.random() < 0.85]
        state.take(i, taken)
    size = rng.choice([g for g in (1, 2, 4, 8) if g <= max(state.size)])
    count = rng.randint(2, 12)
    level = rng.choice([lv for lv in cluster.levels if lv != "kubernetes.io/hostname"])
    spec = GangSpec("sim/g", tuple(Member(f"sim/p{k}", size) for k in range(count)))
    wait = LevelWait(spec, level, index, 0.0, math.inf)
    waits = LevelWaits([n.name for n in cluster.nodes])
    parked = False
    for _ in range(60):
        holds = _still_waits(state, index, wait)
        got = waits.unchanged(7, state)
        assert (got is wait) == (parked and holds) and (got is None or got is wait)
        assert waits.unchanged(7, state) is got  # asked again on the same masks: the same answer
        parked = got is not None
        if holds and not parked:
            waits.park(7, wait, state)
            parked = True
        assert len(waits) == parked
        for i in rng.sample(range(len(state.mask)), rng.randint(1, 4)):
            free = state.free(i)
            if free and rng.random() < 0.5:
                state.take(i, rng.sample(free, rng.randint(1, len(free))))
            else:
                gone = [g for g in range(state.size[i]) if g not in free]
                if gone:
                    state.give(i, rng.sample(gone, rng.randint(1, len(gone))))


def test_a_wait_that_does_not_hold_is_not_parked() -> None:
    cluster = preset_cluster("default")
    index = NetworkIndex.build(((n.name, n.labels) for n in cluster.nodes), cluster.levels)
    state = ClusterState(cluster)  # empty: every leaf holds two 8-GPU members
    spec = GangSpec("sim/g", (Member("sim/p0", 8), Member("sim/p1", 8)))
    waits = LevelWaits([n.name for n in cluster.nodes])
    waits.park(1, LevelWait(spec, LEAF, index, 0.0, math.inf), state)
    assert len(waits) == 0 and waits.unchanged(1, state) is None


# --------------------------------------------------------------------------- the tracker


def _ask() -> GangAsk:
    return GangAsk("ml/g", "ml/w-1", tuple(GangMember(f"ml/w-{i}", 8) for i in range(2)), 2)


def _events(t: GangTracker) -> list[tuple[str, str, str, str, dict[str, object]]]:
    return [(e.kind, e.gang, e.reason, e.cause, dict(e.fields)) for e in t.drain()]


def test_repeat_wait_answers_and_books_as_a_real_filter() -> None:
    """One free node per leaf: the gang waits for a leaf. Asked again over new views of the
    same capacity, `repeat_wait` gives filter's Wait with the same doubling back-off and
    plan_failed events, whichever is used at each step."""
    real, fast = GangTracker(TLEVELS, spill_after_s=600.0), GangTracker(TLEVELS, spill_after_s=600.0)
    offer = frozenset(NAMES)
    for t in (real, fast):
        first = t.filter(_ask(), offer, views({"a1", "b1"}), INDEX, 100.0)
        assert isinstance(first, Wait) and "waiting for one leaf domain" in first.reason
    wait = fast.level_wait("ml/g")
    assert wait is not None and (wait.level, wait.size, wait.count, wait.since) == (LEAF, 8, 2, 100.0)
    assert _events(real) == _events(fast)
    delays = []
    for now in (101.0, 103.5, 180.0, 699.0):
        vs = views({"a1", "b1"})
        want = real.filter(_ask(), offer, vs, INDEX, now)
        got = fast.repeat_wait("ml/g", offer, vs, INDEX, now)
        assert got == want and f"{now - 100:.0f}s so far" in got.reason
        events = _events(fast)
        assert _events(real) == events
        delays += [e[4]["retry_in_s"] for e in events if e[0] == "plan_failed"]
    assert delays == [2.0, 4.0, 8.0, 16.0]
    # at the spill time the answer may differ: repeat_wait says ask for real
    assert fast.repeat_wait("ml/g", offer, views({"a1", "b1"}), INDEX, 700.0) is None
    got_plan = fast.filter(_ask(), offer, views({"a1", "b1"}), INDEX, 700.0)
    assert isinstance(got_plan, Planned) and fast.plans["ml/g"].level == SPINE
    assert fast.level_wait("ml/g") is None  # planned: no wait to repeat


def _vouched(t: GangTracker, gang: str, offer: frozenset[str], index: NetworkIndex, now: float) -> bool:
    """`vouches`, which reads only, says whether `repeat_wait` answers: the two agree."""
    before = t.vouches(gang, offer, index, now)
    assert t.vouches(gang, offer, index, now) == before  # reads only
    assert (t.repeat_wait(gang, offer, {}, index, now) is not None) == before
    return before


def test_repeat_wait_refuses_what_it_cannot_vouch_for() -> None:
    t = GangTracker(TLEVELS, spill_after_s=600.0)
    offer = frozenset(NAMES)
    assert not _vouched(t, "ml/g", offer, INDEX, 0.0)  # never asked
    assert isinstance(t.filter(_ask(), offer, views({"a1", "b1"}), INDEX, 0.0), Wait)
    assert not _vouched(t, "ml/g", frozenset(NAMES[:3]), INDEX, 1.0)  # another offer
    other = NetworkIndex.build(((n, v.labels) for n, v in views(set()).items()), TLEVELS)
    assert not _vouched(t, "ml/g", offer, other, 1.0)  # another index
    assert _vouched(t, "ml/g", offer, INDEX, 1.0)  # the same question: answered
    assert not _vouched(t, "ml/g", offer, INDEX, 600.0)  # the spill time has come
    same = views({"a1", "b1"})
    assert isinstance(t.filter(_ask(), offer, same, INDEX, 2.0), Wait)
    # the same views object within the back-off: filter's back-off answer, as filter gives it
    assert t.repeat_wait("ml/g", offer, same, INDEX, 2.5) == t.filter(_ask(), offer, same, INDEX, 2.5)
    # a gang that does not fit anywhere is no wait for its own level
    t2 = GangTracker(TLEVELS, spill_after_s=600.0)
    assert isinstance(t2.filter(_ask(), offer, views({"a0", "a1", "b1"}), INDEX, 0.0), Wait)
    assert t2.level_wait("ml/g") is None and not _vouched(t2, "ml/g", offer, INDEX, 1.0)


def test_a_required_level_is_not_answered_with_another_gangs_own_level() -> None:
    """Own levels are kept per offer and member sizes: a gang that requires the spine, of the
    same shape as one that waits for a leaf, is planned in the spine at once (its own level
    is never asked: a required level is strict by itself)."""
    t = GangTracker(TLEVELS, spill_after_s=600.0)
    busy = views({"a1", "b1"})
    assert isinstance(t.filter(_ask(), NAMES, busy, INDEX, 0.0), Wait)
    members = tuple(GangMember(f"ml/r-{i}", 8) for i in range(2))
    strict = GangAsk("ml/r", "ml/r-1", members, 2, required_level=SPINE)
    got = t.filter(strict, NAMES, busy, INDEX, 0.0)
    assert isinstance(got, Planned) and t.plans["ml/r"].level == SPINE


def test_own_levels_are_kept_per_label_family() -> None:
    """Two label families (as test_gang_objective's): n0,n1 share an accelerator domain X,
    n2,n3 a clique C. With n1 busy the plan is on the clique, its own family's smallest level:
    taken at once, though the own level over every node (asked first, and kept) is X's."""
    x, c = "accelerator.topograph.run/domain", "nvidia.com/gpu.clique"
    levels = (HOSTNAME, x, c)
    labels = {"n0": {x: "X"}, "n1": {x: "X"}, "n2": {c: "C"}, "n3": {c: "C"}}
    vs = {
        n: NodeView(n, lab, 8, frozenset() if n == "n1" else frozenset(range(8)), A100)
        for n, lab in labels.items()
    }
    index = NetworkIndex.build(labels.items(), levels)
    t = GangTracker(levels, spill_after_s=600.0)
    for k in range(2):  # the second gang of the same shape finds the kept own levels
        members = tuple(GangMember(f"ml/g{k}-{i}", 8) for i in range(2))
        got = t.filter(GangAsk(f"ml/g{k}", members[1].pod, members, 2), list(vs), vs, index, 0.0)
        assert isinstance(got, Planned) and t.plans[f"ml/g{k}"].level == c
        t.drop(f"ml/g{k}", "test", "done")


def test_the_hold_check_answers_as_without_its_memo() -> None:
    """`OwnLevels.hold` keeps own levels per offer, sizes and the plan's label family: a fresh
    tracker per ask (no memo) decides the same over a run of changing capacity."""
    rng = random.Random(3)
    kept = GangTracker(TLEVELS, spill_after_s=600.0)
    for step in range(80):
        busy = {n for n in NAMES if rng.random() < 0.5}
        free = {n: frozenset() if n in busy else frozenset(range(rng.choice([4, 8]))) for n in NAMES}
        vs = {n: NodeView(n, {LEAF: n[0], SPINE: "s"}, 8, free[n], A100) for n in NAMES}
        sizes = rng.choice([[8, 4], [4, 4, 4], [8, 8], [4, 2]])
        members = tuple(GangMember(f"ml/g{step}-{i}", s) for i, s in enumerate(sizes))
        ask = GangAsk(f"ml/g{step}", members[-1].pod, members, len(members))
        fresh = GangTracker(TLEVELS, spill_after_s=600.0)
        assert kept.filter(ask, NAMES, vs, INDEX, 0.0) == fresh.filter(ask, NAMES, vs, INDEX, 0.0)
        kept.drop(ask.gang, "test", "done")


# --------------------------------------------------------------------------- whole runs


#: How a run asks the simulated sidecar about a gang waiting for its own level: the engine's
#: queueing hint skips the ask (`base.Hinted`, the default); without hints the tracker's
#: `repeat_wait` answers it without planning; or every ask is a real filter.
MODES = ("hint", "tracker", "ask")


def _run(
    args: list[str], mode: str
) -> tuple[list[object], list[object], list[object], dict[str, object], Counter[str]]:
    """On `gputopo simulate`'s run of `args`: what the engine recorded of every attempt (each
    placement and failure, with the time and the free GPUs), every answer of the gputopo
    policy, every tracker event, the summary, and how many asks each short cut answered."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cluster, jobs, _, config, _ = prepare(parser.parse_args([*args, "--policies", "gputopo"]))
    outcomes: list[object] = []
    answers: list[object] = []
    events: list[object] = []
    used: Counter[str] = Counter()
    place, count, repeat = sidecar.SidecarPolicy.place, sidecar.SidecarPolicy._count, GangTracker.repeat_wait
    plan = GangTracker.plan
    failure, placed, holds = Recorder.failure, Recorder.placed_job, sidecar.SidecarPolicy._holds

    def recorded(self: sidecar.SidecarPolicy, state: ClusterState, job: Job) -> list[Slot] | Failure:
        got = place(self, state, job)
        answers.append((job.id, state.now, got))
        return got

    def counted(self: sidecar.SidecarPolicy, got: list[Event]) -> None:
        events.extend((e.kind, e.gang, e.reason, e.cause, dict(e.fields)) for e in got)
        count(self, got)

    def repeated(
        self: GangTracker, gang: str, offer: frozenset[str], views: object, index: NetworkIndex, now: float
    ) -> Wait | None:
        got = repeat(self, gang, offer, views, index, now)
        used["tracker"] += got is not None
        return got

    def planned(self: GangTracker, *args: object, **kwargs: object) -> object:
        used["plans"] += 1
        return plan(self, *args, **kwargs)

    def hint(self: sidecar.SidecarPolicy, job: int, gang: str, state: ClusterState) -> Callable[[], bool]:
        still = holds(self, job, gang, state)

        def counted_hint() -> bool:
            got = still()
            used["hint"] += got  # an ask skipped (the ledger asks the hint only where it would ask)
            return got

        return counted_hint

    def failed(self: Recorder, job: Job, now: float, free_total: int, admission: bool) -> None:
        outcomes.append(("failed", job.id, now, free_total, admission))
        failure(self, job, now, free_total, admission)

    def placed_job(self: Recorder, job: Job, slots: Sequence[Slot], now: float) -> float:
        outcomes.append(("placed", job.id, now, list(slots)))
        return placed(self, job, slots, now)

    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(sidecar.SidecarPolicy, "place", recorded))
        stack.enter_context(mock.patch.object(sidecar.SidecarPolicy, "_count", counted))
        stack.enter_context(mock.patch.object(GangTracker, "repeat_wait", repeated))
        stack.enter_context(mock.patch.object(GangTracker, "plan", planned))
        stack.enter_context(mock.patch.object(Recorder, "failure", failed))
        stack.enter_context(mock.patch.object(Recorder, "placed_job", placed_job))
        # a queueing hint that never holds: the engine asks the policy every time
        hints = hint if mode == "hint" else lambda *a: lambda: False
        stack.enter_context(mock.patch.object(sidecar.SidecarPolicy, "_holds", hints))
        if mode == "ask":  # every ask goes to the tracker's filter
            stack.enter_context(mock.patch.object(LevelWaits, "unchanged", lambda self, job, state: None))
        summary = simulate(cluster, jobs, "gputopo", config, pool=AllocatorPool())
    figures = dataclasses.asdict(summary)
    figures.pop("seconds")
    return outcomes, answers, events, figures, used


@pytest.mark.parametrize(
    "args",
    [
        # the default run's generator and cluster, shorter, opted into a week's wait (the wait
        # these short cuts answer is opt-in)
        # (paced at ideal placement: the overloaded run where gangs wait and re-ask)
        ["--pods", "4000", "--gang-spill-after", "604800", "--load-basis", "ideal"],
        # gangs spill while parked (15 of them here)
        [
            "--pods",
            "3000",
            "--cluster-preset",
            "mixed-leaf",
            "--seed",
            "1",
            "--load",
            "0.8",
            "--load-basis",  # the overloaded run this case was written on: gangs wait and re-ask
            "ideal",
            "--gang-spill-after",
            "3600",
        ],
        # binds fail and are re-planned
        [
            "--pods",
            "3000",
            "--cluster-preset",
            "gb200-nvl",
            "--seed",
            "2",
            "--load",
            "0.8",
            "--bind-failure-rate",
            "0.2",
            "--gang-spill-after",
            "604800",
        ],
    ],
)
def test_a_run_with_the_skip_answers_as_one_that_asks_every_time(args: list[str]) -> None:
    """The engine sees the same outcome of every attempt (placed or not, at the same time with
    the same free GPUs) whether the hint skips the ask, the tracker answers it without
    planning, or a real filter does; the answers the hint did not skip are the tracker's, and
    only the skipped asks' `plan_failed` events (their back-off bookkeeping) are missing."""
    runs = {mode: _run(args, mode) for mode in MODES}
    hinted, tracked, asked = (runs[m] for m in MODES)
    assert hinted[4]["hint"] > 50 and hinted[4]["tracker"] == 0  # the hint is exercised
    assert tracked[4]["tracker"] > 50 and tracked[4]["hint"] == 0  # without it, the tracker's skip
    assert asked[4]["tracker"] == 0 and asked[4]["hint"] == 0
    assert hinted[0] == tracked[0] == asked[0]  # every attempt's outcome
    # the hint skips only asks the tracker would have answered without planning: a hint that
    # ran where the ledger would not have asked (too few free GPUs) and dropped the parked
    # counts would show as extra plans here
    assert hinted[4]["plans"] == tracked[4]["plans"] < asked[4]["plans"]
    assert tracked[1] == asked[1] and tracked[2] == asked[2]  # every answer and event
    assert hinted[3] == tracked[3] == asked[3]  # the summary and the lifecycle's figures
    # the hinted run's answers are the others' less the skipped asks, in order
    left = iter(tracked[1])
    assert all(any(a == b for b in left) for a in hinted[1])
    assert len(tracked[1]) - len(hinted[1]) == hinted[4]["hint"]
    assert [e for e in hinted[2] if e[0] != "plan_failed"] == [e for e in tracked[2] if e[0] != "plan_failed"]


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_carried_levels_kept_per_plan_views_equal_a_fresh_reading(seed: int) -> None:
    """`OwnLevels` keeps the plan's carried levels on the identity of its nodes' views: over
    plans on nodes seen before, nodes whose view (and labels) changed, and nodes missing from
    the views, the kept answer is `carried`'s read afresh."""
    from gputopo.gang.levelwait import OwnLevels, carried
    from gputopo.gang.planner import GangPlan
    from gputopo.network.nodeview import Placement

    rng = random.Random(seed)
    names = [f"n{i}" for i in range(8)]
    levels = (HOSTNAME, LEAF, SPINE)

    def view(name: str) -> NodeView:
        labels = {HOSTNAME: name}
        for lv in (LEAF, SPINE):
            if rng.random() < 0.8:
                labels[lv] = rng.choice(["a", "b"])
        return NodeView(name, labels, 8, frozenset(range(8)))

    index = NetworkIndex.build(((n, {}) for n in names), levels)
    kept = OwnLevels()
    current = {n: view(n) for n in names}
    for step in range(30):
        for n in rng.sample(names, 2):  # a new view, maybe other labels
            current[n] = view(n)
        shown = {n: v for n, v in current.items() if rng.random() < 0.9}
        plan = GangPlan(
            "g", LEAF, "a", tuple(Placement(f"p{k}", n, ()) for k, n in enumerate(rng.sample(names, 3)))
        )
        assert kept._carried(plan, shown, index) == frozenset(carried(plan, shown, index)), step
