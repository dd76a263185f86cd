"""Stand-ins for the two peers of the DRA node daemon, spoken to over real sockets.

* `ResourceApi`: the slice of the API server a DRA driver uses — cluster-scoped
  `resource.k8s.io/v1` ResourceSlices (list with `spec.nodeName` / `spec.driver` field
  selectors, create, replace with resourceVersion checks, delete) and namespaced ResourceClaims
  (get) — over HTTP, for the official client. tests/fake_apiserver.py does not store objects of
  this group (and ../shared's stand-in answers unknown kinds with empty lists), so this is the
  test's own extension. Faults can be injected per method.
* `KubeletDra`: what kubelet's plugin watcher and DRA manager do, as a gRPC client over unix
  sockets: find a socket in the registry folder, GetInfo, NotifyRegistrationStatus, then call
  NodePrepareResources / NodeUnprepareResources on the endpoint GetInfo named. It dials the
  wire paths by name (`/pluginregistration.Registration/GetInfo`,
  `/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/...`), as kubelet's Go stubs do, so a package or
  service name that drifted from upstream's fails here.
"""

from __future__ import annotations

import copy
import json
import os
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import grpc
from kubernetes import client

from gputopo_proto.dra.v1 import api_pb2 as dra_pb2
from gputopo_proto.pluginregistration.v1 import api_pb2 as reg_pb2

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
_CLAIM = re.compile(r"/apis/resource\.k8s\.io/v1/namespaces/([^/]+)/resourceclaims/([^/]+)")


class ResourceApi:
    """In-memory store behind the HTTP handler; tests read and change it directly."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.slices: dict[str, dict[str, Any]] = {}
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.version = 0
        self.faults: dict[str, list[int]] = {}
        self.writes: list[tuple[str, str, int]] = []  # (verb, name, pool generation)
        self.changed = threading.Condition(self.lock)

    def inject(self, verb: str, *codes: int) -> None:
        """The next len(codes) requests of `verb` (GET_SLICES, POST, PUT, DELETE, GET_CLAIM) fail."""
        with self.lock:
            self.faults.setdefault(verb, []).extend(codes)

    def take_fault(self, verb: str) -> int | None:
        with self.lock:
            codes = self.faults.get(verb)
            return codes.pop(0) if codes else None

    def put_claim(self, claim: dict[str, Any]) -> None:
        meta = claim["metadata"]
        with self.lock:
            self.claims[(meta["namespace"], meta["name"])] = claim

    def node_slices(self, node: str) -> list[dict[str, Any]]:
        with self.lock:
            return [copy.deepcopy(s) for s in self.slices.values() if s["spec"].get("nodeName") == node]

    def wait(self, check: Any, timeout: float = 10.0) -> Any:
        """Block until `check(self)` is truthy (re-checked on every write); its value."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                value = check(self)
                if value:
                    return value
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError("the API stand-in never reached the expected state")
                self.changed.wait(min(left, 0.2))


def _selected(obj: dict[str, Any], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        path, _, want = term.replace("==", "=").partition("=")
        cur: Any = obj
        for part in path.split("."):
            cur = cur.get(part) if isinstance(cur, dict) else None
        if str(cur) != want:
            return False
    return True


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _json(self, code: int, doc: Any) -> None:
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _status(self, code: int, reason: str) -> None:
        self._json(
            code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code}
        )

    def _fault(self, verb: str) -> bool:
        code = self.server.api.take_fault(verb)
        if code is None:
            return False
        self._status(code, "Injected")
        return True

    def _body(self) -> dict[str, Any]:
        n = int(self.headers.get("Content-Length", "0"))
        doc = json.loads(self.rfile.read(n) or b"{}")
        assert isinstance(doc, dict)
        return doc

    def do_GET(self) -> None:
        url = urlparse(self.path)
        api = self.server.api
        if url.path == SLICES:
            if self._fault("GET_SLICES"):
                return
            selector = parse_qs(url.query).get("fieldSelector", [""])[0]
            with api.lock:
                items = [copy.deepcopy(s) for s in api.slices.values() if _selected(s, selector)]
                rv = str(api.version)
            self._json(
                200,
                {
                    "kind": "ResourceSliceList",
                    "apiVersion": "resource.k8s.io/v1",
                    "metadata": {"resourceVersion": rv},
                    "items": items,
                },
            )
            return
        m = _CLAIM.fullmatch(url.path)
        if m:
            if self._fault("GET_CLAIM"):
                return
            with api.lock:
                claim = api.claims.get((m.group(1), m.group(2)))
            if claim is None:
                self._status(404, "NotFound")
            else:
                self._json(200, claim)
            return
        self._status(404, "NotFound")

    def do_POST(self) -> None:
        api = self.server.api
        if urlparse(self.path).path != SLICES:
            self._status(404, "NotFound")
            return
        if self._fault("POST"):
            return
        body = self._body()
        name = body.get("metadata", {}).get("name", "")
        with api.lock:
            if name in api.slices:
                self._status(409, "AlreadyExists")
                return
            api.version += 1
            body["metadata"]["resourceVersion"] = str(api.version)
            body["metadata"]["uid"] = f"uid-{api.version}"
            api.slices[name] = body
            api.writes.append(("create", name, body["spec"]["pool"]["generation"]))
            api.changed.notify_all()
        self._json(201, body)

    def do_PUT(self) -> None:
        api = self.server.api
        path = urlparse(self.path).path
        if not path.startswith(SLICES + "/"):
            self._status(404, "NotFound")
            return
        if self._fault("PUT"):
            return
        name = path[len(SLICES) + 1 :]
        body = self._body()
        with api.lock:
            old = api.slices.get(name)
            if old is None:
                self._status(404, "NotFound")
                return
            rv = body.get("metadata", {}).get("resourceVersion")
            if rv and rv != old["metadata"]["resourceVersion"]:
                self._status(409, "Conflict")
                return
            api.version += 1
            body["metadata"]["resourceVersion"] = str(api.version)
            body["metadata"]["uid"] = old["metadata"]["uid"]
            api.slices[name] = body
            api.writes.append(("replace", name, body["spec"]["pool"]["generation"]))
            api.changed.notify_all()
        self._json(200, body)

    def do_DELETE(self) -> None:
        api = self.server.api
        path = urlparse(self.path).path
        if not path.startswith(SLICES + "/"):
            self._status(404, "NotFound")
            return
        if self._fault("DELETE"):
            return
        name = path[len(SLICES) + 1 :]
        with api.lock:
            if api.slices.pop(name, None) is None:
                self._status(404, "NotFound")
                return
            api.version += 1
            api.writes.append(("delete", name, 0))
            api.changed.notify_all()
        self._json(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, api: ResourceApi) -> None:
        self.api = api
        super().__init__(("127.0.0.1", 0), _Handler)


@contextmanager
def resource_api() -> Iterator[tuple[ResourceApi, client.ApiClient]]:
    """The stand-in on a loopback port and an official ApiClient pointed at it."""
    api = ResourceApi()
    server = _Server(api)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{server.server_address[1]}"
    api_client = client.ApiClient(cfg)
    try:
        yield api, api_client
    finally:
        server.shutdown()
        server.server_close()
        api_client.close()


def allocated_claim(namespace: str, name: str, uid: str, results: list[dict[str, str]]) -> dict[str, Any]:
    """A ResourceClaim as kube-scheduler leaves it: status.allocation.devices.results."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": namespace, "name": name, "uid": uid},
        "spec": {"devices": {"requests": [{"name": r.get("request", "gpus")} for r in results]}},
        "status": {"allocation": {"devices": {"results": results}}},
    }


class KubeletDra:
    """kubelet's side: registration through the plugin watcher, then the DRA calls."""

    GET_INFO = "/pluginregistration.Registration/GetInfo"
    NOTIFY = "/pluginregistration.Registration/NotifyRegistrationStatus"
    PREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
    UNPREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources"

    def __init__(self, registry_dir: Path) -> None:
        self.registry_dir = registry_dir
        self.info: reg_pb2.PluginInfo | None = None
        self._channels: list[grpc.Channel] = []
        self._dra: grpc.Channel | None = None

    def close(self) -> None:
        for ch in self._channels:
            ch.close()

    def find_socket(self, timeout: float = 10.0) -> Path:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            socks = sorted(p for p in self.registry_dir.glob("*.sock") if p.is_socket())
            if socks:
                return socks[0]
            time.sleep(0.05)
        raise AssertionError(f"no registration socket appeared in {self.registry_dir}")

    def _channel(self, path: str | Path) -> grpc.Channel:
        ch = grpc.insecure_channel(f"unix://{path}")
        grpc.channel_ready_future(ch).result(timeout=10)
        self._channels.append(ch)
        return ch

    def register(self, accept: bool = True, error: str = "") -> reg_pb2.PluginInfo:
        """What the plugin watcher does: GetInfo, validate, then tell the plugin the outcome."""
        ch = self._channel(self.find_socket())
        info = ch.unary_unary(
            self.GET_INFO,
            request_serializer=reg_pb2.InfoRequest.SerializeToString,
            response_deserializer=reg_pb2.PluginInfo.FromString,
        )(reg_pb2.InfoRequest(), timeout=5)
        ok = accept and info.type == "DRAPlugin" and "v1.DRAPlugin" in info.supported_versions
        ch.unary_unary(
            self.NOTIFY,
            request_serializer=reg_pb2.RegistrationStatus.SerializeToString,
            response_deserializer=reg_pb2.RegistrationStatusResponse.FromString,
        )(reg_pb2.RegistrationStatus(plugin_registered=ok, error="" if ok else error or "refused"), timeout=5)
        self.info = info
        if ok:
            assert os.path.isabs(info.endpoint)
            self._dra = self._channel(info.endpoint)
        return info

    def prepare(self, *claims: tuple[str, str, str]) -> dra_pb2.NodePrepareResourcesResponse:
        assert self._dra is not None, "register first"
        call = self._dra.unary_unary(
            self.PREPARE,
            request_serializer=dra_pb2.NodePrepareResourcesRequest.SerializeToString,
            response_deserializer=dra_pb2.NodePrepareResourcesResponse.FromString,
        )
        req = dra_pb2.NodePrepareResourcesRequest(
            claims=[dra_pb2.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]
        )
        out: dra_pb2.NodePrepareResourcesResponse = call(req, timeout=10)
        return out

    def unprepare(self, *claims: tuple[str, str, str]) -> dra_pb2.NodeUnprepareResourcesResponse:
        assert self._dra is not None, "register first"
        call = self._dra.unary_unary(
            self.UNPREPARE,
            request_serializer=dra_pb2.NodeUnprepareResourcesRequest.SerializeToString,
            response_deserializer=dra_pb2.NodeUnprepareResourcesResponse.FromString,
        )
        req = dra_pb2.NodeUnprepareResourcesRequest(
            claims=[dra_pb2.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]
        )
        out: dra_pb2.NodeUnprepareResourcesResponse = call(req, timeout=10)
        return out
