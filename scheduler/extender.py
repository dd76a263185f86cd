"""The extender's verbs: filter, prioritize and bind, translated onto the core's decisions.

Decisions are made in the pure core: single pods by `gputopo.gang.planner` (node objective), gangs by
`gputopo.gang.tracker.GangTracker` (quorum, plans within what kube-scheduler offered, reservations,
re-plans). This module only keeps what a live cluster adds around them, under one lock so
that parallel calls from kube-scheduler never promise the same GPU twice: the snapshot and its
NodeViews (cached per snapshot), the binds this sidecar made that no annotation shows yet, the
one API call of a bind in flight per pod, and the structured log and metrics of every decision.

The locking rule (issue 30; docs/scheduler.md "Reservations and the lock"): `_lock` guards the
tracker (plans, reservations), the cache (assumed binds) and the views built from them, and every
verb takes its views from one `_current` under it. A views object is immutable and carries each
node's reservations (`NodeClass.held`), so whatever a verb computes from it afterwards, outside
the lock (prioritize's scores), sees the same reservations its decision did. On those views one
rule, `NodeClass.takes_reserved`, decides for every pod outside a plan: a node is usable only
when the GPUs its plugin would give the pod (the allocator's pick from what kubelet offers,
reservations included) avoid every reservation there. filter fails such a node, prioritize
scores it 0, and bind, which judges on the views of its own call, refuses it before any API
call, so a pod filtered before a plan and bound after it cannot take that plan's GPUs. A member's
bind that the plugin gives another member's reserved GPUs re-draws those reservations on that
node under the same lock (`GangTracker.exchange`) rather than breaking them. Reservations expire
by their TTL as before (`GangTracker.expire`, first thing in `_current`).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from gputopo import jsonlog
from gputopo.gang import explain
from gputopo.gang import sources as gangsources
from gputopo.gang.asks import Decision, Event, GangAsk, GangMember, Planned, Refused
from gputopo.gang.hypernodes import HyperTiers
from gputopo.gang.planner import GangPlan, SubGroup
from gputopo.gang.reservations import Assumed, Reservations
from gputopo.gang.sources import Tier
from gputopo.gang.tracker import GangTracker
from gputopo.network.levels import NetworkIndex
from gputopo.network.nodeview import ChoiceMemo, NodeView
from gputopo.node.allocator import AllocationError
from gputopo.pod.leafpack import Leaves
from gputopo.pod.objective import ClusterObjective, DemandMix
from gputopo.pod.placement import node_scores
from gputopo.pod.ringwait import RingWait
from scheduler import defaults
from scheduler.model import BadInput, PodInfo, Snapshot
from scheduler.nodeguard import NodeGuard
from scheduler.picture.cache import ClusterCache
from scheduler.picture.classes import NodeClass, NodeViews, reserved_reason
from scheduler.picture.feed import BindError, ClusterState
from scheduler.picture.ranks import Ranked
from scheduler.report.events import EventSink, NullEvents, gang_event
from scheduler.report.metrics import Metrics

log = logging.getLogger("gputopo.scheduler")

#: Tracker event kinds -> the result label of the gputopo_gang_plans metric.
_PLAN_RESULT = {"plan": "planned", "plan_failed": "failed", "plan_dropped": "dropped"}


@dataclass(frozen=True)
class FilterResult:
    node_names: list[str]
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)


class Extender:
    """The three verbs over one GangTracker and one ClusterCache, under one lock."""

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
        spill_after_s: float = defaults.GANG_SPILL_AFTER_S,
    ) -> None:
        self.state = state
        self.events = events or NullEvents()  # Kubernetes Events of gang decisions
        self.levels = tuple(levels)
        self.clock = clock
        self.metrics = metrics or Metrics()
        self.ttl_s = ttl_s
        # single pods and gang plans are ranked by the cluster-level objective
        # (gputopo/pod/objective.py) over the GPU demand of the pods this sidecar has been
        # asked about; the tracker holds it, as the simulator's does
        self.objective = ClusterObjective(DemandMix())
        self.gangs = GangTracker(
            self.levels,
            ttl_s=ttl_s,
            backoff_s=backoff_s,
            objective=self.objective,
            spill_after_s=spill_after_s,
        )
        self.cache = ClusterCache(self.levels, NodeGuard(self.metrics))
        self.ring_wait = RingWait(self.objective.comm, self.objective.band, spill_after_s)  # as a gang's
        self._observed: dict[str, None] = {}  # pods already counted in the mix (bounded, oldest out)
        self._lock = threading.Lock()
        self._binding: set[str] = set()  # pods whose API call of a bind is in flight
        self._swept: object = None  # (snapshot version, assumed version) last swept
        self._last_call: float | None = None  # the clock at the last call (`_take_over`)
        self.takeovers = 0  # passes of `_take_over` that adopted a gang (tests, operators)
        # the leaves of the last network index (`gputopo.pod.leafpack`: single pods pack leaves)
        self._leaves: tuple[NetworkIndex, Leaves] | None = None
        #: the levels some node is labelled with, for the network index they were read from
        #: (Volcano's tiers count only those: `_labelled_levels`)
        self._labelled: tuple[NetworkIndex, frozenset[str]] | None = None
        self._hyper: tuple[NetworkIndex, object, HyperTiers] | None = None

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

    def _log_events(self) -> None:
        """Log and count what the tracker did (caller holds the lock)."""
        for e in self.gangs.drain():
            _log_event(e)
            result = _PLAN_RESULT.get(e.kind)
            if result is not None:
                self.metrics.plans.labels(result=result).inc()
            written = gang_event(e)
            if written is not None:  # on the gang's group object (PodGroup, Workload, ...)
                self.events.emit("", e.gang, *written)
        self.metrics.reservations.set(len(self.gangs.reservations))

    def _current(self, now: float) -> tuple[Snapshot, NodeViews]:
        """Expire what timed out, break the plans the cluster no longer supports (re-planning
        those whose reserved GPUs were taken), then the snapshot and its views (lock held)."""
        self.gangs.expire(now)
        snap = self.state.snapshot()
        cache = self.cache
        cache.forget_caught_up(snap, now)
        taken: dict[str, str] = {}  # gang -> why its reservations broke
        if len(self.gangs.reservations) and (snap.version, cache.assumed_version) != self._swept:
            self._swept = (snap.version, cache.assumed_version)
            binding = self._binding
            taken = self.gangs.sweep(
                alive=lambda k: (p := snap.pods.get(k)) is not None and p.active,
                has_node=snap.nodes.__contains__,
                in_use=lambda node: cache.in_use(snap, node),
                bound_to=lambda k: "" if k in binding else (p.node if (p := snap.pods.get(k)) else ""),
            )
        views = self._views(snap)
        for gang, cause in taken.items():
            if cause == "gpus_taken":
                self.metrics.broken_reservations.inc()
            self._replan(gang, snap, views, now, cause)
        if taken:
            views = self._views(snap)
        last, self._last_call = self._last_call, now
        paused = last is None or now - last >= defaults.TAKEOVER_GAP_S
        if paused and self._take_over(snap, views, now):
            views = self._views(snap)
        self._log_events()
        return snap, views

    def _take_over(self, snap: Snapshot, views: NodeViews, now: float) -> bool:
        """What this sidecar knew only in memory, rebuilt from the API at its first call and
        after every pause (`defaults.TAKEOVER_GAP_S`), since such a call may be its first as the
        leader (docs/operator.md "Failover"): the gangs another replica left part-bound get
        their pending members planned beside the bound ones and reserved before anything else
        is answered (`GangTracker.adopt`), gangs still waiting go on with the wait clock their
        creation gives (`_wait_since`, `GangTracker.resume`), and an empty demand mix is seeded
        with the GPU pods the cluster holds. Cheap when there is nothing to do: one pass over
        the pods. True when a gang was adopted (the views changed). Caller holds the lock."""
        if self.objective.mix.observations == 0:
            for p in snap.pods.values():
                if p.active and p.gpus > 0:
                    self._observe_demand(p)
        partial: dict[str, PodInfo] = {}  # gang -> a pending member
        bound: set[str] = set()
        created: dict[str, float] = {}  # gang -> its oldest active member's creation
        for p in snap.pods.values():
            g = p.gang
            if g is None or not p.active:
                continue
            if p.created is not None and p.created < created.get(g.key, math.inf):
                created[g.key] = p.created
            if self.cache.placed_node(p, snap):
                bound.add(g.key)
            elif p.gpus > 0:
                partial.setdefault(g.key, p)
        for gang, pod in partial.items():  # waiting gangs: their wait clocks
            if gang not in bound and gang not in self.plans:
                since = self._wait_since(created.get(gang), pod, now)
                if since is not None:
                    self.gangs.resume(gang, since, now)
        adopted = False
        index = None
        for gang in sorted(bound.intersection(partial)):
            if gang in self.gangs.plans or self.gangs.first_seen(gang) is not None:
                continue
            index = index or self.cache.network(snap)
            since = self._wait_since(created.get(gang), partial[gang], now)
            made = self.gangs.adopt(self._ask(partial[gang], snap), views, index, now, since)
            if made is not None:
                adopted = True
                if isinstance(made, GangPlan):
                    views = self._views(snap)  # the next gang sees this one's reservations
        if adopted:
            self.takeovers += 1
        return adopted

    def _wait_since(self, created: float | None, pod: PodInfo, now: float) -> float | None:
        """When a gang began waiting, re-derived from its oldest member's creationTimestamp:
        trusted only within the gang's spill time before `now` (a creation time in the future
        is taken as `now`). An older one (a test's frozen clock, or a gang older than its
        whole wait) is not used: the clock then restarts, which errs towards waiting longer
        for the gang's own level, never towards spilling early."""
        if created is None:
            return None
        spill = self.gangs.spill_after_s if pod.topology_wait_s is None else pod.topology_wait_s
        if created < now - spill:
            return None
        return min(created, now)

    def _views(self, snap: Snapshot) -> NodeViews:
        r = self.gangs.reservations
        return self.cache.views(snap, r.by_node(), r.version)

    def _ask(self, pod: PodInfo, snap: Snapshot) -> GangAsk:
        """The tracker's view of a gang: members bound per the watch or by our own binds, each
        in its sub-group; the gang's tree merged from what its members know (`gang_tree`)."""
        g = pod.gang
        assert g is not None
        known = self.cache.members(g.key, snap)
        groups = gang_tree(pod, known)
        names = {s.name for s in groups}
        members = tuple(
            GangMember(m.key, m.gpus, self.cache.placed_node(m, snap), _subgroup(m, names)) for m in known
        )
        need = g.min_member or snap.min_members.get(g.key)
        required, preferred = g.required_level, g.preferred_level
        tiers = dict(g.subgroup_tiers)
        for m in known:
            if m.gang is not None:
                for name, t in m.gang.subgroup_tiers:
                    tiers.setdefault(name, t)
        if g.tier is not None or tiers:  # Volcano: tiers, mapped onto our levels
            net = self.cache.network(snap)
            labelled, hyper = self._labelled_levels(net, snap), self._hyper_tiers(net, snap)
            if g.tier is not None:
                level = gangsources.tier_level(g.tier, net.levels, labelled, hyper)
                required, preferred = (level, None) if g.tier.hard else (None, level)
            groups = tuple(_tiered(s, tiers.get(s.name), net.levels, labelled, hyper) for s in groups)
        return GangAsk(
            g.key,
            pod.key,
            members,
            need,
            required,
            preferred,
            pod.topology_wait_s,
            pod.profile,
            groups,
        )

    def _hyper_tiers(self, net: NetworkIndex, snap: Snapshot) -> HyperTiers | None:
        """What the cluster's Volcano HyperNodes say each tier is, rebuilt when the network index
        (node labels) or the HyperNodes change; None without HyperNodes."""
        if not snap.hypernodes:
            return None
        kept = self._hyper
        if kept is None or kept[0] is not net or kept[1] is not snap.hypernodes:
            labels = {name: snap.nodes[name].labels for name in net.nodes if name in snap.nodes}
            kept = self._hyper = (net, snap.hypernodes, HyperTiers.build(snap.hypernodes, labels, net.levels))
        return kept[2]

    def _labelled_levels(self, net: NetworkIndex, snap: Snapshot) -> frozenset[str]:
        """The levels of `net` some node carries a label for, read once per network index (it is
        rebuilt when the nodes' labels change), not at every member's filter."""
        kept = self._labelled
        if kept is None or kept[0] is not net:
            levels = set(net.levels)
            found = frozenset(k for n in snap.nodes.values() for k in n.labels if k in levels)
            kept = self._labelled = (net, found)
        return kept[1]

    def _replan(self, gang: str, snap: Snapshot, views: NodeViews, now: float, cause: str) -> None:
        """Re-plan a gang's unbound members outside a filter (caller holds the lock)."""
        pending = [
            m for m in self.cache.members(gang, snap) if m.gpus > 0 and not self.cache.placed_node(m, snap)
        ]
        if pending:
            self.gangs.replan(self._ask(pending[0], snap), views, self.cache.network(snap), now, cause)

    # ------------------------------------------------------------------------------ filter

    def filter(self, pod: PodInfo, names: Sequence[str]) -> FilterResult:
        with self._lock:
            now = self.clock()
            self.state.observe(pod)
            snap, views = self._current(now)
            pod = _with_resolved_gang(_with_claim_size(pod, snap), snap)
            self._observe_demand(pod)
            if pod.gang is not None and pod.gpus > 0:
                return self._filter_gang(pod, names, snap, views, now)
            # one pass, per node its class's free count and (2+ GPUs) whether it gives its best ring
            judge = self.ring_wait.judge(pod.gpus, pod.topology_wait_s)
            ok, failed, drop = views.split(names, pod.gpus, judge)
            why = self.ring_wait.reason(
                f"{pod.key}/{pod.uid}", pod.gpus, bool(drop), now, pod.topology_wait_s
            )
        if why is not None:  # held to the nodes that give it their best ring (gputopo.pod.ringwait)
            ok, failed = [n for n in ok if n not in drop], failed | dict.fromkeys(drop, why)
        jsonlog.event(
            log,
            "filter",
            pod=pod.key,
            gpus=pod.gpus,
            candidates=len(names),
            fit=len(ok),
            reason=why or "nodes with enough free GPUs (reservations counted as taken)",
        )
        return FilterResult(ok, failed)

    def _observe_demand(self, pod: PodInfo) -> None:
        """Count a pod's GPU request in the demand mix once (caller holds the lock)."""
        key = f"{pod.key}/{pod.uid}"
        if pod.gpus <= 0 or key in self._observed:
            return
        if len(self._observed) >= 100_000:
            del self._observed[next(iter(self._observed))]
        self._observed[key] = None
        self.objective.mix.observe(pod.gpus, gang=pod.gang is not None)

    def _filter_gang(
        self, pod: PodInfo, names: Sequence[str], snap: Snapshot, views: NodeViews, now: float
    ) -> FilterResult:
        assert pod.gang is not None
        gang = pod.gang.key
        assumed = self.cache.assumed.get(pod.key)
        decision: Decision
        if assumed is not None:
            # asked again while (or just after) its bind went out: where it is going, plan kept
            decision = Planned(assumed.node, f"gang {gang} planned on {assumed.node}")
        else:
            decision = self.gangs.filter(self._ask(pod, snap), names, views, self.cache.network(snap), now)
            self._log_events()
        if not isinstance(decision, Planned):
            jsonlog.event(log, "filter_gang", pod=pod.key, gang=gang, result="wait", reason=decision.reason)
            if decision.event:
                self.events.emit(pod.key, gang, decision.event, decision.reason)
            return FilterResult([], {}, {n: decision.reason for n in names})
        node, reason = decision.node, decision.reason
        if node in names:
            # the planned node alone: kube-scheduler binds there and reads no other node's
            # status (it keeps them only to explain a pod that fits nowhere); naming every
            # other node cost a 1.5 MB answer per member at 20,000 nodes, 5 MB at 60,000
            out = FilterResult([node])
        else:
            reason = f"gang {gang} planned on {node}, which this scheduling cycle did not offer"
            out = FilterResult([], {}, dict.fromkeys(names, reason))
        jsonlog.event(log, "filter_gang", pod=pod.key, gang=gang, result="planned", node=node, reason=reason)
        self.events.emit(
            pod.key, gang, "GangPlanned", _planned_message(self.plans.get(gang), gang, node, pod.key)
        )
        return out

    # -------------------------------------------------------------------------- prioritize

    def prioritize(self, pod: PodInfo, names: Sequence[str]) -> list[tuple[str, int]]:
        """(node, score) for each candidate, in their order (`ranked`'s answer)."""
        return self.ranked(pod, names).pairs()

    def ranked(self, pod: PodInfo, names: Sequence[str]) -> Ranked:
        """Prioritize: a gang member's planned node 10 and the rest 0; otherwise each node by
        the node objective of the best GPU set it gives (one node asked per class), the fullest
        leaf keeping the top score (`gputopo.pod.leafpack`). Scores are asked of one node per
        class (a node's score is a function of its allocator, its free set and the classes
        present: the ranks), and a pod that declared what it trains (`profile`) is weighed by
        that profile instead of the mix. Answered from the kept picture of every node
        (`scheduler.picture.ranks`) when it can: work per changed node and per class, not per
        candidate; else by `_per_node_scores`, the same scores."""
        with self._lock:
            now = self.clock()
            self.state.observe(pod)
            snap, views = self._current(now)
            pod = _with_claim_size(pod, snap)
            in_plan = pod.gang is not None and pod.gang.key in self.gangs.plans
            planned = self.gangs.planned_node(pod.key, pod.gang.key) if pod.gang is not None else None
            if in_plan:
                return Ranked(names, [10 if n == planned else 0 for n in names])
            if pod.gpus == 0:
                return Ranked(names, [0] * len(names))
            net = self.cache.network(snap)
            if self._leaves is None or self._leaves[0] is not net:
                self._leaves = (net, Leaves.of(net))
            leaves = self._leaves[1]
            self._learn_policies()
            objective = self.objective.declared(pod.profile)
            memo = self.gangs.memo()

            def score(reps: list[NodeClass], rep_names: list[str]) -> list[int]:
                return _class_scores(pod.gpus, reps, [views[n] for n in rep_names], memo, objective)

            got = None
            if views.current():
                got = self.cache.ranks.rank(names, pod.gpus, views.class_map(), net, leaves, score)
            path = "kept"
            if got is None:
                path = "per-node"
                got = Ranked(names, _per_node_scores(names, views, net, leaves, score))
        jsonlog.event(
            log,
            "prioritize",
            level=logging.DEBUG,
            pod=pod.key,
            gpus=pod.gpus,
            nodes=len(names),
            path=path,
            reason="node objective of the best GPU set, then least disruption",
        )
        return got

    def _learn_policies(self) -> None:
        """ "The best ring this size gets anywhere" over every server of the cluster, as the
        simulator's objective knows it, not only the ones that happened to be candidates
        (caller holds the lock)."""
        self.objective.learn(p.exact for p in self.cache.policies())

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
            bound_to = self.cache.bound_node(pod)
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
            if r is None and (taken := views.takes_reserved(node, pod.gpus)):
                # the reservation rule (module docstring): judged on the views of now, so a pod
                # whose filter passed before a gang was planned here cannot take its GPUs
                c = views.node_class(node)
                assert c is not None
                raise self._refused(key, node, f"{reserved_reason(c, pod.gpus, taken)}; filter it again")
            # kubelet offers the plugin every free GPU, reserved ones included: predict what it
            # will pick, so the accounting matches the node
            predicted = self.cache.predict(node, pod.gpus, views.get(node))
            if r is not None and predicted:
                # a member bound before its gang-mates on one node may be given (part of) a
                # mate's planned set: the mates' reservations are re-drawn around it
                self.gangs.exchange(r, predicted, _chooser(views.get(node)))
            gpus = predicted or gpus
            self.cache.assume(Assumed(key, node, gpus, pod.gpus, now, pod.uid))
            self._binding.add(key)
        try:
            self.state.bind(pod, node, gpus)
        except BindError as e:
            with self._lock:
                self._binding.discard(key)
                self.cache.unassume(key)
                if gang is not None and self.gangs.bind_failed(key, gang, node, str(e)):
                    self._replan_partial(pod, gang)
                self._log_events()
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
            self.ring_wait.forget(f"{key}/{pod.uid}")  # placed: its ring wait, if any, is over
            if gang is not None:
                waited = self.gangs.bound(key, gang, self.clock())
                if waited is not None:  # the gang's last member: first filter to last bind
                    self.metrics.gang_wait.observe(waited)
                self._log_events()
        self.metrics.binds.labels(result="bound").inc()
        jsonlog.event(log, "bind", pod=key, node=node, gpus=list(gpus), gang=gang, result="bound")

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
        if pod.gpus > 0 and any(self.cache.placed_node(m, snap) for m in self.cache.members(gang, snap)):
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


def _chooser(view: NodeView | None) -> Callable[[list[int], int], Sequence[int]]:
    """`count` GPUs of `free` as the node's allocator picks them (the lowest ones without one)."""
    alloc = view.allocator if view is not None else None

    def choose(free: list[int], count: int) -> Sequence[int]:
        if alloc is not None:
            try:
                return alloc.choose(free, count).indices
            except AllocationError:
                pass
        return free[:count]

    return choose


def _planned_message(plan: GangPlan | None, gang: str, node: str, pod: str = "") -> str:
    """The pod's GangPlanned Event. A member of a tree gang also reads where its own sub-group
    went (`kubectl describe pod` shows only the pod's Events, not the gang object's)."""
    if plan is None:  # steered to where its bind already went
        return f"gang {gang}: this pod goes to {node}"
    nodes = len({p.node for p in plan.placements})
    text = (
        f"gang {gang} planned at level {plan.level}, domain {plan.domain}: this pod on {node} "
        f"({len(plan.placements)} pending members on {nodes} nodes)"
    )
    mine = next((p for p in plan.tree[1:] if pod in p.pods), None)
    if mine is not None:
        text += explain.OWN_SUBGROUP + explain.entry(mine, explain.paths(plan.tree)[mine.name], bounded=True)
    return text


def _with_claim_size(pod: PodInfo, snap: Snapshot) -> PodInfo:
    """A pod that asks for GPUs through ResourceClaims, sized as the cluster state sized it from
    those claims (scheduler/live/dra.py); kube-scheduler's copy of the pod does not say."""
    if not pod.claims or pod.gpus:
        return pod
    known = snap.pods.get(pod.key)
    return replace(pod, gpus=known.gpus) if known is not None and known.gpus else pod


def _with_resolved_gang(pod: PodInfo, snap: Snapshot) -> PodInfo:
    """The pod with its gang as the cluster state resolved it (minimum and topology key from
    the gang's group object, scheduler/live/kinds.py); kube-scheduler's copy has only the pod."""
    known = snap.pods.get(pod.key)
    if known is None or known.gang is None:
        return pod
    if pod.gang is None:  # a gang only the cluster state tells: a ComputeDomain's (live/kinds.py)
        same = (
            known.gang.source == gangsources.COMPUTE_DOMAIN_LABEL
            and known.claim_templates == pod.claim_templates
        )
        return replace(pod, gang=known.gang) if same else pod
    if (known.gang.named or known.gang.key) != pod.gang.key:
        return pod
    return pod if known.gang == pod.gang else replace(pod, gang=known.gang)


def _tiered(
    group: SubGroup,
    tier: Tier | None,
    levels: Sequence[str],
    labelled: frozenset[str],
    hyper: HyperTiers | None,
) -> SubGroup:
    """A sub-group with its Volcano tier (a partition's networkTopology) as its level: required
    when hard, preferred when soft; a tier that is no level leaves it unconstrained."""
    if tier is None:
        return group
    level = gangsources.tier_level(tier, levels, labelled, hyper)
    return replace(
        group, required_level=level if tier.hard else None, preferred_level=None if tier.hard else level
    )


def gang_tree(pod: PodInfo, members: list[PodInfo]) -> tuple[SubGroup, ...]:
    """A gang's sub-groups: what the pod being filtered knows first (its group object's tree, or
    the path it declares), then each member's in name order; the first of each name wins, and
    a sub-group whose parents do not reach the root is dropped (`sources.valid_tree`)."""
    assert pod.gang is not None
    paths = [pod.gang.groups, *(m.gang.groups for m in members if m.gang is not None)]
    return gangsources.valid_tree(s for path in paths for s in path)


def _subgroup(member: PodInfo, names: set[str]) -> str:
    """The member's sub-group when the gang's tree has it, else "" (the root)."""
    g = member.gang
    return g.subgroup if g is not None and g.subgroup in names else ""


def _log_event(e: Event) -> None:
    """One JSON line per tracker event, with its decision and reason."""
    level = logging.DEBUG if e.kind == "quorum_wait" else logging.INFO
    extra = {"cause": e.cause} if e.cause else {}
    fields = dict(e.fields)
    if isinstance(tree := fields.get("tree"), tuple):  # a tree's placement: plain values per sub-group
        fields["tree"] = explain.as_json(tree)
    jsonlog.event(log, e.kind, level, gang=e.gang, reason=e.reason, **extra, **fields)


def _class_scores(
    gpus: int,
    classes: list[NodeClass],
    reps: list[NodeView],
    memo: ChoiceMemo,
    objective: ClusterObjective,
) -> list[int]:
    """Each class's score for a pod of `gpus`, from one node of it (`reps`, in the same order):
    `node_scores` over the representatives (the ranks are over the classes present), except
    that a node whose plugin would give this pod reserved GPUs is no place for it (the
    reservation rule, module docstring): 0, as filter failed it."""
    by_rep = node_scores(gpus, reps, memo=memo, objective=objective)
    return [
        0 if c.held and c.takes_reserved(gpus) else by_rep[v.name] for c, v in zip(classes, reps, strict=True)
    ]


def _per_node_scores(
    names: Sequence[str],
    views: NodeViews,
    net: NetworkIndex,
    leaves: Leaves,
    score: Callable[[list[NodeClass], list[str]], list[int]],
) -> list[int]:
    """Prioritize's scores name by name (what `scheduler.picture.ranks` answers from its kept
    arrays): the candidates grouped by class, `score` asked of one node per class, then among
    the nodes at the top score the fullest leaf keeps it (`gputopo.pod.leafpack`)."""
    classes = views.classes(names)
    by_class = score(list(classes), [members[0] for members in classes.values()])
    scores = {n: s for s, members in zip(by_class, classes.values(), strict=True) for n in members}
    count, at = views.count, net.nodes
    packed = leaves.pack_scores(scores, net.position, lambda p: count(at[p]) or 0)
    return [int(packed.get(n, 0)) for n in names]
