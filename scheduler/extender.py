"""The extender's verbs: filter, prioritize and bind, translated onto the core's decisions.

Decisions are made in the pure core: single pods by `gputopo.gang` (node objective), gangs by
`gputopo.gangs.GangTracker` (quorum, plans within what kube-scheduler offered, reservations,
re-plans). This module only keeps what a live cluster adds around them, under one lock so
that parallel calls from kube-scheduler never promise the same GPU twice: the snapshot and its
NodeViews (cached per snapshot), the binds this sidecar made that no annotation shows yet, the
one API call of a bind in flight per pod, and the structured log and metrics of every decision.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gputopo import jsonlog
from gputopo.allocator import AllocationError
from gputopo.gang import GangPlan, NodeView, node_scores
from gputopo.gangs import Event, GangAsk, GangMember, GangTracker, Planned, Refused
from gputopo.network import NetworkIndex
from gputopo.reservations import Assumed, Reservations
from scheduler import defaults
from scheduler.metrics import Metrics
from scheduler.model import BadInput, PodInfo, Snapshot
from scheduler.state import BindError, ClusterState
from scheduler.views import ViewBuilder

log = logging.getLogger("gputopo.scheduler")

#: Our own binds are remembered this long at most while the node's annotation catches up.
ASSUMED_TTL_S = 600.0

#: Tracker event kinds -> the result label of the gputopo_gang_plans metric.
_PLAN_RESULT = {"plan": "planned", "plan_failed": "failed", "plan_dropped": "dropped"}


@dataclass(frozen=True)
class FilterResult:
    node_names: list[str]
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)


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
    ) -> None:
        self.state = state
        self.levels = tuple(levels)
        self.clock = clock
        self.metrics = metrics or Metrics()
        self.ttl_s = ttl_s
        self.gangs = GangTracker(self.levels, ttl_s=ttl_s, backoff_s=backoff_s)
        self._lock = threading.Lock()
        self._assumed: dict[str, Assumed] = {}
        self._binding: set[str] = set()  # pods whose API call of a bind is in flight
        self._swept: object = None  # (snapshot version, assumed version) last swept
        self._assumed_version = 0
        self._views = ViewBuilder()
        self._warned: dict[str, str] = {}
        self._warned_for: object = None
        self._gang_index: tuple[object, dict[str, list[PodInfo]]] | None = None
        self._fits: tuple[dict[str, NodeView], dict[int, tuple[frozenset[str], dict[str, str]]]] | None = None
        # node scores per views object: (views, {(gpus, names): scores}); swapped whole
        self._scores: tuple[dict[str, NodeView], dict[tuple, dict[str, int]]] | None = None
        self._index_key: int | None = None
        self._index: NetworkIndex | None = None

    @property
    def reservations(self) -> Reservations:
        return self.gangs.reservations

    @property
    def plans(self) -> dict[str, GangPlan]:
        return self.gangs.plans

    def _drop_plan(self, gang: str, reason: str) -> None:
        with self._lock:
            self.gangs.drop(gang, reason, "operator")
            self._log_events()

    def _network(self, snap: Snapshot) -> NetworkIndex:
        if self._index is None or self._index_key != snap.version:
            self._index = NetworkIndex.build(((n.name, n.labels) for n in snap.nodes.values()), self.levels)
            self._index_key = snap.version
        return self._index

    def _log_events(self) -> None:
        """Log and count what the tracker did (caller holds the lock)."""
        for e in self.gangs.drain():
            _log_event(e)
            result = _PLAN_RESULT.get(e.kind)
            if result is not None:
                self.metrics.plans.labels(result=result).inc()
        self.metrics.reservations.set(len(self.gangs.reservations))

    # ----------------------------------------------------------------------------- helpers

    def _current(self, now: float) -> tuple[Snapshot, dict[str, NodeView]]:
        """Expire what timed out, then the snapshot and its node views (caller holds the lock)."""
        self.gangs.expire(now)
        snap = self.state.snapshot()
        stale = [k for k, a in self._assumed.items() if now - a.at > ASSUMED_TTL_S or _caught_up(snap, a)]
        for k in stale:
            del self._assumed[k]
        if stale:
            self._assumed_version += 1
        taken: list[str] = []
        if len(self.gangs.reservations) and (snap.version, self._assumed_version) != self._swept:
            self._swept = (snap.version, self._assumed_version)
            taken = self.gangs.sweep(
                alive=lambda k: (p := snap.pods.get(k)) is not None and p.active,
                has_node=snap.nodes.__contains__,
                in_use=lambda node: self._in_use(snap, node),
            )
        views = self._build(snap)
        if taken:
            for gang in taken:
                self._replan(gang, snap, views, now, "gpus_taken")
            views = self._build(snap)
        if snap.nodes is not self._warned_for:
            self._warned_for = snap.nodes
            self._warn_unknown(snap)
        self._log_events()
        return snap, views

    def _build(self, snap: Snapshot) -> dict[str, NodeView]:
        return self._views.build(
            snap,
            self._assumed,
            self._assumed_version,
            self.gangs.reservations.by_node(),
            self.gangs.reservations.version,
        )

    def _in_use(self, snap: Snapshot, node: str) -> set[int]:
        """GPUs of `node` that a pod holds: the published in-use set and our assumed binds."""
        info = snap.nodes.get(node)
        used = set(info.topology.allocated) if info is not None and info.topology is not None else set()
        for a in self._assumed.values():
            if a.node == node:
                used.update(a.gpus)
        return used

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

    def _ask(self, pod: PodInfo, snap: Snapshot) -> GangAsk:
        """The tracker's view of a gang: members bound per the watch or by our own binds."""
        assert pod.gang is not None
        gang = pod.gang.key
        members = tuple(
            GangMember(m.key, m.gpus, m.node or (a.node if (a := self._assumed.get(m.key)) else ""))
            for m in self._members(gang, snap)
        )
        return GangAsk(
            gang,
            pod.key,
            members,
            pod.gang.min_member or snap.min_members.get(gang),
            pod.gang.required_level,
            pod.gang.preferred_level,
        )

    def _replan(self, gang: str, snap: Snapshot, views: dict[str, NodeView], now: float, cause: str) -> None:
        """Re-plan a gang's unbound members outside a filter (caller holds the lock)."""
        pending = [
            m for m in self._members(gang, snap) if m.gpus > 0 and not m.node and m.key not in self._assumed
        ]
        if pending:
            self.gangs.replan(self._ask(pending[0], snap), views, self._network(snap), now, cause)

    # ------------------------------------------------------------------------------ filter

    def filter(self, pod: PodInfo, names: Sequence[str]) -> FilterResult:
        with self._lock:
            now = self.clock()
            self.state.observe(pod)
            snap, views = self._current(now)
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
        gang = pod.gang.key
        assumed = self._assumed.get(pod.key)
        if assumed is not None:
            # asked again while (or just after) its bind went out: where it is going, plan kept
            decision: Planned | object = Planned(assumed.node, f"gang {gang} planned on {assumed.node}")
        else:
            decision = self.gangs.filter(self._ask(pod, snap), names, views, self._network(snap), now)
            self._log_events()
        if not isinstance(decision, Planned):
            reason = getattr(decision, "reason", "")
            jsonlog.event(log, "filter_gang", pod=pod.key, gang=gang, result="wait", reason=reason)
            return FilterResult([], {}, {n: reason for n in names})
        node, reason = decision.node, decision.reason
        out = FilterResult([node] if node in names else [], {}, {n: reason for n in names if n != node})
        if node not in names:
            reason = f"gang {gang} planned on {node}, which this scheduling cycle did not offer"
            out.unresolvable.update({n: reason for n in names})
        jsonlog.event(log, "filter_gang", pod=pod.key, gang=gang, result="planned", node=node, reason=reason)
        return out

    # -------------------------------------------------------------------------- prioritize

    def prioritize(self, pod: PodInfo, names: Sequence[str]) -> list[tuple[str, int]]:
        with self._lock:
            now = self.clock()
            self.state.observe(pod)
            _snap, views = self._current(now)
            planned = self.gangs.planned_node(pod.key, pod.gang.key) if pod.gang is not None else None
            in_plan = pod.gang is not None and pod.gang.key in self.gangs.plans
            key = (pod.gpus, tuple(names))
        if in_plan:
            return [(n, 10 if n == planned else 0) for n in names]
        if pod.gpus == 0:
            return [(n, 0) for n in names]
        cached = self._scores
        if cached is None or cached[0] is not views or len(cached[1]) > 64:
            cached = self._scores = (views, {})
        scores = cached[1].get(key)
        if scores is None:
            scores = node_scores(pod.gpus, [views[n] for n in names if n in views], memo=self.gangs.memo())
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
            gang = pod.gang.key if pod.gang is not None else None
            try:
                r = self.gangs.permit(key, gang, pod.gpus, node)
            except Refused as e:
                raise self._refused(key, node, str(e)) from None
            gpus = r.gpus if r is not None else self._pick(views.get(node), pod.gpus, node)
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
                    self.gangs.bind_failed(key, gang, node, str(e))
                    self._replan_partial(pod, gang)
                self._log_events()
            self.metrics.binds.labels(result="failed").inc()
            jsonlog.event(log, "bind", logging.WARNING, pod=key, node=node, result="failed", reason=str(e))
            raise
        except BaseException:
            with self._lock:
                self._binding.discard(key)
            raise
        with self._lock:
            self._binding.discard(key)
            if gang is not None:
                self.gangs.bound(key, gang, self.clock())
                self._log_events()
        self.metrics.binds.labels(result="bound").inc()
        jsonlog.event(log, "bind", pod=key, node=node, gpus=list(gpus), gang=gang, result="bound")

    def _refused(self, key: str, node: str, reason: str) -> BindError:
        """A bind refused before any API call, logged and counted like a failed one."""
        self.metrics.binds.labels(result="failed").inc()
        jsonlog.event(log, "bind", logging.WARNING, pod=key, node=node, result="refused", reason=reason)
        return BindError(reason)

    def _replan_partial(self, pod: PodInfo, gang: str) -> None:
        """A gang with members already bound re-plans the rest at once (caller holds the lock):
        released at the next member filter, its capacity could go to another pod in between and
        strand the bound members where the rest no longer fits."""
        now = self.clock()
        snap, views = self._current(now)
        members = self._members(gang, snap)
        if pod.gpus > 0 and any(m.node or m.key in self._assumed for m in members):
            self._replan(gang, snap, views, now, "bind_failed")

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


def _log_event(e: Event) -> None:
    level = logging.WARNING if e.kind == "plan_dropped" else logging.INFO
    fields = {k: v for k, v in e.fields.items() if k not in ("gang", "reason", "cause")}
    if e.kind == "quorum_wait":
        level = logging.DEBUG
    jsonlog.event(log, e.kind, level, gang=e.gang, reason=e.reason, cause=e.cause or None, **fields)


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
