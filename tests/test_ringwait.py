"""A multi-GPU pod waits for a node that gives it that node's best ring (gputopo.pod.ringwait): the
rule against a brute-force oracle, its clock, and both callers — the simulator's sidecar policy
and the real sidecar's filter over HTTP."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gputopo.jobtime.model import comm_s, intra_busbw_gbps, step_s
from gputopo.jobtime.profiles import PROFILE_MIXES, PROFILES, Profile
from gputopo.network.cluster import parse_cluster
from gputopo.network.levels import DEFAULT_LEVELS, HOSTNAME, LEAF, SPINE
from gputopo.network.nodeview import ChoiceMemo
from gputopo.node.allocator import AllocatorPool
from gputopo.node.topofile import load_preset
from gputopo.pod.objective import CommProfile
from gputopo.pod.ringwait import RingWait
from gputopo.sim.policies.base import Failure
from gputopo.sim.policies.sidecar import Lifecycle, SidecarPolicy
from gputopo.sim.state import ClusterState, SimCluster, SimNode
from gputopo.sim.workload import Job
from scheduler.picture.feed import from_cluster
from tests import fake_apiserver as fk
from tests.test_scheduler_http import args, serve  # noqa: F401  (the fixture)

POOL = AllocatorPool()
BAND = 0.05
WEEK = 7 * 86_400.0
#: PCIe box: GPUs 0-3 on one socket, 4-7 on the other, PLX pairs (0,1) (2,3) (4,5) (6,7).
CROSS_SOCKET = [2, 3, 6, 7]  # allocated: the free four straddle the sockets


def oracle_good(name: str, free: frozenset[int], gpus: int) -> bool:
    """Every `gpus`-subset of `free`, every one of the whole node: the best ring each reaches,
    each ring read as the best all-reduce busbw any `gpus`-subset of the node reaches at that
    ring (the job-time model set by set), and the two compared as the expected ratio of step
    times over the default mix of workload profiles."""
    alloc = POOL.get(load_preset(name))
    subsets = list(itertools.combinations(range(alloc.n), gpus))
    here = max(alloc.ring_mbps(s) for s in itertools.combinations(sorted(free), gpus))
    best = max(alloc.ring_mbps(s) for s in subsets)

    def busbw(ring: int) -> float:
        return max(intra_busbw_gbps(alloc.topology, s, ring) for s in subsets if alloc.ring_mbps(s) == ring)

    def step(p: Profile, bw: float) -> float:
        return step_s(p.compute_s, p.overlap, comm_s(p.grad_bytes, gpus, bw))

    shares = PROFILE_MIXES["default"]
    total = sum(shares.values())
    eff = sum(
        v / total * step(PROFILES[k], busbw(best)) / step(PROFILES[k], busbw(here)) for k, v in shares.items()
    )
    return min(eff, 1.0) >= 1 - BAND


@settings(max_examples=150, deadline=None)
@given(
    name=st.sampled_from(["pcie8-plx", "dgx1-v100", "hgx-h100", "l40s-nv4-pairs-4numa"]),
    free=st.sets(st.integers(0, 7), min_size=2),
    data=st.data(),
)
def test_a_node_is_good_when_its_best_set_is_within_the_band_of_the_empty_nodes(
    name: str, free: set[int], data: st.DataObject
) -> None:
    gpus = data.draw(st.integers(2, len(free)))
    wait = RingWait(CommProfile(), BAND, WEEK)
    alloc = POOL.get(load_preset(name))
    assert wait.good(alloc, frozenset(free), gpus) == oracle_good(name, frozenset(free), gpus)
    # asked through a caller's memo (the simulator's): the same verdict, the memo holds the set
    memo, fresh = ChoiceMemo(), RingWait(CommProfile(), BAND, WEEK)
    assert fresh.good(alloc, frozenset(free), gpus, memo) == oracle_good(name, frozenset(free), gpus)
    assert memo.choose(alloc, frozenset(free), gpus) == alloc.choose(sorted(free), gpus) and len(memo) == 1


def test_the_pcie_box_straddling_its_sockets_is_not_good_for_four_but_is_for_two() -> None:
    alloc = POOL.get(load_preset("pcie8-plx"))
    wait = RingWait(CommProfile(), BAND, WEEK)
    assert not wait.good(alloc, frozenset({0, 1, 4, 5}), 4), "6 GB/s across the sockets, 20 inside one"
    assert wait.good(alloc, frozenset({0, 1, 2, 3}), 4)
    assert wait.good(alloc, frozenset({1, 2}), 2), "20 GB/s vs 24: a 3 % slower step is within the band"
    assert not wait.good(alloc, frozenset({1, 5}), 2)
    assert wait.good(None, frozenset({1, 5}), 2), "unknown topology: nothing to judge it by"
    assert wait.good(alloc, frozenset({5}), 1), "a 1-GPU pod has no ring"


def test_the_wait_starts_at_the_first_decline_and_ends_after_the_spill() -> None:
    wait = RingWait(CommProfile(), BAND, 100.0)
    assert not wait.held("p", False, 10.0) and len(wait) == 0, "nothing declined: no wait starts"
    assert wait.held("p", True, 50.0)
    assert wait.held("p", True, 149.0), "100 s from the first decline, not from the last"
    assert not wait.held("p", True, 150.0), "spilled: takes what there is"
    wait.forget("p")
    assert wait.held("p", True, 150.0), "placed and forgotten: a new wait"
    assert not RingWait(CommProfile(), BAND, 0.0).held("q", True, 0.0), "spill 0: the rule is off"


def test_the_remembered_pods_are_bounded_oldest_out() -> None:
    wait = RingWait(CommProfile(), BAND, 100.0, max_held=3)
    for i in range(5):
        wait.held(i, True, float(i))
    assert len(wait) == 3
    assert wait.held(0, True, 120.0), "pod 0 fell out: its wait starts again"


@pytest.mark.parametrize("band, spill", [(-0.1, 1.0), (1.0, 1.0), (0.05, -1.0), (0.05, float("nan"))])
def test_bad_settings_are_refused(band: float, spill: float) -> None:
    with pytest.raises(ValueError):
        RingWait(CommProfile(), band, spill)


# ------------------------------------------------------------------------------ simulator


def pcie_cluster(nodes: int) -> SimCluster:
    topos = (load_preset("pcie8-plx"),)
    return SimCluster(
        topologies=topos,
        nodes=tuple(SimNode(f"n{i}", 0, {HOSTNAME: f"n{i}", LEAF: "l", SPINE: "s"}) for i in range(nodes)),
        levels=DEFAULT_LEVELS,
    )


def policy(cluster: SimCluster, spill: float) -> SidecarPolicy:
    allocs = [POOL.get(t) for t in cluster.topologies]
    return SidecarPolicy(
        "gputopo", cluster, allocs, random.Random(0), planner=True, lifecycle=Lifecycle(spill_after_s=spill)
    )


def test_a_four_gpu_pod_waits_for_a_socket_then_spills() -> None:
    c = pcie_cluster(1)
    state = ClusterState(c)
    state.take(0, CROSS_SOCKET)
    p = policy(c, 1000.0)
    job = Job(id=1, submit=0.0, duration=10.0, pods=(4,))
    state.now = 5.0
    got = p.place(state, job)
    assert isinstance(got, Failure) and "best ring" in got.reason
    state.now = 1004.0
    assert isinstance(p.place(state, job), Failure), "999 s after the first decline: still held"
    state.now = 1005.0
    assert p.place(state, job) == [(0, (0, 1, 4, 5))], "spilled: the set there is"
    assert len(p.ring_wait) == 0, "placed: forgotten"


def test_a_pod_held_to_its_best_ring_takes_the_node_that_gives_it() -> None:
    c = pcie_cluster(2)
    state = ClusterState(c)
    state.take(0, CROSS_SOCKET)  # n0: four free across the sockets (emptier than n1 too)
    state.take(1, [4, 5, 6, 7, 0])  # n1: three free, no room
    p = policy(c, WEEK)
    job = Job(id=1, submit=0.0, duration=10.0, pods=(4,))
    assert isinstance(p.place(state, job), Failure)
    state.give(1, [0])  # n1's socket 0 is whole again
    assert p.place(state, job) == [(1, (0, 1, 2, 3))]


def test_one_gpu_pods_gang_members_and_a_zero_spill_never_wait() -> None:
    c = pcie_cluster(2)
    state = ClusterState(c)
    state.take(0, CROSS_SOCKET)
    state.take(1, CROSS_SOCKET)
    got = policy(c, 0.0).place(state, Job(1, 0.0, 10.0, (4,)))
    assert not isinstance(got, Failure) and got[0][1] == (0, 1, 4, 5), "spill 0 (fill mode): no wait"
    held = policy(c, WEEK)
    assert not isinstance(held.place(state, Job(2, 0.0, 10.0, (1,))), Failure)
    members = SidecarPolicy(
        "gang-only", c, [POOL.get(c.topologies[0])], random.Random(0), planner=False, lifecycle=Lifecycle()
    )
    got = members.place(state, Job(3, 0.0, 10.0, (4, 4)))
    assert not isinstance(got, Failure), "a gang's members wait for their level, not for a ring"


# ------------------------------------------------------------------------ the real sidecar


def http_cluster() -> Any:
    nodes = [
        {
            "name": "cross",
            "labels": {LEAF: "l1", SPINE: "s1"},
            "gpus": "pcie8-plx",
            "allocated": CROSS_SOCKET,
        },
        {
            "name": "socket",
            "labels": {LEAF: "l1", SPINE: "s1"},
            "gpus": "pcie8-plx",
            "allocated": [4, 5, 6, 7],
        },
        {"name": "bare", "labels": {LEAF: "l1", SPINE: "s1"}, "gpus": 8, "allocated": [0, 1, 2, 3]},
    ]
    return from_cluster(parse_cluster({"nodes": nodes}))


def test_by_default_a_multi_gpu_pod_takes_any_node_that_fits_now(serve) -> None:  # noqa: F811
    """The ring wait is opt-in (issue 18): with the sidecar's defaults no node with room is
    filtered out for its ring, and a pod the straddling node alone can take is placed there."""
    client, ext = serve(http_cluster())
    _, out = client.post("/filter", args(fk.pod("ml", "p", 4), ["cross", "socket", "bare"]))
    assert out["NodeNames"] == ["cross", "socket", "bare"] and out["FailedNodes"] == {}
    _, out = client.post("/filter", args(fk.pod("ml", "q", 4), ["cross"]))
    assert out["NodeNames"] == ["cross"] and len(ext.ring_wait) == 0


def test_the_filter_holds_a_multi_gpu_pod_to_the_nodes_at_their_best_ring(serve) -> None:  # noqa: F811
    clock = [1000.0]
    client, _ = serve(http_cluster(), clock, spill_after_s=WEEK)  # the cluster opts in
    status, out = client.post("/filter", args(fk.pod("ml", "p", 4), ["cross", "socket", "bare"]))
    assert status == 200
    assert out["NodeNames"] == ["socket", "bare"], "unknown topology is never held back"
    assert out["FailedNodes"] == {
        "cross": "waiting 0 s for a node that gives 4 GPUs its best ring (ringwait)"
    }
    _, out = client.post("/filter", args(fk.pod("ml", "q", 1), ["cross", "socket"]))
    assert out["NodeNames"] == ["cross", "socket"], "a 1-GPU pod has no ring to wait for"


def test_the_filter_waits_then_spills_after_the_gangs_spill_time(serve) -> None:  # noqa: F811
    clock = [1000.0]
    client, _ = serve(http_cluster(), clock, spill_after_s=WEEK)
    pod = fk.pod("ml", "p", 4)
    _, out = client.post("/filter", args(pod, ["cross"]))
    assert out["NodeNames"] == [] and "best ring" in out["FailedNodes"]["cross"]
    clock[0] += WEEK - 1
    _, out = client.post("/filter", args(pod, ["cross"]))
    assert out["NodeNames"] == [] and "waiting 604799 s" in out["FailedNodes"]["cross"]
    clock[0] += 1
    _, out = client.post("/filter", args(pod, ["cross"]))
    assert out["NodeNames"] == ["cross"] and out["FailedNodes"] == {}
    other = fk.pod("ml", "p", 4, uid="uid-recreated")
    _, out = client.post("/filter", args(other, ["cross"]))
    assert out["NodeNames"] == [], "the same name with a new uid is a new pod: a new wait"


def test_a_pods_topology_wait_bounds_its_own_ring_wait(serve) -> None:  # noqa: F811
    """gputopo.io/topology-wait is the pod's own bound, as for a gang's level: "0s" takes the
    straddling node at once where the cluster opted into a week's wait, and "1h" opts one pod
    into a wait the sidecar's default does not make, giving up after an hour."""
    clock = [1000.0]
    waiting, _ = serve(http_cluster(), clock, spill_after_s=WEEK)
    now = fk.pod("ml", "now", 4, annotations={"gputopo.io/topology-wait": "0s"})
    _, out = waiting.post("/filter", args(now, ["cross"]))
    assert out["NodeNames"] == ["cross"]
    _, out = waiting.post("/filter", args(fk.pod("ml", "plain", 4), ["cross"]))
    assert out["NodeNames"] == [], "without the annotation the cluster's wait applies"
    client, _ = serve(http_cluster(), clock)  # the default: no wait unless the pod asks
    hour = fk.pod("ml", "hour", 4, annotations={"gputopo.io/topology-wait": "1h"})
    _, out = client.post("/filter", args(hour, ["cross"]))
    assert out["NodeNames"] == []
    clock[0] += 3600
    _, out = client.post("/filter", args(hour, ["cross"]))
    assert out["NodeNames"] == ["cross"]
    bad = fk.pod("ml", "bad", 4, annotations={"gputopo.io/topology-wait": "1 week"})
    status, out = client.post("/filter", args(bad, ["cross"]))
    assert status == 400 and "topology-wait must be a duration" in out["Error"]


def test_a_bound_pod_ends_its_ring_wait(serve) -> None:  # noqa: F811
    """The wait's memory is the sidecar's own state: a bind over HTTP removes the pod from it."""
    clock = [1000.0]
    client, ext = serve(http_cluster(), clock, spill_after_s=WEEK)
    pod = fk.pod("ml", "p", 4)
    _, out = client.post("/filter", args(pod, ["cross", "socket"]))
    assert out["NodeNames"] == ["socket"] and len(ext.ring_wait) == 1
    body = {"PodName": "p", "PodNamespace": "ml", "PodUID": pod["metadata"]["uid"], "Node": "socket"}
    assert client.post("/bind", body) == (200, {"Error": ""})
    assert len(ext.ring_wait) == 0
