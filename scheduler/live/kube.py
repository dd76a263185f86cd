"""Live cluster state from the API server: list+watch of Nodes, Pods, PodGroups and, on DRA
clusters, ResourceSlices and ResourceClaims (scheduler/live/dra.py).

Each kind has a reflector thread (`scheduler.live.reflector`): list (remember resourceVersion), then
watch from there; a broken watch resumes from the last resourceVersion seen, a 410 Gone relists.
Objects are kept as raw JSON dicts from the official client (no model deserialisation: at 5,000
nodes that is the difference between milliseconds and seconds) and parsed with the same
functions that parse kube-scheduler's requests. Binding goes through `pods/binding`, idempotently.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from kubernetes import client

from gputopo.network.annotation import Shapes
from gputopo_kube.events import EventWriter
from gputopo_kube.rawapi import RawApi
from scheduler import defaults
from scheduler.live.accounting import PodAccounting, record_prediction
from scheduler.live.binding import create_binding
from scheduler.live.dra import GROUP as DRA_GROUP
from scheduler.live.dra import VERSION as DRA_VERSION
from scheduler.live.dra import DraStore, with_claim_gpus
from scheduler.live.kinds import Discovery, ExtraKinds, Kind
from scheduler.live.objects import group_min, listed_nodes, node_info, parsed_pod, relevant_pod, same_topology
from scheduler.live.reflector import PAGE_SIZE, Reflector
from scheduler.model import NodeChanges, NodeInfo, PodInfo, Snapshot
from scheduler.nodeguard import NodeGuard
from scheduler.picture.layered import Layered
from scheduler.report.metrics import Metrics

#: Pods kube-scheduler asked about but no watch has shown are remembered this long.
OBSERVED_TTL_S = 300.0
#: How often snapshot() re-judges annotation freshness when nothing else changed.
STALENESS_RECHECK_S = 5.0
#: Pods that finished hold nothing: the API server leaves them out of lists and watches.
ACTIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"


class KubeState:
    """ClusterState backed by the API server through the official `kubernetes` client."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        clock: Callable[[], float],
        resource: str = defaults.RESOURCE_NAME,
        annotation_key: str = defaults.TOPOLOGY_ANNOTATION,
        max_age_s: float = defaults.ANNOTATION_MAX_AGE_S,
        watch_timeout_s: int = 300,
        backoff_s: tuple[float, float] = (0.5, 30.0),
        bind_timeout_s: float = 30.0,
        metrics: Metrics | None = None,
        event_timeout_s: float = 5.0,
        page_size: int = PAGE_SIZE,
        topology_levels: bool = True,
        default_levels: tuple[str, ...] = defaults.DEFAULT_LEVELS,
        discovery_ttl_s: float = 10.0,
    ) -> None:
        # the calls without the typed API classes, whose import alone costs seconds (`RawApi`)
        self.core = self.custom = RawApi(api_client)
        self.clock = clock
        self.resource = resource
        self.annotation_key = annotation_key
        self.max_age_s = max_age_s
        # A binding call that hangs would hold the pod "in progress" for ever: bound it.
        self.bind_timeout_s = bind_timeout_s
        # The prediction's Event is best effort: a slow API call must not delay the bind for long.
        self.event_timeout_s = event_timeout_s
        self.prediction_events = EventWriter(
            api_client, controller="gputopo-scheduler", timeout_s=event_timeout_s
        )
        self.metrics = metrics
        self.guard = NodeGuard(metrics)
        self.shapes = Shapes()  # the server models seen, so each node's decode shares its model's links
        self.accounting = PodAccounting(metrics)
        self._lock = threading.Lock()
        self._nodes: dict[str, NodeInfo] = {}
        self._pods: dict[str, PodInfo] = {}
        self._min: dict[str, int] = {}
        self._observed: dict[str, tuple[PodInfo, float]] = {}
        self._version = 0
        self._labels_version = 1  # Snapshot.labels_version: nodes added, removed or relabelled
        self._snap: Snapshot | None = None
        self._snap_at = -math.inf
        self._stale: set[str] = set()
        #: the earliest time a node with a fresh annotation turns stale (`snapshot` rescans the
        #: nodes only when a node changed or this time has come)
        self._next_stale_at = -math.inf
        self._pod_gpus: dict[str, int] = {}
        #: bumped whenever `_pod_gpus` changes: a snapshot keeps the previous copy (the same
        #: object, which the view builder compares by identity) when only pending pods changed
        self._pod_gpus_version = 0
        self._snap_pod_gpus_version = -1
        self._snap_parts: tuple[Mapping[str, NodeInfo], dict[str, PodInfo], dict[str, int]] | None = None
        self._base_nodes: Mapping[str, NodeInfo] = {}  # the watched nodes before DRA views
        self._raw_pods: dict[str, PodInfo] = {}  # pods before group objects are resolved in
        self._nodes_dirty = self._pods_dirty = self._groups_dirty = self._dra_dirty = True
        #: the nodes changed since the last snapshot (None: any; `snapshot` then reads them all)
        self._touched: set[str] | None = None
        #: node -> (its stored NodeInfo, the stale stand-in the snapshot shows for it), so a
        #: stale node keeps one object while it stays stale (the views key on identity) and one
        #: reason, with the age it went stale at (logged once, not again at every snapshot)
        self._stale_info: dict[str, tuple[NodeInfo, NodeInfo]] = {}
        #: the change log the snapshots carry (`NodeChanges`): whatever is derived per node
        #: redoes only the nodes named in it since
        self.changes = NodeChanges()
        # DRA clusters: ResourceSlices and ResourceClaims stand in for absent annotations
        self.dra = DraStore()
        self._dra_in: tuple[object, int, object] | None = None  # (base nodes, dra version, overlaid)
        self._dra_pods: tuple[object, int, object] | None = None  # (pods, dra version, sized)
        self._ended: tuple[int, dict[str, frozenset[str]]] | None = None  # (accounting version, map)
        self._snap_ended: dict[str, frozenset[str]] | None = None
        self._stop = threading.Event()
        self._listed: set[str] = set()
        self._threads: list[threading.Thread] = []
        # Topology objects define the levels unless the operator set --levels.
        self.topology_levels = topology_levels
        self.default_levels = default_levels
        self.extra = ExtraKinds(
            self.custom, Discovery(api_client, ttl_s=discovery_ttl_s), lambda: self._changed("groups")
        )
        common: dict[str, Any] = {
            "watch_timeout_s": watch_timeout_s,
            "backoff_s": backoff_s,
            "page_size": page_size,
        }
        self.reflectors = [
            Reflector(
                "nodes",
                self.core.list_node,
                self._replace_nodes,
                self._apply_node,
                self._stop,
                on_listed=lambda: self._mark("nodes"),
                **common,
            ),
            Reflector(
                "pods",
                self._list_active_pods,
                self._replace_pods,
                self._apply_pod,
                self._stop,
                on_listed=lambda: self._mark("pods"),
                **common,
            ),
            Reflector(
                "podgroups",
                self._list_podgroups,
                self._replace_groups,
                self._apply_group,
                self._stop,
                on_listed=lambda: self._mark("podgroups"),
                absent_ok=True,
                **common,
            ),
            *(self._extra_reflector(k, common) for k in self.extra.kinds),
            self._dra_reflector("resourceslices", self.dra.replace_slices, self.dra.apply_slice, common),
            self._dra_reflector("resourceclaims", self.dra.replace_claims, self.dra.apply_claim, common),
        ]

    def _dra_reflector(
        self,
        plural: str,
        replace_all: Callable[[list[dict[str, Any]]], None],
        apply: Callable[[str, dict[str, Any]], None],
        common: dict[str, Any],
    ) -> Reflector:
        """A `resource.k8s.io/v1` kind (absent on clusters without DRA: served empty, then)."""

        def list_fn(**kw: Any) -> Any:
            return self.custom.list_cluster_custom_object(DRA_GROUP, DRA_VERSION, plural, **kw)

        def replace_locked(items: list[dict[str, Any]]) -> None:
            with self._lock:
                replace_all(items)
                self._changed("dra")

        def apply_locked(event: str, obj: dict[str, Any]) -> None:
            with self._lock:
                apply(event, obj)
                self._changed("dra")

        return Reflector(
            plural,
            list_fn,
            replace_locked,
            apply_locked,
            self._stop,
            on_listed=lambda: self._mark(plural),
            absent_ok=True,
            **common,
        )

    def _extra_reflector(self, kind: Kind, common: dict[str, Any]) -> Reflector:
        def replace_all(items: list[dict[str, Any]]) -> None:
            with self._lock:
                self.extra.replace_all(kind, items)

        def apply(event: str, obj: dict[str, Any]) -> None:
            with self._lock:
                self.extra.apply(kind, event, obj)

        return Reflector(
            kind.name,
            self.extra.list_fn(kind),
            replace_all,
            apply,
            self._stop,
            on_listed=lambda: self._mark(kind.name),
            absent_ok=True,
            **common,
        )

    def _list_active_pods(self, **kwargs: Any) -> Any:
        return self.core.list_pod_for_all_namespaces(field_selector=ACTIVE_PODS, **kwargs)

    def _list_podgroups(self, **kwargs: Any) -> Any:
        return self.custom.list_cluster_custom_object(
            defaults.PODGROUP_GROUP, defaults.PODGROUP_VERSION, defaults.PODGROUP_PLURAL, **kwargs
        )

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        for r in self.reflectors:
            t = threading.Thread(target=r.run, name=f"reflector-{r.kind}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        deadline = self.clock_monotonic() + 5.0
        # A watch may be opening its connection right now; interrupt until every thread is out.
        while any(t.is_alive() for t in self._threads) and self.clock_monotonic() < deadline:
            for r in self.reflectors:
                r.interrupt()
            for t in self._threads:
                t.join(timeout=0.05)

    @staticmethod
    def clock_monotonic() -> float:
        return time.monotonic()

    def ready(self) -> bool:
        with self._lock:
            return {
                "nodes",
                "pods",
                "podgroups",
                "resourceslices",
                "resourceclaims",
            } | self.extra.names <= self._listed

    def _mark(self, kind: str) -> None:
        with self._lock:
            self._listed.add(kind)

    def _changed(self, kind: str) -> None:
        """Something of `kind` (nodes, pods, groups) changed: the next snapshot rebuilds that part."""
        setattr(self, f"_{kind}_dirty", True)
        self._snap = None

    def _count(self, pod: PodInfo | None, sign: int) -> None:
        if pod is not None and pod.node and pod.active and pod.gpus:
            left = self._pod_gpus.get(pod.node, 0) + sign * pod.gpus
            self._pod_gpus_version += 1
            self.changes.mark((pod.node,))
            if left:
                self._pod_gpus[pod.node] = left
            else:
                self._pod_gpus.pop(pod.node, None)

    # ------------------------------------------------------------------ nodes

    def _node_info(self, obj: dict[str, Any]) -> NodeInfo:
        return node_info(
            obj,
            resource=self.resource,
            annotation_key=self.annotation_key,
            clock=self.clock,
            guard=self.guard,
            shapes=self.shapes,
        )

    def _replace_nodes(self, items: list[dict[str, Any]]) -> None:
        old = self._nodes  # compared outside the lock: only the nodes' watch thread writes it
        infos = listed_nodes(items, old, self._node_info)
        with self._lock:
            self._nodes = {i.name: i for i in infos if i.name}
            self._labels_version += 1  # a relist (rare): the index is rebuilt once
            for info in infos:
                self.accounting.check_node(info)
            self._changed("nodes")
            self._touched = None
            self.changes.reset()

    def _apply_node(self, kind: str, obj: dict[str, Any]) -> None:
        info = self._node_info(obj)
        if not info.name:
            return
        if kind != "DELETED":  # outside the lock: only the nodes' watch thread writes the store
            info = same_topology(self._nodes.get(info.name), info)
        with self._lock:
            if kind == "DELETED":
                if self._nodes.pop(info.name, None) is not None:
                    self._labels_version += 1
            else:
                old = self._nodes.get(info.name)
                if old is None or old.labels != info.labels:
                    self._labels_version += 1
                self._nodes[info.name] = info
                self.accounting.check_node(info)
            self._changed("nodes")
            if self._touched is not None:
                self._touched.add(info.name)
            self.changes.mark((info.name,))

    # ------------------------------------------------------------------ pods

    _relevant = staticmethod(relevant_pod)

    def _parsed(self, obj: dict[str, Any]) -> PodInfo | None:
        return parsed_pod(obj, self.resource)

    def _account(self, parsed: PodInfo | None, old: PodInfo | None, gone: bool) -> None:
        """Ended pods free their GPUs; predictions are learned (scheduler/live/accounting.py)."""
        parsed = None if gone else parsed
        self.accounting.observe_pod(parsed, self._relevant(parsed), old, self.clock())

    def _replace_pods(self, items: list[dict[str, Any]]) -> None:
        parsed = [self._parsed(o) for o in items]
        pods = [p for p in (self._relevant(q) for q in parsed) if p is not None]
        with self._lock:
            fresh = {p.key for p in pods}
            for key, old in self._pods.items():
                if key not in fresh:  # ended or deleted while no watch was open
                    self._account(None, old, True)
            for q in parsed:
                if q is not None:
                    self._account(q, self._pods.get(q.key), False)
            self._pods = {p.key: p for p in pods}
            self._pod_gpus = {}
            self._pod_gpus_version += 1
            for p in pods:
                self._count(p, +1)
            self._changed("pods")
            self.changes.reset()  # every node's pod GPUs recounted

    def _apply_pod(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
        parsed = None if kind == "DELETED" else self._parsed(obj)
        pod = self._relevant(parsed)
        with self._lock:
            self._account(parsed, self._pods.get(key), kind == "DELETED")
            self._count(self._pods.get(key), -1)
            if pod is None:
                self._pods.pop(key, None)
                self._observed.pop(key, None)
            else:
                self._pods[key] = pod
                self._count(pod, +1)
            self._changed("pods")

    def observe(self, pod: PodInfo) -> None:
        with self._lock:
            if pod.key in self._pods:
                return
            fresh = pod.key not in self._observed
            self._observed[pod.key] = (pod, self.clock())
            if fresh:
                self._changed("pods")

    # ------------------------------------------------------------------ podgroups

    def _replace_groups(self, items: list[dict[str, Any]]) -> None:
        groups = dict(group_min(o) for o in items)
        with self._lock:
            self.extra.replace_legacy(items)
            self._min = {k: v for k, v in groups.items() if v is not None}
            self._changed("groups")

    def _apply_group(self, kind: str, obj: dict[str, Any]) -> None:
        key, value = group_min(obj)
        with self._lock:
            self.extra.note_legacy(kind, obj)
            if kind == "DELETED" or value is None:
                self._min.pop(key, None)
            else:
                self._min[key] = value
            self._changed("groups")

    # ------------------------------------------------------------------ snapshot

    def annotation_times(self) -> list[float]:
        """generatedAt of every node's decoded annotation, stale ones included (for the age
        metric: the snapshot drops stale topologies, and those are the ones worth seeing)."""
        with self._lock:
            return [i.topology.generated_at for i in self._nodes.values() if i.topology is not None]

    def snapshot(self) -> Snapshot:
        now = self.clock()
        with self._lock:
            if self._snap is not None and now - self._snap_at < STALENESS_RECHECK_S:
                return self._snap
            purged = [k for k, (_, at) in self._observed.items() if now - at > OBSERVED_TTL_S]
            for key in purged:
                del self._observed[key]
            prev = self._snap_parts
            nodes = self._nodes_now(now, prev is None)
            self._base_nodes = nodes
            dra_in = self._dra_in
            if dra_in is None or dra_in[0] is not nodes or dra_in[1] != self.dra.version:
                overlaid = self.dra.overlay(nodes, now)  # DRA nodes without an annotation
                if overlaid is not nodes:  # which DRA nodes changed is not told: all may have
                    self.changes.reset()
                    overlaid = Layered.of(overlaid)
                self._dra_in = dra_in = (nodes, self.dra.version, overlaid)
            nodes = dra_in[2]  # type: ignore[assignment]
            if self._pods_dirty or purged or prev is None:
                pods = {k: p for k, (p, _) in self._observed.items()}
                pods.update(self._pods)
                # a pending pod (the filter's own question) holds no GPUs: the node GPU counts,
                # and so every node's view, stay what they were (the same dict object)
                if prev is None or self._pod_gpus_version != self._snap_pod_gpus_version:
                    pod_gpus = dict(self._pod_gpus)
                    self._snap_pod_gpus_version = self._pod_gpus_version
                else:
                    pod_gpus = prev[2]
                self._raw_pods = pods
            else:
                pods, pod_gpus = self._raw_pods, prev[2]
            pods = self.extra.resolve(pods)  # what group objects say: minimums, topology keys
            sized = self._dra_pods
            if sized is None or sized[0] is not pods or sized[1] != self.dra.version:
                self._dra_pods = sized = (pods, self.dra.version, with_claim_gpus(pods, self.dra))
            pods = sized[2]  # type: ignore[assignment]
            self.accounting.prune(self._nodes, now)
            if self._ended is None or self._ended[0] != self.accounting.version:
                self._ended = (self.accounting.version, self.accounting.ended_by_node())
            changed = prev is None or nodes is not prev[0] or pods is not prev[1] or self._groups_dirty
            changed = changed or self._ended[1] is not self._snap_ended
            changed = changed or self._dra_dirty
            if changed:
                self._version += 1
            self._nodes_dirty = self._pods_dirty = self._groups_dirty = self._dra_dirty = False
            self._snap_parts = (nodes, pods, pod_gpus)
            self._snap_ended = self._ended[1]
            levels = self.extra.levels(self.default_levels) if self.topology_levels else ()
            mins = {**self.extra.min_members(), **self._min}
            self._snap = Snapshot(
                nodes,
                pods,
                mins,
                self._version,
                pod_gpus,
                self._snap_ended,
                levels,
                self.extra.hypernodes(),
                labels_version=self._labels_version,
                changes=self.changes,
                changes_seq=self.changes.seq,
            )
            self._snap_at = now
            return self._snap

    def _nodes_now(self, now: float, first: bool) -> Layered[str, NodeInfo]:
        """The nodes as the snapshot shows them (a stale annotation's node as unknown topology),
        lock held. Only the nodes changed since the last snapshot are read, and each one's
        age judged (`_touched`), unless every node must be: the first snapshot, a relist, or
        an annotation due to age out (`_next_stale_at`), when every node's age is read. The
        mapping shares the last one's entries but for those that changed (`Layered`)."""
        touched, last = self._touched, self._base_nodes
        every = first or touched is None or now >= self._next_stale_at or not isinstance(last, Layered)
        if not every and not self._nodes_dirty:
            assert isinstance(last, Layered)
            return last
        names: Iterable[str] = self._nodes if every else (touched or ())
        stale = set() if every else set(self._stale)
        soonest = math.inf if every else self._next_stale_at
        for name in names:
            info = self._nodes.get(name)
            stale.discard(name)
            if info is None or info.topology is None:
                continue
            until = info.topology.generated_at + self.max_age_s
            if now > until:
                stale.add(name)
            elif until < soonest:
                soonest = until
        self._next_stale_at = soonest
        shown: dict[str, NodeInfo] = {}
        for name in stale:
            info = self._nodes[name]
            kept = self._stale_info.get(name)
            if kept is None or kept[0] is not info:
                assert info.topology is not None
                age = now - info.topology.generated_at
                problem = f"annotation stale: {age:.0f}s old (limit {self.max_age_s:.0f}s)"
                kept = self._stale_info[name] = (info, replace(info, topology=None, topology_problem=problem))
            shown[name] = kept[1]
        for name in list(self._stale_info):
            if name not in stale:
                del self._stale_info[name]
        if every:
            out = dict(self._nodes)
            out.update(shown)
            nodes = Layered(out)
            if isinstance(last, Layered):  # which nodes changed is told only node by node
                self.changes.mark(n for n in set(self._stale) ^ stale)
        else:
            assert isinstance(last, Layered)
            flips = set(self._stale) ^ stale
            changed = {
                n: shown.get(n) or self._nodes[n] for n in (touched or set()) | flips if n in self._nodes
            }
            removed = [n for n in touched or () if n not in self._nodes]
            nodes = last.replace(changed, removed)
            self.changes.mark(flips)
        self._stale = stale
        self._touched = set()
        return nodes

    # ------------------------------------------------------------------ for Events

    def group_ref(self, gang_key: str) -> Any:
        """The object defining a gang (apiVersion, kind, namespace, name, uid), if known."""
        with self._lock:
            return self.extra.ref(gang_key)

    def pod_uid(self, pod_key: str) -> str:
        with self._lock:
            pod = self._pods.get(pod_key) or (self._observed.get(pod_key) or (None, 0))[0]
            return pod.uid if pod is not None else ""

    # ------------------------------------------------------------------ bind

    def bind(self, pod: PodInfo, node: str, gpus: Iterable[int]) -> None:
        gpus = tuple(gpus)
        if gpus:
            with self._lock:
                self.accounting.predict(pod.key, node, gpus, self.clock())
            record_prediction(self.prediction_events, pod, node, gpus)
        create_binding(self.core, pod, node, self.bind_timeout_s)
