"""Kubernetes Events for the sidecar's gang decisions, where operators look for them.

`kubectl describe pod` (and `kubectl describe` of the PodGroup) then shows why a gang member
waits: the gang is waiting for its quorum, was planned at a level and domain, was planned again
after a plan broke, or does not fit (with the planner's reason); binds refused say why too.

The extender calls `emit(pod_key, gang_key, reason, message)` at its decision points, under its
lock, so `emit` never blocks and never raises: it rate-limits (one event per reason per object
per `interval_s`), puts the event on a bounded queue (the oldest is dropped when full) and
returns. One background thread writes events.k8s.io/v1 Events (microsecond `eventTime`, so
`kubectl gputopo why` orders them against kube-scheduler's own; core/v1 where that API is
refused: `gputopo_kube.events`) through the official client, each call bounded by a timeout; a
failed write is logged with the API server's message (once per `interval_s`) and forgotten.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from kubernetes import client

from gputopo import jsonlog
from gputopo.gang import explain
from gputopo.gang.asks import Event
from gputopo_kube.events import EventWriter, api_message

log = logging.getLogger("gputopo.scheduler.events")

#: A write whose connection was dropped before any answer (reset, refused, broken pipe: the API
#: server restarting, a load balancer closing an idle connection) is tried again this often,
#: as client-go's event broadcaster retries its sink; an HTTP error or a timeout is not (the
#: server answered, or may have created the event).
CONNECTION_RETRIES = 2
RETRY_PAUSE_S = 0.05


def _connection_dropped(e: BaseException) -> bool:
    """Whether `e` (from the client, or urllib3 under it) is a connection lost before an answer."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, TimeoutError) or "Timeout" in type(cur).__name__:
            return False
        if isinstance(cur, ConnectionError) or type(cur).__name__ in ("ProtocolError", "NewConnectionError"):
            return True
        reason = getattr(cur, "reason", None)
        cur = reason if isinstance(reason, BaseException) else (cur.__cause__ or cur.__context__)
    return False


COMPONENT = "gputopo-scheduler"
#: Event reasons (CamelCase, as Kubernetes components write them) and their type.
#: On a Node: the sidecar refused its topology annotation / uses it again.
REJECTED_REASON = "TopologyRejected"
ACCEPTED_REASON = "TopologyAccepted"
WARNING_REASONS = frozenset({"GangUnschedulable", "BindRefused", "BindFailed", REJECTED_REASON})

#: Tracker event kinds -> the reason of the Kubernetes Event written on the gang's group object.
_GANG_REASONS = {
    "plan": "GangPlanned",
    "plan_failed": "GangUnschedulable",
    "plan_dropped": "GangPlanDropped",
    "replan": "GangReplanned",
    "adopt": "GangAdopted",
}


def gang_event(e: Event) -> tuple[str, str] | None:
    """The (reason, message) of the Kubernetes Event a gang tracker event writes on the gang's
    group object, or None for kinds that write none (quorum waits: one per member filter). A
    tree's plan names every sub-group's domain (`gputopo.gang.explain`, which `kubectl gputopo
    why` reads back), summarised beyond what the API server's 1 KiB note limit holds."""
    reason = _GANG_REASONS.get(e.kind)
    if reason is None:
        return None
    tree = e.fields.get("tree")
    if e.kind == "plan" and isinstance(tree, tuple) and tree:
        # a tree: each sub-group's domain and why, whole sub-groups while the 1 KiB note holds
        head = f"gang {e.gang}: "
        offered = e.fields.get("offered")
        limit = explain.MAX_NOTE - explain.NOTE_SLACK - len(head.encode())
        text = explain.plan_text(tree, offered=offered if isinstance(offered, int) else None, limit=limit)
        return reason, head + text
    where = ""
    if e.kind == "plan" and "level" in e.fields:
        where = f" at level {e.fields['level']}, domain {e.fields.get('domain')}"
    return reason, f"gang {e.gang}{where}: {e.reason}"


class EventSink(Protocol):
    def emit(self, pod_key: str, gang_key: str | None, reason: str, message: str) -> None:
        """Record a decision about a pod (and its gang's group object); never blocks."""
        ...


class NullEvents:
    """No API server (snapshot file mode, tests of the planner): events go nowhere."""

    def emit(self, pod_key: str, gang_key: str | None, reason: str, message: str) -> None:
        pass


class EventEmitter:
    """Rate-limited, queued Event writer (see the module docstring)."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        pod_uid: Callable[[str], str],
        group_ref: Callable[[str], Mapping[str, str] | None],
        interval_s: float = 30.0,
        queue_size: int = 1000,
        timeout_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.writer = EventWriter(api_client, controller=COMPONENT, timeout_s=timeout_s)
        self.pod_uid = pod_uid
        self.group_ref = group_ref
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.clock = clock
        self._lock = threading.Lock()
        self._queue: collections.deque[tuple[str, str | None, str, str, str]] = collections.deque(
            maxlen=queue_size
        )
        self._last: dict[tuple[str, str], float] = {}  # (object key, reason) -> last emitted
        self._dropped_plans: set[str] = set()  # gangs whose plan broke: the next plan is a re-plan
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._failed_at = -interval_s
        self.written = self.suppressed = self.overflowed = self.failed = 0
        self._thread = threading.Thread(target=self._run, name="event-writer", daemon=True)
        self._thread.start()

    # -- the extender's side: cheap, under its lock ---------------------------------------------

    def emit(self, pod_key: str, gang_key: str | None, reason: str, message: str) -> None:
        now = self.clock()
        with self._lock:
            if reason == "GangPlanDropped" and gang_key:
                if len(self._dropped_plans) > 10_000:
                    self._dropped_plans.clear()
                self._dropped_plans.add(gang_key)
            elif reason == "GangPlanned" and gang_key in self._dropped_plans:
                self._dropped_plans.discard(gang_key)
                reason = "GangReplanned"
                message = f"{message} (after the previous plan broke)"
            keys = [
                k for k in (f"pod:{pod_key}" if pod_key else "", f"gang:{gang_key}" if gang_key else "") if k
            ]
            fresh = [
                k for k in keys if now - self._last.get((k, reason), -self.interval_s) >= self.interval_s
            ]
            if not fresh:
                self.suppressed += 1
                return
            if len(self._last) > 50_000:
                self._last = {k: t for k, t in self._last.items() if now - t < self.interval_s}
            for k in fresh:
                self._last[(k, reason)] = now
            if len(self._queue) == self._queue.maxlen:
                self.overflowed += 1
            self._queue.append(
                (
                    pod_key if f"pod:{pod_key}" in fresh else "",
                    gang_key if f"gang:{gang_key}" in fresh else None,
                    reason,
                    message,
                    "",
                )
            )
        self._wake.set()

    def node_topology(self, node: str, stage: str, reason: str | None) -> None:
        """NodeGuard's hook: the sidecar refused `node`'s annotation (`reason`), or accepts it
        again (None). An Event on the Node (`kubectl describe node`, `kubectl gputopo nodes`):
        the guard calls only on a change, so this writes nothing per watch event or heartbeat."""
        if reason is None:
            event = (
                ACCEPTED_REASON,
                f"gputopo-scheduler uses this node's topology annotation again ({stage})",
            )
        else:
            event = (
                REJECTED_REASON,
                f"gputopo-scheduler ignores this node's topology annotation ({stage}): {reason}; "
                "its GPUs are counted from allocatable, with a neutral score",
            )
        with self._lock:
            if len(self._queue) == self._queue.maxlen:
                self.overflowed += 1
            self._queue.append(("", None, event[0], event[1], node))
        self._wake.set()

    # -- the writer thread ---------------------------------------------------------------------

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=timeout_s)

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until the queue is empty (tests, shutdown); False on timeout."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            with self._lock:
                if not self._queue and not self._busy:
                    return True
            time.sleep(0.01)
        return False

    _busy = False

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(timeout=1.0)
            self._wake.clear()
            while True:
                with self._lock:
                    if not self._queue:
                        self._busy = False
                        break
                    item = self._queue.popleft()
                    self._busy = True
                try:
                    self._write(*item)
                except Exception as e:  # never let one event stop the writer
                    self._failed(f"{type(e).__name__}: {e}")

    def _write(self, pod_key: str, gang_key: str | None, reason: str, message: str, node: str) -> None:
        targets: list[dict[str, str]] = []
        if node:  # kubelet's Node Events name the node as their uid; kubectl describe node finds both
            targets.append({"apiVersion": "v1", "kind": "Node", "name": node, "uid": node})
        if pod_key:
            ns, _, name = pod_key.partition("/")
            targets.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "namespace": ns,
                    "name": name,
                    "uid": self.pod_uid(pod_key),
                }
            )
        ref = self.group_ref(gang_key) if gang_key else None
        if ref is not None:
            targets.append(dict(ref))
        kind = "Warning" if reason in WARNING_REASONS else "Normal"
        action = "Binding" if reason.startswith("Bind") else "Reading" if node else "Scheduling"
        for target in targets:
            for attempt in range(1 + CONNECTION_RETRIES):
                try:
                    self.writer.create(target, reason, message, type_=kind, action=action)
                    self.written += 1
                    break
                except Exception as e:
                    if attempt < CONNECTION_RETRIES and _connection_dropped(e) and not self._stop.is_set():
                        time.sleep(RETRY_PAUSE_S * 2**attempt)  # the writer's own thread: no verb waits
                        continue
                    self._failed(api_message(e))
                    break

    def _failed(self, why: str) -> None:
        self.failed += 1
        now = self.clock()
        if now - self._failed_at >= self.interval_s:
            self._failed_at = now
            jsonlog.event(log, "event_write_failed", logging.WARNING, reason=why, failed_so_far=self.failed)
