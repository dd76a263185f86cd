"""Live cluster state through the official client against a local fake API server."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

import pytest

from gputopo.network.annotation import encode, make
from gputopo.node.topology import Topology
from scheduler.live.kube import KubeState
from scheduler.model import NodeInfo, parse_pod
from scheduler.picture.feed import BindError
from tests import fake_apiserver as fk

PRESETS = Path(__file__).resolve().parent.parent / "gputopo" / "node" / "presets"
NOW = 1_800_000_000.0


def wait_until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached")


def annotated(name: str, allocated: tuple[int, ...] = (), at: float = NOW) -> str:
    topo = Topology.from_dict(json.loads((PRESETS / "dgx-a100.json").read_text()))
    return encode(make(name, topo, generated_at=at, plugin_version="0.1.0", allocated=allocated))


@pytest.fixture
def clock() -> list[float]:
    return [NOW]


def start(api_client, clock: list[float], **kw) -> KubeState:
    state = KubeState(api_client, clock=lambda: clock[0], watch_timeout_s=5, backoff_s=(0.05, 0.2), **kw)
    state.start()
    wait_until(state.ready)
    return state


def test_lists_nodes_pods_and_podgroups(clock: list[float]) -> None:
    with fk.running() as (api, _, api_client):
        api.put(
            "nodes",
            fk.node(
                "a1",
                {"network.topology.nvidia.com/leaf": "l1"},
                annotations={"gputopo.io/topology": annotated("a1", (0, 1))},
            ),
        )
        api.put("nodes", fk.node("a2", annotations={"gputopo.io/topology": "{corrupt"}))
        api.put("nodes", fk.node("a3", gpus=4))
        api.put("pods", fk.pod("ml", "w-0", 2, labels={"scheduling.x-k8s.io/pod-group": "g1"}))
        api.put("pods", fk.pod("web", "nginx", 0))
        api.put("podgroups", fk.podgroup("ml", "g1", 4))
        state = start(api_client, clock)
        try:
            snap = state.snapshot()
            assert set(snap.nodes) == {"a1", "a2", "a3"}
            assert snap.nodes["a1"].topology is not None
            assert snap.nodes["a1"].topology.allocated == {0, 1}
            assert snap.nodes["a1"].labels["network.topology.nvidia.com/leaf"] == "l1"
            assert snap.nodes["a2"].topology is None and "not JSON" in snap.nodes["a2"].topology_problem
            assert snap.nodes["a3"].topology is None and snap.nodes["a3"].gpu_capacity == 4
            assert "annotation missing" in snap.nodes["a3"].topology_problem
            assert set(snap.pods) == {"ml/w-0"}, "pods without GPUs or gangs are not tracked"
            assert snap.min_members == {"ml/g1": 4}
            clock[0] += 3600
            assert state.snapshot().nodes["a1"].topology is None
            assert "stale" in state.snapshot().nodes["a1"].topology_problem
        finally:
            state.stop()


def test_watch_applies_changes_and_resumes_after_a_break(clock: list[float]) -> None:
    with fk.running() as (api, _, api_client):
        api.put("nodes", fk.node("a1"))
        state = start(api_client, clock)
        try:
            api.put("pods", fk.pod("ml", "p", 1))
            wait_until(lambda: "ml/p" in state.snapshot().pods)
            seen = api.rv
            before = len(api.watch_requests("nodes"))
            before_pods = len(api.watch_requests("pods"))
            api.break_watches()
            # each kind's watch resumes on its own thread: wait for both, not the first
            wait_until(lambda: len(api.watch_requests("nodes")) > before)
            wait_until(lambda: len(api.watch_requests("pods")) > before_pods)
            # the resumed watch starts from the last version the reflector saw, not from scratch
            assert int(api.watch_requests("nodes")[-1]) >= int(api.watch_requests("nodes")[before - 1] or 0)
            assert api.watch_requests("pods")[-1] == str(seen)
            api.put("nodes", fk.node("a2"))
            wait_until(lambda: "a2" in state.snapshot().nodes)
            api.delete("pods", "ml/p")
            wait_until(lambda: "ml/p" not in state.snapshot().pods)
            lists = [r.lists for r in state.reflectors[:3]]  # nodes, pods, podgroups
            assert lists == [1, 1, 1], "a broken watch resumes without relisting"
        finally:
            state.stop()


def test_410_gone_relists(clock: list[float]) -> None:
    with fk.running() as (api, _, api_client):
        api.put("nodes", fk.node("a1"))
        state = start(api_client, clock)
        try:
            api.compact()
            api.put("nodes", fk.node("a9"))
            wait_until(lambda: "a9" in state.snapshot().nodes)
            assert state.reflectors[0].lists >= 2
        finally:
            state.stop()


def test_missing_podgroup_crd_is_not_fatal(clock: list[float]) -> None:
    with fk.running(fk.FakeAPI(podgroups_crd=False)) as (api, _, api_client):
        api.put("nodes", fk.node("a1"))
        state = start(api_client, clock)
        try:
            assert state.snapshot().min_members == {}
        finally:
            state.stop()


def test_bind_is_idempotent_and_reports_refusals(clock: list[float]) -> None:
    with fk.running() as (api, _, api_client):
        api.put("nodes", fk.node("a1"))
        api.put("pods", fk.pod("ml", "p", 1))
        api.put("pods", fk.pod("ml", "q", 1))
        state = start(api_client, clock)
        try:
            p = parse_pod(fk.pod("ml", "p", 1))
            state.bind(p, "a1", (0,))
            assert api.bindings == [("ml/p", "a1")]
            state.bind(p, "a1", (0,))  # already bound there: success
            with pytest.raises(BindError, match="409"):
                state.bind(p, "a2", (0,))
            api.inject("bind", 500)
            with pytest.raises(BindError, match="500"):
                state.bind(parse_pod(fk.pod("ml", "q", 1)), "a1", (1,))
            with pytest.raises(BindError, match="404"):
                state.bind(parse_pod(fk.pod("ml", "ghost", 1)), "a1", (1,))
        finally:
            state.stop()


def test_a_new_pending_pod_keeps_every_nodes_view_and_a_bound_one_does_not(clock: list[float]) -> None:
    """kube-scheduler asks about a pod the sidecar has not seen at almost every filter. A pending
    pod holds no GPUs, so the snapshot keeps the node GPU counts (the same object: the view
    builder then rebuilds nothing) and does not read every node's annotation age again; a pod
    bound to a node changes that node's count, and an annotation that ages out is still seen
    when its time comes (bench/bench_live.py measures the cost)."""
    with fk.running() as (api, _, api_client):
        for n in ("a1", "a2"):
            api.put("nodes", fk.node(n, annotations={"gputopo.io/topology": annotated(n, at=NOW)}))
        state = start(api_client, clock)
        try:
            first = state.snapshot()
            state.observe(parse_pod(fk.pod("ml", "pending", 2)))
            clock[0] += 10  # past the snapshot's recheck, well inside the annotation's age limit
            second = state.snapshot()
            assert "ml/pending" in second.pods and second is not first
            assert second.pod_gpus is first.pod_gpus, "a pending pod changed no node's count"
            api.put("pods", fk.pod("ml", "bound", 2, node_name="a1"))
            wait_until(lambda: "ml/bound" in state.snapshot().pods)
            third = state.snapshot()
            assert third.pod_gpus is not first.pod_gpus and third.pod_gpus == {"a1": 2}
            clock[0] = NOW + 300
            api.put(
                "nodes", fk.node("a2", annotations={"gputopo.io/topology": annotated("a2", at=NOW + 300)})
            )
            wait_until(lambda: getattr(state.snapshot().nodes["a2"].topology, "generated_at", 0) == NOW + 300)
            clock[0] = NOW + state.max_age_s + 1  # a1's annotation ages out; a2's is newer
            state.observe(parse_pod(fk.pod("ml", "later", 1)))
            aged = state.snapshot()
            assert aged.nodes["a1"].topology is None and "stale" in aged.nodes["a1"].topology_problem
            assert aged.nodes["a2"].topology is not None
        finally:
            state.stop()


def test_a_store_updated_node_by_node_shows_what_a_fresh_one_lists(clock: list[float]) -> None:
    """The live store reads only the nodes changed since its last snapshot (and their ages),
    layering its node map on the last one (`KubeState._nodes_now`); what it shows, and the
    change log it names those nodes in, must equal what a store listing afresh shows."""
    key = "gputopo.io/topology"

    def put(name: str, at: float, allocated: tuple[int, ...] = ()) -> None:
        api.put("nodes", fk.node(name, {"leaf": name}, annotations={key: annotated(name, allocated, at=at)}))

    def shown(nodes: Mapping[str, NodeInfo]) -> dict[str, NodeInfo]:
        # a stale node keeps the reason (and the age in it) it went stale with: one object, and
        # one warning, while it stays stale
        return {
            n: replace(i, topology_problem=re.sub(r"\d+s old", "old", i.topology_problem))
            for n, i in nodes.items()
        }

    def same_as_fresh() -> None:
        fresh = start(api_client, clock)
        try:
            assert shown(state.snapshot().nodes) == shown(fresh.snapshot().nodes)
        finally:
            fresh.stop()

    with fk.running() as (api, _, api_client):
        for name in ("a1", "a2", "a3", "a4"):
            put(name, NOW)
        state = start(api_client, clock)
        try:
            seq = state.snapshot().changes_seq
            put("a2", NOW + 100, (0, 1))
            api.delete("nodes", "a3")
            put("a5", NOW)
            put("a6", NOW - state.max_age_s - 10)  # stale on arrival: judged as a changed node
            wait_until(
                lambda: {"a5", "a6"} <= set(state.snapshot().nodes) and "a3" not in state.snapshot().nodes
            )
            wait_until(lambda: getattr(state.snapshot().nodes["a2"].topology, "allocated", ()) == {0, 1})
            snap = state.snapshot()
            assert snap.nodes["a6"].topology is None and "stale" in snap.nodes["a6"].topology_problem
            same_as_fresh()
            clock[0] = NOW + state.max_age_s + 50  # a1, a4, a5 age out (a2 is newer): every age read
            state.observe(parse_pod(fk.pod("ml", "later", 1)))
            aged = state.snapshot()
            assert [n for n in ("a1", "a2", "a4", "a5") if aged.nodes[n].topology is None] == [
                "a1",
                "a4",
                "a5",
            ]
            same_as_fresh()
            named = aged.changes.since(seq, aged.changes_seq) if aged.changes is not None else None
            assert named is not None and {"a1", "a2", "a3", "a4", "a5", "a6"} <= set(named)
            put("a1", clock[0])  # republished: fresh again, as a changed node
            wait_until(lambda: state.snapshot().nodes["a1"].topology is not None)
            same_as_fresh()
        finally:
            state.stop()
