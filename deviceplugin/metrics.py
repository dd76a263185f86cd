"""Prometheus metrics of the plugin, in a registry of its own, and its health on the same port.

A private CollectorRegistry (not prometheus_client's global one) lets tests build as many
daemons as they like in one process and read exact values, and keeps library metrics of
other code out of the plugin's endpoint.

The metrics port also answers GET /healthz and /readyz, for kubelet's httpGet probes: an
exec probe starts a process (Python, twice for readiness) on every GPU node each period,
against a 50m CPU request; an HTTP answer from the running daemon costs next to nothing.
Each path asks a check the daemon sets (`set_check`): 200 with {"ok": true} while it holds,
503 with {"ok": false, "reason": ...} otherwise, and 503 before the daemon set one.
"""

from __future__ import annotations

import json
import logging
import platform
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, make_wsgi_app

from gputopo import __version__, jsonlog
from gputopo.node.allocator import Allocator

log = logging.getLogger("deviceplugin.metrics")

# GetPreferredAllocation is expected in well under 2 ms on 8 GPUs and up to ~20 ms on 16.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 2.0)
# One-direction ring GB/s of real layouts: SYS 6 ... PIX 24, NV1 25, NV2 50, NV4 100, NV6 150,
# NV12 300, NV18 450 (H100) and 900 (NVLink 5).
RING_GBPS_BUCKETS = (6.0, 12.0, 16.0, 20.0, 24.0, 25.0, 50.0, 100.0, 150.0, 200.0, 300.0, 450.0, 600.0, 900.0)
# A ring as a share of the best any set of that size reaches on the empty node (1 = the best).
RING_SHARE_BUCKETS = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0)


#: A health check: None while healthy, else the reason it is not (shown in the probe's body).
HealthCheck = Callable[[], "str | None"]
#: The paths kubelet's probes ask (liveness, readiness).
HEALTH_PATHS = ("/healthz", "/readyz")


class _Server(ThreadingMixIn, WSGIServer):
    """One thread per request, so a slow scrape never holds up a probe."""

    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    """No access log line per scrape or probe on stderr."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Metrics:
    """All series the plugin exports; `serve(port)` exposes them and /healthz, /readyz over HTTP."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.build_info = Info(
            "gputopo_build",
            "gputopo version, Python and topology backend of this plugin",
            registry=self.registry,
        )
        self.set_build(backend="")
        self.gpu_healthy = Gauge(
            "gputopo_gpu_healthy",
            "1 while the GPU is advertised Healthy to kubelet, 0 while Unhealthy (at most 16 per node).",
            ["gpu", "uuid"],
            registry=self.registry,
        )
        self.ring_gbps = Histogram(
            "gputopo_allocation_ring_gbps",
            "Ring bandwidth (GB/s, one direction) of each multi-GPU set answered, by RPC.",
            ["rpc"],
            buckets=RING_GBPS_BUCKETS,
            registry=self.registry,
        )
        self.ring_share = Histogram(
            "gputopo_allocation_ring_share",
            "Ring bandwidth of each multi-GPU set answered as a share of the node's best for that size, by RPC.",
            ["rpc"],
            buckets=RING_SHARE_BUCKETS,
            registry=self.registry,
        )
        self.preferred_seconds = Histogram(
            "gputopo_preferred_allocation_seconds",
            "Time to answer one GetPreferredAllocation container request (validation + allocator).",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.allocations = Counter(
            "gputopo_allocations",
            "Container requests answered, by RPC and result (ok or invalid).",
            ["rpc", "result"],
            registry=self.registry,
        )
        self.health_transitions = Counter(
            "gputopo_health_transitions",
            "GPU health changes, by the new state (healthy or unhealthy).",
            ["to"],
            registry=self.registry,
        )
        self.registrations = Counter(
            "gputopo_registrations",
            "Register calls to kubelet, by result (ok or error).",
            ["result"],
            registry=self.registry,
        )
        self.devices = Gauge(
            "gputopo_devices",
            "GPUs advertised to kubelet, by health.",
            ["health"],
            registry=self.registry,
        )
        self._health_lock = threading.Lock()
        self._health_labels: set[tuple[str, str]] = set()
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._checks: dict[str, HealthCheck] = {}

    def set_build(self, backend: str) -> None:
        self.build_info.info(
            {"version": __version__, "python": platform.python_version(), "backend": backend}
        )

    def observe_ring(self, rpc: str, allocator: Allocator, indices: Iterable[int]) -> None:
        """The ring a set of GPUs got, and its share of the best an empty node offers for that
        size; one GPU has no ring and is not observed."""
        chosen = list(indices)
        if len(chosen) < 2:
            return
        ring = allocator.ring_mbps(chosen)
        best = allocator.best_ring_mbps(len(chosen))
        self.ring_gbps.labels(rpc).observe(ring / 1000)
        self.ring_share.labels(rpc).observe(ring / best if best > 0 else 0.0)

    def export_health(self, gpus: Iterable[tuple[int, str, bool]]) -> None:
        """Per-GPU health from (index, uuid, healthy); GPUs gone from the topology disappear
        (removed one by one, so a scrape never sees the set empty in between)."""
        with self._health_lock:
            now: set[tuple[str, str]] = set()
            for index, uuid, healthy in gpus:
                key = (str(index), uuid)
                now.add(key)
                self.gpu_healthy.labels(*key).set(1 if healthy else 0)
            for key in self._health_labels - now:
                self.gpu_healthy.remove(*key)
            self._health_labels = now

    def set_check(self, path: str, check: HealthCheck) -> None:
        """What GET `path` (/healthz or /readyz) answers from now on."""
        if path not in HEALTH_PATHS:
            raise ValueError(f"health path {path!r} is not one of {HEALTH_PATHS}")
        self._checks[path] = check

    def health(self, path: str) -> str | None:
        """The check's answer: None when healthy, else why not. A check that raises is unhealthy
        with the exception as the reason, never an error out of the HTTP server."""
        check = self._checks.get(path)
        if check is None:
            return "starting: the daemon has not set this check yet"
        try:
            return check()
        except Exception as e:  # any failure of a check is an unhealthy answer
            return f"check failed: {type(e).__name__}: {e}"

    def _app(self) -> Callable[..., Iterable[bytes]]:
        metrics_app = make_wsgi_app(self.registry)

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "")
            if path not in HEALTH_PATHS:
                return metrics_app(environ, start_response)
            reason = self.health(path)
            body = json.dumps({"ok": reason is None} | ({} if reason is None else {"reason": reason}))
            status = "200 OK" if reason is None else "503 Service Unavailable"
            start_response(status, [("Content-Type", "application/json"), ("Cache-Control", "no-store")])
            return [body.encode() + b"\n"]

        return app

    def serve(self, port: int, addr: str = "0.0.0.0") -> bool:
        """Expose /metrics, /healthz and /readyz; a port in use is logged, not fatal: devices
        matter more than metrics (the probes then fail and say so)."""
        if port == 0:
            return False
        try:
            server = make_server(addr, port, self._app(), _Server, handler_class=_QuietHandler)
        except OSError as e:
            jsonlog.event(
                log,
                "metrics_unavailable",
                logging.ERROR,
                port=port,
                reason=f"cannot listen: {e.strerror or e}; serving devices without metrics",
            )
            return False
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
        self._thread.start()
        jsonlog.event(log, "metrics_serving", port=port, reason="metrics port configured")
        return True

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
