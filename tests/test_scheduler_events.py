"""Kubernetes Events of gang decisions, over the API stand-in through the official client:
what `kubectl describe pod` (and describe of the PodGroup) shows, rate-limited, never blocking."""

from __future__ import annotations

import logging
import re
import threading
import time

from gputopo_kube.events import core_event, v1_event
from scheduler.extender import Extender
from scheduler.live.kube import KubeState
from scheduler.report.events import EventEmitter
from scheduler.web.server import Server
from tests import fake_apiserver as fk
from tests.test_scheduler_http import Client
from tests.test_scheduler_interop import TIER0, gang_pods, two_domains
from tests.test_scheduler_live import KEY, NOW, annotation, args, bind_body, wait_until

PG = {
    "apiVersion": "scheduling.k8s.io/v1alpha2",
    "kind": "PodGroup",
    "metadata": {"namespace": "ml", "name": "train", "uid": "pg-uid"},
    "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}},
}


class Setup:
    def __init__(self, api, state, ext, emitter, client, clock) -> None:
        self.api, self.state, self.ext, self.emitter, self.client, self.clock = (
            api,
            state,
            ext,
            emitter,
            client,
            clock,
        )

    def events(self, kind: str | None = None) -> list[tuple[str, str, str, str]]:
        assert self.emitter.flush()
        views = [fk.event_view(e) for e in self.api.events]
        return [
            (v["kind"], v["name"], v["reason"], v["message"])
            for v in views
            if kind is None or v["kind"] == kind
        ]


def run(pods, nodes=None, **emitter_kw):
    """Context: fake API with the Workload API served, a KubeState, an Extender with Events."""

    class _Ctx:
        def __enter__(self) -> Setup:
            self.cm = fk.running(fk.FakeAPI(serve=("k8s-podgroups",)))
            api, _, api_client = self.cm.__enter__()
            self.api = api
            for name, labels in nodes or two_domains(TIER0):
                api.put("nodes", fk.node(name, labels, annotations={KEY: annotation(name)}))
            api.put("k8s-podgroups", PG)
            for p in pods:
                api.put("pods", p)
            clock = [0.0]
            self.state = KubeState(api_client, clock=lambda: NOW, watch_timeout_s=5, backoff_s=(0.05, 0.2))
            self.emitter = EventEmitter(
                api_client,
                pod_uid=self.state.pod_uid,
                group_ref=self.state.group_ref,
                clock=lambda: clock[0],
                **emitter_kw,
            )
            self.state.guard.notify = self.emitter.node_topology  # as python -m scheduler wires it
            ext = Extender(self.state, clock=lambda: NOW, events=self.emitter)
            self.server = Server(ext, "127.0.0.1", 0)
            self.state.start()
            wait_until(self.state.ready)
            self.server.start()
            return Setup(api, self.state, ext, self.emitter, Client(self.server), clock)

        def __exit__(self, *exc) -> None:
            if self.api.event_gate is not None:
                self.api.event_gate.set()
            self.server.stop()
            self.emitter.stop()
            self.state.stop()
            self.cm.__exit__(*exc)

    return _Ctx()


NAMES = ["n0", "n1", "n2", "n3"]


def test_waiting_planned_replanned_and_refused_events_on_the_pod_and_the_podgroup() -> None:
    pods = gang_pods(2, spec={"schedulingGroup": {"podGroupName": "train"}})
    with run(pods[:1]) as s:
        s.client.post("/filter", args(pods[0], NAMES))
        s.client.post("/filter", args(pods[0], NAMES))  # same reason again: rate-limited
        waiting = [e for e in s.events() if e[2] == "GangWaiting"]
        assert waiting == [
            ("Pod", "w-0", "GangWaiting", "gang ml/podgroup:train waiting for members 1/2"),
            ("PodGroup", "train", "GangWaiting", "gang ml/podgroup:train waiting for members 1/2"),
        ]
        (pod_event,) = [e for e in s.api.events if e["regarding"]["kind"] == "Pod"]
        assert pod_event["apiVersion"] == "events.k8s.io/v1" and pod_event["action"] == "Scheduling"
        assert pod_event["regarding"]["uid"] == "uid-ml-w-0" and pod_event["type"] == "Normal"
        assert pod_event["reportingController"] == "gputopo-scheduler"
        # microseconds, so `kubectl gputopo why` orders it against kube-scheduler's own Events
        assert re.fullmatch(fk.MICRO_TIME, pod_event["eventTime"])
        group_event = next(e for e in s.api.events if e["regarding"]["kind"] == "PodGroup")
        assert group_event["regarding"] == {
            "apiVersion": "scheduling.k8s.io/v1alpha2",
            "kind": "PodGroup",
            "namespace": "ml",
            "name": "train",
            "uid": "pg-uid",
        }
        s.api.put("pods", pods[1])
        wait_until(lambda: "ml/w-1" in s.state.snapshot().pods)
        _, out = s.client.post("/filter", args(pods[0], NAMES))
        (first,) = out["NodeNames"]
        planned = [e for e in s.events("Pod") if e[2] == "GangPlanned"]
        assert len(planned) == 1 and f"level {TIER0}, domain" in planned[0][3] and first in planned[0][3]
        s.api.inject("bind", 500)
        s.client.post("/bind", bind_body("w-0", first))
        reasons = [e[2] for e in s.events()]
        assert "BindFailed" in reasons and "GangPlanDropped" in reasons
        _, out = s.client.post("/filter", args(pods[1], NAMES))
        replanned = [e for e in s.events() if e[2] == "GangReplanned"]
        assert replanned and "after the previous plan broke" in replanned[0][3]
        # a bind that does not match the plan is refused, with the reason on the pod
        (planned_node,) = out["NodeNames"]
        other = next(n for n in NAMES if n != planned_node)
        assert "filter it again" in s.client.post("/bind", bind_body("w-1", other))[1]["Error"]
        assert s.emitter.flush()
        refused = [fk.event_view(e) for e in s.api.events if e["reason"] == "BindRefused"]
        assert refused and refused[0]["type"] == "Warning"
        assert "filter it again" in refused[0]["message"]


def test_a_gang_that_does_not_fit_says_why() -> None:
    pods = [fk.pod("ml", f"w-{i}", 8) for i in range(5)]
    for p in pods:
        p["spec"]["schedulingGroup"] = {"podGroupName": "train"}
    pg = {**PG, "spec": {"schedulingPolicy": {"gang": {"minCount": 5}}}}
    with run(pods) as s:
        s.api.put("k8s-podgroups", pg)
        wait_until(lambda: s.state.snapshot().min_members.get("ml/podgroup:train") == 5)
        s.client.post("/filter", args(pods[0], NAMES))
        assert s.emitter.flush()
        (event,) = [
            v
            for v in map(fk.event_view, s.api.events)
            if v["reason"] == "GangUnschedulable" and v["kind"] == "Pod"
        ]
        assert event["type"] == "Warning" and "does not fit" in event["message"]


def test_rate_limit_is_per_reason_per_object_and_expires() -> None:
    pods = gang_pods(1, spec={"schedulingGroup": {"podGroupName": "train"}})
    with run(pods, interval_s=30.0) as s:
        for _ in range(5):
            s.client.post("/filter", args(pods[0], NAMES))
        assert len(s.events("Pod")) == 1 and s.emitter.suppressed >= 4
        s.clock[0] += 31
        s.client.post("/filter", args(pods[0], NAMES))
        assert len(s.events("Pod")) == 2, "after the interval the same reason is shown again"


def test_a_slow_event_api_never_blocks_a_verb_and_writes_are_bounded(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="gputopo.scheduler.events")
    pods = gang_pods(1, spec={"schedulingGroup": {"podGroupName": "train"}})
    with run(pods, timeout_s=0.3, queue_size=4) as s:
        s.api.event_gate = threading.Event()  # the API server never answers event writes
        for _ in range(20):
            s.clock[0] += 31
            status, _ = s.client.post("/filter", args(pods[0], NAMES))
            assert status == 200
        writes = [r for r in s.api.requests if r[0] == "event"]
        assert len(writes) < 20, "20 verbs answered while the event writer was stuck on the first writes"
        wait_until(lambda: any(r.getMessage() == "event_write_failed" for r in caplog.records), timeout=10)
        assert s.emitter.overflowed > 0, "a bounded queue drops the oldest"
        s.api.event_gate.set()
        s.api.event_gate = None
        s.clock[0] += 31
        s.client.post("/filter", args(pods[0], NAMES))
        wait_until(lambda: s.emitter.written > 0, timeout=10)


def test_a_scheduler_plugins_podgroup_gets_the_events_too() -> None:
    pods = [fk.pod("ml", "sp-0", 8, labels={"scheduling.x-k8s.io/pod-group": "legacy"})]
    with run(pods) as s:
        s.api.put(
            "podgroups",
            {
                "apiVersion": "scheduling.x-k8s.io/v1alpha1",
                "kind": "PodGroup",
                "metadata": {"namespace": "ml", "name": "legacy", "uid": "legacy-uid"},
                "spec": {"minMember": 2},
            },
        )
        wait_until(lambda: s.state.snapshot().min_members.get("ml/legacy") == 2)
        s.client.post("/filter", args(pods[0], NAMES))
        assert s.emitter.flush()
        (group_event,) = [e for e in s.api.events if e["regarding"]["kind"] == "PodGroup"]
        assert group_event["regarding"]["uid"] == "legacy-uid"
        assert group_event["regarding"]["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
        assert group_event["reason"] == "GangWaiting"


def test_an_event_whose_connection_dropped_is_written_on_a_retry_and_an_http_error_is_not() -> None:
    """A connection lost before any answer (API server restart, proxy closing it) is retried,
    as client-go's broadcaster retries its sink; an HTTP error is the server's answer and is
    not (one event per reason per interval: retrying a 4xx/5xx would only repeat it)."""
    pods = gang_pods(2, spec={"schedulingGroup": {"podGroupName": "train"}})
    with run(pods[:1]) as s:
        s.api.inject("event", fk.DROP)
        s.client.post("/filter", args(pods[0], NAMES))
        waiting = [e for e in s.events() if e[2] == "GangWaiting"]
        assert [e[0] for e in waiting] == ["Pod", "PodGroup"]
        assert s.emitter.failed == 0
        writes = [r for r in s.api.requests if r[0] == "event"]
        assert len(writes) == 3  # the dropped one, its retry, the PodGroup's
        s.api.inject("event", 500)
        s.clock[0] += 31
        s.client.post("/filter", args(pods[0], NAMES))
        assert [e[0] for e in s.events() if e[2] == "GangWaiting"] == ["Pod", "PodGroup", "PodGroup"]
        assert s.emitter.failed == 1


def test_core_v1_events_where_the_events_api_is_refused_and_the_api_message_is_logged(caplog) -> None:
    """An API server (or RBAC) without events.k8s.io/v1: one warning, then core/v1 Events for
    good; a refused write logs the API server's own message, not just the status."""
    caplog.set_level(logging.WARNING, logger="gputopo")
    pods = gang_pods(2, spec={"schedulingGroup": {"podGroupName": "train"}})
    with run(pods[:1]) as s:
        s.api.events_v1 = False
        s.client.post("/filter", args(pods[0], NAMES))
        assert [e[:3] for e in s.events()] == [
            ("Pod", "w-0", "GangWaiting"),
            ("PodGroup", "train", "GangWaiting"),
        ]
        assert {e["apiVersion"] for e in s.api.events} == {"v1"}
        assert all(e["involvedObject"]["namespace"] == "ml" for e in s.api.events)
        refusals = [r for r in caplog.records if r.getMessage() == "events_api_refused"]
        assert len(refusals) == 1, "said once, not per event"
        assert "could not find the requested resource" in refusals[0].fields["reason"]
        s.api.inject("event", 403)
        s.clock[0] += 31
        s.client.post("/filter", args(pods[0], NAMES))
        assert s.emitter.flush()
        failed = [r for r in caplog.records if r.getMessage() == "event_write_failed"]
        assert failed and "injected failure creating an event" in failed[-1].fields["reason"]


def test_a_refused_annotation_is_an_event_on_its_node_once_per_change() -> None:
    """The sidecar's reason for ignoring a node's annotation is where operators look (kubectl
    describe node, kubectl gputopo nodes): one Warning when it starts, none per re-publication
    of the same refusal, one Normal when the node's annotation is used again. A node without
    any annotation gets none (the plugin says why on its Node)."""
    nodes = [("n0", {}), ("n1", {})]
    with run([], nodes=nodes) as s:
        node = fk.node("n1", {}, annotations={KEY: '{"not": "an annotation"'})
        s.api.put("nodes", node)
        wait_until(lambda: any(e[0] == "Node" for e in s.events()))
        for i in range(3):  # the node changes (labels, status), the refusal does not: no new Event
            node["metadata"]["labels"]["round"] = str(i)
            s.api.put("nodes", node)
        s.api.put("nodes", fk.node("n2", {}))  # no annotation at all: not the sidecar's to report
        s.api.put("nodes", fk.node("n1", {}, annotations={KEY: annotation("n1")}))
        wait_until(lambda: len([e for e in s.events() if e[0] == "Node"]) >= 2)
        time.sleep(0.3)
        node_events = [e for e in s.events() if e[0] == "Node"]
        assert [(e[1], e[2]) for e in node_events] == [("n1", "TopologyRejected"), ("n1", "TopologyAccepted")]
        assert "not JSON" in node_events[0][3] and "counted from allocatable" in node_events[0][3]
        (warning,) = [e for e in s.api.events if e["reason"] == "TopologyRejected"]
        assert warning["type"] == "Warning" and warning["metadata"]["namespace"] == "default"
        assert warning["regarding"] == {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "n1"}


def test_events_carry_a_valid_name_of_their_own_not_a_generate_name() -> None:
    """The real kube-apiserver 1.37 refused `generateName: "<node>."` (it validates the prefix
    as a subdomain, which may not end in a dot), so every Event was lost there. Events are named
    as client-go names them: the object's name, the time in hex, and a checksum that keeps two
    Events about one object at one instant apart; the name is a valid RFC 1123 subdomain."""
    subdomain = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    ref = {"apiVersion": "v1", "kind": "Node", "namespace": "", "name": "dgx1-a", "uid": "u"}
    kw = {"type_": "Normal", "controller": "gputopo.io/scheduler", "instance": "i", "at": 1765000000.25}
    a = v1_event(ref, reason="Planned", note="gang g", action="Plan", **kw)
    b = v1_event(ref, reason="Replanned", note="gang g", action="Plan", **kw)
    c = core_event(ref, reason="Planned", note="gang g", **kw)
    for ev in (a, b, c):
        assert "generateName" not in ev["metadata"]
        name = ev["metadata"]["name"]
        assert subdomain.match(name) and len(name) <= 253, name
        assert name.startswith("dgx1-a.")
    assert a["metadata"]["name"] != b["metadata"]["name"]
