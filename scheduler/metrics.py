"""Prometheus metrics of the sidecar, on a registry of its own (no process-global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.latency = Histogram(
            "gputopo_extender_request_seconds",
            "Extender request latency by verb",
            ["verb"],
            registry=self.registry,
            buckets=_BUCKETS,
        )
        self.requests = Counter(
            "gputopo_extender_requests",
            "Extender requests by verb and HTTP status",
            ["verb", "code"],
            registry=self.registry,
        )
        self.plans = Counter(
            "gputopo_gang_plans",
            "Gang plans by result (planned, failed, dropped)",
            ["result"],
            registry=self.registry,
        )
        self.reservations = Gauge(
            "gputopo_reservations_active", "Gang member reservations currently held", registry=self.registry
        )
        self.binds = Counter("gputopo_binds", "Binds by result", ["result"], registry=self.registry)
        # One bad node costs only itself: each rejection is counted by the step that refused it.
        self.node_rejections = Counter(
            "gputopo_node_topology_rejected",
            "Nodes whose topology was refused, by step (annotation, allocatable, node, view), once per node and reason",
            ["stage"],
            registry=self.registry,
        )
        self.predictions = Counter(
            "gputopo_gpu_predictions",
            "Binds whose predicted GPUs were compared with what the node's plugin reported, by result",
            ["result"],
            registry=self.registry,
        )
        self.broken_reservations = Counter(
            "gputopo_reservations_broken",
            "Reservations broken because their GPUs were no longer free on the node",
            registry=self.registry,
        )
        self.refused = Counter(
            "gputopo_extender_refused",
            "Connections and requests refused by the server's own limits, by reason",
            ["reason"],
            registry=self.registry,
        )
