"""Prometheus metrics of the sidecar, on a registry of its own (no process-global state).

Per-node series are avoided on purpose: at 20,000 nodes a gauge with a `node` label is 20,000
series per scrape. Annotation age is therefore one gauge histogram (the distribution across
nodes now, computed at scrape time from the cluster snapshot, a dozen buckets whatever the
cluster size) plus the oldest age; docs/scheduler.md says how to read them.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import GaugeHistogramMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gputopo import __version__

_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
#: Annotation age buckets (s): the plugin re-publishes every few minutes; 900 s is the default
#: age after which the sidecar treats a node as unknown.
AGE_BUCKETS = (15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 21600.0, 86400.0)
#: Gang wait buckets (s): from the first member seen to the last member bound.
GANG_WAIT_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0)


class _AnnotationAges(Collector):
    """Scrape-time view of how old every node's decoded topology annotation is."""

    def __init__(self, times: Callable[[], Iterable[float]], now: Callable[[], float]) -> None:
        self._times = times
        self._now = now

    def collect(self) -> Iterator[Metric]:
        now = self._now()
        ages = sorted(max(0.0, now - t) for t in self._times())
        counts, k = [], 0
        for le in AGE_BUCKETS:
            while k < len(ages) and ages[k] <= le:
                k += 1
            counts.append((f"{le:g}", float(k)))
        counts.append(("+Inf", float(len(ages))))
        yield GaugeHistogramMetricFamily(
            "gputopo_node_annotation_age_seconds",
            "Age of each node's topology annotation now, as a distribution across nodes (no node label)",
            buckets=counts,
            gsum_value=float(sum(ages)),
        )
        oldest = GaugeMetricFamily(
            "gputopo_node_annotation_age_max_seconds",
            "Age of the oldest decoded topology annotation (0 when none)",
        )
        oldest.add_metric([], ages[-1] if ages else 0.0)
        yield oldest


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.build_info = Info(
            "gputopo_build", "gputopo version and Python of this sidecar", registry=self.registry
        )
        self.build_info.info({"version": __version__, "python": platform.python_version()})
        self.gang_wait = Histogram(
            "gputopo_gang_wait_seconds",
            "Time from a gang's first member seen to all of its members bound",
            registry=self.registry,
            buckets=GANG_WAIT_BUCKETS,
        )
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

    def track_annotation_ages(self, times: Callable[[], Iterable[float]], now: Callable[[], float]) -> None:
        """Export, at every scrape, the ages of the annotations whose generatedAt `times()` gives
        (live mode: KubeState.annotation_times, stale nodes included)."""
        self.registry.register(_AnnotationAges(times, now))
