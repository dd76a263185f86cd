"""Issue 18, "start when you can": the user scenarios of the issue, replayed over real HTTP by
the kube-scheduler stand-in (filter -> prioritize -> bind, clock advanced per round).

With the shipped defaults a gang without a required level is placed now in the smallest level
that holds it among the offered nodes (its preferred level first, then each larger one), and a
single multi-GPU pod takes the best node that fits now. A required level still waits for that
level, for ever; waiting for a better domain is opt-in, per pod (gputopo.io/topology-wait) or
per cluster (--gang-spill-after), and then still waits as before.
"""

from __future__ import annotations

from typing import Any

import pytest

from gputopo.network.cluster import parse_cluster
from gputopo.network.levels import HOSTNAME, LEAF, SPINE
from scheduler.extender import Extender
from scheduler.live.kube import KubeState
from scheduler.picture.feed import FileState, from_cluster
from scheduler.web.server import Server
from tests import fake_apiserver as fk
from tests.kube_scheduler_standin import Outcome, StandIn
from tests.test_scheduler_live import NOW, wait_until
from tests.test_scheduler_live import annotation as live_annotation

LEVELS = (HOSTNAME, LEAF, SPINE)
LIGHT_NAME = "pod-group.scheduling.sigs.k8s.io/name"
LIGHT_MIN = "pod-group.scheduling.sigs.k8s.io/min-available"
KUEUE_GROUP = "kueue.x-k8s.io/pod-group-name"
KUEUE_TOTAL = "kueue.x-k8s.io/pod-group-total-count"
WAIT = "gputopo.io/topology-wait"
#: Spine s1 has leaves l1, l2; spine s2 has l3..l6.
SPINES = {"s1": ("l1", "l2"), "s2": ("l3", "l4", "l5", "l6")}
#: Per leaf, three 8-GPU nodes with 4, 2 and 0 GPUs free: one slot of 4 GPUs and three of 2 per
#: leaf, so no leaf holds 4 x 4 or 11 x 2 (every leaf is full for them) while spine s2 holds
#: both (4 slots of 4, 12 of 2) and spine s1 neither (2 and 6). With every GPU free a leaf holds
#: either gang: the leaf is each gang's own level, the one an opted-in wait waits for.
ALLOCATED = ([0, 1, 2, 3], [0, 1, 2, 3, 4, 5], list(range(8)))


def leaves_full_spine_has_room() -> FileState:
    nodes = [
        {
            "name": f"{leaf}-n{i}",
            "labels": {HOSTNAME: f"{leaf}-n{i}", LEAF: leaf, SPINE: spine},
            "gpus": "dgx-a100",
            "allocated": allocated,
        }
        for spine, leaves in SPINES.items()
        for leaf in leaves
        for i, allocated in enumerate(ALLOCATED)
    ]
    return from_cluster(parse_cluster({"levels": list(LEVELS), "nodes": nodes}))


def spine_of(node: str) -> str:
    leaf = node.split("-")[0]
    return next(s for s, leaves in SPINES.items() if leaf in leaves)


def light_gang(name: str, count: int, gpus: int, annotations: dict[str, str] | None = None) -> list[dict]:
    """A gang named by the light pod-group labels (no group object needed)."""
    labels = {LIGHT_NAME: name, LIGHT_MIN: str(count)}
    return [fk.pod("ml", f"{name}-{i}", gpus, labels=labels, annotations=annotations) for i in range(count)]


def kueue_gang(name: str, count: int, gpus: int, annotations: dict[str, str]) -> list[dict]:
    """A gang as Kueue's pod groups name it: a label, and the total count on every pod."""
    notes = {KUEUE_TOTAL: str(count), **annotations}
    return [
        fk.pod("ml", f"{name}-{i}", gpus, labels={KUEUE_GROUP: name}, annotations=notes) for i in range(count)
    ]


def bound_promptly(out: Outcome, pods: list[dict], clock: list[float], start: float) -> set[str]:
    """Every pod bound within the stand-in's first rounds (the last member's filter plans the
    gang, the others bind at their next turn): no wait on any clock. The nodes used."""
    keys = {f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pods}
    assert set(out.bound) == keys, out.pending
    assert clock[0] - start <= 3.0, "placed in the first rounds, not after a wait"
    assert not out.bind_errors
    return {out.bound[k] for k in keys}


@pytest.mark.parametrize(("count", "gpus"), [(4, 4), (11, 2)])
def test_a_gang_no_leaf_holds_is_placed_now_in_the_spine_that_does(running, count: int, gpus: int) -> None:
    """Issue 18: "a 4-pod x 4-GPU gang while every leaf is full but a spine has room: 0 of 4
    bound after 25 s" (and 11 x 2 alike). Now every member binds at once, in the one spine
    that holds the gang, not across the cluster."""
    clock = [1000.0]
    ext, standin = running(leaves_full_spine_has_room(), clock)
    pods = light_gang("g", count, gpus)
    out = standin.run(pods, clock=clock, idle_rounds=3)
    nodes = bound_promptly(out, pods, clock, 1000.0)
    assert {spine_of(n) for n in nodes} == {"s2"}
    assert len({n.split("-")[0] for n in nodes}) > 1, "no leaf could hold it"
    assert len(ext.reservations) == 0


@pytest.mark.parametrize(
    ("make", "key"),
    [
        (kueue_gang, "kueue.x-k8s.io/podset-preferred-topology"),
        (kueue_gang, "kai.scheduler/topology-preferred-placement"),
        (kueue_gang, "gputopo.io/preferred-topology"),
        (light_gang, "gputopo.io/preferred-topology"),
    ],
)
def test_a_gang_preferring_a_leaf_no_leaf_holds_is_placed_in_a_larger_level(running, make, key: str) -> None:
    """Issue 18: a gang annotated Kueue's (or KAI's, or gputopo's) preferred topology at the
    leaf, that no leaf can hold: 0 of 3 bound after 30 s. Preferred means the best domain now,
    falling back level by level, as Kueue and KAI place it: bound at once in spine s2."""
    clock = [1000.0]
    _, standin = running(leaves_full_spine_has_room(), clock)
    pods = make("p", 3, 4, {key: LEAF})
    out = standin.run(pods, clock=clock, idle_rounds=3)
    nodes = bound_promptly(out, pods, clock, 1000.0)
    assert {spine_of(n) for n in nodes} == {"s2"} and len(nodes) == 3


def test_a_preferred_leaf_that_holds_the_gang_is_taken(running) -> None:
    """Preferring the leaf still means the leaf where one holds the gang: two members of 2 GPUs
    fit the 4 free GPUs of one leaf's first node, or its first two nodes."""
    clock = [1000.0]
    _, standin = running(leaves_full_spine_has_room(), clock)
    pods = kueue_gang("p", 3, 2, {"kueue.x-k8s.io/podset-preferred-topology": LEAF})
    out = standin.run(pods, clock=clock, idle_rounds=3)
    nodes = bound_promptly(out, pods, clock, 1000.0)
    assert len({n.split("-")[0] for n in nodes}) == 1, "one leaf"


@pytest.mark.parametrize(
    ("make", "key"),
    [
        (light_gang, "gputopo.io/required-topology"),
        (kueue_gang, "kueue.x-k8s.io/podset-required-topology"),
        (kueue_gang, "kai.scheduler/topology-required-placement"),
    ],
)
def test_a_required_leaf_still_waits_however_long(running, make, key: str) -> None:
    """A required level is a constraint, not a preference: the gang waits for one leaf that
    holds it, for hours of the stand-in's clock, and binds nothing meanwhile (all or nothing)."""
    clock = [1000.0]
    ext, standin = running(leaves_full_spine_has_room(), clock)
    pods = make("r", 4, 4, {key: LEAF})
    out = standin.run(pods, clock=clock, tick_s=3600.0, idle_rounds=6)
    assert out.bound == {}
    assert any("does not fit" in r for r in out.pending.values()), out.pending
    assert "ml/r" not in ext.plans


def test_a_required_spine_is_placed_now(running) -> None:
    clock = [1000.0]
    _, standin = running(leaves_full_spine_has_room(), clock)
    pods = light_gang("r", 4, 4, {"gputopo.io/required-topology": SPINE})
    out = standin.run(pods, clock=clock, idle_rounds=3)
    assert {spine_of(n) for n in bound_promptly(out, pods, clock, 1000.0)} == {"s2"}


@pytest.mark.parametrize(("count", "gpus"), [(4, 4), (11, 2)])
def test_a_pods_topology_wait_opts_into_waiting_for_a_leaf(running, count: int, gpus: int) -> None:
    """gputopo.io/topology-wait: 1h opts this gang into the wait the default no longer makes:
    it waits for one leaf (its own level), binds nothing, and after the hour takes the spine."""
    clock = [1000.0]
    _, standin = running(leaves_full_spine_has_room(), clock)
    pods = light_gang("w", count, gpus, {WAIT: "1h"})
    out = standin.run(pods, clock=clock, tick_s=60.0, idle_rounds=10)
    assert out.bound == {} and clock[0] - 1000.0 < 3600.0
    assert any(f"waiting for one leaf domain to hold all {count} members" in r for r in out.pending.values())
    out = standin.run(pods, clock=clock, tick_s=600.0, idle_rounds=10)
    assert len(out.bound) == count and {spine_of(n) for n in out.bound.values()} == {"s2"}
    assert clock[0] - 1000.0 >= 3600.0


def test_the_clusters_spill_after_opts_every_gang_in_and_a_pod_can_opt_out(running) -> None:
    """--gang-spill-after > 0 makes every gang without a required level wait for its own level;
    a pod's gputopo.io/topology-wait: 0s places its gang now all the same."""
    clock = [1000.0]
    _, standin = running(leaves_full_spine_has_room(), clock, spill_after_s=86_400.0)
    out = standin.run(light_gang("w", 4, 4), clock=clock, idle_rounds=3)
    assert out.bound == {}
    assert all("waiting for one leaf domain" in out.pending[f"ml/w-{i}"] for i in range(4))
    now = light_gang("n", 4, 4, {WAIT: "0s"})
    out = standin.run(now, clock=clock, idle_rounds=3)
    assert set(out.bound) == {f"ml/n-{i}" for i in range(4)}
    assert {spine_of(n) for n in out.bound.values()} == {"s2"}


def single_pod_node() -> FileState:
    """A DGX-1 with 5 GPUs free whose set is not the node's best ring for 5 (an emptier DGX-1
    gives a better one: the ring wait's case), and a node with nothing free."""
    nodes = [
        {
            "name": "v",
            "labels": {HOSTNAME: "v", LEAF: "l1", SPINE: "s1"},
            "gpus": "dgx1-v100",
            "allocated": [0, 1, 2],
        },
        {
            "name": "full",
            "labels": {HOSTNAME: "full", LEAF: "l1", SPINE: "s1"},
            "gpus": "dgx1-v100",
            "allocated": list(range(8)),
        },
    ]
    return from_cluster(parse_cluster({"levels": list(LEVELS), "nodes": nodes}))


def test_a_single_pod_takes_all_five_free_gpus_of_a_node_now(running) -> None:
    """Issue 18: a single pod asking for all 5 free GPUs of a node was refused there, because
    an emptier node would give it a better ring some day. Now it binds there at once; opted in
    (per cluster), the ring wait still holds it back."""
    clock = [1000.0]
    _, standin = running(single_pod_node(), clock)
    pod = fk.pod("ml", "five", 5)
    out = standin.run([pod], clock=clock, idle_rounds=3)
    assert out.bound == {"ml/five": "v"} and clock[0] - 1000.0 <= 1.0
    clock = [1000.0]
    _, standin = running(single_pod_node(), clock, spill_after_s=86_400.0)
    answers: list[dict[str, Any]] = []
    standin.after_filter = lambda _pod, res: answers.append(res)
    out = standin.run([fk.pod("ml", "five", 5)], clock=clock, idle_rounds=3)
    assert out.bound == {} and answers
    assert all("best ring (ringwait)" in a["FailedNodes"]["v"] for a in answers)


def test_live_a_kueue_gang_preferring_a_leaf_binds_through_the_api_in_the_spine_that_holds_it() -> None:
    """The issue's Kueue case as a new user meets it, in live mode: nodes publishing their
    annotation, pods grouped by Kueue's label and count and preferring the leaf, all on the
    fake API server, watched through the official client; the stand-in schedules them over
    HTTP and every binding reaches the API. No leaf has room for 3 x 4 GPUs, spine s2 has."""
    spines = {"s1": ("l1", "l2"), "s2": ("l3", "l4", "l5")}
    clock = [NOW]
    with fk.running() as (api, _, api_client):
        for spine, leaves in spines.items():
            for leaf in leaves:
                for i, allocated in enumerate(((0, 1, 2, 3), tuple(range(8)))):
                    name = f"{leaf}-n{i}"
                    note = {"gputopo.io/topology": live_annotation(name, allocated)}
                    api.put("nodes", fk.node(name, {LEAF: leaf, SPINE: spine}, annotations=note))
        pods = kueue_gang("k", 3, 4, {"kueue.x-k8s.io/podset-preferred-topology": LEAF})
        for p in pods:
            api.put("pods", p)
        state = KubeState(api_client, clock=lambda: clock[0], watch_timeout_s=5, backoff_s=(0.05, 0.2))
        server = Server(Extender(state, clock=lambda: clock[0]), "127.0.0.1", 0)
        standin = None
        try:
            state.start()
            wait_until(state.ready)
            server.start()
            standin = StandIn(*server.address, sorted(state.snapshot().nodes))
            out = standin.run(pods, clock=clock, idle_rounds=3)
            nodes = bound_promptly(out, pods, clock, NOW)
            assert {n.split("-")[0] for n in nodes} <= set(spines["s2"]) and len(nodes) == 3
            assert sorted(api.bindings) == sorted(out.bound.items())
        finally:
            if standin is not None:
                standin.close()
            server.stop()
            state.stop()
