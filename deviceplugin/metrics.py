"""Prometheus metrics of the plugin, in a registry of its own.

A private CollectorRegistry (not prometheus_client's global one) lets tests build as many
daemons as they like in one process and read exact values, and keeps library metrics of
other code out of the plugin's endpoint.
"""

from __future__ import annotations

import logging
import platform
import threading
from collections.abc import Iterable
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, start_http_server

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


class Metrics:
    """All series the plugin exports; `serve(port)` exposes them over HTTP."""

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

    def serve(self, port: int, addr: str = "0.0.0.0") -> bool:
        """Expose /metrics; a port in use is logged, not fatal: devices matter more than metrics."""
        if port == 0:
            return False
        try:
            self._server, self._thread = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as e:
            jsonlog.event(
                log,
                "metrics_unavailable",
                logging.ERROR,
                port=port,
                reason=f"cannot listen: {e.strerror or e}; serving devices without metrics",
            )
            return False
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
