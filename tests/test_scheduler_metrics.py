"""The sidecar's operator metrics on its real /metrics endpoint in live mode (API stand-in <-
official client <- KubeState): build info, annotation age across nodes without a node label,
and the gang wait histogram."""

from __future__ import annotations

import platform

from prometheus_client.parser import text_string_to_metric_families

from gputopo import __version__
from scheduler.extender import Extender
from scheduler.live.kube import KubeState
from scheduler.report.metrics import AGE_BUCKETS, Metrics
from scheduler.web.server import Server
from tests import fake_apiserver as fk
from tests.test_scheduler_http import Client
from tests.test_scheduler_live import KEY, LEAF, NOW, annotation, args, bind_body, wait_until


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


def test_gang_wait_is_observed_once_from_first_filter_to_last_bind_over_http() -> None:
    """A 3-member gang (minMember 3): the first member is filtered at t0 and waits for quorum,
    the other two arrive 30 s later, binds follow 60 s and 90 s after t0. The histogram gets one
    sample, 90 s (first filter to last bind): nothing while members remain unbound."""
    with fk.running() as (api, _, api_client):
        clock = [NOW]
        for i, leaf in enumerate(["l1", "l1", "l1", "l2"]):
            api.put("nodes", fk.node(f"n{i}", {LEAF: leaf}, annotations={KEY: annotation(f"n{i}")}))
        api.put("podgroups", fk.podgroup("ml", "g", 3))
        pods = fk.gang_pods("ml", "g", 3)
        api.put("pods", pods[0])
        state = KubeState(api_client, clock=lambda: clock[0], watch_timeout_s=5, backoff_s=(0.05, 0.2))
        metrics = Metrics()
        ext = Extender(state, clock=lambda: clock[0], metrics=metrics)
        server = Server(ext, "127.0.0.1", 0)
        state.start()
        try:
            wait_until(state.ready)
            server.start()
            client = Client(server)
            names = [f"n{i}" for i in range(4)]
            _, out = client.post("/filter", args(pods[0], names))
            assert out["NodeNames"] == [], "waits for quorum"
            clock[0] += 30
            for p in pods[1:]:
                api.put("pods", p)
            wait_until(lambda: len(state.snapshot().pods) == 3)
            planned = {}
            for p in pods:
                _, out = client.post("/filter", args(p, names))
                (planned[p["metadata"]["name"]],) = out["NodeNames"]
            for k, name in enumerate(sorted(planned)):
                clock[0] = NOW + 60 + 15 * k  # binds at +60, +75, +90 s
                assert client.post("/bind", bind_body(name, planned[name])) == (200, {"Error": ""})
                m = samples(client)
                if k < 2:
                    assert m[("gputopo_gang_wait_seconds_count", ())] == 0, "members remain unbound"
            assert m[("gputopo_gang_wait_seconds_count", ())] == 1
            assert m[("gputopo_gang_wait_seconds_sum", ())] == 90.0
            assert m[("gputopo_gang_wait_seconds_bucket", (("le", "60.0"),))] == 0
            assert m[("gputopo_gang_wait_seconds_bucket", (("le", "300.0"),))] == 1
            assert ext.gangs.first_seen("ml/g") is None, "forgotten once bound"
        finally:
            server.stop()
            state.stop()
