"""The extender's decisions: filter, prioritize and bind, for single pods and whole gangs.

The HTTP layer only translates; everything that changes state happens here under one lock, so
parallel calls from kube-scheduler can never promise the same GPU twice. Planning itself is
`gputopo.gang` (one objective, imported); this module owns what happens around a plan: who the
members are, the reservations that hold a plan's capacity, dropping a plan when it breaks, and
backing off a gang that fits nowhere. Every decision is logged with its reason.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from gputopo import jsonlog
from gputopo.allocator import AllocationError
from gputopo.gang import ChoiceMemo, GangPlan, GangSpec, Member, NodeView, node_scores, plan_gang
from gputopo.network import NetworkIndex
from scheduler import defaults
from scheduler.events import EventSink, NullEvents
from scheduler.metrics import Metrics
from scheduler.model import BadInput, PodInfo, Snapshot
from scheduler.reservations import Reservation, Reservations
from scheduler.state import BindError, ClusterState
from scheduler.views import Assumed, ViewBuilder

log = logging.getLogger("gputopo.scheduler")

#: Our own binds are remembered this long at most while the node's annotation catches up.
ASSUMED_TTL_S = 600.0


@dataclass(frozen=True)
class FilterResult:
    node_names: list[str]
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)


@dataclass
class _Backoff:
    until: float
    delay: float
    reason: str


@dataclass(frozen=True)
class _Wait:
    reason: str
    event: str = "GangWaiting"  # the Event reason shown on the pod ("" = none)


@dataclass(frozen=True)
class _Planned:
    node: str


class Extender:
    def __init__(
        self,
        state: ClusterState,
        levels: Sequence[str] = defaults.DEFAULT_LEVELS,
        *,
        clock: Callable[[], float],
        metrics: Metrics | None = None,
        ttl_s: float = defaults.RESERVATION_TTL_S,
        backoff_s: tuple[float, float] = defaults.GANG_BACKOFF_S,
        events: EventSink | None = None,
    ) -> None:
        self.state = state
        self.events = events or NullEvents()  # Kubernetes Events of gang decisions
        self.levels = tuple(levels)
        self.clock = clock
        self.metrics = metrics or Metrics()
        self.ttl_s = ttl_s
        self.backoff_s = backoff_s
        self._lock = threading.Lock()
        self.reservations = Reservations()
        self.plans: dict[str, GangPlan] = {}
        self._backoff: dict[str, _Backoff] = {}
        self._assumed: dict[str, Assumed] = {}
        self._binding: set[str] = set()  # pods whose API call of a bind is in flight
        self._swept: object = None  # the snapshot version reservations were last checked against
        self._assumed_version = 0
        self._views = ViewBuilder()
        self._warned: dict[str, str] = {}
        self._warned_for: object = None
        self._gang_index: tuple[object, dict[str, list[PodInfo]]] | None = None
        self._fits: tuple[dict[str, NodeView], dict[int, tuple[frozenset[str], dict[str, str]]]] | None = None
        # node scores per views object: (views, {(gpus, names): scores}); swapped whole
        self._scores: tuple[dict[str, NodeView], dict[tuple, dict[str, int]]] | None = None
        self._memo = ChoiceMemo()
        self._index_key: int | None = None
        self._index: NetworkIndex | None = None

    def _memo_now(self) -> ChoiceMemo:
        """Allocator answers are pure in (allocator, free set, size): keep them, within bounds."""
        if len(self._memo) > 200_000:
            self._memo = ChoiceMemo()
        return self._memo

    def _levels(self, snap: Snapshot) -> tuple[str, ...]:
        """The cluster's own levels (its Topology objects) when it defines any, else ours."""
        return snap.levels or self.levels

    def _network(self, snap: Snapshot) -> NetworkIndex:
        if self._index is None or self._index_key != snap.version:
            levels = self._levels(snap)
            self._index = NetworkIndex.build(((n.name, n.labels) for n in snap.nodes.values()), levels)
            self._index_key = snap.version
        return self._index

    # ----------------------------------------------------------------------------- helpers

    def _current(self, now: float) -> tuple[Snapshot, dict[str, NodeView]]:
        """Expire what timed out, then the snapshot and its node views (caller holds the lock)."""
        for gang in self.reservations.expired(now):
            self._drop_plan(gang, "reservation expired before every member bound")
        snap = self.state.snapshot()
        if len(self.reservations) and snap.version != self._swept:
            self._sweep(snap)
        stale = [k for k, a in self._assumed.items() if now - a.at > ASSUMED_TTL_S or _caught_up(snap, a)]
        for k in stale:
            del self._assumed[k]
        if stale:
            self._assumed_version += 1
        views = self._views.build(
            snap,
            self._assumed,
            self._assumed_version,
            self.reservations.by_node(),
            self.reservations.version,
        )
        if snap.nodes is not self._warned_for:
            self._warned_for = snap.nodes
            self._warn_unknown(snap)
        self.metrics.reservations.set(len(self.reservations))
        return snap, views

    def _warn_unknown(self, snap: Snapshot) -> None:
        if len(self._warned) > 100_000:
            self._warned.clear()
        for name, info in snap.nodes.items():
            if info.topology is None and info.topology_problem:
                if self._warned.get(name) != info.topology_problem:
                    self._warned[name] = info.topology_problem
                    jsonlog.event(
                        log,
                        "unknown_topology",
                        logging.WARNING,
                        node=name,
                        reason=info.topology_problem,
                        effect="GPUs counted only, neutral score",
                    )
            elif name in self._warned:
                del self._warned[name]

    def _sweep(self, snap: Snapshot) -> None:
        """A reserved member that was deleted or finished, or a planned node that went away,
        breaks its gang's plan now: holding the capacity until the TTL would starve others."""
        self._swept = snap.version
        broken: dict[str, str] = {}
        for r in self.reservations:
            pod = snap.pods.get(r.pod)
            if pod is None or not pod.active:
                broken.setdefault(r.gang, f"planned member {r.pod} was deleted or finished")
            elif r.node not in snap.nodes:
                broken.setdefault(r.gang, f"planned node {r.node} went away")
        for gang, reason in broken.items():
            self._drop_plan(gang, reason)

    def _drop_plan(self, gang: str, reason: str) -> None:
        plan = self.plans.pop(gang, None)
        released = self.reservations.release_gang(gang)
        if plan is not None or released:
            jsonlog.event(log, "plan_dropped", gang=gang, reason=reason, released=len(released))
            self.events.emit("", gang, "GangPlanDropped", f"plan of gang {gang} dropped: {reason}")
            self.metrics.plans.labels(result="dropped").inc()

    # ------------------------------------------------------------------------------ filter

    def filter(self, pod: PodInfo, names: Sequence[str]) -> FilterResult:
        with self._lock:
            now = self.clock()
            self.state.observe(pod)
            snap, views = self._current(now)
            pod = _with_resolved_gang(pod, snap)
            if pod.gang is not None and pod.gpus > 0:
                return self._filter_gang(pod, names, snap, views, now)
        return self._filter_single(pod, names, views)

    def _fit(self, views: dict[str, NodeView], gpus: int) -> tuple[frozenset[str], dict[str, str]]:
        """Nodes with room for `gpus`, and the reason for each other node, per views object:
        a 5,000-node filter is then a set lookup per candidate, not a computation."""
        cached = self._fits
        if cached is None or cached[0] is not views:
            cached = self._fits = (views, {})
        hit = cached[1].get(gpus)
        if hit is None:
            fit = frozenset(n for n, v in views.items() if len(v.free) >= gpus)
            why = {n: f"needs {gpus} GPUs, {len(v.free)} free" for n, v in views.items() if n not in fit}
            hit = cached[1][gpus] = (fit, why)
        return hit

    def _filter_single(self, pod: PodInfo, names: Sequence[str], views: dict[str, NodeView]) -> FilterResult:
        if pod.gpus == 0:
            ok = [n for n in names if n in views]
            failed = {n: "node unknown to gputopo" for n in names if n not in views}
        else:
            fit, why = self._fit(views, pod.gpus)
            ok = [n for n in names if n in fit]
            failed = {n: why.get(n, "node unknown to gputopo") for n in names if n not in fit}
        jsonlog.event(
            log,
            "filter",
            pod=pod.key,
            gpus=pod.gpus,
            candidates=len(names),
            fit=len(ok),
            reason="nodes with enough free GPUs (reservations counted as taken)",
        )
        return FilterResult(ok, failed)

    def _filter_gang(
        self, pod: PodInfo, names: Sequence[str], snap: Snapshot, views: dict[str, NodeView], now: float
    ) -> FilterResult:
        assert pod.gang is not None
        decision = self._gang_decision(pod, snap, views, now)
        gang = pod.gang.key
        if isinstance(decision, _Wait):
            jsonlog.event(log, "filter_gang", pod=pod.key, gang=gang, result="wait", reason=decision.reason)
            if decision.event:
                self.events.emit(pod.key, gang, decision.event, decision.reason)
            return FilterResult([], {}, {n: decision.reason for n in names})
        node = decision.node
        reason = f"gang {gang} planned on {node}"
        out = FilterResult([node] if node in names else [], {}, {n: reason for n in names if n != node})
        if node not in names:
            reason = f"gang {gang} planned on {node}, which this scheduling cycle did not offer"
            out.unresolvable.update({n: reason for n in names})
        jsonlog.event(log, "filter_gang", pod=pod.key, gang=gang, result="planned", node=node, reason=reason)
        self.events.emit(pod.key, gang, "GangPlanned", _planned_message(self.plans.get(gang), gang, node))
        return out

    def _members(self, gang: str, snap: Snapshot) -> list[PodInfo]:
        """Active pods of a gang; the index is rebuilt once per pods mapping, not per call."""
        cached = self._gang_index
        if cached is None or cached[0] is not snap.pods:
            index: dict[str, list[PodInfo]] = {}
            for p in snap.pods.values():
                if p.gang is not None and p.active:
                    index.setdefault(p.gang.key, []).append(p)
            cached = self._gang_index = (snap.pods, index)
        return sorted(cached[1].get(gang, ()), key=lambda p: p.key)

    def _gang_decision(
        self, pod: PodInfo, snap: Snapshot, views: dict[str, NodeView], now: float
    ) -> _Wait | _Planned:
        assert pod.gang is not None
        gang = pod.gang.key
        assumed = self._assumed.get(pod.key)
        if assumed is not None:
            # asked again while (or just after) its bind went out: where it is going, plan kept
            return _Planned(assumed.node)
        plan = self.plans.get(gang)
        if plan is not None:
            mine = next((p for p in plan.placements if p.pod == pod.key), None)
            gone = [p.node for p in plan.placements if p.node not in snap.nodes]
            if gone:
                self._drop_plan(gang, f"planned node {gone[0]} went away")
            elif mine is not None and self.reservations.get(pod.key) is not None:
                return _Planned(mine.node)
            else:
                self._drop_plan(gang, f"member {pod.key} is not in the plan")
        members = self._members(gang, snap)
        need = pod.gang.min_member or snap.min_members.get(gang)
        if need is None:
            return _Wait(f"gang {gang}: PodGroup {gang} not found")
        if len(members) < need:
            return _Wait(f"gang {gang} waiting for members {len(members)}/{need}")
        back = self._backoff.get(gang)
        if back is not None and now < back.until:
            return _Wait(f"{back.reason} (retry in {back.until - now:.0f}s)", "GangUnschedulable")
        # Members without GPUs count towards minMember but need no placement.
        pending = [m for m in members if not m.node and m.key not in self._assumed and m.gpus > 0]
        bound_nodes = {m.node for m in members if m.node} | {
            self._assumed[m.key].node for m in members if m.key in self._assumed
        }
        if pod.key not in {m.key for m in pending}:
            return _Wait(f"pod {pod.key} is already bound", "")
        spec = GangSpec(
            gang,
            tuple(Member(m.key, m.gpus) for m in pending),
            required_level=pod.gang.required_level,
            preferred_level=pod.gang.preferred_level,
        )
        result = self._plan(spec, views, bound_nodes, snap)
        if not isinstance(result, GangPlan):
            delay = self.backoff_s[0] if back is None else min(back.delay * 2, self.backoff_s[1])
            self._backoff[gang] = _Backoff(now + delay, delay, f"gang {gang} does not fit: {result}")
            self.metrics.plans.labels(result="failed").inc()
            jsonlog.event(
                log, "plan_failed", gang=gang, members=len(pending), reason=result, retry_in_s=delay
            )
            return _Wait(f"gang {gang} does not fit: {result}", "GangUnschedulable")
        self._backoff.pop(gang, None)
        self.plans[gang] = result
        gpus_of = {m.key: m.gpus for m in pending}
        self.reservations.add(
            Reservation(p.pod, gang, p.node, tuple(p.gpus), gpus_of[p.pod], now + self.ttl_s)
            for p in result.placements
        )
        self.metrics.plans.labels(result="planned").inc()
        jsonlog.event(
            log,
            "plan",
            gang=gang,
            level=result.level,
            domain=result.domain,
            nodes=sorted({p.node for p in result.placements}),
            members=len(result.placements),
            reason=f"smallest level whose one domain holds all {len(result.placements)} pending members",
        )
        mine = next(p for p in result.placements if p.pod == pod.key)
        return _Planned(mine.node)

    def _plan(
        self, spec: GangSpec, views: dict[str, NodeView], bound_nodes: set[str], snap: Snapshot
    ) -> GangPlan | str:
        """Plan the pending members; members already bound pin the search to their domain first.
        With a required level, the rest of the gang may only join the bound members' domain of
        that level: planning them anywhere else would split the gang across domains."""
        index = self._network(snap)
        candidates = list(views.values())
        known = [n for n in bound_nodes if n in snap.nodes]
        required = spec.required_level
        if known and required is not None:
            domains = {snap.nodes[n].labels.get(required, n) for n in known}
            if len(domains) > 1:
                return f"members already bound span {len(domains)} domains of required level {required}"
            (where,) = domains
            candidates = [v for v in candidates if v.labels.get(required, v.name) == where]
        levels = index.levels
        if known:
            for level in levels:
                values = {snap.nodes[n].labels.get(level, n) for n in known}
                if len(values) == 1:
                    (value,) = values
                    near = [v for v in candidates if v.labels.get(level, v.name) == value]
                    plan = plan_gang(spec, near, levels, index=index, memo=self._memo_now())
                    if isinstance(plan, GangPlan):
                        return plan
        plan = plan_gang(spec, candidates, levels, index=index, memo=self._memo_now())
        return plan if isinstance(plan, GangPlan) else plan.reason

    # -------------------------------------------------------------------------- prioritize

    def prioritize(self, pod: PodInfo, names: Sequence[str]) -> list[tuple[str, int]]:
        with self._lock:
            now = self.clock()
            self.state.observe(pod)
            _snap, views = self._current(now)
            plan = self.plans.get(pod.gang.key) if pod.gang is not None else None
            key = (pod.gpus, tuple(names))
        if plan is not None:
            planned = {p.pod: p.node for p in plan.placements}.get(pod.key)
            return [(n, 10 if n == planned else 0) for n in names]
        if pod.gpus == 0:
            return [(n, 0) for n in names]
        cached = self._scores
        if cached is None or cached[0] is not views or len(cached[1]) > 64:
            cached = self._scores = (views, {})
        scores = cached[1].get(key)
        if scores is None:
            scores = node_scores(pod.gpus, [views[n] for n in names if n in views], memo=self._memo_now())
            cached[1][key] = scores
        jsonlog.event(
            log,
            "prioritize",
            level=logging.DEBUG,
            pod=pod.key,
            gpus=pod.gpus,
            nodes=len(names),
            reason="node objective of the best GPU set, then least disruption",
        )
        return [(n, int(scores.get(n, 0))) for n in names]

    # -------------------------------------------------------------------------------- bind

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        key = f"{namespace}/{name}"
        with self._lock:
            now = self.clock()
            snap, views = self._current(now)
            pod = snap.pods.get(key)
            if pod is None:
                raise BadInput(f"pod {key} is unknown (filter it first)")
            if uid and pod.uid and uid != pod.uid:
                raise BadInput(f"pod {key} has uid {pod.uid}, not {uid}")
            if node not in snap.nodes:
                raise BadInput(f"node {node} is unknown")
            if key in self._binding:
                raise self._refused(key, node, f"a bind of {key} is already in progress")
            bound_to = pod.node or (self._assumed[key].node if key in self._assumed else "")
            if bound_to:
                if bound_to == node:
                    jsonlog.event(log, "bind", pod=key, node=node, result="already bound")
                    return
                raise BindError(f"pod {key} is already bound to {bound_to}")
            r = self.reservations.get(key)
            gang = pod.gang.key if pod.gang is not None else None
            # A bind that does not match the plan comes from a filter answer older than the plan
            # (a re-plan happened meanwhile): refuse it and keep the plan, whose capacity would
            # otherwise go to other gangs while members of this one are already bound.
            if r is not None and r.node != node:
                raise self._refused(
                    key, node, f"gang {r.gang} planned {key} on {r.node}, not {node}; filter it again"
                )
            if r is None and gang is not None and pod.gpus > 0:
                # all or nothing: without a reservation the rest of the gang may no longer fit
                raise self._refused(
                    key, node, f"pod {key} has no reservation in gang {gang}'s plan; filter it again"
                )
            gpus = r.gpus if r is not None else self._pick(views.get(node), pod.gpus, node)
            self.reservations.release_pod(key)
            self._assumed[key] = Assumed(key, node, gpus, pod.gpus, now, pod.uid)
            self._assumed_version += 1
            self._binding.add(key)
        try:
            self.state.bind(pod, node, gpus)
        except BindError as e:
            with self._lock:
                self._binding.discard(key)
                if self._assumed.pop(key, None) is not None:
                    self._assumed_version += 1
                if gang is not None:
                    self._drop_plan(gang, f"bind of {key} on {node} failed: {e}")
                    self._replan_partial(pod, gang)
            self.metrics.binds.labels(result="failed").inc()
            jsonlog.event(log, "bind", logging.WARNING, pod=key, node=node, result="failed", reason=str(e))
            self.events.emit(key, gang, "BindFailed", f"binding to {node} failed: {e}")
            raise
        except BaseException:
            with self._lock:
                self._binding.discard(key)
            raise
        with self._lock:
            self._binding.discard(key)
        self.metrics.binds.labels(result="bound").inc()
        jsonlog.event(log, "bind", pod=key, node=node, gpus=list(gpus), gang=gang, result="bound")
        if gang is not None:
            with self._lock:
                # a member bound: the gang is progressing, so its other reservations get a new TTL
                self.reservations.renew_gang(gang, self.clock() + self.ttl_s)
                plan = self.plans.get(gang)
                if plan is not None and not any(self.reservations.get(p.pod) for p in plan.placements):
                    del self.plans[gang]
                    jsonlog.event(
                        log,
                        "gang_bound",
                        gang=gang,
                        level=plan.level,
                        domain=plan.domain,
                        members=len(plan.placements),
                        reason="every planned member is bound",
                    )

    def _refused(self, key: str, node: str, reason: str) -> BindError:
        """A bind refused before any API call, logged and counted like a failed one."""
        self.metrics.binds.labels(result="failed").inc()
        jsonlog.event(log, "bind", logging.WARNING, pod=key, node=node, result="refused", reason=reason)
        self.events.emit(key, None, "BindRefused", f"bind to {node} refused: {reason}")
        return BindError(reason)

    def _replan_partial(self, pod: PodInfo, gang: str) -> None:
        """A gang with members already bound re-plans the rest at once (caller holds the lock):
        released at the next member filter, its capacity could go to another pod in between and
        strand the bound members where the rest no longer fits."""
        now = self.clock()
        snap, views = self._current(now)
        members = self._members(gang, snap)
        if pod.gpus > 0 and any(m.node or m.key in self._assumed for m in members):
            self._gang_decision(pod, snap, views, now)

    def _pick(self, view: NodeView | None, size: int, node: str) -> tuple[int, ...]:
        if view is None or size == 0:
            return ()
        if len(view.free) < size:
            raise BindError(f"{node} has {len(view.free)} free GPUs, pod needs {size}")
        if view.allocator is None:
            return ()
        try:
            return view.allocator.choose(sorted(view.free), size).indices
        except AllocationError as e:
            raise BindError(f"{node}: {e}") from None


def _planned_message(plan: GangPlan | None, gang: str, node: str) -> str:
    if plan is None:  # steered to where its bind already went
        return f"gang {gang}: this pod goes to {node}"
    nodes = len({p.node for p in plan.placements})
    return (
        f"gang {gang} planned at level {plan.level}, domain {plan.domain}: this pod on {node} "
        f"({len(plan.placements)} pending members on {nodes} nodes)"
    )


def _with_resolved_gang(pod: PodInfo, snap: Snapshot) -> PodInfo:
    """The pod with its gang as the cluster state resolved it (minimum and topology key from
    the gang's group object, scheduler/apikinds.py); kube-scheduler's copy has only the pod."""
    known = snap.pods.get(pod.key)
    if pod.gang is None or known is None or known.gang is None or known.gang.key != pod.gang.key:
        return pod
    return pod if known.gang == pod.gang else replace(pod, gang=known.gang)


def _caught_up(snap: Snapshot, a: Assumed) -> bool:
    """An assumed bind is no longer needed once the watch shows the pod bound and the node's
    annotation was written after the bind (or the node has no annotation to wait for)."""
    pod = snap.pods.get(a.pod)
    if pod is not None and a.uid and pod.uid and pod.uid != a.uid:
        return True  # deleted and recreated under the same name: the old bind is history
    if pod is None or not pod.node:
        return pod is None
    info = snap.nodes.get(a.node)
    return info is None or info.topology is None or info.topology.generated_at > a.at
