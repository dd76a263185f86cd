"""The `gputopo` and `gang-only` policies as deployed: kube-scheduler + the sidecar over time.

Single pods go where kube-scheduler puts them given the extender's prioritize scores
(`gputopo.pod.kubesched`: scaled, weighted extender score + LeastAllocated, random among ties), over
the nodes the filter passes: opted in (`Lifecycle.spill_after_s` > 0), one of 2+ GPUs waits for a
node at its best ring (`gputopo.pod.ringwait`);
worked out per class of identical nodes in `gputopo.sim.policies.podclasses`.
Gangs (`gputopo`) go through the sidecar's own `GangTracker`, driven the way kube-scheduler
drives it: members are created over `arrival_spread_s` and each is filtered as it appears
(the first ones wait for quorum; only the first is asked, the others get the same answer);
the last one's filter plans and reserves; the planning member binds at once, the others come
back after kube-scheduler's 1 s pod back-off (its bind is the cluster event that requeues them)
and bind one after another; a bind fails with probability `bind_failure_rate`, after which the
member retries with kube-scheduler's doubling back-off (1 s to 10 s) and the tracker re-plans;
a plan whose members do not bind within `reservation_ttl_s` of each other expires and is
re-planned. Where neither can happen (no bind failures, a TTL longer than the back-off) the
members of a new plan are permitted in that order and only the last bind is told to the
tracker, which leaves everything as the member-by-member loop does (`_bound_at_once`).
The lifecycle runs on its own clock inside one placement: the rest of the cluster
does not change meanwhile.
`gang-only` places members one by one with kube-scheduler's choice (no gang planner).
By default a gang is placed now in the smallest level that holds it, as the sidecar's. A gang
opted into waiting for a domain of its own level is asked again only when one may hold it now
(`gputopo.sim.policies.levelwaits`; the tracker's `repeat_wait` answers the rest as a filter would), and
its failure carries a queueing hint (`base.Hinted`) so the engine does not even ask meanwhile.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import compress
from operator import ne

from gputopo.gang import asks, tracker
from gputopo.gang.asks import GangAsk, GangMember, Refused, Wait
from gputopo.gang.reservations import Reservation
from gputopo.gang.tracker import GangTracker
from gputopo.jobtime.profiles import Profile
from gputopo.network.levels import NetworkIndex
from gputopo.network.nodeview import ChoiceMemo, NodeView
from gputopo.node.allocator import Allocator
from gputopo.pod.objective import ClusterObjective, DemandMix
from gputopo.pod.ringwait import RingWait
from gputopo.sim.jobmodel import JobModel
from gputopo.sim.policies.base import Failure, Hinted, Slot, place_one_by_one
from gputopo.sim.policies.levelwaits import LevelWaits
from gputopo.sim.policies.podclasses import PodClasses
from gputopo.sim.state import ClusterState, SimCluster
from gputopo.sim.workload import Job

#: kube-scheduler's pod back-off (podInitialBackoffSeconds, podMaxBackoffSeconds defaults).
POD_BACKOFF_S = (1.0, 10.0)
#: Binds tried per member within one placement before the gang is put back in the queue.
MAX_ATTEMPTS = 100


@dataclass(frozen=True)
class Lifecycle:
    """How the sidecar's gang lifecycle is exercised (`gputopo simulate` flags)."""

    arrival_spread_s: float = 10.0  # a gang's members are created within this long
    reservation_ttl_s: float = tracker.RESERVATION_TTL_S
    bind_failure_rate: float = 0.0  # share of binds the API server refuses
    spill_after_s: float = tracker.SPILL_AFTER_S  # opt-in wait for a gang's own level (gangwait): 0
    #: the run's job-time model when some jobs' pods declare their profile (--declared-share):
    #: `JobModel.declared` says which, and the sidecar weighs those by it
    declares: JobModel | None = None
    #: every member's bind through the tracker's verbs one by one even where nothing can fail
    #: (no bind failures, no reservation lapsing before the last bind): the reference the
    #: shortcut (`SidecarPolicy._bound_at_once`) is tested against
    bind_one_by_one: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.arrival_spread_s) and self.arrival_spread_s >= 0):
            raise ValueError(
                f"arrival spread must be a non-negative number of seconds, got {self.arrival_spread_s}"
            )
        if not (math.isfinite(self.reservation_ttl_s) and self.reservation_ttl_s > 0):
            raise ValueError(
                f"reservation TTL must be a positive number of seconds, got {self.reservation_ttl_s}"
            )
        if not (math.isfinite(self.spill_after_s) and self.spill_after_s >= 0):
            raise ValueError(
                f"spill-after must be a non-negative number of seconds, got {self.spill_after_s}"
            )
        if not (0 <= self.bind_failure_rate < 1):
            raise ValueError(f"bind failure rate must be in [0, 1), got {self.bind_failure_rate}")


class SidecarPolicy(PodClasses):
    """What a cluster running deploy/ does; `planner=False` is `gang-only`."""

    def __init__(
        self,
        name: str,
        cluster: SimCluster,
        allocators: Sequence[Allocator],
        rng: random.Random,
        *,
        planner: bool,
        lifecycle: Lifecycle | None = None,
    ) -> None:
        self.name = name
        self.cluster = cluster
        self.allocators = allocators
        self.rng = rng
        self.life = lifecycle or Lifecycle()
        self._planner = planner
        self._binds = random.Random(rng.random())  # its own stream: failures do not shift choices
        self._memo = ChoiceMemo()
        # single pods: the cluster-level objective over the demand seen so far (as the sidecar)
        self.objective = ClusterObjective(DemandMix())
        self.objective.learn(allocators)
        # a multi-GPU pod waits for a node at its best ring as a gang for its level (ringwait)
        self.ring_wait = RingWait(self.objective.comm, self.objective.band, self.life.spill_after_s)
        self._seen_jobs: set[int] = set()
        self._init_pods()
        self._index = {node.name: i for i, node in enumerate(cluster.nodes)}
        self._names = [node.name for node in cluster.nodes]
        self._offer = frozenset(self._names)  # every node, as kube-scheduler offers them
        self._net = NetworkIndex.build(((n.name, n.labels) for n in cluster.nodes), cluster.levels)
        self._init_leaves(self._net)  # single pods pack the fullest leaf (gputopo.pod.leafpack)
        self.tracker = GangTracker(
            cluster.levels,
            ttl_s=self.life.reservation_ttl_s,
            objective=self.objective,
            spill_after_s=self.life.spill_after_s,
        )
        self._arrived: set[int] = set()  # gangs not yet placed whose members all exist
        self._waiting = LevelWaits(self._names)  # gangs waiting for their own level, as last asked
        self._seen: list[int] = []  # free masks `_all_views` was last brought up to date with
        self._all: dict[str, NodeView] = {}
        self.stats: Counter[str] = Counter()  # counts
        self._waited_s = 0.0  # summed quorum waits

    def figures(self) -> dict[str, float]:
        """The lifecycle's own figures for the report (Summary.extra)."""
        if not self._planner:
            return {}
        s = self.stats
        waited = s["gangs_waited_for_quorum"]
        return {
            "gangs_waited_for_quorum": waited,
            "quorum_wait_s_mean": self._waited_s / waited if waited else 0.0,
            "reservations_expired": s["reservations_expired"],
            "bind_failures_injected": s["bind_failures_injected"],
            "replans_after_bind_failure": s["replans_after_bind_failure"],
            "replans_after_expiry": s["replans_after_expiry"],
            "gangs_stalled": s["gangs_stalled"],  # a re-plan around bound members found no room
        }

    def _all_views(self, state: ClusterState) -> dict[str, NodeView]:
        """Every node's view, as a new dict (the tracker's back-off compares views by identity,
        so each placement gets its own), refreshing only the nodes whose free mask changed."""
        if len(self._seen) != len(state.mask):
            self._seen = [-1] * len(state.mask)
        seen, names, masks = self._seen, self._names, state.mask
        if seen != masks:
            cached, every = self._views, self._all
            for i in list(compress(range(len(masks)), map(ne, seen, masks))):  # nodes whose mask changed
                mask = seen[i] = masks[i]
                every[names[i]] = cached.get((i, mask)) or self._view(i, mask)
        return dict(self._all)

    # ------------------------------------------------------------------ jobs

    def place(self, state: ClusterState, job: Job) -> list[Slot] | Failure:
        """All pods of the job, or a Failure; the state is left unchanged either way."""
        gang = len(job.pods) > 1  # `job.is_gang`
        if job.id not in self._seen_jobs:  # the sidecar sees each pod when it is first filtered
            self._seen_jobs.add(job.id)
            observe = self.objective.mix.observe
            for size in job.pods:
                observe(size, gang=gang)
        declares = self.life.declares
        profile = declares.declared(job.id) if declares is not None else None
        if gang and self._planner:
            return self._lifecycle(state, job, profile)
        if gang:
            if profile is None:
                return place_one_by_one(state, job, self.place_pod)
            return place_one_by_one(state, job, lambda s, size: self.place_pod(s, size, profile=profile))
        got = (
            self.place_pod(state, job.pods[0], job.id)
            if profile is None
            else self.place_pod(state, job.pods[0], job.id, profile=profile)
        )
        if isinstance(got, Failure):
            return got
        self.ring_wait.forget(job.id)
        return [got]

    def _lifecycle(
        self, state: ClusterState, job: Job, profile: Profile | None = None
    ) -> list[Slot] | Failure:
        gang = f"sim/job-{job.id}"
        t, n = self.tracker, len(job.pods)
        if self._waiting.unchanged(job.id, state) is not None:  # the same members, asked again
            # a new views object, as `_all_views` gives each placement: no back-off answers
            again = t.repeat_wait(gang, self._offer, {}, self._net, state.now)
            if again is not None:
                self._count(t.drain())
                return Hinted(again.reason, holds=self._holds(job.id, gang, state))
            self._waiting.forget(job.id)
        pods = [f"{gang}-{k}" for k in range(n)]
        where: dict[str, str] = {}
        members = [GangMember(pods[i], job.pods[i], "") for i in range(n)]  # node: once bound
        views = self._all_views(state)

        current = tuple(members)  # every member as the gang is now (renewed on each bind)
        base = now = state.now  # the simulation's clock: a gang's wait for its level spans placements
        if job.id not in self._arrived:  # members are created over the spread, once
            self._arrived.add(job.id)
            spread = self.life.arrival_spread_s
            if spread > 0:
                rand = self._binds.random  # `uniform(0, spread)` is `spread * random()`, bit for bit
                times = [spread * rand() for _ in range(n)]
                last, first_in = max(times), min(times)
                # each member is filtered as it appears: the first starts the gang's wait
                # (`first_seen`); the ones up to the last are answered "waiting for quorum" with
                # nothing kept but that event (no plan can exist yet, `_arrived` runs this
                # once), so only the first is asked (test_sim_fastpaths has the check)
                if n > 1:
                    t.filter(
                        GangAsk(gang, pods[0], current[:1], n, profile=profile),
                        self._offer,
                        views,
                        self._net,
                        base,
                    )
                self.stats["gangs_waited_for_quorum"] += 1
                self._waited_s += last - first_in
                now = base + last - first_in
        first = t.filter(
            GangAsk(gang, pods[n - 1], current, n, profile=profile), self._offer, views, self._net, now
        )
        if isinstance(first, Wait):
            wait = t.level_wait(gang)
            self._waiting.park(job.id, wait, state)
            self._count(t.drain())
            return (
                Failure(first.reason)
                if wait is None
                else Hinted(first.reason, holds=self._holds(job.id, gang, state))
            )
        queue = [(now, 0, n - 1)] + [(now + POD_BACKOFF_S[0], k + 1, k) for k in range(n - 1)]
        attempts = [0] * n
        slots: dict[int, Slot] = {}
        held: dict[int, int] = {}  # free masks of the nodes members bound to (the state is not touched)
        offer, net, index, rate, draw = (
            self._offer,
            self._net,
            self._index,
            self.life.bind_failure_rate,
            self._binds.random,
        )
        try:
            at_once = self._bound_at_once(state, job, gang, pods, now)
            if at_once is not None:
                slots, queue = at_once, []
            while queue:  # once per member bind: the tracker's verbs and the loop's own state in locals
                now, seq, k = heapq.heappop(queue)
                pod = pods[k]
                t.expire(now)
                decision = t.filter(GangAsk(gang, pod, current, n, profile=profile), offer, views, net, now)
                if isinstance(decision, Wait):  # a re-plan around bound members found no room
                    self.stats["gangs_stalled"] += 1
                    return Failure(decision.reason)
                size = job.pods[k]
                try:
                    r = t.permit(pod, gang, size, decision.node)
                except Refused:
                    r = None
                if r is None or draw() < rate:
                    if r is not None:
                        self.stats["bind_failures_injected"] += 1
                        t.bind_failed(pod, gang, decision.node, "injected API error")
                        if where:
                            t.replan(
                                GangAsk(gang, pod, current, n, profile=profile),
                                views,
                                net,
                                now,
                                "bind_failed",
                            )
                    attempts[k] += 1
                    if attempts[k] > MAX_ATTEMPTS:  # bounded, whatever the failure rate
                        self.stats["gangs_stalled"] += 1
                        return Failure(f"member {pod} failed to bind {MAX_ATTEMPTS} times")
                    delay = min(POD_BACKOFF_S[0] * 2 ** (attempts[k] - 1), POD_BACKOFF_S[1])
                    heapq.heappush(queue, (now + delay, seq + n * attempts[k], k))
                    continue
                name = r.node
                node = index[name]
                gpus = tuple(sorted(r.gpus))
                mask = held.get(node, state.mask[node])
                bits = 0
                for g in gpus:
                    bits |= 1 << g
                if bits & ~mask or len(gpus) != bits.bit_count():
                    raise ValueError(f"GPUs {list(gpus)} are not free on node {name}")
                mask = held[node] = mask & ~bits
                slots[k] = (node, gpus)
                where[pod] = name
                members[k] = GangMember(pod, size, name)
                current = tuple(members)
                views[name] = self._views.get((node, mask)) or self._view(node, mask)
                t.bound(pod, gang, now)
        finally:
            self._count(t.drain())
            t.drop(gang, "simulated placement done", "done")
            t.drain()
        self._arrived.discard(job.id)  # placed: the engine will not ask again
        return [slots[k] for k in range(n)]

    def _bound_at_once(
        self, state: ClusterState, job: Job, gang: str, pods: list[str], now: float
    ) -> dict[int, Slot] | None:
        """Every member bound on the plan just made, as the member-by-member loop of
        `_lifecycle` binds them when nothing can go wrong; None (the loop then runs) otherwise.

        Nothing can when no bind fails (a failure rate of 0: each bind still draws from the
        bind stream, as the loop does) and no reservation lapses before the last member binds
        (the planning member at `now` renews them to `now` + TTL; the others bind after the pod
        back-off, at `now` + 1 s), and the tracker holds a reservation for every member and
        none for anyone else. Each member's filter then answers its planned node (the plan
        stands, its reservation is there, every node is offered), its permit takes that
        reservation, and its bind only renews the others' TTL (no event) until the last one's
        completes the plan. So the members are permitted in the loop's order and only the last
        bind is told to the tracker: the same placements, draws, events and tracker state as
        the loop (but for the renewed expiry times of reservations already taken), without a
        filter, an ask and an expiry check per member."""
        life, t, n = self.life, self.tracker, len(pods)
        last = now + POD_BACKOFF_S[0] if n > 1 else now
        if life.bind_failure_rate != 0 or life.bind_one_by_one or not now + t.ttl_s > last:
            return None
        if len(t.reservations) != n or gang not in t.plans:
            return None
        held: list[Reservation] = []
        for pod in pods:
            got = t.reservations.get(pod)
            if got is None or got.gang != gang:
                return None
            held.append(got)
        draw, index, masks = self._binds.random, self._index, state.mask
        taken: dict[int, int] = {}  # free masks of the nodes members bound to
        slots: dict[int, Slot] = {}
        for k in (n - 1, *range(n - 1)):  # the planning member first, then the others in turn
            r = t.permit(pods[k], gang, job.pods[k], held[k].node)
            assert r is not None  # a reservation of this gang, on its planned node
            draw()  # `draw() < rate` with a rate of 0: the draw without the failure
            node = index[r.node]
            gpus = tuple(sorted(r.gpus))
            mask = taken.get(node, masks[node])
            bits = 0
            for g in gpus:
                bits |= 1 << g
            if bits & ~mask or len(gpus) != bits.bit_count():
                raise ValueError(f"GPUs {list(gpus)} are not free on node {r.node}")
            taken[node] = mask & ~bits
            slots[k] = (node, gpus)
        t.bound(pods[n - 2 if n > 1 else 0], gang, last)
        return slots

    def _holds(self, job: int, gang: str, state: ClusterState) -> Callable[[], bool]:
        """The queueing hint of a gang parked waiting for its own level (`Hinted.holds`): True
        while asking again would not reach a plan; asked where the ledger would ask the policy,
        it makes the checks `_lifecycle` makes first, in its order (the parked counts brought up
        to date as that ask would), then `repeat_wait`'s (`vouches`)."""
        waiting, tracker, offer, net = self._waiting, self.tracker, self._offer, self._net
        return lambda: (
            waiting.unchanged(job, state) is not None and tracker.vouches(gang, offer, net, state.now)
        )

    def _count(self, events: list[asks.Event]) -> None:
        """Fold tracker events into the figures: which drops were followed by a new plan."""
        cause = ""
        for e in events:
            if e.kind == "plan_dropped":
                cause = e.cause
                if cause == "expired":
                    self.stats["reservations_expired"] += 1
            elif e.kind == "plan" and cause in ("bind_failed", "expired"):
                self.stats[
                    "replans_after_bind_failure" if cause == "bind_failed" else "replans_after_expiry"
                ] += 1
                cause = ""
