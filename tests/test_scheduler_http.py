"""The extender over real HTTP, with bodies shaped as kube-scheduler sends them (both modes)."""

from __future__ import annotations

import http.client
import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gputopo.network.cluster import parse_cluster
from scheduler import defaults
from scheduler.extender import Extender
from scheduler.model import PodInfo
from scheduler.picture.feed import BindError, FileState, from_cluster
from scheduler.web.server import Server
from tests import fake_apiserver as fk

LEAF = "network.topology.nvidia.com/leaf"
SPINE = "network.topology.nvidia.com/spine"


def cluster(**extra: Any) -> FileState:
    nodes = [
        {
            "name": "a1",
            "labels": {LEAF: "leaf-1", SPINE: "s1"},
            "gpus": "dgx-a100",
            "allocated": [0, 1, 2, 3, 4, 5],
        },
        {"name": "a2", "labels": {LEAF: "leaf-1", SPINE: "s1"}, "gpus": "dgx1-v100", "allocated": [0, 3]},
        {"name": "a3", "labels": {LEAF: "leaf-2", SPINE: "s1"}, "gpus": "dgx-a100"},
        {"name": "a4", "labels": {LEAF: "leaf-2", SPINE: "s1"}, "gpus": "dgx-a100"},
        {"name": "a5", "labels": {LEAF: "leaf-3", SPINE: "s1"}, "gpus": 8},
    ]
    return from_cluster(parse_cluster({"nodes": nodes, **extra}))


class Client:
    def __init__(self, server: Server) -> None:
        self.host, self.port = server.address

    def raw(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, resp.getheader("Content-Type"), resp.read()
        finally:
            conn.close()

    def post(self, path: str, doc: Any) -> tuple[int, Any]:
        status, _, body = self.raw(
            "POST", path, json.dumps(doc).encode(), {"Content-Type": "application/json"}
        )
        return status, json.loads(body)


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[Server] = []

    def start(
        state: FileState, clock: list[float] | None = None, *, spill_after_s: float | None = None, **kw: Any
    ) -> tuple[Client, Extender]:
        """A sidecar over `state`; `spill_after_s` is its --gang-spill-after (None: the default)."""
        clock = clock or [1000.0]
        wait = {} if spill_after_s is None else {"spill_after_s": spill_after_s}
        ext = Extender(state, state.levels or defaults.DEFAULT_LEVELS, clock=lambda: clock[0], **wait)
        server = Server(ext, "127.0.0.1", 0, **kw)
        server.start()
        servers.append(server)
        return Client(server), ext

    yield start
    for s in servers:
        s.stop()


def args(pod: dict, names: list[str]) -> dict:
    """ExtenderArgs with nodeCacheCapable: true."""
    return {"Pod": pod, "Nodes": None, "NodeNames": names}


def node_list(names: list[str]) -> dict:
    return {
        "kind": "NodeList",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": "77"},
        "items": [fk.node(n) for n in names],
    }


ALL = ["a1", "a2", "a3", "a4", "a5"]


def test_filter_cache_mode_returns_node_names_and_reasons(serve) -> None:
    client, _ = serve(cluster())
    status, out = client.post("/filter", args(fk.pod("ml", "p", 4), ALL))
    assert status == 200
    assert set(out) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert out["Nodes"] is None and out["Error"] == ""
    assert out["NodeNames"] == ["a2", "a3", "a4", "a5"]
    assert out["FailedNodes"] == {"a1": "needs 4 GPUs, 2 free"}


def test_filter_without_node_cache_returns_the_node_objects(serve) -> None:
    client, _ = serve(cluster())
    status, out = client.post(
        "/filter", {"Pod": fk.pod("ml", "p", 4), "Nodes": node_list(ALL), "NodeNames": None}
    )
    assert status == 200
    assert out["NodeNames"] is None
    assert [i["metadata"]["name"] for i in out["Nodes"]["items"]] == ["a2", "a3", "a4", "a5"]
    assert out["Nodes"]["items"][0] == fk.node("a2"), "node objects are passed back untouched"
    assert out["FailedNodes"] == {"a1": "needs 4 GPUs, 2 free"}


def test_prioritize_prefers_the_node_that_gives_the_best_gpu_set(serve) -> None:
    client, _ = serve(cluster())
    status, out = client.post("/prioritize", args(fk.pod("ml", "p", 2), ALL))
    assert status == 200
    scores = {h["Host"]: h["Score"] for h in out}
    assert set(scores) == set(ALL) and all(0 <= s <= 10 for s in scores.values())
    # a1 has exactly the two NVSwitch GPUs left: best ring and best fit
    assert scores["a1"] == 10
    assert scores["a5"] == 5, "unknown topology is neutral"
    assert scores["a3"] < 10
    # both modes score alike
    status, again = client.post(
        "/prioritize", {"Pod": fk.pod("ml", "p", 2), "Nodes": node_list(ALL), "NodeNames": None}
    )
    assert again == out


def test_bind_allocates_and_is_idempotent(serve) -> None:
    state = cluster()
    client, _ = serve(state)
    pod = fk.pod("ml", "p", 2)
    client.post("/filter", args(pod, ALL))
    bind = {"PodName": "p", "PodNamespace": "ml", "PodUID": pod["metadata"]["uid"], "Node": "a1"}
    assert client.post("/bind", bind) == (200, {"Error": ""})
    assert state.held() == {"ml/p": ("a1", (6, 7))}
    assert client.post("/bind", bind) == (200, {"Error": ""}), "already bound there: success"
    status, out = client.post("/bind", {**bind, "Node": "a3"})
    assert status == 200 and "already bound to a1" in out["Error"]
    _, out = client.post("/filter", args(fk.pod("ml", "q", 1), ["a1"]))
    assert out["NodeNames"] == [] and out["FailedNodes"] == {"a1": "needs 1 GPUs, 0 free"}


def gpu_pod(quantity: str) -> dict:
    pod = fk.pod("ml", "p", 1)
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = quantity
    return pod


def light_gang_pod(min_available: str) -> dict:
    labels = {
        "pod-group.scheduling.sigs.k8s.io/name": "g",
        "pod-group.scheduling.sigs.k8s.io/min-available": min_available,
    }
    return fk.pod("ml", "p", 1, labels=labels)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "malformed JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (json.dumps({"Nodes": None, "NodeNames": ["a1"]}).encode(), "Pod must be an object"),
        (
            json.dumps({"Pod": fk.pod("ml", "p", 1), "Nodes": None, "NodeNames": None}).encode(),
            "NodeNames or Nodes",
        ),
        (json.dumps({"Pod": fk.pod("ml", "p", 1), "NodeNames": "a1"}).encode(), "NodeNames must be a list"),
        (
            json.dumps({"Pod": fk.pod("ml", "p", 1), "Nodes": {"items": [{}]}}).encode(),
            "metadata must be an object",
        ),
        (json.dumps(args(fk.pod("ml", "p", 99999), ["a1"])).encode(), "out of range"),
        (json.dumps(args(fk.pod("ml", "p", -1), ["a1"])).encode(), "whole number"),
        (json.dumps(args({**fk.pod("ml", "p", 1), "metadata": {}}, ["a1"])).encode(), "name is required"),
        (b"\xff\xfe", "malformed JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "malformed JSON"),
        # str.isdigit() accepts these, int() does not: they once escaped as a 500
        (json.dumps(args(gpu_pod("\u00b2"), ["a1"])).encode(), "whole number"),
        (json.dumps(args(gpu_pod("9" * 5000), ["a1"])).encode(), "whole number"),
        (json.dumps(args(light_gang_pod("\u00b2"), ["a1"])).encode(), "positive integer"),
        (json.dumps(args(light_gang_pod("9" * 5000), ["a1"])).encode(), "positive integer"),
    ],
)
def test_bad_filter_input_is_a_400_with_a_reason(serve, body: bytes, message: str) -> None:
    client, _ = serve(cluster())
    for path in ("/filter", "/prioritize"):
        status, ctype, out = client.raw("POST", path, body, {"Content-Type": "application/json"})
        assert status == 400 and ctype == "application/json"
        assert message in json.loads(out)["Error"]
    assert client.raw("GET", "/healthz")[0] == 200, "still serving"


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"PodName": "ghost", "PodNamespace": "ml", "PodUID": "u", "Node": "a1"}, "unknown"),
        (
            {"PodName": "p", "PodNamespace": "ml", "PodUID": "uid-ml-p", "Node": "nowhere"},
            "node nowhere is unknown",
        ),
        ({"PodName": "p", "PodNamespace": "ml", "PodUID": "other", "Node": "a1"}, "has uid"),
        ({"PodNamespace": "ml", "Node": "a1"}, "required"),
        ({"PodName": 7, "Node": "a1"}, "must be a string"),
    ],
)
def test_bad_bind_input_is_a_400_with_the_error_field(serve, doc: dict, message: str) -> None:
    client, _ = serve(cluster())
    client.post("/filter", args(fk.pod("ml", "p", 1), ALL))
    status, out = client.post("/bind", doc)
    assert status == 400 and message in out["Error"]


def test_size_limits_paths_and_probes(serve) -> None:
    client, _ = serve(cluster(), max_body=1000)
    status, _, out = client.raw("POST", "/filter", b"x" * 2000)
    assert status == 413 and "exceeds" in json.loads(out)["Error"]
    status, _, out = client.raw("POST", "/nope", b"{}")
    assert status == 404
    assert client.raw("GET", "/healthz")[0] == 200
    assert client.raw("GET", "/readyz")[0] == 200
    client.post("/filter", args(fk.pod("ml", "p", 1), ["a1"]))
    status, ctype, text = client.raw("GET", "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    body = text.decode()
    assert 'gputopo_extender_request_seconds_count{verb="filter"}' in body
    assert 'gputopo_extender_requests_total{code="413",verb="filter"} 1.0' in body
    assert 'gputopo_extender_refused_total{reason="body_too_large"} 1.0' in body


def gang_pod(name: str, gpus: int = 8, group: str = "g1") -> dict:
    return fk.pod("ml", name, gpus, labels={"scheduling.x-k8s.io/pod-group": group})


def test_gang_waits_for_members_then_steers_each_to_its_planned_node(serve) -> None:
    state = cluster(podgroups=[{"namespace": "ml", "name": "g1", "minMember": 2}])
    client, ext = serve(state)
    _, out = client.post("/filter", args(gang_pod("w-0"), ALL))
    assert out["NodeNames"] == [] and out["FailedNodes"] == {}
    assert set(out["FailedAndUnresolvableNodes"]) == set(ALL)
    assert out["FailedAndUnresolvableNodes"]["a3"] == "gang ml/g1 waiting for members 1/2"
    _, out = client.post("/filter", args(gang_pod("w-1"), ALL))
    # two empty DGX A100s share leaf-2: the smallest domain that holds both 8-GPU members
    assert out["NodeNames"] in (["a3"], ["a4"])
    first = out["NodeNames"][0]
    # the planned node alone: no other node's status (kube-scheduler binds, reads none of them)
    assert out["FailedNodes"] == {} and out["FailedAndUnresolvableNodes"] == {}
    _, out0 = client.post("/filter", args(gang_pod("w-0"), ALL))
    other = ({"a3", "a4"} - {first}).pop()
    assert out0["NodeNames"] == [other]
    # the reserved capacity is taken for everybody else
    _, single = client.post("/filter", args(fk.pod("ml", "solo", 1), ["a3", "a4"]))
    assert single["NodeNames"] == []
    prio = dict((h["Host"], h["Score"]) for h in client.post("/prioritize", args(gang_pod("w-1"), ALL))[1])
    assert prio[first] == 10 and sum(prio.values()) == 10
    for pod, node in (("w-1", first), ("w-0", other)):
        _status, out = client.post(
            "/bind", {"PodName": pod, "PodNamespace": "ml", "PodUID": f"uid-ml-{pod}", "Node": node}
        )
        assert out == {"Error": ""}
    assert len(ext.reservations) == 0
    assert {k: v[0] for k, v in state.held().items()} == {"ml/w-1": first, "ml/w-0": other}


def test_gang_that_fits_nowhere_waits_with_back_off(serve) -> None:
    clock = [1000.0]
    state = cluster(podgroups=[{"namespace": "ml", "name": "big", "minMember": 3}])
    client, ext = serve(state, clock)
    pods = [gang_pod(f"b-{i}", 8, "big") for i in range(3)]
    for p in pods[:2]:
        client.post("/filter", args(p, ALL))
    pods[2]["metadata"]["annotations"]["gputopo.io/required-topology"] = LEAF
    _, out = client.post("/filter", args(pods[2], ALL))
    reason = out["FailedAndUnresolvableNodes"]["a1"]
    assert "does not fit" in reason and out["NodeNames"] == []
    assert len(ext.reservations) == 0, "a waiting gang holds nothing"
    _, out = client.post("/filter", args(pods[2], ALL))
    assert "retry in" in out["FailedAndUnresolvableNodes"]["a1"]
    clock[0] += 5
    _, out = client.post("/filter", args(pods[2], ALL))
    assert "retry in" not in out["FailedAndUnresolvableNodes"]["a1"], "planned again after the back-off"


def test_parallel_single_pods_never_share_a_gpu(serve) -> None:
    state = cluster()
    client, _ = serve(state)
    errors: list[str] = []

    def worker(i: int) -> None:
        pod = fk.pod("ml", f"p{i}", 1 + i % 3)
        _, out = client.post("/filter", args(pod, ALL))
        if not out["NodeNames"]:
            return
        scores = client.post("/prioritize", args(pod, out["NodeNames"]))[1]
        best = max(scores, key=lambda h: (h["Score"], h["Host"]))["Host"]
        _status, res = client.post(
            "/bind", {"PodName": f"p{i}", "PodNamespace": "ml", "PodUID": "", "Node": best}
        )
        if res["Error"]:
            errors.append(res["Error"])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    held = state.held()
    seen: set[tuple[str, int]] = set()
    for node, gpus in held.values():
        for g in gpus:
            assert (node, g) not in seen, f"GPU {g} of {node} given twice"
            seen.add((node, g))
    initially = {"a1": {0, 1, 2, 3, 4, 5}, "a2": {0, 3}}
    for node, g in seen:
        assert g not in initially.get(node, set())
    assert held, "some pods were bound"
    assert all("free" in e or "GPUs" in e for e in errors)


def test_gang_members_without_gpus_count_but_need_no_placement(serve) -> None:
    state = cluster(podgroups=[{"namespace": "ml", "name": "g2", "minMember": 3}])
    client, ext = serve(state)
    launcher = fk.pod("ml", "launcher", 0, labels={"scheduling.x-k8s.io/pod-group": "g2"})
    _, out = client.post("/filter", args(launcher, ALL))
    assert out["NodeNames"] == ALL, "a GPU-less member goes anywhere"
    client.post("/filter", args(gang_pod("w-0", 8, "g2"), ALL))
    _, out = client.post("/filter", args(gang_pod("w-1", 8, "g2"), ALL))
    assert out["NodeNames"] in (["a3"], ["a4"])
    assert {p.pod for p in ext.plans["ml/g2"].placements} == {"ml/w-0", "ml/w-1"}


def test_a_member_whose_plan_lapsed_is_not_bound_alone(serve) -> None:
    """All or nothing: a member kube-scheduler binds after its gang's reservation expired (and
    its capacity went to someone else) must not be bound by itself, stranded in a leaf the rest
    of its gang can no longer fit in."""
    clock = [1000.0]
    state = cluster(podgroups=[{"namespace": "ml", "name": "g1", "minMember": 2}])
    client, ext = serve(state, clock)
    pods = [gang_pod(f"w-{i}") for i in range(2)]
    for p in pods:
        p["metadata"]["annotations"]["gputopo.io/required-topology"] = LEAF
    planned = {}
    for p in pods + pods:
        _, out = client.post("/filter", args(p, ALL))
        planned[p["metadata"]["name"]] = out["NodeNames"]
    assert sorted(n for (n,) in planned.values()) == ["a3", "a4"]
    clock[0] += defaults.RESERVATION_TTL_S + 1
    (other,), (late,) = planned["w-1"], planned["w-0"]
    _, out = client.post("/filter", args(fk.pod("ml", "solo", 1), [other]))
    assert out["NodeNames"] == [other], "the lapsed reservation no longer holds w-1's node"
    solo = {"PodName": "solo", "PodNamespace": "ml", "PodUID": "", "Node": other}
    assert client.post("/bind", solo) == (200, {"Error": ""})
    status, out = client.post("/bind", {"PodName": "w-0", "PodNamespace": "ml", "PodUID": "", "Node": late})
    assert status == 200 and "no reservation" in out["Error"]
    assert "ml/g1" not in ext.plans
    assert set(state.held()) == {"ml/solo"}, "no member of the gang holds a GPU"
    assert len(ext.reservations) == 0
    _, out = client.post("/filter", args(pods[0], ALL))
    assert "does not fit" in out["FailedAndUnresolvableNodes"]["a1"]


def test_a_replan_around_bound_members_keeps_the_required_domain(serve) -> None:
    """Members already bound pin a re-plan: with required-topology the rest must join their
    domain of that level or wait, never complete the gang in another domain."""
    clock = [1000.0]
    state = cluster(podgroups=[{"namespace": "ml", "name": "g1", "minMember": 2}])
    client, ext = serve(state, clock)
    pods = [gang_pod(f"w-{i}") for i in range(2)]
    for p in pods:
        p["metadata"]["annotations"]["gputopo.io/required-topology"] = LEAF
    planned = {}
    for p in pods + pods:
        _, out = client.post("/filter", args(p, ALL))
        if out["NodeNames"]:
            planned[p["metadata"]["name"]] = out["NodeNames"][0]
    assert sorted(planned.values()) == ["a3", "a4"], "leaf-2 is the one leaf that holds both"
    bind = {"PodName": "w-1", "PodNamespace": "ml", "PodUID": "", "Node": planned["w-1"]}
    assert client.post("/bind", bind) == (200, {"Error": ""})
    # w-0 does not come back in time (kube-scheduler's own filters refuse its node, say): the
    # plan lapses ...
    clock[0] += defaults.RESERVATION_TTL_S + 1
    # ... and a single pod takes one GPU of w-0's node before w-0 comes back
    solo = {"PodName": "solo", "PodNamespace": "ml", "PodUID": "", "Node": planned["w-0"]}
    client.post("/filter", args(fk.pod("ml", "solo", 1), ALL))
    assert client.post("/bind", solo) == (200, {"Error": ""})
    _, out = client.post("/filter", args(pods[0], ALL))
    assert out["NodeNames"] == [], "a5 (leaf-3) has room but is outside w-1's leaf"
    assert "does not fit" in out["FailedAndUnresolvableNodes"]["a5"]
    assert "ml/g1" not in ext.plans and len(ext.reservations) == 0


def test_a_bind_that_does_not_match_the_plan_is_refused_and_the_plan_kept(serve) -> None:
    """A bind for another node comes from a filter answer older than the current plan; dropping
    the plan then would hand its capacity to other pods while members are already bound."""
    state = cluster(podgroups=[{"namespace": "ml", "name": "g1", "minMember": 3}])
    client, ext = serve(state)
    pods = [gang_pod(f"w-{i}", 4) for i in range(3)]
    planned = {}
    for p in pods + pods:
        _, out = client.post("/filter", args(p, ALL))
        if out["NodeNames"]:
            planned[p["metadata"]["name"]] = out["NodeNames"][0]
    plan = ext.plans["ml/g1"]
    bind = {"PodName": "w-0", "PodNamespace": "ml", "PodUID": "", "Node": planned["w-0"]}
    assert client.post("/bind", bind) == (200, {"Error": ""})
    wrong = next(n for n in ALL if n != planned["w-1"])
    _, out = client.post("/bind", {**bind, "PodName": "w-1", "Node": wrong})
    assert f"planned ml/w-1 on {planned['w-1']}" in out["Error"]
    assert ext.plans.get("ml/g1") is plan and len(ext.reservations) == 2, "plan and capacity kept"
    assert ext.metrics.binds.labels(result="failed")._value.get() == 1, "the refusal is counted"
    _, out = client.post("/filter", args(fk.pod("ml", "solo", 8), ALL))
    assert planned["w-1"] not in out["NodeNames"] and planned["w-2"] not in out["NodeNames"]
    for name in ("w-1", "w-2"):
        assert client.post("/bind", {**bind, "PodName": name, "Node": planned[name]}) == (200, {"Error": ""})
    assert {k: v[0] for k, v in state.held().items()} == {f"ml/{k}": v for k, v in planned.items()}


@pytest.mark.parametrize("seed", [3, 7])
def test_competing_gangs_in_parallel_are_all_or_nothing_and_never_share_a_gpu(seed: int) -> None:
    """Four gangs of 3 x 8 GPUs that each require one leaf, on two leaves of four nodes: their
    members filter and bind from parallel clients, and one bind in seven names a node from an
    outdated answer (as kube-scheduler does when a re-plan overtook its cycle)."""
    rnd = random.Random(seed)
    nodes = [{"name": f"n{i}", "labels": {LEAF: f"l{i // 4}"}, "gpus": "dgx-a100"} for i in range(8)]
    groups = [{"namespace": "ml", "name": f"g{k}", "minMember": 3} for k in range(4)]
    state = from_cluster(parse_cluster({"nodes": nodes, "podgroups": groups}))
    ext = Extender(state, defaults.DEFAULT_LEVELS, clock=time.monotonic, backoff_s=(0.01, 0.05))
    server = Server(ext, "127.0.0.1", 0)
    server.start()
    client = Client(server)
    names = [n["name"] for n in nodes]
    stale = [rnd.random() < 1 / 7 for _ in range(2000)]

    def member(k: int, i: int) -> None:
        name = f"g{k}-{i}"
        pod = fk.pod(
            "ml",
            name,
            8,
            labels={"scheduling.x-k8s.io/pod-group": f"g{k}"},
            annotations={"gputopo.io/required-topology": LEAF},
        )
        for attempt in range(150):
            _, out = client.post("/filter", args(pod, names))
            if out["NodeNames"]:
                node = out["NodeNames"][0]
                if stale[(k * 3 + i) * 150 % 2000 + attempt % 13]:
                    node = names[(names.index(node) + 1 + attempt) % len(names)]
                bind = {"PodName": name, "PodNamespace": "ml", "PodUID": "", "Node": node}
                if client.post("/bind", bind)[1] == {"Error": ""}:
                    return
            time.sleep(0.005)

    threads = [threading.Thread(target=member, args=(k, i)) for k in range(4) for i in range(3)]
    rnd.shuffle(threads)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        server.stop()
    held = state.held()
    seen: set[tuple[str, int]] = set()
    for node, gpus in held.values():
        assert len(gpus) == 8
        for g in gpus:
            assert (node, g) not in seen, f"GPU {g} of {node} given twice"
            seen.add((node, g))
    per_gang: dict[str, set[str]] = {}
    for pod, (node, _) in held.items():
        per_gang.setdefault(pod.split("/")[1].split("-")[0], set()).add(node)
    assert len(per_gang) == 2, "one gang per leaf"
    for gang, where in per_gang.items():
        members = [p for p in held if p.startswith(f"ml/{gang}-")]
        assert len(members) == 3, f"{gang} is partly placed: {members}"
        assert len({int(n[1:]) // 4 for n in where}) == 1, f"{gang} spans leaves"
    assert len(ext.reservations) == 0


@pytest.mark.parametrize(
    ("path", "length", "status"),
    [
        ("/filter", b"\xb2", 400),  # "²": str.isdigit() says yes, int() says no
        ("/bind", b"9" * 5000, 400),  # beyond int()'s 4,300-digit limit
        ("/filter", b"-5", 400),
        ("/nope", b"\xb2", 404),
    ],
)
def test_a_content_length_that_is_not_a_number_is_a_clear_answer(serve, path, length, status) -> None:
    client, _ = serve(cluster())
    with socket.create_connection((client.host, client.port), timeout=5) as conn:
        head = b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: " + length
        conn.sendall(head + b"\r\n\r\n{}")
        reply = http.client.HTTPResponse(conn)
        reply.begin()
        body = json.loads(reply.read())
    assert reply.status == status and body["Error"]
    assert client.raw("GET", "/healthz")[0] == 200


@pytest.mark.parametrize(
    ("init", "needs"),
    [
        ([{"gpus": "4"}], 4),  # an init container runs alone: the larger of it and the app
        ([{"gpus": "1", "restartPolicy": "Always"}], 3),  # a sidecar runs beside the app: summed
        ([{"gpus": "1", "restartPolicy": "Always"}, {"gpus": "3"}], 4),  # init after a sidecar
    ],
)
def test_init_and_sidecar_containers_count_as_kubernetes_counts_them(serve, init, needs) -> None:
    client, _ = serve(cluster())
    pod = fk.pod("ml", "p", 2)
    pod["spec"]["initContainers"] = [
        {"name": f"i{k}", "resources": {"limits": {"nvidia.com/gpu": c["gpus"]}}}
        | ({"restartPolicy": c["restartPolicy"]} if "restartPolicy" in c else {})
        for k, c in enumerate(init)
    ]
    _, out = client.post("/filter", args(pod, ["a1"]))
    assert out["FailedNodes"] == {"a1": f"needs {needs} GPUs, 2 free"}


def test_a_pod_recreated_under_the_same_name_is_a_new_pod(serve) -> None:
    """Jobs recreate failed workers under the same name: what the sidecar remembers of the old
    pod's bind (until the node's annotation catches up) must not answer for the new one."""
    state = cluster(podgroups=[{"namespace": "ml", "name": "g1", "minMember": 1}])
    client, _ = serve(state)
    old = gang_pod("w-0")
    _, out = client.post("/filter", args(old, ALL))
    (first,) = out["NodeNames"]
    bind = {"PodName": "w-0", "PodNamespace": "ml", "PodUID": old["metadata"]["uid"], "Node": first}
    assert client.post("/bind", bind) == (200, {"Error": ""})
    state.delete_pod("ml/w-0")
    new = gang_pod("w-0")
    new["metadata"]["uid"] = "uid-second"
    _, out = client.post("/filter", args(new, ALL))
    assert len(out["NodeNames"]) == 1, out["FailedAndUnresolvableNodes"]
    (second,) = out["NodeNames"]
    assert client.post("/bind", {**bind, "PodUID": "uid-second", "Node": second}) == (200, {"Error": ""})
    assert state.held()["ml/w-0"][0] == second, "the new pod was really bound"


def test_a_planned_node_that_goes_away_releases_the_whole_plan_at_once(serve) -> None:
    state = cluster(podgroups=[{"namespace": "ml", "name": "g1", "minMember": 2}])
    client, ext = serve(state)
    for name in ("w-0", "w-1"):
        client.post("/filter", args(gang_pod(name), ALL))
    assert len(ext.reservations) == 2
    state.remove_node("a4")
    _, out = client.post("/filter", args(fk.pod("ml", "solo", 8), ["a3"]))
    assert out["NodeNames"] == ["a3"], "a3 is no longer held for a gang that cannot use it as planned"
    assert len(ext.reservations) == 0 and "ml/g1" not in ext.plans


@pytest.mark.parametrize(
    ("request_line", "status"),
    [
        (b"PUT /filter HTTP/1.1", 501),  # methods the extender does not serve
        (b"DELETE /bind HTTP/1.1", 501),
        (b"POST /filter HTTP/1.1\r\nX: " + b"x" * 70_000, 431),  # a header line over http.server's limit
    ],
)
def test_what_http_server_itself_refuses_is_json_too(serve, request_line: bytes, status: int) -> None:
    client, _ = serve(cluster())
    with socket.create_connection((client.host, client.port), timeout=5) as conn:
        conn.sendall(request_line + b"\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        reply = http.client.HTTPResponse(conn)
        reply.begin()
        body = reply.read()
    assert reply.status == status and reply.getheader("Content-Type") == "application/json"
    assert json.loads(body)["Error"]


class _FailOnce(FileState):
    """A snapshot-file cluster whose first bind of `pod` is refused (an API server hiccup)."""

    fail: str = ""

    def bind(self, pod: PodInfo, node: str, gpus: tuple[int, ...]) -> None:
        if pod.key == self.fail:
            self.fail = ""
            raise BindError(f"injected: binding {pod.key} refused")
        super().bind(pod, node, gpus)


def test_a_member_failing_after_others_bound_keeps_the_gangs_capacity(serve) -> None:
    """A refused bind after another member bound must not hand the gang's capacity to others:
    w-0 is bound in leaf-2, so the rest of the gang can only go there (required), and a single
    pod asking in between must not take the last 8 free GPUs of that leaf."""
    state = cluster(podgroups=[{"namespace": "ml", "name": "g1", "minMember": 2}])
    state.__class__ = _FailOnce
    client, ext = serve(state)
    pods = [gang_pod(f"w-{i}") for i in range(2)]
    for p in pods:
        p["metadata"]["annotations"]["gputopo.io/required-topology"] = LEAF
    planned = {}
    for p in pods + pods:
        _, out = client.post("/filter", args(p, ALL))
        if out["NodeNames"]:
            planned[p["metadata"]["name"]] = out["NodeNames"][0]
    bind = {"PodName": "w-0", "PodNamespace": "ml", "PodUID": "", "Node": planned["w-0"]}
    assert client.post("/bind", bind) == (200, {"Error": ""})
    state.fail = "ml/w-1"
    _, out = client.post("/bind", {**bind, "PodName": "w-1", "Node": planned["w-1"]})
    assert "injected" in out["Error"]
    _, out = client.post("/filter", args(fk.pod("ml", "solo", 8), ALL))
    assert planned["w-1"] not in out["NodeNames"], "the failed member's place is held for it"
    solo = {"PodName": "solo", "PodNamespace": "ml", "PodUID": "", "Node": out["NodeNames"][0]}
    assert client.post("/bind", solo) == (200, {"Error": ""})
    _, out = client.post("/filter", args(pods[1], ALL))
    assert out["NodeNames"] == [planned["w-1"]]
    assert client.post("/bind", {**bind, "PodName": "w-1", "Node": planned["w-1"]}) == (200, {"Error": ""})
    assert len(ext.reservations) == 0
