"""Keeps this node's topology annotation (gputopo.io/topology) in step with the plugin.

The scheduler sidecar plans on what this writes, so it must be right and never noisy:
  * it is rebuilt from the plugin's current snapshot (topology + health) and from kubelet's own
    record of the GPUs in use (PodResources), re-read on every change and periodically, so it
    is right after a plugin restart and after pods end;
  * it is patched only when its content changes (plus a heartbeat well inside the sidecar's
    staleness limit), at most once per `min_interval_s` — changes in between are coalesced;
  * an API or kubelet error is logged (with the API server's own message: `nodes "n1" is
    forbidden: ...`, not just `Forbidden`) and retried with back-off; nothing here can stop the
    plugin;
  * why it cannot publish is also an Event on its Node (`kubectl describe node`, `kubectl
    gputopo nodes`): reason `TopologyNotPublished` (Warning), written when the cause changes, not
    per retry, and `TopologyPublished` once when a publication succeeds again.
`sync(now)` makes one decision and says when it wants to run next, so tests drive it with a fake
clock; `start()` runs it on a thread, woken by `update()` (the daemon's listener hook).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from deviceplugin import settings
from deviceplugin.publish.podresources import PodResourcesClient, PodResourcesError, ids_to_uuids
from deviceplugin.state import Snapshot
from gputopo import __version__, jsonlog
from gputopo.network.annotation import MAX_POD_KEY_CHARS, MAX_PODS, encode, make

log = logging.getLogger("deviceplugin.publisher")

NODE_NAME_ENV = "NODE_NAME"
#: reportingController of the plugin's Events.
EVENT_CONTROLLER = "gputopo-device-plugin"


class NodePatcher(Protocol):
    """The one call of `kubernetes.client.CoreV1Api` the publisher needs."""

    def patch_node(
        self, name: str, body: Any, *, _content_type: str | None = ..., _request_timeout: float | None = ...
    ) -> Any: ...


class NodeEvents(Protocol):
    """The one call of `gputopo_kube.events.EventWriter` the publisher needs."""

    def create(
        self, regarding: Mapping[str, str], reason: str, note: str, *, type_: str = ..., action: str = ...
    ) -> None: ...


#: Event reasons on the Node (docs/deviceplugin.md "Publishing").
NOT_PUBLISHED_REASON = "TopologyNotPublished"
PUBLISHED_REASON = "TopologyPublished"


class PublisherError(ValueError):
    """The publisher cannot be set up (no node name); the message says what is missing."""


def api_message(e: BaseException) -> str:
    """The API server's own message for a failed call (`gputopo_kube.events.api_message`),
    imported when needed: the plugin loads the Kubernetes client only when it publishes."""
    from gputopo_kube.events import api_message as message

    return message(e)


def node_name_from_env(environ: dict[str, str] | None = None) -> str:
    """The node name the downward API puts in NODE_NAME (spec.nodeName)."""
    name = (environ if environ is not None else dict(os.environ)).get(NODE_NAME_ENV, "").strip()
    if not name:
        raise PublisherError(f"{NODE_NAME_ENV} is not set (downward API: fieldRef spec.nodeName)")
    return name


class Publisher:
    def __init__(
        self,
        node_name: str,
        api: NodePatcher,
        in_use: Callable[[], frozenset[str] | Mapping[str, frozenset[str]]],
        *,
        annotation_key: str = settings.TOPOLOGY_ANNOTATION,
        plugin_version: str = __version__,
        min_interval_s: float = 5.0,
        resync_s: float = 30.0,
        heartbeat_s: float = 300.0,
        backoff_s: tuple[float, float] = (1.0, 60.0),
        settle_s: float = 1.0,
        request_timeout_s: float = 10.0,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        events: NodeEvents | None = None,
    ) -> None:
        if not node_name:
            raise PublisherError("node name is required")
        self.node_name = node_name
        self.api = api
        self.in_use = in_use
        self.annotation_key = annotation_key
        self.plugin_version = plugin_version
        self.min_interval_s = min_interval_s
        self.resync_s = resync_s
        self.heartbeat_s = heartbeat_s
        self.backoff_s = backoff_s
        self.settle_s = settle_s
        self.request_timeout_s = request_timeout_s
        self.monotonic = monotonic
        self.wall = wall
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._in_use: frozenset[str] | None = None
        self._pods: dict[str, frozenset[str]] | None = None  # pod -> GPU UUIDs, when known
        self._published: tuple | None = None
        self._patched_at = -float("inf")
        self._retry_at = -float("inf")
        self._delay = backoff_s[0]
        self._poked = False
        self._recheck_at: float | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.patches = 0
        self.failures = 0
        self.events = events
        self._problem: str | None = None  # the cause last reported on the Node, until published

    # ------------------------------------------------------------------ hook and lifecycle

    def update(self, snapshot: Snapshot) -> None:
        """Listener for the plugin's snapshot store: remember the newest, wake the thread."""
        with self._lock:
            self._snapshot = snapshot
        self._wake.set()

    def poke(self) -> None:
        """Something may have changed in PodResources (an Allocate happened): look again now,
        and once more `settle_s` later, because kubelet records the devices only after
        Allocate has returned."""
        with self._lock:
            self._poked = True
        self._wake.set()

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="node-publisher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                delay = self.sync(self.monotonic())
            except Exception as e:  # never let a bug end the thread silently
                jsonlog.event(
                    log,
                    "publish_failed",
                    logging.ERROR,
                    node=self.node_name,
                    reason=f"{type(e).__name__}: {e}",
                )
                delay = self.backoff_s[1]
            self._wake.wait(timeout=max(0.0, delay))
            self._wake.clear()

    # ------------------------------------------------------------------ one decision

    def sync(self, now: float) -> float:
        """Publish if needed and allowed at `now`; returns seconds until it wants to run again."""
        with self._lock:
            poked, self._poked = self._poked, False
        if poked:
            self._recheck_at = now + self.settle_s
        elif self._recheck_at is not None and now >= self._recheck_at:
            self._recheck_at = None  # this is the second look
        delay = self._sync(now)
        if self._recheck_at is not None:
            delay = min(delay, self._recheck_at - now)
        return delay

    def _sync(self, now: float) -> float:
        with self._lock:
            snap = self._snapshot
        if snap is None:
            return self.resync_s
        if now < self._retry_at:
            return self._retry_at - now
        confirmed = True  # kubelet told us the GPUs in use just now
        try:
            self._in_use, self._pods = _split(self.in_use())
        except PodResourcesError as e:
            confirmed = False
            jsonlog.event(
                log,
                "podresources_failed",
                logging.WARNING,
                node=self.node_name,
                reason=str(e),
                effect="keeping the last in-use set" if self._in_use is not None else "not publishing yet",
            )
            if self._in_use is None:
                self._report("podresources", f"cannot read the GPUs in use from kubelet's PodResources: {e}")
                return self._fail(now)
        content = self._content(snap, self._in_use or frozenset(), self._pods)
        changed = content != self._published
        if not changed and now - self._patched_at < self.heartbeat_s:
            return min(self.resync_s, self._patched_at + self.heartbeat_s - now)
        if not changed and not confirmed:
            # A heartbeat vouches that the in-use set is current; unconfirmed, let the
            # annotation age so the sidecar stops trusting it.
            return self.resync_s
        if now - self._patched_at < self.min_interval_s:
            return self._patched_at + self.min_interval_s - now  # coalesce: the newest wins later
        _, unhealthy, allocated, pods = content
        text = encode(
            make(
                self.node_name,
                snap.topology,
                generated_at=self.wall(),
                plugin_version=self.plugin_version,
                unhealthy=unhealthy,
                allocated=allocated,
                policy=snap.allocator.name,
                pods=pods,
            )
        )
        body = {"metadata": {"annotations": {self.annotation_key: text}}}
        try:
            self.api.patch_node(
                self.node_name,
                body,
                _content_type="application/merge-patch+json",
                # the client's default is to wait forever: one silent API server would freeze us
                _request_timeout=self.request_timeout_s,
            )
        except Exception as e:
            status = getattr(e, "status", None)
            message = api_message(e)
            jsonlog.event(
                log,
                "publish_failed",
                logging.WARNING,
                node=self.node_name,
                status=status,
                reason=message,
                retry_in_s=self._delay,
            )
            what = f"HTTP {status}" if status is not None else type(e).__name__
            self._report(f"patch:{what}", f"the API server refused the annotation patch ({what}): {message}")
            return self._fail(now)
        self._published = content
        self._patched_at = now
        self._delay = self.backoff_s[0]
        self.patches += 1
        if self._problem is not None:
            self._event(
                PUBLISHED_REASON, "Normal", f"{self.annotation_key} published again ({len(text)} bytes)"
            )
            self._problem = None
        jsonlog.event(
            log,
            "published",
            node=self.node_name,
            bytes=len(text),
            allocated=sorted(allocated),
            unhealthy=sorted(unhealthy),
            reason="content changed" if changed else "heartbeat",
        )
        return self.resync_s

    def _report(self, cause: str, note: str) -> None:
        """An Event on the Node when the cause of not publishing changes (not per retry: a
        kubelet down for an hour is one Event, not sixty)."""
        if cause != self._problem:
            self._problem = cause
            self._event(NOT_PUBLISHED_REASON, "Warning", f"{self.annotation_key} not published: {note}")

    def _event(self, reason: str, type_: str, note: str) -> None:
        if self.events is None:
            return
        # kubelet's own Node Events name the node as their uid; `kubectl describe node` looks for both
        node = {"apiVersion": "v1", "kind": "Node", "name": self.node_name, "uid": self.node_name}
        try:
            self.events.create(node, reason, note, type_=type_, action="Publishing")
        except Exception as e:  # the API server is likely the problem being reported
            jsonlog.event(
                log,
                "node_event_failed",
                logging.DEBUG,
                node=self.node_name,
                event=reason,
                reason=api_message(e),
            )

    def _fail(self, now: float) -> float:
        self.failures += 1
        delay = self._delay
        self._retry_at = now + delay
        self._delay = min(delay * 2, self.backoff_s[1])
        return delay

    def _content(
        self, snap: Snapshot, in_use: frozenset[str], pods: dict[str, frozenset[str]] | None
    ) -> tuple:
        """What the annotation says, minus its timestamp: the thing compared for 'changed'."""
        topo = snap.topology
        unhealthy = tuple(g.index for g in topo.gpus if not snap.healthy(g.uuid))
        by_uuid = topo.index_by_uuid
        unknown = sorted(u for u in in_use if u not in by_uuid)
        if unknown:
            jsonlog.event(
                log,
                "unknown_devices",
                logging.WARNING,
                node=self.node_name,
                ids=unknown[:8],
                reason="kubelet reports devices this plugin does not have; ignored",
            )
        allocated = tuple(sorted(by_uuid[u] for u in in_use if u in by_uuid))
        pod_map = None
        if pods is not None and len(pods) <= MAX_PODS:
            pod_map = {
                k: tuple(sorted(by_uuid[u] for u in ids if u in by_uuid))
                for k, ids in pods.items()
                if len(k) <= MAX_POD_KEY_CHARS and any(u in by_uuid for u in ids)
            }
        text = encode(
            make(
                self.node_name,
                topo,
                generated_at=0.0,
                plugin_version=self.plugin_version,
                unhealthy=unhealthy,
                allocated=allocated,
                policy=snap.allocator.name,
                pods=pod_map,
            )
        )
        return (text, unhealthy, allocated, pod_map)


def _split(
    raw: frozenset[str] | Mapping[str, frozenset[str]],
) -> tuple[frozenset[str], dict[str, frozenset[str]] | None]:
    """In-use GPU UUIDs, and per pod when the reader gives pods (PodResourcesClient.assignments);
    a plain set (the older reader) publishes no pod map."""
    if isinstance(raw, Mapping):
        pods = {k: ids_to_uuids(v) for k, v in raw.items()}
        return frozenset().union(*pods.values()), pods
    return ids_to_uuids(raw), None


def for_cluster(
    node_name: str,
    in_use: Callable[[], frozenset[str] | Mapping[str, frozenset[str]]],
    kubeconfig: str | None = None,
    **kwargs: Any,
) -> Publisher:
    """A Publisher talking to the API server with the official client (`core_api`), writing its
    Node Events through `gputopo_kube.events.EventWriter`."""
    from gputopo_kube.events import EventWriter

    core = core_api(kubeconfig)
    events = EventWriter(
        core.api_client, controller=EVENT_CONTROLLER, timeout_s=kwargs.get("request_timeout_s", 10.0)
    )
    return Publisher(node_name, core, in_use, events=events, **kwargs)


class NodePublication:
    """The Node annotation publisher and the PodResources reader it asks which GPUs are in use,
    as device-plugin mode runs them: built before its daemon starts, started after it serves."""

    def __init__(self, publisher: Publisher, pods: PodResourcesClient) -> None:
        self.publisher = publisher
        self.pods = pods

    @classmethod
    def for_cluster(
        cls, node_name: str, kubeconfig: str | None, pod_resources_socket: str, resource_name: str
    ) -> NodePublication:
        """Talking to the API server (`for_cluster`) and to kubelet's PodResources socket; raises
        whatever the client setup raises when there is no API server configuration."""
        pods = PodResourcesClient(pod_resources_socket, resource_name)
        try:
            # per pod, so the sidecar can free a pod's GPUs as soon as it sees the pod end
            return cls(for_cluster(node_name, pods.assignments, kubeconfig=kubeconfig), pods)
        except BaseException:
            pods.close()
            raise

    def stop(self) -> None:
        """Stop publishing and close the PodResources channel (safe when never started)."""
        self.publisher.stop()
        self.pods.close()


def core_api(kubeconfig: str | None = None) -> Any:
    """CoreV1Api of the official client: in-cluster config (the plugin's ServiceAccount), or a
    kubeconfig when given or when not in a cluster (`gputopo_kube`). Also used for the per-node
    config label."""
    from kubernetes import client

    from gputopo_kube import api_client

    return client.CoreV1Api(api_client(kubeconfig))
