"""The extender's HTTP face: kube-scheduler's wire format in, the Extender's decisions out.

Only translation happens here (design.md §6, PascalCase keys, both nodeCacheCapable modes).
Anything a client sends that cannot be understood is answered with HTTP 400 and a JSON body
`{"Error": reason}` — the verb's own error field — and nothing reaches the Extender; an
unexpected failure is a 500 with the same shape, logged, and the server keeps serving.

Bounded (docs/scheduler.md "Limits"): at most `max_connections` connections at once (each
holds a thread; more are answered 503 and closed without a thread), an idle connection is closed
after `idle_timeout` seconds, a body must arrive within `body_timeout` (408), a body over
`max_body` is 413 unread, and bodies being read and decoded together stay under
`max_inflight_body` (503 unread): memory does not grow with the number of clients.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gputopo import jsonlog
from gputopo.numerals import ascii_uint
from scheduler import defaults
from scheduler.extender import Extender
from scheduler.model import BadInput, parse_node_names, parse_pod
from scheduler.picture.feed import BindError
from scheduler.web.limits import BUSY_RESPONSE, Budget, ConnectionCap, Limits, Refused

log = logging.getLogger("gputopo.scheduler.http")


class Encoded:
    """An answer already encoded as JSON (prioritize's HostPriorityList, joined from kept
    fragments: `scheduler.picture.ranks.Ranked.encode`)."""

    __slots__ = ("body",)

    def __init__(self, body: bytes) -> None:
        self.body = body


def _filter(ext: Extender, args: Any) -> tuple[int, Any]:
    if not isinstance(args, dict):
        raise BadInput("ExtenderArgs must be a JSON object")
    pod = parse_pod(args.get("Pod"))
    names, cache_mode = parse_node_names(args)
    result = ext.filter(pod, names)
    if cache_mode:
        out: dict[str, Any] = {"Nodes": None, "NodeNames": result.node_names}
    else:
        keep = set(result.node_names)
        items = [i for i in args["Nodes"].get("items") or [] if i["metadata"]["name"] in keep]
        nodes = {k: v for k, v in args["Nodes"].items() if k != "items"}
        nodes["items"] = items
        out = {"Nodes": nodes, "NodeNames": None}
    out["FailedNodes"] = result.failed
    out["FailedAndUnresolvableNodes"] = result.unresolvable
    out["Error"] = ""
    return 200, out


def _prioritize(ext: Extender, args: Any) -> tuple[int, Any]:
    if not isinstance(args, dict):
        raise BadInput("ExtenderArgs must be a JSON object")
    pod = parse_pod(args.get("Pod"))
    names, _ = parse_node_names(args)
    return 200, Encoded(ext.ranked(pod, names).encode())


def _bind(ext: Extender, args: Any) -> tuple[int, Any]:
    if not isinstance(args, dict):
        raise BadInput("ExtenderBindingArgs must be a JSON object")
    fields = {}
    for key in ("PodName", "PodNamespace", "PodUID", "Node"):
        value = args.get(key, "")
        if not isinstance(value, str):
            raise BadInput(f"{key} must be a string")
        fields[key] = value
    if not fields["PodName"] or not fields["Node"]:
        raise BadInput("PodName and Node are required")
    try:
        ext.bind(fields["PodNamespace"] or "default", fields["PodName"], fields["PodUID"], fields["Node"])
    except BindError as e:
        return 200, {"Error": str(e)}
    return 200, {"Error": ""}


VERBS: dict[str, tuple[str, Callable[[Extender, Any], tuple[int, Any]]]] = {
    defaults.FILTER_PATH: ("filter", _filter),
    defaults.PRIORITIZE_PATH: ("prioritize", _prioritize),
    defaults.BIND_PATH: ("bind", _bind),
}


_READ_CHUNK = 1024 * 1024


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall
    server: ExtenderHTTPServer

    _unread = False  # a refused request's body is still on the wire

    def finish(self) -> None:
        """Close gently after a refusal that left the body unread: closing a socket with unread
        input sends a TCP reset, which can destroy the refusal before the client reads it. So:
        answer, half-close, swallow a little of the body (bounded in bytes and time), close."""
        try:
            super().finish()  # flushes the answer
            if self._unread:
                self.connection.shutdown(socket.SHUT_WR)
                self.connection.settimeout(0.2)
                deadline = time.monotonic() + 0.5
                for _ in range(64):  # at most 4 MiB and 0.5 s (+ one 0.2 s read)
                    if not self.connection.recv(65536) or time.monotonic() > deadline:
                        break
        except OSError:
            pass

    def setup(self) -> None:
        # StreamRequestHandler puts `timeout` on the socket: every read (the next request line of
        # a kept-alive connection included) gives up after it, and handle_one_request closes.
        self.timeout = self.server.idle_timeout  # type: ignore[misc]  # per connection, on purpose
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug(format, *args)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """What http.server itself refuses (malformed request line, unknown method, headers too
        long) gets the same JSON shape as everything else, not its HTML page."""
        reason = message or self.responses.get(code, ("error",))[0]
        jsonlog.event(log, "bad_request", logging.WARNING, code=code, reason=reason)
        body = orjson.dumps({"Error": reason})
        self.send_response(code, message)
        self.send_header("Connection", "close")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        if self.close_connection:  # tell the client, so it does not send its next call here
            self.send_header("Connection", "close")
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, code: int, doc: Any) -> None:
        self._send(code, doc.body if isinstance(doc, Encoded) else orjson.dumps(doc))

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == defaults.HEALTHZ_PATH:
            self._send(200, b"ok\n", "text/plain")
        elif path == defaults.READYZ_PATH:
            ready = self.server.extender.state.ready()
            self._send(
                200 if ready else 503, b"ok\n" if ready else b"cluster state not loaded\n", "text/plain"
            )
        elif path == defaults.METRICS_PATH:
            self._send(200, generate_latest(self.server.extender.metrics.registry), CONTENT_TYPE_LATEST)
        else:
            self._json(404, {"Error": f"no such path {path}"})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        verb = VERBS.get(path)
        if verb is None:
            self._drain()
            self._json(404, {"Error": f"no such verb {path}"})
            return
        name, fn = verb
        metrics = self.server.extender.metrics
        start = time.perf_counter()
        code = 500
        reserved = 0
        try:
            reserved = self._reserve()
            args = self._read_json()
            code, out = fn(self.server.extender, args)
        except Refused as e:
            code, out = e.code, {"Error": str(e)}
            self.close_connection = True  # the body (if any) was not read: the stream is unusable
            self._unread = True
            metrics.refused.labels(reason=e.metric).inc()
            jsonlog.event(log, "request_refused", logging.WARNING, verb=name, code=code, reason=str(e))
        except BadInput as e:
            code, out = 400, {"Error": str(e)}
            jsonlog.event(log, "bad_request", logging.WARNING, verb=name, reason=str(e))
        except Exception as e:  # a bug must not take the daemon down with it
            code, out = 500, {"Error": f"internal error: {type(e).__name__}"}
            log.exception("internal_error", extra={"fields": {"verb": name}})
        try:
            self._json(code, out)
        finally:
            # the answer (in non-cache mode it holds node objects of the request) is written:
            # the body and its decoded form are garbage from here
            self.server.budget.release(reserved)
            metrics.latency.labels(verb=name).observe(time.perf_counter() - start)
            metrics.requests.labels(verb=name, code=str(code)).inc()

    def _length(self) -> int | None:
        """Content-Length as a number; None when absent or not plain ASCII digits of a sane
        length (`str.isdigit` also accepts "²", which `int` refuses)."""
        length = (self.headers.get("Content-Length") or "").strip()
        return ascii_uint(length)

    def _drain(self) -> None:
        length = self._length()
        if length is not None and length <= _READ_CHUNK:  # larger: not worth reading, just close
            self.rfile.read(length)
        else:
            self.close_connection = True

    def _reserve(self) -> int:
        """Count this body against the in-flight budget before reading a byte of it."""
        size = self._length()
        if size is None:
            self.close_connection = True
            raise BadInput("Content-Length is required (a number of bytes)")
        if size > self.server.max_body:
            raise Refused(
                413, f"request body of {size} bytes exceeds {self.server.max_body}", "body_too_large"
            )
        if not self.server.budget.reserve(size):
            raise Refused(
                503,
                f"busy: {self.server.max_inflight_body} bytes of request bodies already in flight; retry",
                "inflight_bytes",
            )
        return size

    def _read_body(self, size: int) -> bytes:
        """Exactly `size` bytes, which must all arrive within the server's body timeout."""
        deadline = time.monotonic() + self.server.body_timeout
        chunks: list[bytes] = []
        got = 0
        try:
            while got < size:
                if time.monotonic() > deadline:
                    raise Refused(
                        408,
                        f"request body not received within {self.server.body_timeout:g} s",
                        "body_timeout",
                    )
                chunk = self.rfile.read1(min(_READ_CHUNK, size - got))
                if not chunk:
                    raise Refused(400, f"request body ended after {got} of {size} bytes", "body_short")
                chunks.append(chunk)
                got += len(chunk)
        except TimeoutError:
            raise Refused(
                408, f"request body stalled for {self.server.idle_timeout:g} s", "body_timeout"
            ) from None
        return b"".join(chunks)

    def _read_json(self) -> Any:
        size = self._length()
        assert size is not None  # _reserve checked it
        body = self._read_body(size)
        try:
            return orjson.loads(body)  # 3-4x faster than json on a 5,000-name NodeNames list
        except orjson.JSONDecodeError as e:
            raise BadInput(f"malformed JSON: {e}") from None


class ExtenderHTTPServer(ConnectionCap, ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256  # kube-scheduler calls in parallel; the default backlog of 5 resets them

    def __init__(self, address: tuple[str, int], extender: Extender, limits: Limits) -> None:
        self.extender = extender
        self.max_body = limits.max_body
        self.max_inflight_body = limits.max_inflight_body
        self.idle_timeout = limits.idle_timeout
        self.body_timeout = limits.body_timeout
        self.cap_connections(limits.max_connections)
        self.budget = Budget(limits.max_inflight_body)
        super().__init__(address, _Handler)

    @property
    def inflight_body_bytes(self) -> int:
        return self.budget.taken

    def refuse(self, request: Any) -> None:
        """A connection past `max_connections` gets a 503 from the accept loop."""
        self.extender.metrics.refused.labels(reason="connections").inc()
        try:
            request.settimeout(0.5)
            request.sendall(BUSY_RESPONSE)
        except OSError:
            pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        """socketserver prints a traceback to stderr; a client hanging up mid-answer is routine
        (debug), anything else one JSON error line."""
        err = sys.exc_info()[1]
        if isinstance(err, (ConnectionError, TimeoutError)):
            jsonlog.event(log, "client_gone", logging.DEBUG, reason=f"{type(err).__name__}: {err}")
        else:
            jsonlog.event(log, "connection_failed", logging.ERROR, reason=f"{type(err).__name__}: {err}")


class Server:
    """The HTTP server with an explicit lifecycle: start() serves on a thread, stop() ends it."""

    def __init__(
        self,
        extender: Extender,
        host: str = defaults.DEFAULT_HOST,
        port: int = defaults.DEFAULT_PORT,
        max_body: int = defaults.MAX_BODY_BYTES,
        limits: Limits | None = None,
    ) -> None:
        limits = limits or Limits()
        if max_body != defaults.MAX_BODY_BYTES:
            limits = replace(limits, max_body=max_body)
        self.httpd = ExtenderHTTPServer((host, port), extender, limits)
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.httpd.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}"

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="extender-http", daemon=True
        )
        self._thread.start()
        jsonlog.event(log, "listening", url=self.url)

    def stop(self) -> None:
        if self._thread is not None:  # shutdown() waits for serve_forever: only if it ran
            self.httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self.httpd.server_close()
