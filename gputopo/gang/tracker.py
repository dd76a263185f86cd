"""One gang's life from its first member to its last bind: quorum, plan, reserve, bind, re-plan.

`planner.plan_gang` answers "where would these members go now?"; this module owns everything
around that answer over time, for the sidecar and the simulator alike (both drive the same
`GangTracker`, so what the simulator measures is what the sidecar does). Its verbs follow
scheduler-plugins' coscheduling Manager: `quorum` is PreFilter's check, `plan` plans and
reserves, `filter` is one member's filter call (steer to the plan, or quorum then plan),
`permit` is Permit (may this member bind now?), `bound` is PostBind, `bind_failed` is Unreserve,
`replan` plans the unbound rest outside a filter, and `expire`/`sweep` drop plans whose
reservations ran out or that the cluster no longer supports.

Rules that keep a gang all or nothing under a real kube-scheduler (docs/scheduler.md):
  * a plan is made only over the nodes kube-scheduler offered (the `NodeNames` of the filter
    that makes it; a re-plan outside a filter uses the gang's last offer), because
    kube-scheduler has already removed cordoned, tainted, NotReady nodes and those failing the
    pod's selectors, affinity, CPU or memory, which the sidecar cannot see;
  * a later member whose offer lacks its planned node breaks the plan at once: the members not
    yet bound are re-planned within that offer, before anything else is answered;
  * so no member ever binds while the plan depends on a node kube-scheduler did not offer:
    every plan is made inside an offer, and a missing node is replaced before the next answer;
  * a reservation whose GPUs another pod now holds breaks the plan; the rest is re-planned;
  * a gang without a required level is placed now, in the smallest level whose one domain holds
    it among the offered nodes (its preferred level first, then each larger one): Kueue's,
    KAI's and Volcano's "preferred" mean the same. Waiting for a better domain is opt-in: with
    `spill_after_s` > 0 (the sidecar's --gang-spill-after, a pod's gputopo.io/topology-wait) a
    gang with no member bound waits up to that long for one domain of its own level
    (`gang.levelwait`) rather than take a larger level now, as a gang that fits nowhere waits;
  * a gang that fits nowhere is not re-planned for an identical question (same views, same
    offer) until its back-off runs out, but any change of the cluster or the offer re-plans at
    once: kube-scheduler only asks again on a cluster event or its 5-minute flush, so a timer
    that only the sidecar sees must never be what makes a member wait.

Pure: no I/O, no clock of its own (every call takes `now`), no threads; the caller's lock
guards it. Decisions come back as values with reasons, and what happened is queued as
`Event`s that the caller logs or counts (`drain`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any

from gputopo.gang import explain
from gputopo.gang.asks import Decision, Event, GangAsk, Planned, Refused, Wait
from gputopo.gang.levelwait import LevelWait, OwnLevels
from gputopo.gang.memo import PlanMemo
from gputopo.gang.planner import GangPlan, GangSpec, Member, NoPlan, plan_gang
from gputopo.gang.reservations import Reservation, Reservations
from gputopo.network.levels import NetworkIndex, domain_of
from gputopo.network.nodeview import NodeView
from gputopo.node.policy import GpuPolicy
from gputopo.pod.objective import ClusterObjective

#: A plan's capacity is held this long without a bind of one of its members.
RESERVATION_TTL_S = 120.0
#: First and largest retry delay of a gang that fits nowhere (for an unchanged question).
BACKOFF_S = (1.0, 60.0)
#: How long a gang with no member bound waits for a domain of its own level (`gang.levelwait`)
#: before it takes a larger one, unless its pods ask for a wait (gputopo.io/topology-wait):
#: none at all. A preferred level is placed now, as Kueue, KAI and Volcano place it, and Slurm waits
#: for fewer switches (`--switches=count@max-time`) only when the job asks (issue 18: the
#: slowdown the wait avoided was an unmeasured model's, and users met gangs that never bound).
SPILL_AFTER_S = 0.0
#: Gangs whose first filter time is remembered (for the wait until their last bind); a gang
#: deleted before it bound is never told, so the oldest are forgotten past this many.
MAX_WAITING_GANGS = 100_000

_pod_of = operator.attrgetter("pod")
_allocator_of = operator.attrgetter("allocator")

__all__ = ["GangTracker"]


@dataclass
class _Backoff:
    until: float
    delay: float
    reason: str
    views: object  # the views object the failed plan saw
    offer: frozenset[str] | None
    level: LevelWait | None = None  # the failure was a wait for the gang's own level


class GangTracker:
    """The lifecycle of every gang; see the module docstring for the rules."""

    def __init__(
        self,
        levels: Sequence[str],
        *,
        ttl_s: float = RESERVATION_TTL_S,
        backoff_s: tuple[float, float] = BACKOFF_S,
        objective: ClusterObjective | None = None,
        spill_after_s: float = SPILL_AFTER_S,
    ) -> None:
        if not spill_after_s >= 0:
            raise ValueError(f"spill_after_s must be >= 0, got {spill_after_s!r}")
        self.levels = tuple(levels)
        self.ttl_s = ttl_s
        self.backoff_s = backoff_s
        #: the cluster objective (and its demand mix) every plan is ranked by; the caller's
        #: single pods share it, so the sidecar and the simulator decide alike
        self.objective = objective
        self.spill_after_s = spill_after_s
        self.reservations = Reservations()
        self.plans: dict[str, GangPlan] = {}
        self._offers: dict[str, frozenset[str]] = {}  # gang -> nodes its plan was made over
        #: tree gangs: every node kube-scheduler offered any of its members (`filter`)
        self._tree_offers: dict[str, frozenset[str]] = {}
        self._backoff: dict[str, _Backoff] = {}
        self._events: list[Event] = []
        self._memo = PlanMemo()
        self._first_seen: dict[str, float] = {}  # gang -> its first member's first filter
        self._own = OwnLevels()  # the gangs' own levels, kept per offer (capacity and labels)
        self._policies: dict[int, GpuPolicy] = {}  # id -> node policy the objective learned (`_learn`)

    # ------------------------------------------------------------------ events

    def drain(self) -> list[Event]:
        """What happened since the last call, oldest first."""
        out, self._events = self._events, []
        return out

    def _emit(self, kind: str, gang: str, reason: str, cause: str = "", **fields: object) -> None:
        self._events.append(Event(kind, gang, reason, cause, fields))

    def memo(self) -> PlanMemo:
        """Allocator answers and the planner's answers (`PlanMemo`): kept, within bounds."""
        if len(self._memo) > 200_000:
            self._memo = PlanMemo()
        return self._memo

    # ------------------------------------------------------------------ time and breakage

    def expire(self, now: float) -> list[str]:
        """Drop every plan with a reservation past its time; the gangs dropped."""
        if now < self.reservations.earliest:  # nothing can have run out (one call per member bind)
            return []
        gangs = sorted(self.reservations.expired(now))
        for gang in gangs:
            self.drop(gang, "reservation expired before every member bound", "expired")
        return gangs

    def sweep(
        self,
        *,
        alive: Callable[[str], bool],
        has_node: Callable[[str], bool],
        in_use: Callable[[str], Set[int]],
        bound_to: Callable[[str], str] | None = None,
    ) -> dict[str, str]:
        """Break the plans the cluster no longer supports: a reserved member deleted or finished,
        a planned node gone, or reserved GPUs that another pod now holds (`in_use(node)`: the
        node's published in-use GPUs and other assumed binds). Holding such capacity until the
        TTL would starve others. Returns the gangs whose reserved GPUs were taken, with that
        cause: the caller re-plans them at once (`replan`), since their members are still
        waiting.

        `bound_to(pod)` is the node the cluster shows a pod bound to ("" while unbound, and for
        a bind of the caller's own in flight). A reserved member bound at all was bound by
        someone else: a permitted bind takes its reservation out first (`permit`). That happens
        when another replica of the scheduler held the lease meanwhile and finished part of the
        gang on its own plan: a plan of this tracker for the rest could then put them in
        another domain (a split gang), so it is broken and the gang re-planned around the
        members now bound (also returned, cause `bound_elsewhere`)."""
        broken: dict[str, tuple[str, str]] = {}
        for r in self.reservations:
            if r.gang in broken:
                continue
            if not alive(r.pod):
                broken[r.gang] = (f"planned member {r.pod} was deleted or finished", "member_gone")
            elif bound_to is not None and (where := bound_to(r.pod)):
                broken[r.gang] = (
                    f"planned member {r.pod} was bound to {where} by another scheduler "
                    f"(this plan put it on {r.node})",
                    "bound_elsewhere",
                )
            elif not has_node(r.node):
                broken[r.gang] = (f"planned node {r.node} went away", "node_gone")
            elif r.gpus and (taken := in_use(r.node) & set(r.gpus)):
                broken[r.gang] = (
                    f"GPUs {sorted(taken)} of {r.node} reserved for {r.pod} are now in use by another pod",
                    "gpus_taken",
                )
        for gang, (reason, cause) in broken.items():
            self.drop(gang, reason, cause)
        return {g: cause for g, (_, cause) in broken.items() if cause in ("gpus_taken", "bound_elsewhere")}

    def drop(self, gang: str, reason: str, cause: str) -> None:
        """Forget a gang's plan and give its reservations back."""
        plan = self.plans.pop(gang, None)
        released = self.reservations.release_gang(gang)
        if plan is not None or released:
            self._emit("plan_dropped", gang, reason, cause, released=len(released))

    # ------------------------------------------------------------------ filter

    def planned_node(self, pod: str, gang: str) -> str | None:
        """Where the current plan puts `pod` (for prioritize), or None."""
        plan = self.plans.get(gang)
        if plan is None:
            return None
        return next((p.node for p in plan.placements if p.pod == pod), None)

    def quorum(self, ask: GangAsk) -> Wait | None:
        """None once the gang has minMember active pods; else why it waits (PreFilter)."""
        need = ask.min_member
        if need is None:
            return Wait(f"gang {ask.gang}: PodGroup {ask.gang} not found")
        if len(ask.members) < need:
            reason = f"gang {ask.gang} waiting for members {len(ask.members)}/{need}"
            self._emit("quorum_wait", ask.gang, reason, members=len(ask.members), need=need)
            return Wait(reason)
        return None

    def filter(
        self,
        ask: GangAsk,
        offer: Collection[str],
        views: Mapping[str, NodeView],
        index: NetworkIndex,
        now: float,
    ) -> Decision:
        """The decision for one member's filter, `offer` being the nodes kube-scheduler sent."""
        gang, pod = ask.gang, ask.pod
        if gang not in self._first_seen:
            self._seen(gang, now)
        plan = self.plans.get(gang)
        if plan is not None:
            mine = None
            for p in plan.placements:  # once per member bind: a loop, not a generator
                if p.pod == pod:
                    mine = p
                    break
            if mine is not None and self.reservations.get(pod) is not None:
                if mine.node in offer:
                    return Planned(mine.node, f"gang {gang} planned on {mine.node}")
                if ask.groups:
                    # A tree: kube-scheduler 1.37's workload scheduling offers one placement
                    # (one domain) per pod group at a time, so an offer without the planned
                    # node is a placement of another sub-group, not a node gone: the plan is
                    # kept (a node that did go away is re-planned when the reservation lapses).
                    return Wait(
                        f"gang {gang} planned {pod} on {mine.node}, outside this offer "
                        f"(another placement of its pod groups)",
                        "GangUnschedulable",
                    )
                self.drop(
                    gang,
                    f"planned node {mine.node} of {ask.pod} was not offered by kube-scheduler "
                    "(cordoned, tainted, not ready or failing the pod's constraints)",
                    "not_offered",
                )
                self._emit("replan", gang, f"excluding {mine.node}", "not_offered", node=mine.node)
            else:
                self.drop(gang, f"member {ask.pod} is not in the plan", "not_in_plan")
        waiting = self.quorum(ask)
        if waiting is not None:
            return waiting
        if not any(m.pod == ask.pod and not m.node for m in ask.members):
            return Wait(f"pod {ask.pod} is already bound", "")
        offered = frozenset(offer)
        if ask.groups:  # a tree is planned over every node offered for any of its members
            offered = self._tree_offers[gang] = self._tree_offers.get(gang, frozenset()) | offered
        back = self._backoff.get(gang)
        if back is not None and now < back.until and back.views is views and back.offer == offered:
            return Wait(f"{back.reason} (retry in {back.until - now:.0f}s)", "GangUnschedulable")
        made = self.plan(ask, offered, views, index, now)
        if isinstance(made, Wait):
            return made
        mine = next(p for p in made.placements if p.pod == ask.pod)
        return Planned(mine.node, f"gang {gang} planned on {mine.node}")

    def adopt(
        self,
        ask: GangAsk,
        views: Mapping[str, NodeView],
        index: NetworkIndex,
        now: float,
        since: float | None = None,
    ) -> GangPlan | Wait | None:
        """Take over a gang that another replica of the scheduler was finishing: members already
        bound, the rest pending, and no plan of this tracker (nor a filter here since its last
        bind here). Its reservations lived in that replica's memory only, so the pending
        members are planned and reserved now, before any other pod is answered: a single pod
        or another gang asked about first could otherwise take the room beside the bound
        members and strand them. The plan is `plan`'s with the bound members pinning the
        search to their domain (`_search`), over every node, since no offer is known yet; the
        first filter of each member still checks its planned node is offered (`filter`).
        None when there is nothing to take over (no member bound, none pending, already
        planned or seen here, or below quorum: the first filter then answers as usual).
        `since` is when the gang began waiting as far as the caller can tell (`resume`)."""
        gang = ask.gang
        if gang in self.plans or gang in self._first_seen:
            return None
        if not any(m.node for m in ask.members):
            return None
        if not any(not m.node and m.gpus > 0 for m in ask.members):
            return None
        if ask.min_member is None or len(ask.members) < ask.min_member:
            return None
        self._seen(gang, now if since is None else min(since, now))
        self._emit(
            "adopt",
            gang,
            "members already bound by another scheduler replica: the pending ones are re-planned "
            "beside them and their capacity reserved",
            "takeover",
            bound=sum(1 for m in ask.members if m.node),
        )
        return self.plan(ask, frozenset(views), views, index, now)

    def replan(
        self, ask: GangAsk, views: Mapping[str, NodeView], index: NetworkIndex, now: float, cause: str
    ) -> GangPlan | Wait:
        """Plan the members not yet bound outside a filter (after a failed bind, or reserved
        GPUs found taken), over the nodes the gang's last plan was offered."""
        self.drop(ask.gang, "re-planned", cause)
        self._emit("replan", ask.gang, "members not yet bound, within the last offer", cause)
        offer = self._offers.get(ask.gang)
        return self.plan(ask, offer if offer is not None else frozenset(views), views, index, now)

    def plan(
        self,
        ask: GangAsk,
        offer: frozenset[str],
        views: Mapping[str, NodeView],
        index: NetworkIndex,
        now: float,
    ) -> GangPlan | Wait:
        """Plan the pending GPU members within `offer` and reserve their capacity, or Wait with
        the planner's reason (and a back-off for the same question)."""
        gang = ask.gang
        # Members without GPUs count towards minMember but need no placement.
        pending = sorted([m for m in ask.members if not m.node and m.gpus > 0], key=_pod_of)
        if not pending:
            return Wait(f"gang {gang} has no pending member that needs GPUs", "")
        spec = GangSpec(
            gang,
            tuple([Member(m.pod, m.gpus, m.group) for m in pending]),
            required_level=ask.required_level,
            preferred_level=ask.preferred_level,
            profile=ask.profile,
            groups=ask.groups,
            bound=tuple((m.group, m.node) for m in ask.members if m.node) if ask.groups else (),
        )
        bound = {m.node for m in ask.members if m.node}
        # every view when the offer holds them all (the simulator's case): a C-level check
        if offer.issuperset(views):
            offered = list(views.values())
        else:
            offered = [v for n, v in views.items() if n in offer]
        # a gang waiting for its leaf is asked again at every change of the cluster: found
        # without planning where it is the same answer (`OwnLevels.waits`)
        since = self._first_seen.get(gang, now)
        spill = self.spill_after_s if ask.spill_after_s is None else ask.spill_after_s
        waits = None if bound else self._own.waits(spec, offer, offered, index, since, now, spill)
        result: GangPlan | NoPlan | str | None = None if waits is None else waits.reason(now)
        if result is None:
            if self.objective is not None:  # "the best ring a size gets anywhere": every server
                self._learn(self.objective, views)
            result = self._search(spec, offered, bound, views, index)
            if isinstance(result, GangPlan) and not bound:
                result = self._own.hold(spec, result, offer, offered, views, index, now - since, spill)
        if not isinstance(result, GangPlan):
            stuck = ""
            if isinstance(result, NoPlan):  # a tree names the sub-group it could not place
                stuck, result = result.group, result.reason
            return self._failed(gang, result, len(pending), views, offer, now, waits, stuck)
        self._backoff.pop(gang, None)
        self.plans[gang] = result
        self._offers[gang] = offer
        gpus_of = {m.pod: m.gpus for m in pending}
        expires = now + self.ttl_s
        self.reservations.add(
            [
                Reservation(p.pod, gang, p.node, tuple(p.gpus), gpus_of[p.pod], expires)
                for p in result.placements
            ]
        )
        if result.tree:  # a tree: where each sub-group went and why (`gang.explain`)
            reason = explain.plan_text(result.tree, offered=len(offer))
            tree: dict[str, Any] = {"tree": result.tree, "offered": len(offer)}
        else:
            reason = (
                result.why
                or f"smallest level whose one domain holds all {len(result.placements)} pending members"
            ) + f", within the {len(offer)} nodes offered"
            tree = {}
        self._emit(
            "plan",
            gang,
            reason,
            level=result.level,
            domain=result.domain,
            nodes=sorted({p.node for p in result.placements}),
            members=len(result.placements),
            **tree,
        )
        return result

    def _failed(
        self,
        gang: str,
        result: str,
        members: int,
        views: object,
        offer: frozenset[str],
        now: float,
        level: LevelWait | None,
        stuck: str = "",
    ) -> Wait:
        """A plan that found no room: the back-off for the same question, and the answer.
        `stuck`: the path of the tree's sub-group that could not be placed (a log field, so a
        waiting tree is found by sub-group without reading the reason)."""
        back = self._backoff.get(gang)
        reason = f"gang {gang} does not fit: {result}"
        if back is None:
            delay = self.backoff_s[0]
            self._backoff[gang] = _Backoff(now + delay, delay, reason, views, offer, level)
        else:  # renewed in place: the tracker is the only holder (a gang waiting is asked often)
            delay = min(back.delay * 2, self.backoff_s[1])
            back.until, back.delay, back.reason = now + delay, delay, reason
            back.views, back.offer, back.level = views, offer, level
        extra = {"subgroup": stuck} if stuck else {}
        self._emit("plan_failed", gang, result, members=members, retry_in_s=delay, **extra)
        return Wait(reason, "GangUnschedulable")

    def _learn(self, objective: ClusterObjective, views: Mapping[str, NodeView]) -> None:
        """`objective.learn` of every view's server, asked only for the policies not seen
        before (by identity; a policy's `exact` is fixed): a plan would otherwise build a set
        over every view although the servers rarely change."""
        known = self._policies
        # the distinct allocators first (a few, from one pool): `learn` takes a set anyway
        fresh = [a for a in set(map(_allocator_of, views.values())) if a is not None and id(a) not in known]
        if not fresh:
            return
        if len(known) > 10_000:  # bounded: learning again is a no-op for the objective
            known.clear()
        for a in fresh:
            known[id(a)] = a  # the reference keeps the id its own
        objective.learn({a.exact for a in fresh})

    def level_wait(self, gang: str) -> LevelWait | None:
        """What the gang's last plan, a wait for its own level found without planning
        (`OwnLevels.waits`), can change with (`gang.levelwait.LevelWait`); None after any other answer."""
        back = self._backoff.get(gang)
        return None if back is None else back.level

    def vouches(self, gang: str, offer: frozenset[str], index: NetworkIndex, now: float) -> bool:
        """Whether `repeat_wait` would answer (not None) for the same question at `now`: the
        gang's last answer was a wait for its own level (`level_wait`) over the same offer and
        index, no plan exists, its first filter is the one the wait counts from and the spill
        time has not come. Reads only: the caller that gets True may skip asking altogether when
        it has checked the capacity side itself (the simulator's queueing hint); the tracker's
        back-off and `plan_failed` event for that ask are then not booked."""
        back = self._backoff.get(gang)
        wait = None if back is None else back.level
        if back is None or wait is None or gang in self.plans or wait.index is not index:
            return False
        if back.offer is not offer and back.offer != offer:
            return False
        return self._first_seen.get(gang) == wait.since and not wait.spills(now)

    def repeat_wait(
        self, gang: str, offer: frozenset[str], views: object, index: NetworkIndex, now: float
    ) -> Wait | None:
        """`filter`'s answer and bookkeeping for a gang whose last plan was `level_wait(gang)`,
        asked again at `now` with the same members over new `views` in which, the caller
        checked, no domain of that level reached `count` slots and the offer still has them.
        This checks the rest (`vouches`); None when the answer could differ: ask `filter` then."""
        if not self.vouches(gang, offer, index, now):
            return None
        back = self._backoff[gang]
        wait = back.level
        assert wait is not None  # `vouches` checked it
        if now < back.until and back.views is views:  # as `filter`'s back-off
            return Wait(f"{back.reason} (retry in {back.until - now:.0f}s)", "GangUnschedulable")
        return self._failed(gang, wait.reason(now), wait.count, views, offer, now, wait)

    def _search(
        self,
        spec: GangSpec,
        candidates: list[NodeView],
        bound_nodes: set[str],
        views: Mapping[str, NodeView],
        index: NetworkIndex,
    ) -> GangPlan | NoPlan | str:
        """Plan the pending members; members already bound pin the search to their domain first.
        With a required level, the rest of the gang may only join the bound members' domain of
        that level: planning them anywhere else would split the gang across domains. Domains are
        `levels.domain_of`'s, so two nodes with an empty label value are not one domain."""
        labels = {n: views[n].labels for n in bound_nodes if n in views}
        required = spec.required_level
        if labels and required is not None:
            domains = {domain_of(n, lab, required) for n, lab in labels.items()}
            if len(domains) > 1:
                return f"members already bound span {len(domains)} domains of required level {required}"
            (where,) = domains
            candidates = [v for v in candidates if domain_of(v.name, v.labels, required) == where]
        if labels:
            for level in index.levels:
                values = {domain_of(n, lab, level) for n, lab in labels.items()}
                if len(values) == 1:
                    (value,) = values
                    near = [v for v in candidates if domain_of(v.name, v.labels, level) == value]
                    if near:
                        plan = plan_gang(
                            spec, near, index.levels, index=index, memo=self.memo(), objective=self.objective
                        )
                        if isinstance(plan, GangPlan):
                            return plan
        if not candidates:
            return "no node offered by kube-scheduler can take a member"
        plan = plan_gang(
            spec, candidates, index.levels, index=index, memo=self.memo(), objective=self.objective
        )
        return plan

    # ------------------------------------------------------------------ bind

    def permit(self, pod: str, gang: str | None, gpus: int, node: str) -> Reservation | None:
        """May `pod` bind to `node` now? Its reservation (taken out of the table: the bind turns
        it into an allocation), None for a pod outside any plan, or Refused with the reason."""
        r = self.reservations.get(pod)
        # A bind that does not match the plan comes from a filter answer older than the plan
        # (a re-plan happened meanwhile): refuse it and keep the plan, whose capacity would
        # otherwise go to other gangs while members of this one are already bound.
        if r is not None and r.node != node:
            raise Refused(f"gang {r.gang} planned {pod} on {r.node}, not {node}; filter it again")
        if r is None and gang is not None and gpus > 0:
            # all or nothing: without a reservation the rest of the gang may no longer fit
            raise Refused(f"pod {pod} has no reservation in gang {gang}'s plan; filter it again")
        if r is None:
            return None
        self.reservations.release_pod(pod)
        return r

    def exchange(
        self, r: Reservation, given: Sequence[int], choose: Callable[[list[int], int], Sequence[int]]
    ) -> list[Reservation]:
        """A member permitted with reservation `r` will really be given `given`: the node plugin
        picks from every free GPU, reserved ones included, so which member kube-scheduler binds
        first decides it, and a member may be given GPUs planned for a gang-mate, or for a
        member of another gang on that node. The reservations on that node that `given`
        overlaps are re-drawn there from their own GPUs and `r`'s, less `given`, instead of
        being broken at the next `sweep` (which would re-plan their gangs): a member's bind
        takes no GPU reserved for another pod, and every plan keeps its nodes. A re-drawn
        reservation takes `r`'s planned set when it fits exactly (two equal members swap: the
        plan's sets stay the same sets), else `choose(free, count)` (the node's allocator)
        picks from what is left, which always has room: `given` is `r.count` GPUs, so at most
        `r.count` of the pooled GPUs go. Returns the re-drawn reservations ([]: none hit)."""
        taken = set(given)
        if len(taken) != r.count:
            return []
        hit = sorted(
            (o for o in self.reservations.on_node(r.node, excluding=r.pod) if taken.intersection(o.gpus)),
            key=lambda o: (o.gang != r.gang, o.pod),  # gang-mates first: they may swap with `r`
        )
        if not hit:
            return []
        pool = set(r.gpus).union(*(o.gpus for o in hit)) - taken
        redrawn = []
        for o in hit:
            if len(r.gpus) == o.count and pool.issuperset(r.gpus):
                gpus = tuple(sorted(r.gpus))
            else:
                gpus = tuple(sorted(choose(sorted(pool), o.count)))
            pool -= set(gpus)
            redrawn.append(Reservation(o.pod, o.gang, o.node, gpus, o.count, o.expires_at))
        self.reservations.add(redrawn)
        for gang in sorted({o.gang for o in hit}):
            self._emit(
                "reservation_exchanged",
                gang,
                f"{r.pod} of gang {r.gang} is given GPUs {sorted(taken)} on {r.node}, planned for "
                f"{', '.join(o.pod for o in hit if o.gang == gang)}: re-drawn there from the GPUs "
                f"{r.pod} was planned and theirs",
                "bind_order",
                node=r.node,
                members=[o.pod for o in redrawn if o.gang == gang],
            )
        return redrawn

    def bound(self, pod: str, gang: str, now: float) -> float | None:
        """A member bound: the gang is progressing, so its other reservations get a new TTL;
        once no member holds a reservation the plan is complete. Returns, then, how long the
        gang waited from its first member's first filter (`first_seen`) to this last bind
        (None while members remain, or when the gang was never filtered here). A place that a
        plan made while this bind was in flight gave the pod again (its node was going away) is
        given back: the bind went through after all."""
        self.reservations.release_pod(pod)
        self.reservations.renew_gang(gang, now + self.ttl_s)
        plan = self.plans.get(gang)
        if plan is None or self.reservations.holds(gang):
            return None
        del self.plans[gang]
        self._offers.pop(gang, None)
        self._tree_offers.pop(gang, None)
        first = self._first_seen.pop(gang, None)
        waited = None if first is None else max(0.0, now - first)
        self._emit(
            "gang_bound",
            gang,
            "every planned member is bound",
            level=plan.level,
            domain=plan.domain,
            members=len(plan.placements),
            waited_s=None if waited is None else round(waited, 3),
        )
        return waited

    def first_seen(self, gang: str) -> float | None:
        """When the gang's first member was first filtered (quorum first asked), until it binds."""
        return self._first_seen.get(gang)

    def resume(self, gang: str, since: float, now: float) -> bool:
        """Start a gang's wait clock at `since` (at most `now`) where this tracker has none: a
        gang another replica of the scheduler was timing (its wait for its own level, and the
        wait reported at its last bind) goes on from when it began, not from the takeover.
        False when the tracker already times it."""
        if gang in self._first_seen:
            return False
        self._seen(gang, min(since, now))
        return True

    def _seen(self, gang: str, now: float) -> None:
        if gang in self._first_seen:
            return
        if len(self._first_seen) >= MAX_WAITING_GANGS:  # oldest first: dicts keep insertion order
            del self._first_seen[next(iter(self._first_seen))]
        self._first_seen[gang] = now

    def bind_failed(self, pod: str, gang: str, node: str, reason: str) -> bool:
        """The bind of a member failed: the plan is dropped (its capacity may be wrong now), and
        True returned. The caller re-plans at once when members are already bound (`replan`):
        released until the next filter, that capacity could go to another pod and strand the
        bound members. A plan made while that bind was in flight that already gives the pod a
        place (its node went away meanwhile) stands: the failure is of an older decision, and
        the pod's next filter is steered to its new place (False)."""
        why = f"bind of {pod} on {node} failed: {reason}"
        r = self.reservations.get(pod)
        if r is not None and r.gang == gang and r.node != node and gang in self.plans:
            self._emit("plan_kept", gang, f"{why}; the plan made since places it on {r.node}", "bind_failed")
            return False
        self.drop(gang, why, "bind_failed")
        return True
