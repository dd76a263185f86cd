"""A small stand-in for the Kubernetes API server, for tests through the official client.

It answers only what gputopo uses: list and watch of Nodes, Pods, PodGroups and the optional
kinds of scheduler/live/kinds.py (served only when a test asks for them, listed in `GET /apis`
discovery), with resourceVersions, paginated lists (`limit`/`continue`, a consistent snapshot
per list, expirable tokens -> 410), `status.phase` field selectors (a watched object that stops
matching arrives as DELETED, as from the real API server), watch bookmarks when asked for, 410
Gone for a too-old version, and watches that can be broken on demand; pod reads,
`pods/binding`, Node PATCH and Event creation. Failures can be injected per endpoint so tests
can exercise retries, re-plans and resumption.
"""

from __future__ import annotations

import copy
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from kubernetes import client

#: A fault code for `inject`: drop the connection without an answer (events only).
DROP = -1
PODGROUPS = "/apis/scheduling.x-k8s.io/v1alpha1/podgroups"

#: Optional kinds a test can serve: name -> (group, default version, plural).
EXTRA_KINDS: dict[str, tuple[str, str, str]] = {
    "k8s-podgroups": ("scheduling.k8s.io", "v1alpha2", "podgroups"),
    "k8s-workloads": ("scheduling.k8s.io", "v1alpha1", "workloads"),
    "k8s-compositepodgroups": ("scheduling.k8s.io", "v1alpha3", "compositepodgroups"),
    "volcano-podgroups": ("scheduling.volcano.sh", "v1beta1", "podgroups"),
    "kai-podgroups": ("scheduling.run.ai", "v2alpha2", "podgroups"),
    "computedomains": ("resource.nvidia.com", "v1beta1", "computedomains"),
    "volcano-hypernodes": ("topology.volcano.sh", "v1alpha1", "hypernodes"),
    "kueue-topologies": ("kueue.x-k8s.io", "v1beta1", "topologies"),
    "kai-topologies": ("kai.scheduler", "v1alpha1", "topologies"),
    # DRA (built in from Kubernetes 1.34; absent on older clusters)
    "resourceslices": ("resource.k8s.io", "v1", "resourceslices"),
    "resourceclaims": ("resource.k8s.io", "v1", "resourceclaims"),
}


def _field(obj: Any, path: str) -> str:
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return "" if obj is None else str(obj)


def matches(obj: dict[str, Any], selector: str) -> bool:
    """A field selector of `a.b!=x` / `a.b=x` terms, all of which must hold."""
    for term in filter(None, selector.split(",")):
        if "!=" in term:
            path, _, value = term.partition("!=")
            if _field(obj, path) == value:
                return False
        else:
            path, _, value = term.replace("==", "=").partition("=")
            if _field(obj, path) != value:
                return False
    return True


def _key(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else meta["name"]


#: metav1.MicroTime as the API server parses it (RFC3339Micro: six digits, Z or an offset).
MICRO_TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)"


def event_problem(body: dict[str, Any], namespace: str, v1: bool) -> str:
    """What the API server's Event validation refuses (pkg/apis/core/validation/events.go), in
    part: the fields each API requires, the note's length, the namespace of a cluster-scoped
    object's Event; "" when valid."""
    about = (body.get("regarding") if v1 else body.get("involvedObject")) or {}
    if (body.get("metadata") or {}).get("namespace", namespace) != namespace:
        return "metadata.namespace: does not match the request"
    if not about.get("namespace") and namespace not in ("default", "kube-system"):
        return f"namespace {namespace}: an Event about a cluster-scoped object must be in default"
    if about.get("namespace") and about["namespace"] != namespace:
        return "involvedObject.namespace: does not match event.namespace"
    if v1:
        for field in ("eventTime", "reportingController", "reportingInstance", "action", "reason"):
            if not body.get(field):
                return f"{field}: Required value"
        if not re.fullmatch(MICRO_TIME, body["eventTime"]):
            return f"eventTime: not a MicroTime: {body['eventTime']!r}"
        if len((body.get("note") or "").encode()) > 1024:  # Go's len: bytes, not characters
            return "note: Too long"
    elif len(body.get("message") or "") > 1024 * 4:
        return "message: Too long"
    if body.get("type") not in ("Normal", "Warning"):
        return "type: Unsupported value"
    return ""


def event_view(e: dict[str, Any]) -> dict[str, Any]:
    """An Event as either API wrote it, in one shape: kind, name, uid, reason, message, type, from."""
    about = e.get("regarding") or e.get("involvedObject") or {}
    return {
        "api": e.get("apiVersion"),
        "kind": about.get("kind"),
        "name": about.get("name"),
        "uid": about.get("uid"),
        "ref": about,
        "reason": e.get("reason"),
        "message": e.get("note") if "regarding" in e else e.get("message"),
        "type": e.get("type"),
        "from": e.get("reportingController") or (e.get("source") or {}).get("component"),
        "namespace": (e.get("metadata") or {}).get("namespace"),
    }


class FakeAPI:
    """The store, its event history and the injected faults."""

    def __init__(self, *, podgroups_crd: bool = True, serve: dict[str, str] | tuple[str, ...] = ()) -> None:
        self.cond = threading.Condition()
        self.rv = 100
        self.objects: dict[str, dict[str, dict[str, Any]]] = {"nodes": {}, "pods": {}, "podgroups": {}}
        # optional kinds served: name -> version; a dict picks versions, a tuple the defaults
        versions = serve if isinstance(serve, dict) else {k: EXTRA_KINDS[k][1] for k in serve}
        self.paths: dict[str, str] = {
            "/api/v1/nodes": "nodes",
            "/api/v1/pods": "pods",
            PODGROUPS: "podgroups",
        }
        self.served: dict[str, str] = {}
        for name, version in versions.items():
            self.serve_kind(name, version)
        self.events: list[dict[str, Any]] = []  # core/v1 Events created
        self.watch_queries: list[tuple[str, str]] = []  # (kind, query string) of every watch
        self.event_gate: threading.Event | None = None  # when set, event writes wait for it
        self.page_snapshots: dict[str, tuple[int, list[dict[str, Any]]]] = {}
        self.bookmark_every_s = 0.2
        self.history: list[tuple[int, str, str, dict[str, Any]]] = []
        self.compacted = 0  # watches from a resourceVersion below this get 410
        self.generation = 0  # bumped to break every open watch
        self.podgroups_crd = podgroups_crd
        self.fail: dict[str, list[int]] = {}  # endpoint -> status codes to answer next
        self.requests: list[tuple[str, str]] = []
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.events: list[dict[str, Any]] = []  # Events created, as sent (not listed or watched)
        self.events_v1 = True  # events.k8s.io/v1 served (False: 404, as a server without it)
        self.bindings: list[tuple[str, str]] = []
        self.bind_gate: threading.Event | None = None  # when set, bindings wait for it (slow API server)

    # -- store --------------------------------------------------------------
    def put(self, kind: str, obj: dict[str, Any], event: str | None = None) -> dict[str, Any]:
        with self.cond:
            obj = copy.deepcopy(obj)
            key = _key(obj)
            existed = key in self.objects[kind]
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self.objects[kind][key] = obj
            self.history.append(
                (self.rv, kind, event or ("MODIFIED" if existed else "ADDED"), copy.deepcopy(obj))
            )
            self.cond.notify_all()
            return obj

    def delete(self, kind: str, key: str) -> None:
        with self.cond:
            obj = self.objects[kind].pop(key)
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self.history.append((self.rv, kind, "DELETED", obj))
            self.cond.notify_all()

    def break_watches(self) -> None:
        with self.cond:
            self.generation += 1
            self.cond.notify_all()

    def compact(self) -> None:
        """Forget history: every watch resuming from an older version gets 410 Gone."""
        with self.cond:
            self.compacted = self.rv + 1
            self.history.clear()
            self.generation += 1
            self.cond.notify_all()

    def inject(self, endpoint: str, *codes: int) -> None:
        with self.cond:
            self.fail.setdefault(endpoint, []).extend(codes)

    def take_fault(self, endpoint: str) -> int | None:
        with self.cond:
            codes = self.fail.get(endpoint)
            return codes.pop(0) if codes else None

    def serve_kind(self, name: str, version: str | None = None) -> None:
        """Start serving an optional kind (a CRD installed while the sidecar runs)."""
        group, default, plural = EXTRA_KINDS[name]
        with self.cond:
            self.paths[f"/apis/{group}/{version or default}/{plural}"] = name
            self.served[name] = version or default
            self.objects.setdefault(name, {})

    def watch_requests(self, kind: str) -> list[str]:
        return [q for k, q in self.requests if k == f"watch:{kind}"]

    def list_requests(self, kind: str) -> list[str]:
        """The query string of every list request of `kind` (one per page)."""
        return [q for k, q in self.requests if k == f"list:{kind}"]

    def expire_continue_tokens(self) -> None:
        with self.cond:
            self.page_snapshots.clear()

    def discovery(self) -> dict[str, Any]:
        groups: dict[str, list[str]] = {"scheduling.x-k8s.io": ["v1alpha1"]} if self.podgroups_crd else {}
        for name, version in self.served.items():
            groups.setdefault(EXTRA_KINDS[name][0], []).append(version)
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {
                    "name": g,
                    "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                    "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]},
                }
                for g, vs in groups.items()
            ],
        }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # watches stream chunked, as the real API server does
    disable_nagle_algorithm = True
    server: FakeServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _json(self, code: int, doc: Any) -> None:
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _status(self, code: int, reason: str, message: str = "") -> None:
        self._json(
            code,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "code": code,
                "reason": reason,
                "message": message or reason,
            },
        )

    def _kind(self, path: str) -> str | None:
        return self.server.api.paths.get(path)

    def do_GET(self) -> None:
        api = self.server.api
        url = urlparse(self.path)
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        kind = self._kind(url.path)
        if url.path in ("/apis", "/apis/"):
            api.requests.append(("discovery", ""))
            self._json(200, api.discovery())
            return
        if kind == "podgroups" and not api.podgroups_crd:
            self._status(404, "NotFound", "the server could not find the requested resource")
            return
        selector = q.get("fieldSelector", "")
        if kind is not None and q.get("watch") in ("true", "1"):
            api.requests.append((f"watch:{kind}", q.get("resourceVersion", "")))
            api.watch_queries.append((kind, url.query))
            self._watch(
                kind,
                int(q.get("resourceVersion") or 0),
                float(q.get("timeoutSeconds") or 30),
                selector,
                q.get("allowWatchBookmarks") in ("true", "1"),
            )
            return
        if kind is not None:
            api.requests.append((f"list:{kind}", url.query))
            fault = api.take_fault(f"list:{kind}")
            if fault:
                self._status(fault, "Injected")
                return
            self._list(kind, q, selector)
            return
        m = re.fullmatch(r"/api/v1/nodes/([^/]+)", url.path)
        if m:  # read_node (the plugin's per-node config label)
            api.requests.append(("get:nodes", m.group(1)))
            with api.cond:
                found = copy.deepcopy(api.objects["nodes"].get(m.group(1)))
            if found is None:
                self._status(404, "NotFound", f'nodes "{m.group(1)}" not found')
            else:
                self._json(200, found)
            return
        m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)", url.path)
        if m:
            pod = api.objects["pods"].get(f"{m.group(1)}/{m.group(2)}")
            if pod is None:
                self._status(404, "NotFound")
            else:
                self._json(200, pod)
            return
        self._status(404, "NotFound", url.path)

    def _list(self, kind: str, q: dict[str, str], selector: str) -> None:
        """One page: the first request takes a consistent snapshot, `continue` tokens walk it."""
        api = self.server.api
        token = q.get("continue", "")
        limit = int(q.get("limit") or 0)
        if token:
            with api.cond:
                snap = api.page_snapshots.get(token.split(":")[0])
            if snap is None:
                self._status(410, "Expired", "the provided continue parameter is too old")
                return
            rv, items = snap
            offset = int(token.split(":")[1])
        else:
            with api.cond:
                items = [copy.deepcopy(o) for _, o in sorted(api.objects[kind].items())]
                rv = api.rv
            items = [o for o in items if matches(o, selector)] if selector else items
            offset = 0
        page = items[offset : offset + limit] if limit else items[offset:]
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if limit and offset + limit < len(items):
            with api.cond:
                sid = token.split(":")[0] if token else f"s{len(api.page_snapshots)}-{rv}"
                api.page_snapshots[sid] = (rv, items)
            meta["continue"] = f"{sid}:{offset + limit}"
            meta["remainingItemCount"] = len(items) - offset - limit
        self._json(200, {"kind": "List", "apiVersion": "v1", "metadata": meta, "items": page})

    def _watch(
        self, kind: str, since: int, timeout: float, selector: str = "", bookmarks: bool = False
    ) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.close_connection = True
        try:
            self._stream(kind, since, timeout, selector, bookmarks)
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass

    def _chunk(self, doc: Any) -> None:
        data = json.dumps(doc).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _stream(self, kind: str, since: int, timeout: float, selector: str, bookmarks: bool) -> None:
        api = self.server.api
        if since and since < api.compacted:
            self._chunk(
                {
                    "type": "ERROR",
                    "object": {
                        "kind": "Status",
                        "code": 410,
                        "reason": "Expired",
                        "message": f"too old resource version: {since}",
                    },
                }
            )
            return
        deadline = time.monotonic() + timeout
        with api.cond:
            gen = api.generation
        sent = since
        quiet_since = time.monotonic()
        while True:
            with api.cond:
                if api.generation != gen or self.server.closing:
                    return
                pending = [e for e in api.history if e[0] > sent and e[1] == kind]
                now_rv = api.rv
                if not pending:
                    now = time.monotonic()
                    if bookmarks and (now >= deadline or now - quiet_since >= api.bookmark_every_s):
                        quiet_since = now
                        if now_rv > sent:  # "nothing of your kind up to here": resume from it
                            sent = now_rv
                            bookmark = {"kind": kind, "metadata": {"resourceVersion": str(now_rv)}}
                            pending = [(now_rv, kind, "BOOKMARK", bookmark)]
                    if not pending:
                        if now >= deadline:
                            return
                        api.cond.wait(timeout=0.05)
                        continue
            for rv, _, etype, obj in pending:
                if selector and etype != "BOOKMARK" and not matches(obj, selector):
                    if etype == "ADDED":
                        sent = rv
                        continue
                    etype = "DELETED"  # it left the selection, as the real API server reports it
                self._chunk({"type": etype, "object": obj})
                sent = max(sent, rv)
                quiet_since = time.monotonic()

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"{}")

    def do_POST(self) -> None:
        api = self.server.api
        body = self._body()
        ev = re.fullmatch(
            r"(/api/v1|/apis/events\.k8s\.io/v1)/namespaces/([^/]+)/events", urlparse(self.path).path
        )
        if ev:
            v1 = ev.group(1) != "/api/v1"
            about = (body.get("regarding") if v1 else body.get("involvedObject")) or {}
            api.requests.append(("event", f"{ev.group(2)}/{about.get('name')}"))
            if v1 and not api.events_v1:
                self._status(404, "NotFound", "the server could not find the requested resource")
                return
            if problem := event_problem(body, ev.group(2), v1):
                self._status(422, "Invalid", f"Event is invalid: {problem}")
                return
            if api.event_gate is not None:
                api.event_gate.wait(timeout=30)
            fault = api.take_fault("event")
            if fault == DROP:  # the connection goes away before any answer (a restart, a proxy)
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if fault:
                self._status(fault, "Injected", "injected failure creating an event")
                return
            with api.cond:
                api.events.append(body)
            self._json(201, body)
            return
        m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/binding", urlparse(self.path).path)
        if not m:
            self._status(404, "NotFound")
            return
        key = f"{m.group(1)}/{m.group(2)}"
        node = (body.get("target") or {}).get("name")
        api.requests.append(("bind", key))
        gate = api.bind_gate
        if gate is not None:
            gate.wait(timeout=30)
        fault = api.take_fault("bind")
        if fault:
            self._status(fault, "Injected", f"injected failure binding {key}")
            return
        with api.cond:
            pod = copy.deepcopy(api.objects["pods"].get(key))
        if pod is None:
            self._status(404, "NotFound", f"pods {key} not found")
            return
        if pod["spec"].get("nodeName"):
            self._status(409, "Conflict", f"pod {key} is already assigned to node {pod['spec']['nodeName']}")
            return
        pod["spec"]["nodeName"] = node
        api.put("pods", pod)
        api.bindings.append((key, node))
        self._json(201, {"kind": "Status", "status": "Success", "code": 201})

    def do_PATCH(self) -> None:
        api = self.server.api
        body = self._body()
        m = re.fullmatch(r"/api/v1/nodes/([^/]+)", urlparse(self.path).path)
        if not m:
            self._status(404, "NotFound")
            return
        name = m.group(1)
        api.requests.append(("patch", name))
        fault = api.take_fault("patch")
        if fault:
            self._status(fault, "Injected", f"injected failure patching {name}")
            return
        with api.cond:
            node = copy.deepcopy(api.objects["nodes"].get(name))
        if node is None:
            self._status(404, "NotFound", f"nodes {name} not found")
            return
        anns = (body.get("metadata") or {}).get("annotations") or {}
        mine = node["metadata"].setdefault("annotations", {})
        for k, v in anns.items():
            if v is None:
                mine.pop(k, None)
            else:
                mine[k] = v
        api.patches.append((name, body))
        self._json(200, api.put("nodes", node))


class FakeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, api: FakeAPI) -> None:
        self.api = api
        self.closing = False
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@contextmanager
def running(api: FakeAPI | None = None) -> Iterator[tuple[FakeAPI, FakeServer, client.ApiClient]]:
    """A fake API server on a random loopback port and an official ApiClient pointed at it."""
    api = api or FakeAPI()
    server = FakeServer(api)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    cfg = client.Configuration()
    cfg.host = server.url
    api_client = client.ApiClient(cfg)
    try:
        yield api, server, api_client
    finally:
        server.closing = True
        api.break_watches()
        server.shutdown()
        server.server_close()
        api_client.close()


def node(
    name: str, labels: dict[str, str] | None = None, gpus: int = 8, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            "annotations": dict(annotations or {}),
        },
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "96"},
            "capacity": {"nvidia.com/gpu": str(gpus)},
        },
    }


def podgroup(namespace: str, name: str, min_member: int) -> dict[str, Any]:
    """A scheduler-plugins PodGroup (`scheduling.x-k8s.io/v1alpha1`) with its minMember."""
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"namespace": namespace, "name": name},
        "spec": {"minMember": min_member},
    }


def gang_pods(namespace: str, group: str, count: int, gpus: int = 8) -> list[dict[str, Any]]:
    """`count` pods `<group>-<i>` of `gpus` GPUs each, labelled into PodGroup `group`."""
    label = {"scheduling.x-k8s.io/pod-group": group}
    return [pod(namespace, f"{group}-{i}", gpus, labels=label) for i in range(count)]


def pod(
    namespace: str,
    name: str,
    gpus: int = 1,
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    node_name: str = "",
    uid: str = "",
) -> dict[str, Any]:
    """A v1.Pod shaped as kube-scheduler and the API server send it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{namespace}-{name}",
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
            "creationTimestamp": "2026-11-29T07:00:00Z",
        },
        "spec": {
            "schedulerName": "gputopo-scheduler",
            "nodeName": node_name or None,
            "containers": [
                {
                    "name": "main",
                    "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                    "resources": {
                        "limits": {"nvidia.com/gpu": str(gpus), "cpu": "8", "memory": "64Gi"},
                        "requests": {"nvidia.com/gpu": str(gpus), "cpu": "8", "memory": "64Gi"},
                    },
                }
            ],
            "restartPolicy": "Never",
        },
        "status": {"phase": "Pending", "qosClass": "Guaranteed"},
    }
