"""The live sidecar (over its real HTTP server) and the simulator's SidecarPolicy plan a gang
alike for the same cluster: both drive one `GangTracker` holding one `ClusterObjective`, so the
cluster objective's tie order and the wait for a gang's own level are the same decision in
both. Each case is built so that the objective's answer is not what best fit alone gives."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from gputopo.network.cluster import parse_cluster
from gputopo.network.levels import HOSTNAME, LEAF, SPINE
from gputopo.node.allocator import AllocatorPool
from gputopo.sim.clusters import from_snapshot
from gputopo.sim.policies.base import Failure
from gputopo.sim.policies.sidecar import Lifecycle, SidecarPolicy
from gputopo.sim.state import ClusterState
from gputopo.sim.workload import Job
from scheduler.extender import Extender
from scheduler.picture.feed import from_cluster
from scheduler.web.server import Server
from tests import fake_apiserver as fk
from tests.test_scheduler_http import Client, args

LEVELS = (HOSTNAME, LEAF, SPINE)
WEEK = 7 * 86_400.0  # an opt-in wait for the own level (--gang-spill-after)
GROUP = "scheduling.x-k8s.io/pod-group"


def node(name: str, kind: str, leaf: str, allocated: list[int]) -> dict[str, Any]:
    return {
        "name": name,
        "labels": {HOSTNAME: name, LEAF: leaf, SPINE: "s"},
        "gpus": kind,
        "allocated": allocated,
    }


#: Two 1-GPU members: a DGX-1 with 4 GPUs free (best fit) and a PCIe box with 6 (the objective).
PAIR = [node("a-dgx1", "dgx1-v100", "a", [4, 5, 6, 7]), node("b-pcie", "pcie8-plx", "b", [6, 7])]
#: Two 8-GPU members: leaf a has one free node (spine only, now); leaf b two, one of them busy
#: until the test frees it. By default both place the gang now across the spine; opted into a
#: wait, both wait for leaf b, then take it.
WHOLE = [
    node("a-n0", "dgx-a100", "a", []),
    node("a-n1", "dgx-a100", "a", list(range(8))),
    node("b-n0", "dgx-a100", "b", []),
    node("b-n1", "dgx-a100", "b", list(range(8))),
]


def snapshot(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "levels": list(LEVELS),
        "nodes": nodes,
        "podgroups": [{"namespace": "ml", "name": "g", "minMember": 2}],
    }


@pytest.fixture
def sidecar() -> Iterator[Any]:
    servers: list[Server] = []

    def start(nodes: list[dict[str, Any]], spill_after_s: float = 0.0) -> tuple[Extender, Client]:
        state = from_cluster(parse_cluster(snapshot(nodes)))
        ext = Extender(state, LEVELS, clock=lambda: 1000.0, spill_after_s=spill_after_s)
        server = Server(ext, "127.0.0.1", 0)
        server.start()
        servers.append(server)
        return ext, Client(server)

    yield start
    for s in servers:
        s.stop()


def live_plan(
    ext: Extender, client: Client, gpus: int, names: list[str]
) -> list[tuple[str, tuple[int, ...]]] | str:
    """Filter both members as kube-scheduler would; the plan's (node, GPUs), or the reason."""
    out: dict[str, Any] = {}
    for i in range(2):
        _, out = client.post("/filter", args(fk.pod("ml", f"g-{i}", gpus, labels={GROUP: "g"}), names))
    if not out["NodeNames"]:
        return next(iter(out["FailedAndUnresolvableNodes"].values()))
    return sorted((p.node, tuple(sorted(p.gpus))) for p in ext.plans["ml/g"].placements)


def sim_plan(
    nodes: list[dict[str, Any]], gpus: int, spill_after_s: float = 0.0
) -> list[tuple[str, tuple[int, ...]]] | str:
    cluster = from_snapshot(parse_cluster(snapshot(nodes)))
    pool = AllocatorPool()
    policy = SidecarPolicy(
        "gputopo",
        cluster,
        [pool.get(t) for t in cluster.topologies],
        random.Random(0),
        planner=True,
        lifecycle=Lifecycle(spill_after_s=spill_after_s),
    )
    got = policy.place(ClusterState(cluster), Job(id=0, submit=0.0, duration=60.0, pods=(gpus, gpus)))
    if isinstance(got, Failure):
        return got.reason
    return sorted((cluster.nodes[n].name, tuple(sorted(g))) for n, g in got)


def test_the_objective_picks_the_same_node_in_the_sidecar_and_the_simulator(sidecar) -> None:
    ext, client = sidecar(PAIR)
    live = live_plan(ext, client, 1, ["a-dgx1", "b-pcie"])
    assert live == sim_plan(PAIR, 1)
    assert isinstance(live, list) and {n for n, _ in live} == {"b-pcie"}, "not best fit's a-dgx1"


def test_by_default_both_place_the_gang_now_in_the_smallest_level_that_holds_it(sidecar) -> None:
    """No leaf holds both members now: the defaults (no wait) place them across the spine at
    once, in the sidecar and the simulator alike (issue 18, "start when you can")."""
    ext, client = sidecar(WHOLE)
    names = [n["name"] for n in WHOLE]
    live = live_plan(ext, client, 8, names)
    assert live == sim_plan(WHOLE, 8)
    assert isinstance(live, list) and {n for n, _ in live} == {"a-n0", "b-n0"}
    assert ext.plans["ml/g"].level == SPINE


def test_both_wait_for_a_leaf_alike_and_plan_it_alike_once_it_frees(sidecar) -> None:
    ext, client = sidecar(WHOLE, WEEK)  # the cluster opts into the wait
    names = [n["name"] for n in WHOLE]
    live = live_plan(ext, client, 8, names)
    simulated = sim_plan(WHOLE, 8, WEEK)
    assert isinstance(live, str) and isinstance(simulated, str)
    assert "waiting for one leaf domain" in live and "waiting for one leaf domain" in simulated
    freed = [{**n, "allocated": []} if n["name"] == "b-n1" else n for n in WHOLE]
    ext, client = sidecar(freed, WEEK)
    live = live_plan(ext, client, 8, names)
    assert live == sim_plan(freed, 8, WEEK)
    assert isinstance(live, list) and {n for n, _ in live} == {"b-n0", "b-n1"}


def test_a_pods_topology_wait_overrides_the_sidecars_spill_after(sidecar) -> None:
    """gputopo.io/topology-wait over real HTTP: "0s" makes this gang take the spine at once
    where the sidecar was told to wait for a leaf; "1h" makes one gang wait where the sidecar's
    default places it now; a malformed value is refused with the annotation named, and nothing
    is planned."""
    ext, client = sidecar(WHOLE, WEEK)
    names = [n["name"] for n in WHOLE]
    wait = {"gputopo.io/topology-wait": "0s"}
    out: dict[str, Any] = {}
    for i in range(2):
        pod = fk.pod("ml", f"g-{i}", 8, labels={GROUP: "g"}, annotations=wait)
        _, out = client.post("/filter", args(pod, names))
    assert out["NodeNames"], out
    assert sorted(p.node for p in ext.plans["ml/g"].placements) == ["a-n0", "b-n0"]
    assert ext.plans["ml/g"].level == SPINE
    ext, client = sidecar(WHOLE)
    hour = {"gputopo.io/topology-wait": "1h"}
    for i in range(2):
        pod = fk.pod("ml", f"g-{i}", 8, labels={GROUP: "g"}, annotations=hour)
        _, out = client.post("/filter", args(pod, names))
    assert not out["NodeNames"] and "ml/g" not in ext.plans
    assert "waiting for one leaf domain" in next(iter(out["FailedAndUnresolvableNodes"].values()))
    ext, client = sidecar(WHOLE)
    bad = fk.pod("ml", "g-0", 8, labels={GROUP: "g"}, annotations={"gputopo.io/topology-wait": "soon"})
    status, out = client.post("/filter", args(bad, names))
    assert status == 400 and "gputopo.io/topology-wait must be a duration" in out["Error"], (status, out)
    assert "ml/g" not in ext.plans
