"""Kubernetes Events as both daemons write them: events.k8s.io/v1, microsecond `eventTime`.

One writer for the sidecar (decisions on pods and gang objects, its reason for refusing a node's
annotation) and the plugin (why it cannot publish, on its Node), so both speak the same way.

Why events.k8s.io/v1: core/v1 Events written with first/lastTimestamp carry whole seconds, so
`kubectl gputopo why` could not order them against kube-scheduler's own `FailedScheduling`,
which kube-scheduler writes through events.k8s.io/v1 with a MicroTime `eventTime`. The API
server stores both in one table; `kubectl describe` and `kubectl get events` show both.

Where events.k8s.io/v1 is refused (403: a chart from before this change grants only core
`events`; 404: not served), the writer falls back to core/v1 Events with second timestamps, for
good, and says so once in the log. `api_message` gives the API server's own message of a
failure (the Status body's `message`, e.g. `nodes "n1" is forbidden: User ... cannot patch
resource "nodes" ...`) instead of the client's `Forbidden`.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

from gputopo import jsonlog
from gputopo_kube.rawapi import RawApi

log = logging.getLogger("gputopo.kube.events")

#: The API server refuses notes over 1 kB (events.k8s.io/v1 validation).
MAX_NOTE = 1024
#: reason and action are at most 128 characters.
MAX_FIELD = 128
#: Events about cluster-scoped objects (Nodes) live here, as kubelet's do.
CLUSTER_SCOPED_NAMESPACE = "default"


def api_message(e: BaseException) -> str:
    """What the API server said, on one line: the Status body's `message` when the failure is an
    HTTP answer with one (`nodes "n1" is forbidden: ...`), else `HTTP 403 Forbidden`, else the
    transport's reason (`connection refused`)."""
    status = getattr(e, "status", None)
    body = getattr(e, "body", None)
    if status is not None and body:
        try:
            doc = json.loads(body)
        except (ValueError, TypeError, RecursionError):
            doc = None
        if isinstance(doc, dict) and isinstance(doc.get("message"), str) and doc["message"].strip():
            return " ".join(doc["message"].split())[:2000]
    if status is not None:
        return f"HTTP {status} {' '.join(str(getattr(e, 'reason', '') or '').split())}".strip()
    reason = getattr(e, "reason", None) or e
    return f"{type(e).__name__}: {' '.join(str(reason).split())}"[:2000]


def micro_time(at: float) -> str:
    """RFC 3339 with microseconds, as the API server writes a MicroTime. Never a whole second:
    the client's models (kubernetes >= 35) re-serialise the time with `isoformat()`, which drops
    a zero fraction, and the API server's MicroTime wants exactly six digits."""
    when = datetime.fromtimestamp(at, UTC)
    if when.microsecond == 0:
        when = when.replace(microsecond=1)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _seconds(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def bounded_note(note: str) -> str:
    """`note` cut to MAX_NOTE bytes of UTF-8, never inside a character: the API server counts
    bytes (Go's len), and a tree's plan note carries "→" (3 bytes), so a cut by characters could
    still be refused and the Event lost."""
    raw = note.encode()
    return note if len(raw) <= MAX_NOTE else raw[:MAX_NOTE].decode(errors="ignore")


def event_namespace(regarding: Mapping[str, str]) -> str:
    return regarding.get("namespace") or CLUSTER_SCOPED_NAMESPACE


def event_name(regarding: Mapping[str, str], reason: str, note: str, at: float) -> str:
    """The Event's own name, `<object>.<unix ns in hex>.<crc of reason and note>`, as client-go's
    recorder names events (`%v.%x` of the object's name and UnixNano). Not `generateName`: the
    real kube-apiserver 1.37 validates a generateName prefix itself, and `<node>.` (ending in a
    dot) was refused ("a lowercase RFC 1123 subdomain ... must end with an alphanumeric
    character"), so every Event about an object was lost. The checksum keeps two Events about
    one object at one instant apart."""
    crc = zlib.crc32(f"{reason}\n{note}".encode())
    return f"{regarding['name'][:200]}.{int(at * 1e9):x}.{crc:08x}"


def v1_event(
    regarding: Mapping[str, str],
    *,
    reason: str,
    note: str,
    type_: str,
    action: str,
    controller: str,
    instance: str,
    at: float,
) -> dict[str, Any]:
    """An events.k8s.io/v1 Event about `regarding` (apiVersion, kind, namespace, name, uid)."""
    ref = {k: v for k, v in regarding.items() if v}
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {
            "name": event_name(regarding, reason, note, at),
            "namespace": event_namespace(regarding),
        },
        "eventTime": micro_time(at),
        "reportingController": controller,
        "reportingInstance": instance[:MAX_FIELD],
        "action": action[:MAX_FIELD],
        "reason": reason[:MAX_FIELD],
        "note": bounded_note(note),
        "type": type_,
        "regarding": ref,
    }


def core_event(
    regarding: Mapping[str, str],
    *,
    reason: str,
    note: str,
    type_: str,
    controller: str,
    instance: str,
    at: float,
) -> dict[str, Any]:
    """The same Event as core/v1 (whole-second timestamps): the fallback."""
    stamp = _seconds(at)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": event_name(regarding, reason, note, at),
            "namespace": event_namespace(regarding),
        },
        "involvedObject": {k: v for k, v in regarding.items() if v},
        "reason": reason[:MAX_FIELD],
        "message": bounded_note(note),
        "type": type_,
        "source": {"component": controller},
        "reportingComponent": controller,
        "reportingInstance": instance[:MAX_FIELD],
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


class EventWriter:
    """Creates Events, one call each, bounded by `timeout_s`; `create` raises what the client
    raises (the caller decides whether to retry or log). Thread-safe."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        controller: str,
        instance: str | None = None,
        timeout_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api = RawApi(api_client)  # not the typed EventsV1Api and CoreV1Api: seconds to import
        self.controller = controller
        self.instance = instance or socket.gethostname()
        self.timeout_s = timeout_s
        self.clock = clock
        self._lock = threading.Lock()
        self.legacy = False  # events.k8s.io/v1 refused once: core/v1 from then on

    def create(
        self,
        regarding: Mapping[str, str],
        reason: str,
        note: str,
        *,
        type_: str = "Normal",
        action: str = "Reporting",
    ) -> None:
        at = self.clock()
        namespace = event_namespace(regarding)
        if not self.legacy:
            body = v1_event(
                regarding,
                reason=reason,
                note=note,
                type_=type_,
                action=action,
                controller=self.controller,
                instance=self.instance,
                at=at,
            )
            try:
                self._send(self.api.create_events_v1_event, namespace, body)
                return
            except Exception as e:
                if getattr(e, "status", None) not in (403, 404):
                    raise
                with self._lock:
                    first, self.legacy = not self.legacy, True
                if first:
                    jsonlog.event(
                        log,
                        "events_api_refused",
                        logging.WARNING,
                        controller=self.controller,
                        reason=api_message(e),
                        effect="writing core/v1 Events (whole-second times) from now on; "
                        "grant create on events.events.k8s.io",
                    )
        body = core_event(
            regarding,
            reason=reason,
            note=note,
            type_=type_,
            controller=self.controller,
            instance=self.instance,
            at=at,
        )
        self._send(self.api.create_namespaced_event, namespace, body)

    def _send(self, create: Any, namespace: str, body: dict[str, Any]) -> None:
        resp = create(namespace, body, _preload_content=False, _request_timeout=self.timeout_s)
        try:
            resp.drain_conn()  # unread bytes left on a pooled connection break the next call
        finally:
            resp.release_conn()
