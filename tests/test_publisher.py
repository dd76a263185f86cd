"""The Node publisher: content, change-only and rate-limited patches, retries, and the real client."""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from deviceplugin.publish.podresources import PodResourcesError
from deviceplugin.publish.publisher import Publisher, PublisherError, node_name_from_env
from deviceplugin.state import make_snapshot
from gputopo.network.annotation import decode
from gputopo.node.topofile import load_preset
from tests import fake_apiserver as fk

KEY = "gputopo.io/topology"
TOPO = load_preset("dgx-a100")
UUIDS = [g.uuid for g in TOPO.gpus]


class RecordingAPI:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.errors: list[Exception] = []

    def patch_node(self, name: str, body: Any, **kwargs: Any) -> Any:
        if self.errors:
            raise self.errors.pop(0)
        self.bodies.append(body)
        return {}

    def last(self, now: float = 2_000_000_000.0):
        return decode(self.bodies[-1]["metadata"]["annotations"][KEY], now=now, max_age_s=1e9)


def snapshot(version: int = 1, unhealthy: tuple[int, ...] = ()):
    health = {u: i not in unhealthy for i, u in enumerate(UUIDS)}
    return make_snapshot(version, TOPO, health)


def publisher(api: Any, in_use: list, **kw: Any) -> Publisher:
    def read() -> frozenset[str]:
        value = in_use[0]
        if isinstance(value, Exception):
            raise value
        return frozenset(value)

    return Publisher(
        "node-a",
        api,
        read,
        min_interval_s=10,
        resync_s=30,
        heartbeat_s=300,
        backoff_s=(1, 8),
        wall=lambda: 1_900_000_000.0,
        **kw,
    )


def test_publishes_topology_health_and_gpus_in_use() -> None:
    api = RecordingAPI()
    in_use = [{UUIDS[2], UUIDS[3] + "::1"}]
    pub = publisher(api, in_use)
    assert pub.sync(0.0) == 30, "nothing to publish before the first snapshot"
    pub.update(snapshot(unhealthy=(7,)))
    pub.sync(0.0)
    got = api.last()
    assert got.node == "node-a" and got.allocated == {2, 3} and got.unhealthy == {7}
    assert got.free == {0, 1, 4, 5, 6}
    assert (got.topology.bandwidth_mbps == TOPO.bandwidth_mbps).all()
    assert got.generated_at == 1_900_000_000.0


def test_patches_only_on_change_and_at_most_once_per_interval() -> None:
    api = RecordingAPI()
    in_use = [set()]
    pub = publisher(api, in_use)
    pub.update(snapshot())
    pub.sync(0.0)
    assert len(api.bodies) == 1
    pub.sync(5.0)
    pub.sync(40.0)
    assert len(api.bodies) == 1, "unchanged content is not patched again"
    in_use[0] = {UUIDS[0]}
    pub.update(snapshot(2))
    assert pub.sync(41.0) == 30, "a change after the interval is published at once"
    assert len(api.bodies) == 2
    in_use[0] = {UUIDS[0], UUIDS[1]}
    assert pub.sync(42.0) == pytest.approx(9.0), "too soon: wait for the rest of the interval"
    in_use[0] = {UUIDS[0], UUIDS[1], UUIDS[5]}
    pub.update(snapshot(3, unhealthy=(6,)))
    pub.sync(45.0)
    assert len(api.bodies) == 2
    pub.sync(51.0)
    assert len(api.bodies) == 3, "the changes in between were coalesced into one patch"
    assert api.last().allocated == {0, 1, 5} and api.last().unhealthy == {6}


def test_heartbeat_keeps_the_annotation_fresh() -> None:
    api = RecordingAPI()
    pub = publisher(api, [set()])
    pub.update(snapshot())
    pub.sync(0.0)
    pub.sync(299.0)
    assert len(api.bodies) == 1
    pub.sync(300.0)
    assert len(api.bodies) == 2


def test_api_errors_are_retried_with_back_off_never_raised() -> None:
    api = RecordingAPI()
    api.errors = [
        ApiException(status=500, reason="boom"),
        ApiException(status=429, reason="slow down"),
        ConnectionError("reset"),
    ]
    pub = publisher(api, [set()])
    pub.update(snapshot())
    assert pub.sync(0.0) == 1
    assert pub.sync(0.5) == pytest.approx(0.5), "waits out the back-off"
    assert pub.sync(1.0) == 2
    assert pub.sync(3.0) == 4
    pub.sync(7.0)
    assert len(api.bodies) == 1 and pub.failures == 3


def test_podresources_errors_hold_publication_until_in_use_is_known() -> None:
    api = RecordingAPI()
    in_use: list = [PodResourcesError("kubelet down")]
    pub = publisher(api, in_use)
    pub.update(snapshot())
    pub.sync(0.0)
    assert api.bodies == [], "never publish 'nothing in use' without having asked kubelet"
    in_use[0] = {UUIDS[4]}
    pub.sync(1.0)
    assert api.last().allocated == {4}
    in_use[0] = PodResourcesError("kubelet restarting")
    pub.update(snapshot(2, unhealthy=(1,)))
    pub.sync(20.0)
    assert api.last().allocated == {4} and api.last().unhealthy == {1}, "last known in-use set kept"


def test_node_name_comes_from_the_downward_api() -> None:
    assert node_name_from_env({"NODE_NAME": "gpu-7"}) == "gpu-7"
    with pytest.raises(PublisherError, match="NODE_NAME"):
        node_name_from_env({})


def test_thread_patches_the_node_through_the_official_client_and_survives_errors() -> None:
    with fk.running() as (api, _, api_client):
        api.put("nodes", fk.node("node-a"))
        api.inject("patch", 500)
        in_use = [{UUIDS[1]}]
        pub = Publisher(
            "node-a",
            client.CoreV1Api(api_client),
            lambda: frozenset(in_use[0]),
            min_interval_s=0.05,
            resync_s=0.05,
            backoff_s=(0.05, 0.2),
        )
        pub.update(snapshot())
        pub.start()
        try:
            deadline = time.monotonic() + 10
            while not api.patches and time.monotonic() < deadline:
                time.sleep(0.02)
            text = api.objects["nodes"]["node-a"]["metadata"]["annotations"][KEY]
            assert decode(text, now=time.time(), max_age_s=60).allocated == {1}
            assert pub.failures >= 1, "the injected 500 was retried"
            # a plugin restart: a new publisher learns the GPUs in use from kubelet, not from memory
            pub.stop()
            in_use[0] = {UUIDS[1], UUIDS[6]}
            pub = Publisher(
                "node-a",
                client.CoreV1Api(api_client),
                lambda: frozenset(in_use[0]),
                min_interval_s=0.05,
                resync_s=0.05,
            )
            pub.update(snapshot())
            pub.start()
            deadline = time.monotonic() + 10
            while len(api.patches) < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            text = api.objects["nodes"]["node-a"]["metadata"]["annotations"][KEY]
            assert decode(text, now=time.time(), max_age_s=60).allocated == {1, 6}
            assert set(api.objects["nodes"]["node-a"]["metadata"]["annotations"]) == {KEY}
        finally:
            pub.stop()


def test_a_poke_looks_again_once_kubelet_has_recorded_the_allocation() -> None:
    """kubelet records a container's devices (what PodResources serves) only after Allocate has
    returned, so the look a poke triggers at once is usually too early: the publisher must look
    again shortly after, not leave the new allocation unpublished until the 30 s resync."""
    api = RecordingAPI()
    in_use: list = [set()]
    pub = publisher(api, in_use)
    pub.update(snapshot())
    pub.sync(0.0)
    assert api.last().allocated == set()
    pub.poke()  # inside Allocate: kubelet has not recorded GPU 3 yet
    delay = pub.sync(20.0)
    assert len(api.bodies) == 1
    assert delay <= 2.0, "a poke must bring a second look within seconds"
    in_use[0] = {UUIDS[3]}  # Allocate returned; kubelet recorded it
    pub.sync(20.0 + delay)
    assert len(api.bodies) == 2 and api.last().allocated == {3}
    assert pub.sync(21.0 + delay) > 2.0, "after the second look, back to the resync period"


def test_no_heartbeat_while_podresources_is_down() -> None:
    """A heartbeat says 'this is current'. While kubelet's PodResources cannot be read, the GPUs
    in use are not known to be current, so the annotation must be left to go stale (the sidecar
    then falls back to counting) instead of re-stamping the last known set as fresh."""
    api = RecordingAPI()
    in_use: list = [{UUIDS[1]}]
    pub = publisher(api, in_use)
    pub.update(snapshot())
    pub.sync(0.0)
    assert len(api.bodies) == 1
    in_use[0] = PodResourcesError("kubelet down")
    for t in (300.0, 600.0, 1200.0):
        pub.sync(t)
    assert len(api.bodies) == 1, "no heartbeat on an in-use set kubelet could not confirm"
    in_use[0] = {UUIDS[1]}
    pub.sync(1201.0)
    assert len(api.bodies) == 2 and api.last().allocated == {1}, "heartbeat again once confirmed"


def test_an_api_server_that_never_answers_costs_one_timeout_not_the_publisher() -> None:
    """The official client waits forever by default; a black-holed API server must not freeze
    publication (and the plugin's shutdown) for good."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # connections are accepted by the kernel and never answered
    try:
        cfg = client.Configuration()
        cfg.host = f"http://127.0.0.1:{listener.getsockname()[1]}"
        pub = Publisher(
            "node-a",
            client.CoreV1Api(client.ApiClient(cfg)),
            lambda: frozenset(),
            request_timeout_s=0.5,
        )
        pub.update(snapshot())
        done = threading.Event()
        threading.Thread(target=lambda: (pub.sync(0.0), done.set()), daemon=True).start()
        assert done.wait(5), "patch_node is still waiting on a silent API server"
        assert pub.failures == 1 and pub.patches == 0
    finally:
        listener.close()


def test_publishes_the_pod_map_when_the_reader_gives_pods() -> None:
    api = RecordingAPI()
    reads = [{"ml/a": frozenset({UUIDS[2], UUIDS[3] + "::1"}), "ml/b": frozenset({UUIDS[5]})}]
    pub = Publisher("node-a", api, lambda: reads[0], min_interval_s=1, wall=lambda: 1_900_000_000.0)
    pub.update(snapshot())
    pub.sync(0.0)
    value = api.last()
    assert value.allocated == {2, 3, 5}
    assert value.pods == {"ml/a": {2, 3}, "ml/b": {5}}
    reads[0] = {"ml/b": frozenset({UUIDS[5]})}  # pod a ended
    pub.sync(5.0)
    assert api.last().pods == {"ml/b": {5}} and api.last().allocated == {5}


def test_a_plain_set_reader_publishes_no_pod_map() -> None:
    api = RecordingAPI()
    pub = publisher(api, [{UUIDS[1]}])
    pub.update(snapshot())
    pub.sync(0.0)
    assert api.last().pods is None and api.last().allocated == {1}


FORBIDDEN = "injected failure patching node-a"  # the stand-in's Status message for the 403


def test_a_refused_patch_logs_the_api_servers_message_and_says_why_on_the_node(caplog) -> None:
    """Through the real client and the API stand-in: a 403 logs the Status body's message (what
    RBAC or the admission policy said), not `Forbidden`; the Node gets one Warning Event per
    cause (not per retry), in events.k8s.io/v1 with a microsecond time, and one Normal Event
    once publishing works again."""
    from gputopo_kube.events import EventWriter

    caplog.set_level(logging.WARNING, logger="deviceplugin.publisher")
    with fk.running() as (api, _, api_client):
        api.put("nodes", fk.node("node-a"))
        core = client.CoreV1Api(api_client)
        events = EventWriter(api_client, controller="gputopo-device-plugin")
        in_use: list = [
            PodResourcesError("PodResources unreachable at /var/lib/kubelet/pod-resources/kubelet.sock")
        ]
        pub = publisher(core, in_use, events=events)
        pub.update(snapshot())
        pub.sync(0.0)
        pub.sync(1.0)  # the same cause again: no second Event
        in_use[0] = {UUIDS[0]}
        api.inject("patch", 403, 403)  # answered with a Status whose message says why
        pub.sync(3.0)
        pub.sync(10.0)  # still refused: same cause, no new Event
        pub.sync(30.0)
        assert api.patches, "published once the API server lets it"
        logged = [r.fields for r in caplog.records if r.getMessage() == "publish_failed"]
        assert logged and logged[0]["status"] == 403 and logged[0]["reason"] == FORBIDDEN
        views = [fk.event_view(e) for e in api.events]
        assert [(v["kind"], v["name"], v["type"], v["reason"]) for v in views] == [
            ("Node", "node-a", "Warning", "TopologyNotPublished"),
            ("Node", "node-a", "Warning", "TopologyNotPublished"),
            ("Node", "node-a", "Normal", "TopologyPublished"),
        ]
        assert "PodResources unreachable" in views[0]["message"]
        assert "HTTP 403" in views[1]["message"] and FORBIDDEN in views[1]["message"]
        assert all(v["api"] == "events.k8s.io/v1" and v["namespace"] == "default" for v in views)
        assert all(v["from"] == "gputopo-device-plugin" and v["uid"] == "node-a" for v in views)
        assert all(re.fullmatch(fk.MICRO_TIME, e["eventTime"]) for e in api.events)


def test_node_events_that_cannot_be_written_never_stop_publishing() -> None:
    class Broken:
        calls = 0

        def create(self, *a: Any, **k: Any) -> None:
            Broken.calls += 1
            raise ConnectionError("API server down")

    api = RecordingAPI()
    in_use: list = [PodResourcesError("kubelet down")]
    pub = publisher(api, in_use, events=Broken())
    pub.update(snapshot())
    pub.sync(0.0)
    in_use[0] = {UUIDS[1]}
    pub.sync(5.0)
    assert api.last().allocated == {1} and Broken.calls == 2
