"""The `gputopo` and `gang-only` policies as deployed: kube-scheduler + the sidecar over time.

Single pods go where kube-scheduler puts them given the extender's prioritize scores
(`gputopo.kubesched`: scaled, weighted extender score + LeastAllocated, random among ties), over
the nodes the filter passes: one of 2+ GPUs waits for a node at its best ring (`gputopo.ringwait`).
Gangs (`gputopo`) go through the sidecar's own `GangTracker`, driven the way kube-scheduler
drives it: members are created over `arrival_spread_s` and each is filtered as it appears
(the first ones wait for quorum; only the first is asked, the others get the same answer);
the last one's filter plans and reserves; the planning member binds at once, the others come
back after kube-scheduler's 1 s pod back-off (its bind is the cluster event that requeues them)
and bind one after another; a bind fails with probability `bind_failure_rate`, after which the
member retries with kube-scheduler's doubling back-off (1 s to 10 s) and the tracker re-plans;
a plan whose members do not bind within `reservation_ttl_s` of each other expires and is
re-planned. The lifecycle runs on its own clock inside one placement: the rest of the cluster
does not change meanwhile.
`gang-only` places members one by one with kube-scheduler's choice (no gang planner).
A gang waiting for a domain of its own level is asked again only when one may hold it now
(`gputopo.sim.levelwaits`; the tracker's `repeat_wait` answers the rest as a filter would).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress
from operator import ne

from gputopo import gangs, kubesched
from gputopo.allocator import Allocator, Choice
from gputopo.clusterobjective import ClusterObjective, DemandMix
from gputopo.gang import ChoiceMemo, NodeView
from gputopo.gangs import GangAsk, GangMember, GangTracker, Refused, Wait
from gputopo.network import NetworkIndex
from gputopo.placement import MAX_SCORE, scores_in_order
from gputopo.ringwait import RingWait
from gputopo.sim.levelwaits import LevelWaits
from gputopo.sim.policies import Failure, Slot, place_one_by_one
from gputopo.sim.state import ClusterState, SimCluster
from gputopo.sim.workload import Job

#: kube-scheduler's pod back-off (podInitialBackoffSeconds, podMaxBackoffSeconds defaults).
POD_BACKOFF_S = (1.0, 10.0)
#: Binds tried per member within one placement before the gang is put back in the queue.
MAX_ATTEMPTS = 100
#: The most classes for which only the best distinct key gets MAX_SCORE (`scores_in_order`):
#: `_best_classes` then looks at the classes with that key alone.
_ALONE_AT_TOP = next(
    k - 1 for k in range(2, 66) if sorted(scores_in_order([(i,) for i in range(k)]))[-2] >= MAX_SCORE
)
#: A class's parts of its single-pod score (`SidecarPolicy._part`).
_Part = tuple[float, Choice, tuple[object, ...], tuple[int, ...], tuple[int, ...], Allocator, frozenset[int]]
#: What `_best_classes` reads of a set of classes with room that no mix changes (`SidecarPolicy._frame`).
_Frame = tuple[tuple[tuple[int, int], ...], list[_Part], list[int]]


@dataclass(frozen=True)
class Lifecycle:
    """How the sidecar's gang lifecycle is exercised (`gputopo simulate` flags)."""

    arrival_spread_s: float = 10.0  # a gang's members are created within this long
    reservation_ttl_s: float = gangs.RESERVATION_TTL_S
    bind_failure_rate: float = 0.0  # share of binds the API server refuses
    spill_after_s: float = gangs.SPILL_AFTER_S  # a gang's wait for its own level (gangwait)

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


class SidecarPolicy:
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
        self._views: dict[tuple[int, int], NodeView] = {}
        #: (pod size, the classes present) -> the classes at kube-scheduler's best total, for
        #: the demand mix version `_tops_version` (`place_pod`); `_by_room` the same keyed on
        #: the classes with room
        self._tops: dict[tuple[int, frozenset[tuple[int, int]]], tuple[tuple[int, int], ...]] = {}
        self._by_room: dict[tuple[int, frozenset[tuple[int, int]]], tuple[tuple[int, int], ...]] = {}
        self._tops_version = -1
        self._parts: dict[tuple[tuple[int, int], int], _Part] = {}  # (class, size) -> `_part`
        self._totals: dict[tuple[int, int], tuple[int, ...]] = {}  # (GPUs left, GPUs) -> `_part`'s totals
        self._parts_learned = -1
        #: (pod size, the classes present) -> `_ring_split`'s answer (pure in them: never renewed)
        self._rings: dict[tuple[int, frozenset[tuple[int, int]]], tuple[list[tuple[int, int]], bool]] = {}
        self._good: dict[tuple[tuple[int, int], int], tuple[object, ...]] = {}  # see `_good_key`
        self._ring_ok: dict[tuple[tuple[int, int], int], bool] = {}  # see `_ring_good`
        #: `_by_room`'s answers that hold for every mix version (`_best_classes`), and `_tops`'
        #: (`place_pod` copies them back after a new version)
        self._static: dict[tuple[int, frozenset[tuple[int, int]]], tuple[tuple[int, int], ...]] = {}
        self._fixed: dict[tuple[int, frozenset[tuple[int, int]]], tuple[tuple[int, int], ...]] = {}
        #: (pod size, the classes with room) -> what `_best_classes` reads of them that does not
        #: depend on the mix (`_frame`)
        self._frames: dict[tuple[int, frozenset[tuple[int, int]]], _Frame] = {}
        self._index = {node.name: i for i, node in enumerate(cluster.nodes)}
        self._names = [node.name for node in cluster.nodes]
        self._offer = frozenset(self._names)  # every node, as kube-scheduler offers them
        self._net = NetworkIndex.build(((n.name, n.labels) for n in cluster.nodes), cluster.levels)
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

    def _view(self, node: int, mask: int) -> NodeView:
        key = (node, mask)
        hit = self._views.get(key)
        if hit is None:
            spec = self.cluster.nodes[node]
            n = self.cluster.topologies[spec.topology].n
            if len(self._views) > 100_000:
                self._views.clear()
            free = frozenset(i for i in range(n) if mask >> i & 1)
            hit = self._views[key] = NodeView(spec.name, spec.labels, n, free, self.allocators[spec.topology])
        return hit

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

    # ------------------------------------------------------------------ single pods

    def place_pod(self, state: ClusterState, size: int, waiting: int | None = None) -> Slot | Failure:
        """kube-scheduler's choice among the nodes with room, given the extender's scores; the
        pod of job `waiting` (a single pod, not a gang member) is held to the nodes that give it
        their best ring while `ring_wait` says so, as the sidecar's filter holds it."""
        # Which classes kube-scheduler's best total falls on is a function of the pod size, the
        # set of classes present (the classes with room follow from it), the demand mix version
        # and the servers the objective knows (`_best_classes`), not of the classes' members: it
        # is kept per set, and only the order (the state's, which decides ties) and the counts
        # are read fresh.
        classes = state.classes
        objective = self.objective
        if objective.mix.version != self._tops_version or objective.learned != self._parts_learned:
            self._renew()
        held: list[tuple[int, int]] | None = None  # the classes the ring wait leaves, if it holds
        key = (size, frozenset(classes))
        if waiting is not None and size > 1:
            good, declined = self._rings.get(key) or self._ring_split(classes, key)
            if declined and self.ring_wait.held(waiting, True, state.now):
                if not good:
                    return Failure(f"waiting for a node that gives {size} GPUs its best ring")
                held = good
        top = self._top_of_room(held, size) if held is not None else self._tops.get(key)
        if top is None:
            if len(self._tops) > 50_000:
                self._tops.clear()
                self._by_room.clear()
            top = self._fixed.get(key)  # an answer no mix version changes, found before
            if top is None:
                room = [c for c in classes if c[1].bit_count() >= size]
                by_room = (size, frozenset(room))
                top = self._top_of_room(room, size)
                if by_room in self._static:
                    if len(self._fixed) > 50_000:
                        self._fixed.clear()
                    self._fixed[key] = top
            self._tops[key] = top
        if not top:
            return Failure(f"no node has {size} free GPUs")
        if len(top) == 1:
            chosen = top[0]
        else:  # kubesched.select_host over the tied classes, in the state's order
            tied = [c for c in classes if c in top]
            pick = self.rng.randrange(sum(len(classes[c]) for c in tied))
            for chosen in tied:
                if pick < len(classes[chosen]):
                    break
                pick -= len(classes[chosen])
        members = classes[chosen]
        node = sorted(members)[self.rng.randrange(len(members))] if len(members) > 1 else min(members)
        return node, (self._parts.get((chosen, size)) or self._part(chosen, size))[3]  # may be bounded away

    def _top_of_room(self, room: list[tuple[int, int]], size: int) -> tuple[tuple[int, int], ...]:
        """`_best_classes` of the classes with room, kept per (size, set with room): fewer sets
        than of every class present, so shared between them."""
        by_room = (size, frozenset(room))
        top = self._by_room.get(by_room) or self._static.get(by_room)
        if top is None:
            top, static = self._best_classes(room, size)
            if static and len(self._static) > 50_000:
                self._static.clear()
            (self._static if static else self._by_room)[by_room] = top
        return top

    def _ring_split(
        self, classes: dict[tuple[int, int], set[int]], key: tuple[int, frozenset[tuple[int, int]]]
    ) -> tuple[list[tuple[int, int]], bool]:
        """The classes with room for `key`'s size whose set is good enough for it (`ring_wait.good`),
        and whether some class with room is not: a function of the size and the set of classes
        present (a class is a topology and a free mask; the ring wait's answer is pure in them),
        so kept per key (`_rings`); the state's order of the classes present is read fresh only
        where it decides (`place_pod`'s ties), never here."""
        size = key[0]
        room = [c for c in classes if c[1].bit_count() >= size]
        good = [c for c in room if self._ring_good(classes, c, size)]
        if len(self._rings) > 50_000:
            self._rings.clear()
        hit = self._rings[key] = (good, len(good) < len(room))
        return hit

    def _ring_good(self, classes: dict[tuple[int, int], set[int]], c: tuple[int, int], size: int) -> bool:
        """`ring_wait.good` of class `c`: pure in its topology, free mask and the size, so kept
        per (class, size) in `_ring_ok`."""
        hit = self._ring_ok.get((c, size))
        if hit is None:
            if len(self._ring_ok) > 100_000:
                self._ring_ok.clear()
            v = self._view(min(classes[c]), c[1])
            hit = self._ring_ok[(c, size)] = self.ring_wait.good(v.allocator, v.free, size)
        return hit

    def _renew(self) -> None:
        """A new demand mix version: every answer and good-enough key goes (an older mix is
        never asked for again); a newly learned server: the classes' parts too."""
        self._tops.clear()
        self._by_room.clear()
        self._good.clear()
        self._tops_version = self.objective.mix.version
        if self.objective.learned != self._parts_learned:
            self._parts.clear()
            self._static.clear()
            self._fixed.clear()
            self._frames.clear()
            self._parts_learned = self.objective.learned

    def _best_classes(
        self, room: list[tuple[int, int]], size: int
    ) -> tuple[tuple[tuple[int, int], ...], bool]:
        """The classes of `room` at kube-scheduler's best total (`kubesched.select_host`), in
        `room`'s order, and whether that holds for every mix version: when at most one class is
        good enough, no cost (the only part of a key that depends on the mix) decides a rank."""
        if not room:
            return (), True
        if len(room) <= _ALONE_AT_TOP:
            # Only the best distinct key scores MAX_SCORE, and it is a good-enough class's (their
            # keys lead with True): the best total is among the classes with that key unless a
            # class below could reach it with a lower score (totals grow with the score). The
            # same keys are asked in the same order as `_class_totals`, which decides otherwise.
            order, got, ok = self._frames.get((size, frozenset(room))) or self._frame(room, size)
            good = self._good
            keys = [good.get((order[i], size)) or self._good_key(order[i], size, got[i]) for i in ok]
            best_key = max(keys)
            tied = [i for i, k in zip(ok, keys, strict=True) if k == best_key]
            top = max(got[i][4][MAX_SCORE] for i in tied)
            below = max((p[4][MAX_SCORE - 1] for i, p in enumerate(got) if i not in tied), default=-1)
            if top > below:
                best = [order[i] for i in tied if got[i][4][MAX_SCORE] == top]  # in `room`'s order:
                return (best[0],) if len(best) == 1 else tuple(c for c in room if c in best), len(ok) <= 1
        totals, good_enough = self._class_totals(room, size)
        best = max(totals)
        return tuple(c for c, t in zip(room, totals, strict=True) if t == best), good_enough <= 1

    def _frame(self, room: list[tuple[int, int]], size: int) -> _Frame:
        """What `_best_classes` reads of `room` that depends on no mix version: the classes (in
        the order first asked: the answer is read as a set), their parts and which of them are
        good enough (`ClusterObjective.floor`); kept per (size, room set) for rooms where the
        costs decide (two or more good enough) while the objective learns no new server."""
        parts = self._parts
        got = [parts.get((c, size)) or self._part(c, size) for c in room]
        floor = self.objective.floor(p[0] for p in got)
        ok = [i for i, p in enumerate(got) if p[0] >= floor]
        frame = (tuple(room), got, ok)
        if len(ok) > 1:
            if len(self._frames) > 50_000:
                self._frames.clear()
            self._frames[(size, frozenset(room))] = frame
        return frame

    def _class_totals(self, room: list[tuple[int, int]], size: int) -> tuple[list[int], int]:
        """kube-scheduler's total per class of `room` (non-empty classes with room for `size`):
        `placement.node_scores` with the objective over one node per class, through the same
        steps (`ClusterObjective.floor`, `key`, `placement.scores_in_order`), from each class's
        parts that do not depend on the other classes (`_part`, `_good_key`); and how many
        classes are good enough."""
        parts, good = self._parts, self._good
        got = [parts.get((c, size)) or self._part(c, size) for c in room]
        floor = self.objective.floor(p[0] for p in got)
        ok = [p[0] >= floor for p in got]
        keys = [
            (good.get((c, size)) or self._good_key(c, size, p)) if fine else p[2]
            for c, p, fine in zip(room, got, ok, strict=True)
        ]
        totals = [p[4][score] for score, p in zip(scores_in_order(keys), got, strict=True)]
        return totals, sum(ok)

    def _part(self, c: tuple[int, int], size: int) -> _Part:
        """What a class's score is made of that depends neither on the other classes nor on the
        mix: (efficiency, the allocator's choice, the objective's key when not good enough, the
        GPUs it gives sorted, kube-scheduler's total per extender score 0..10, the allocator,
        the free set); kept while the objective learns no new server (`_renew`)."""
        if len(self._parts) > 100_000:
            self._parts.clear()
        topology, mask = c
        allocator = self.allocators[topology]
        n = self.cluster.topologies[topology].n
        free = frozenset(i for i in range(n) if mask >> i & 1)
        choice = self._memo.choose(allocator, free, size)
        eff = self.objective.efficiency(size, choice.ring_mbps)
        low = self.objective.key(size, allocator, free, choice, eff, False)
        totals = self._totals.get((len(free) - size, n))  # pure in the GPUs left and the node's
        if totals is None:
            totals = self._totals[(len(free) - size, n)] = tuple(
                kubesched.total_score(s, len(free) - size, n) for s in range(MAX_SCORE + 1)
            )
        hit = self._parts[(c, size)] = (
            eff,
            choice,
            low,
            tuple(sorted(choice.indices)),
            totals,
            allocator,
            free,
        )
        return hit

    def _good_key(self, c: tuple[int, int], size: int, part: _Part) -> tuple[object, ...]:
        """The objective's key of class `c` when good enough, for the mix version `_tops_version`
        (`_renew` empties them when it changes): `ClusterObjective.key`'s, with the first cut's
        part of it taken from the key when not good enough (`_part`: it depends on no mix)."""
        if len(self._good) > 100_000:
            self._good.clear()
        hit = self._good[(c, size)] = (True, self.objective.cost(part[5], part[6], part[1]), part[2][2])
        return hit

    # ------------------------------------------------------------------ jobs

    def place(self, state: ClusterState, job: Job) -> list[Slot] | Failure:
        """All pods of the job, or a Failure; the state is left unchanged either way."""
        gang = len(job.pods) > 1  # `job.is_gang`
        if job.id not in self._seen_jobs:  # the sidecar sees each pod when it is first filtered
            self._seen_jobs.add(job.id)
            observe = self.objective.mix.observe
            for size in job.pods:
                observe(size, gang=gang)
        if gang and self._planner:
            return self._lifecycle(state, job)
        if gang:
            return place_one_by_one(state, job, self.place_pod)
        got = self.place_pod(state, job.pods[0], job.id)
        if isinstance(got, Failure):
            return got
        self.ring_wait.forget(job.id)
        return [got]

    def _lifecycle(self, state: ClusterState, job: Job) -> list[Slot] | Failure:
        gang = f"sim/job-{job.id}"
        t, n = self.tracker, len(job.pods)
        if self._waiting.unchanged(job.id, state) is not None:  # the same members, asked again
            # a new views object, as `_all_views` gives each placement: no back-off answers
            again = t.repeat_wait(gang, self._offer, {}, self._net, state.now)
            if again is not None:
                self._count(t.drain())
                return Failure(again.reason)
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
                    t.filter(GangAsk(gang, pods[0], current[:1], n), self._offer, views, self._net, base)
                self.stats["gangs_waited_for_quorum"] += 1
                self._waited_s += last - first_in
                now = base + last - first_in
        first = t.filter(GangAsk(gang, pods[n - 1], current, n), self._offer, views, self._net, now)
        if isinstance(first, Wait):
            self._waiting.park(job.id, t.level_wait(gang), state)
            self._count(t.drain())
            return Failure(first.reason)
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
            while queue:  # once per member bind: the tracker's verbs and the loop's own state in locals
                now, seq, k = heapq.heappop(queue)
                pod = pods[k]
                t.expire(now)
                decision = t.filter(GangAsk(gang, pod, current, n), offer, views, net, now)
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
                            t.replan(GangAsk(gang, pod, current, n), views, net, now, "bind_failed")
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

    def _count(self, events: list[gangs.Event]) -> None:
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
