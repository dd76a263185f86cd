"""The simulator's sidecar path: kube-scheduler's score model, gangs through the GangTracker."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gputopo.network.levels import DEFAULT_LEVELS, HOSTNAME, LEAF, SPINE
from gputopo.node.allocator import AllocatorPool
from gputopo.node.topofile import load_preset
from gputopo.pod import kubesched
from gputopo.pod.placement import node_scores
from gputopo.sim.engine import RunConfig
from gputopo.sim.policies.catalog import build_policy
from gputopo.sim.policies.sidecar import Lifecycle, SidecarPolicy
from gputopo.sim.run import simulate
from gputopo.sim.state import ClusterState, SimCluster, SimNode
from gputopo.sim.workload import Job

ROOT = Path(__file__).resolve().parent.parent


def test_the_score_model_scales_the_extender_as_kube_scheduler_does() -> None:
    # 0..10 x weight 20 x (MaxNodeScore 100 / MaxExtenderPriority 10) = up to 2000
    assert kubesched.total_score(10, 0, 8) == 2000
    assert kubesched.total_score(0, 8, 8) == 100, "LeastAllocated alone: an empty node scores 100"
    assert kubesched.total_score(7, 3, 8) == 7 * 200 + 3 * 100 // 8
    assert kubesched.least_allocated(5, 0) == 0 and kubesched.least_allocated(9, 8) == 100


def test_select_host_takes_the_best_total_and_splits_ties_by_node_count() -> None:
    rng = random.Random(0)
    picks = Counter(kubesched.select_host([(5, 1), (9, 1), (9, 3), (9, 0)], rng) for _ in range(4000))
    assert set(picks) == {1, 2}, "only the best total, never an empty class"
    assert 0.2 < picks[1] / 4000 < 0.3, "a class of 3 nodes wins 3 times as often as one of 1"
    assert kubesched.select_host([], rng) == -1


def small_cluster() -> SimCluster:
    topos = (load_preset("dgx-a100"), load_preset("hgx-h100"))
    nodes = tuple(
        SimNode(f"n{i}", i % 2, {HOSTNAME: f"n{i}", LEAF: f"l{i // 4}", SPINE: "s"}) for i in range(8)
    )
    return SimCluster(topologies=topos, nodes=nodes, levels=DEFAULT_LEVELS)


@settings(max_examples=40, deadline=None)
@given(busy=st.lists(st.integers(0, 7), min_size=8, max_size=8), size=st.sampled_from([1, 2, 3, 4, 8]))
def test_a_single_pod_goes_to_a_node_with_the_best_kube_scheduler_total(busy: list[int], size: int) -> None:
    """Oracle: score every node one by one (no classes) and check the choice is among the best."""
    c = small_cluster()
    state = ClusterState(c)
    for i, b in enumerate(busy):
        if b:
            state.take(i, tuple(range(b)))
    pool = AllocatorPool()
    policy = build_policy("gputopo", c, pool, random.Random(1))
    assert isinstance(policy, SidecarPolicy)
    got = policy.place_pod(state, size)
    fits = [i for i in range(8) if state.mask[i].bit_count() >= size]
    if not fits:
        assert not isinstance(got, tuple)
        return
    assert isinstance(got, tuple)
    views = [policy._view(i, state.mask[i]) for i in fits]
    ext = node_scores(size, views, objective=policy.objective)  # the extender as deployed
    totals = {
        i: kubesched.total_score(ext[v.name], len(v.free) - size, v.gpu_count)
        for i, v in zip(fits, views, strict=True)
    }
    node, gpus = got
    assert totals[node] == max(totals.values())
    assert len(gpus) == size and set(gpus) <= set(state.free(node))


def gang_jobs(count: int = 60) -> list[Job]:
    rng = random.Random(4)
    jobs = []
    for i in range(count):
        pods = (8,) * rng.choice([2, 3, 4]) if i % 3 == 0 else (rng.choice([1, 2, 4]),)
        jobs.append(Job(id=i, submit=float(i * 30), duration=600.0, pods=pods))
    return jobs


def run(lifecycle: Lifecycle, seed: int = 0):
    return simulate(small_cluster(), gang_jobs(), "gputopo", RunConfig(seed=seed, lifecycle=lifecycle))


def test_injected_bind_failures_are_replanned_and_gangs_stay_whole() -> None:
    calm = run(Lifecycle(bind_failure_rate=0.0))
    rough = run(Lifecycle(bind_failure_rate=0.3))
    assert calm.extra["bind_failures_injected"] == 0 and calm.extra["replans_after_bind_failure"] == 0
    assert rough.extra["bind_failures_injected"] > 0
    assert rough.extra["replans_after_bind_failure"] > 0
    assert rough.placed == calm.placed == 60, "every job placed, whole (the engine takes all slots or none)"
    assert run(Lifecycle(bind_failure_rate=0.3)).extra == rough.extra, "seeded: the same run twice"


def test_a_short_reservation_ttl_expires_plans_that_bind_slowly() -> None:
    slow = run(Lifecycle(bind_failure_rate=0.4, reservation_ttl_s=1.5))
    assert slow.extra["reservations_expired"] > 0 and slow.extra["replans_after_expiry"] > 0
    assert run(Lifecycle(bind_failure_rate=0.4)).extra["reservations_expired"] == 0


def test_members_arriving_over_time_wait_for_quorum() -> None:
    spread = run(Lifecycle(arrival_spread_s=20.0))
    gangs = sum(1 for j in gang_jobs() if j.is_gang)
    assert spread.extra["gangs_waited_for_quorum"] == gangs
    assert 0 < spread.extra["quorum_wait_s_mean"] <= 20.0
    assert run(Lifecycle(arrival_spread_s=0.0)).extra["gangs_waited_for_quorum"] == 0


def test_lifecycle_values_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError, match="bind failure rate"):
        Lifecycle(bind_failure_rate=1.0)
    with pytest.raises(ValueError, match="TTL"):
        Lifecycle(reservation_ttl_s=0.0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bind-failure-rate", "1.5"], "--bind-failure-rate must be between 0 and 0.9"),
        (["--bind-failure-rate", "nan"], "--bind-failure-rate must be between"),
        (["--gang-spread", "-1"], "--gang-spread must be between 0 and 86400"),
        (["--reservation-ttl", "0"], "--reservation-ttl must be more than 0"),
        (["--reservation-ttl", "inf"], "--reservation-ttl must be more than 0"),
        (["--gang-spread", "soon"], "argument --gang-spread: invalid float value"),
    ],
)
def test_bad_lifecycle_flags_exit_2_with_one_line(args: list[str], message: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "gputopo.sim", *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr and r.stdout == ""


def test_the_table_shows_the_lifecycle_figures() -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "gputopo.sim",
            "--pods",
            "400",
            "--policies",
            "gputopo,kubelet-default",
            "--bind-failure-rate",
            "0.2",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**os.environ, "COLUMNS": "120"},  # both policies in one block (pytest's COLUMNS is 80)
    )
    assert r.returncode == 0, r.stderr
    rows = {line[:40].strip(): line[40:].split() for line in r.stdout.splitlines()}
    assert rows["re-plans after bind failures"][1] == "n/a", "baselines do not model the lifecycle"
    assert int(rows["gangs that waited for quorum"][0].replace(",", "")) > 0
    assert (
        "gang lifecycle: members created within 10 s, reservation TTL 120 s, bind failure rate 0.2"
        in r.stdout
    )
