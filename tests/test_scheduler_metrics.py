"""The sidecar's operator metrics on its real /metrics endpoint in live mode (API stand-in <-
official client <- KubeState): build info, annotation age across nodes without a node label,
and the gang wait histogram."""

from __future__ import annotations

import platform

from prometheus_client.parser import text_string_to_metric_families

from gputopo import __version__
from scheduler.extender import Extender
from scheduler.kube import KubeState
from scheduler.metrics import AGE_BUCKETS, Metrics
from scheduler.server import Server
from tests import fake_apiserver as fk
from tests.test_scheduler_http import Client
from tests.test_scheduler_live import KEY, NOW, annotation, wait_until


def samples(client: Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, _, body = client.raw("GET", "/metrics")
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def test_build_info_annotation_ages_and_gang_wait_on_metrics() -> None:
    with fk.running() as (api, _, api_client):
        clock = [NOW]
        ages = {"fresh": 10.0, "recent": 100.0, "stale": 2 * 86400.0}
        for name, age in ages.items():
            api.put("nodes", fk.node(name, annotations={KEY: annotation(name, at=NOW - age)}))
        api.put("nodes", fk.node("corrupt", annotations={KEY: "{"}))  # no age to tell: not counted
        api.put("nodes", fk.node("bare"))
        state = KubeState(api_client, clock=lambda: clock[0], watch_timeout_s=5, backoff_s=(0.05, 0.2))
        metrics = Metrics()
        metrics.track_annotation_ages(state.annotation_times, lambda: clock[0])
        ext = Extender(state, clock=lambda: clock[0], metrics=metrics)
        server = Server(ext, "127.0.0.1", 0)
        state.start()
        try:
            wait_until(state.ready)
            server.start()
            client = Client(server)
            pod = fk.pod("ml", "p", 2)
            assert client.post("/filter", {"Pod": pod, "Nodes": None, "NodeNames": list(ages)})[0] == 200
            m = samples(client)
            info = ("gputopo_build_info", (("python", platform.python_version()), ("version", __version__)))
            assert m[info] == 1.0
            bucket = {
                le: m[("gputopo_node_annotation_age_seconds_bucket", (("le", f"{le:g}"),))]
                for le in AGE_BUCKETS
            }
            assert bucket[15.0] == 1 and bucket[60.0] == 1 and bucket[120.0] == 2 and bucket[86400.0] == 2
            assert m[("gputopo_node_annotation_age_seconds_bucket", (("le", "+Inf"),))] == 3
            assert m[("gputopo_node_annotation_age_seconds_gcount", ())] == 3
            assert m[("gputopo_node_annotation_age_seconds_gsum", ())] == sum(ages.values())
            assert m[("gputopo_node_annotation_age_max_seconds", ())] == 2 * 86400.0
            assert not any("node" in dict(labels) for _, labels in m), "no per-node series"
            clock[0] += 60  # ages are read at scrape time
            assert (
                samples(client)[("gputopo_node_annotation_age_seconds_gsum", ())] == sum(ages.values()) + 180
            )
            # gang wait: declared for the gang lifecycle to observe (one sample here, directly)
            assert m[("gputopo_gang_wait_seconds_count", ())] == 0
            metrics.gang_wait.observe(42.0)
            after = samples(client)
            assert after[("gputopo_gang_wait_seconds_count", ())] == 1
            assert after[("gputopo_gang_wait_seconds_bucket", (("le", "60.0"),))] == 1
            assert after[("gputopo_gang_wait_seconds_bucket", (("le", "30.0"),))] == 0
        finally:
            server.stop()
            state.stop()
