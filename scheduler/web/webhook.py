"""The opt-in mutating admission webhook: HTTPS `POST /mutate-pods`, AdmissionReview v1.

For clusters that do not serve MutatingAdmissionPolicy, the chart registers this server in a
MutatingWebhookConfiguration whose namespaceSelector / objectSelector pick the opted-in
namespaces and pods; the API server sends each such pod's CREATE here and applies the JSONPatch
that comes back. The decision (which pods, what patch) is `gputopo.pod.optin.decide`; this module
only speaks the wire format.

Never in the way of a pod: the configuration's failurePolicy is Ignore, and this server answers
`allowed: true` to every AdmissionReview it can read — with no patch when the request is not a
pod CREATE, the pod is shaped oddly, asks for no GPUs or names another scheduler (logged with
the reason). Only a body that is not an AdmissionReview v1 at all (not JSON, no `request.uid`)
gets HTTP 400 with a JSON `{"error": reason}`: there is no uid to answer for.

Bounded like the extender's server: a body over `max_body` is refused unread (413), at most
`max_connections` connections hold a thread (more are closed), every socket read (the TLS
handshake included) gives up after `timeout_s`. The TLS handshake happens in the connection's
thread, never in the accept loop. The certificate and key are re-read when their files change
(a renewed Secret), checked at most every `reload_s` on new connections.
"""

from __future__ import annotations

import base64
import logging
import os
import ssl
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter

from gputopo import jsonlog
from gputopo.numerals import ascii_uint
from gputopo.pod.optin import decide
from scheduler.web.limits import ConnectionCap

log = logging.getLogger("gputopo.scheduler.webhook")

MUTATE_PATH = "/mutate-pods"
HEALTHZ_PATH = "/healthz"
DEFAULT_PORT = 8443
DEFAULT_TLS_DIR = "/etc/gputopo/webhook-tls"
DEFAULT_SCHEDULER_NAME = "gputopo-scheduler"
API_VERSION = "admission.k8s.io/v1"
#: kube-apiserver caps a request at 3 MiB of object; an AdmissionReview carries it (and maybe
#: oldObject) as JSON: 8 MiB holds any pod the API server would store.
MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_CONNECTIONS = 32
TIMEOUT_S = 10.0  # the API server's default webhook timeout is 10 s
RELOAD_S = 10.0


class TLSFilesError(ValueError):
    """The certificate or key cannot be read or do not form a pair; the message says which."""


class BadReview(ValueError):
    """The body is not an AdmissionReview this server can answer: HTTP 400 with the reason."""


@dataclass(frozen=True)
class WebhookConfig:
    """What the webhook sets and where its certificate is."""

    cert_file: str
    key_file: str
    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    resources: tuple[str, ...] = ()


def tls_files(tls_dir: str) -> tuple[str, str]:
    """The certificate and key of a kubernetes.io/tls Secret mounted at `tls_dir`."""
    return os.path.join(tls_dir, "tls.crt"), os.path.join(tls_dir, "tls.key")


def _uid(doc: Any) -> str:
    if not isinstance(doc, dict):
        raise BadReview("body must be a JSON object (an AdmissionReview)")
    if doc.get("kind") != "AdmissionReview" or doc.get("apiVersion") != API_VERSION:
        raise BadReview(
            f"expected kind AdmissionReview, apiVersion {API_VERSION}; "
            f"got kind {doc.get('kind')!r}, apiVersion {doc.get('apiVersion')!r}"
        )
    request = doc.get("request")
    if not isinstance(request, dict):
        raise BadReview("AdmissionReview has no request object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("AdmissionReview request has no uid")
    return uid


def review(doc: Any, *, scheduler_name: str, resources: Iterable[str] = ()) -> tuple[dict[str, Any], str]:
    """The AdmissionReview answer to `doc` and the reason for it. Raises BadReview only when
    there is no request uid to answer for; anything else is allowed, patched or not."""
    uid = _uid(doc)
    request = doc["request"]
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    kind = request.get("kind") if isinstance(request.get("kind"), dict) else {}
    if request.get("operation") != "CREATE":
        reason = f"operation {request.get('operation')!r} is not CREATE"
    elif kind.get("kind") != "Pod" or kind.get("group", "") != "" or request.get("subResource"):
        reason = f"not a pod (kind {kind.get('kind')!r}, subResource {request.get('subResource')!r})"
    else:
        decision = decide(request.get("object"), scheduler_name=scheduler_name, resources=resources)
        reason = decision.reason
        if decision.patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(orjson.dumps(list(decision.patch))).decode("ascii")
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}, reason


def _where(doc: Any) -> dict[str, str]:
    """namespace/name of the reviewed pod, for the log line (generateName when unnamed yet)."""
    raw = doc.get("request") if isinstance(doc, dict) else None
    request: dict[str, Any] = raw if isinstance(raw, dict) else {}
    obj = request.get("object")
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    name = request.get("name") or meta.get("name") or meta.get("generateName") or ""
    return {"namespace": str(request.get("namespace") or ""), "pod": str(name)[:253]}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: WebhookHTTPServer

    def setup(self) -> None:
        self.timeout = self.server.timeout_s  # type: ignore[misc]  # per connection, on purpose
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug(format, *args)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (bad request line, unknown method) as JSON, not HTML."""
        self.close_connection = True
        self._json(code, {"error": message or self.responses.get(code, ("error",))[0]})

    def _json(self, code: int, doc: Any) -> None:
        body = orjson.dumps(doc)
        self.send_response(code)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] == HEALTHZ_PATH:
            self._json(200, {"status": "ok"})
        else:
            self._json(404, {"error": f"no such path {self.path.split('?', 1)[0]}"})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]  # the API server adds ?timeout=10s
        size = ascii_uint((self.headers.get("Content-Length") or "").strip())
        if size is None or size > self.server.max_body:
            self.close_connection = True  # the body stays unread: the stream is unusable
            reason = (
                "Content-Length is required (a number of bytes)"
                if size is None
                else f"request body of {size} bytes exceeds {self.server.max_body}"
            )
            jsonlog.event(log, "bad_review", logging.WARNING, reason=reason)
            self.server.count("bad_request")
            self._json(400 if size is None else 413, {"error": reason})
            return
        body = self.rfile.read(size)
        doc: Any = None
        if path != MUTATE_PATH:
            self._json(404, {"error": f"no such path {path}"})
            return
        try:
            if len(body) < size:
                raise BadReview(f"request body ended after {len(body)} of {size} bytes")
            try:
                doc = orjson.loads(body)
            except orjson.JSONDecodeError as e:
                raise BadReview(f"malformed JSON: {e}") from None
            config = self.server.config
            answer, reason = review(doc, scheduler_name=config.scheduler_name, resources=config.resources)
        except BadReview as e:
            self.close_connection = len(body) < size or self.close_connection
            jsonlog.event(log, "bad_review", logging.WARNING, reason=str(e))
            self.server.count("bad_request")
            self._json(400, {"error": str(e)})
            return
        except Exception as e:  # a bug answers allowed-without-patch: never block a pod
            uid = _uid(doc)  # review() got past this check before anything else could fail
            log.exception("internal_error", extra={"fields": {"path": path}})
            answer = {
                "apiVersion": API_VERSION,
                "kind": "AdmissionReview",
                "response": {"uid": uid, "allowed": True},
            }
            reason = f"internal error: {type(e).__name__}"
        patched = "patch" in answer["response"]
        self.server.count("mutated" if patched else "admitted")
        jsonlog.event(log, "pod_mutated" if patched else "pod_admitted", **_where(doc), reason=reason)
        self._json(200, answer)


class WebhookHTTPServer(ConnectionCap, ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(
        self,
        address: tuple[str, int],
        config: WebhookConfig,
        *,
        max_body: int = MAX_BODY_BYTES,
        max_connections: int = MAX_CONNECTIONS,
        timeout_s: float = TIMEOUT_S,
        reload_s: float = RELOAD_S,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.config = config
        #: on the sidecar's registry: served on /metrics with the extender's series
        self.reviews = Counter(
            "gputopo_webhook_reviews_total",
            "AdmissionReviews answered by the opt-in webhook, by result (mutated: schedulerName set; "
            "admitted: allowed unchanged; bad_request: HTTP 4xx, not an AdmissionReview)",
            ["result"],
            registry=registry if registry is not None else CollectorRegistry(),
        )
        self.max_body = max_body
        self.timeout_s = timeout_s
        self.reload_s = reload_s
        self.cap_connections(max_connections)
        self._tls_lock = threading.Lock()
        self._stamp = self._file_stamp()
        self._context = self._load_context()  # an unreadable certificate fails here, at start
        self._checked_at = time.monotonic()
        super().__init__(address, _Handler)

    def count(self, result: str) -> None:
        self.reviews.labels(result=result).inc()

    # -- TLS ------------------------------------------------------------------------------------

    def _file_stamp(self) -> tuple[tuple[float, int], ...]:
        stamps = []
        for path in (self.config.cert_file, self.config.key_file):
            try:
                st = os.stat(path)
                stamps.append((st.st_mtime, st.st_size))
            except OSError:
                stamps.append((0.0, -1))
        return tuple(stamps)

    def _load_context(self) -> ssl.SSLContext:
        cert, key = self.config.cert_file, self.config.key_file
        for path in (cert, key):
            try:
                with open(path, "rb"):
                    pass
            except OSError as e:
                raise TLSFilesError(f"cannot read {path}: {e.strerror or e}") from None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as e:
            reason = getattr(e, "reason", None) or e.strerror or str(e)
            raise TLSFilesError(f"certificate {cert} and key {key} do not load: {reason}") from None
        return ctx

    def context(self) -> ssl.SSLContext:
        """The TLS context, re-read when the certificate or key file changed (a renewed Secret:
        kubelet swaps the mounted files); a pair that does not load keeps the old one, logged."""
        now = time.monotonic()
        with self._tls_lock:
            if now - self._checked_at < self.reload_s:
                return self._context
            self._checked_at = now
            stamp = self._file_stamp()
            if stamp != self._stamp:
                try:
                    self._context = self._load_context()
                    self._stamp = stamp
                    jsonlog.event(log, "certificate_reloaded", cert=self.config.cert_file)
                except TLSFilesError as e:
                    jsonlog.event(
                        log,
                        "certificate_reload_failed",
                        logging.WARNING,
                        reason=str(e),
                        effect="keeping the old one",
                    )
            return self._context

    # -- connections ----------------------------------------------------------------------------

    def refuse(self, request: Any) -> None:
        jsonlog.event(log, "connection_refused", logging.WARNING, reason="too many open connections")

    def finish_request(self, request: Any, client_address: Any) -> None:
        """TLS handshake here, in the connection's own thread, bounded by the timeout."""
        request.settimeout(self.timeout_s)
        try:
            tls = self.context().wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError) as e:
            jsonlog.event(log, "tls_handshake_failed", logging.DEBUG, reason=str(e))
            return
        try:
            _Handler(tls, client_address, self)
        finally:
            try:
                tls.close()
            except OSError:
                pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        err = sys.exc_info()[1]
        level = logging.DEBUG if isinstance(err, (ConnectionError, TimeoutError)) else logging.ERROR
        jsonlog.event(log, "connection_failed", level, reason=f"{type(err).__name__}: {err}")


class WebhookServer:
    """The HTTPS server with an explicit lifecycle: start() serves on a thread, stop() ends it."""

    def __init__(
        self, config: WebhookConfig, host: str = "0.0.0.0", port: int = DEFAULT_PORT, **kwargs: Any
    ) -> None:
        self.httpd = WebhookHTTPServer((host, port), config, **kwargs)
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.httpd.server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="webhook-https", daemon=True
        )
        self._thread.start()
        host, port = self.address
        jsonlog.event(
            log,
            "webhook_listening",
            url=f"https://{host}:{port}{MUTATE_PATH}",
            scheduler_name=self.httpd.config.scheduler_name,
        )

    def stop(self) -> None:
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self.httpd.server_close()
