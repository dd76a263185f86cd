"""The event loop and its metrics on tiny clusters whose answers are known by hand."""

from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gputopo.jobtime.model import DEFAULT_OVERSUBSCRIPTION, comm_s, step_s
from gputopo.jobtime.profiles import Profile
from gputopo.network.levels import DEFAULT_LEVELS, HOSTNAME, LEAF, SPINE
from gputopo.node.allocator import AllocatorPool
from gputopo.node.topofile import load_preset
from gputopo.sim.engine import RunConfig, queue_priority, run_replay
from gputopo.sim.jobmodel import JobModel
from gputopo.sim.metrics import Recorder, Summary
from gputopo.sim.policies.base import Failure, Hinted
from gputopo.sim.policies.catalog import build_policy
from gputopo.sim.run import compare, simulate
from gputopo.sim.state import ClusterState, SimCluster, SimNode
from gputopo.sim.workload import Job

POLICIES = ("gputopo", "kubelet-default", "best-effort-pairs", "best-combo", "gang-only")


#: The old fixed workload, as one custom profile: 1 GB all-reduced, 0.2 s compute, no overlap.
ONE_GB = Profile("custom", grad_bytes=1e9, compute_s=0.2, overlap=0.0)


def _step(gpus: int, busbw: float) -> float:
    return step_s(ONE_GB.compute_s, ONE_GB.overlap, comm_s(ONE_GB.grad_bytes, gpus, busbw))


def cluster(preset: str, nodes: list[tuple[str, str, frozenset[int]]]) -> SimCluster:
    """Nodes as (name, leaf, allocated GPUs), all of one preset, one spine."""
    return SimCluster(
        topologies=(load_preset(preset),),
        nodes=tuple(
            SimNode(name, 0, {HOSTNAME: name, LEAF: leaf, SPINE: "spine-1"}, allocated)
            for name, leaf, allocated in nodes
        ),
        levels=DEFAULT_LEVELS,
    )


def job(i: int, pods: tuple[int, ...], submit: float = 0.0, duration: float = 100.0) -> Job:
    return Job(id=i, submit=submit, duration=duration, pods=pods)


def by_policy(results: list) -> dict:
    return {r.policy: r for r in results}


def test_network_aware_gang_stays_in_one_leaf_and_runs_faster() -> None:
    # name order interleaves the leaves, so a network-blind first fit splits the gang
    c = cluster(
        "hgx-h100",
        [
            ("n1", "a", frozenset()),
            ("n2", "b", frozenset()),
            ("n3", "a", frozenset()),
            ("n4", "b", frozenset(range(4))),
        ],
    )
    # a 2:1 oversubscribed spine (the default spine is non-blocking, docs/jobtime.md)
    model = JobModel(custom=ONE_GB, oversubscription={**DEFAULT_OVERSUBSCRIPTION, SPINE: 2.0})
    res = by_policy(compare(c, [job(0, (8, 8))], POLICIES, RunConfig(comm=model)))
    assert res["gputopo"].gangs == 1 and res["gputopo"].gangs_one_leaf == 1.0
    for name in ("kubelet-default", "best-effort-pairs", "gang-only"):
        assert res[name].gangs_one_leaf == 0.0, name
        assert res[name].gangs_one_spine == 1.0, name
    # 8 x 400 Gb/s IB at 0.92 = 368 GB/s per node, halved above the leaf; in the leaf the
    # NVSwitch ring (450 x 0.8 = 360 GB/s) is the slower part
    spine, leaf = _step(16, 368 / 2), _step(16, 360.0)
    assert res["kubelet-default"].job_time_ratio == pytest.approx(spine / leaf)
    assert res["gputopo"].job_time_ratio == pytest.approx(1.0)
    assert res["gputopo"].throughput_vs_baseline == pytest.approx(spine / leaf)
    assert res["kubelet-default"].throughput_vs_baseline == pytest.approx(1.0)


def test_padded_group_fails_admission_and_the_job_waits() -> None:
    # free {0,1,4,5,6} of an NV12-pairs node: go-gpuallocator answers [4, 5, nil] for 3 GPUs
    c = cluster("a100-pcie-nvlink-pairs", [("n1", "a", frozenset({2, 3, 7}))])
    res = by_policy(compare(c, [job(0, (3,))], POLICIES, RunConfig()))
    assert res["best-effort-pairs"].admission_failures == 1
    assert res["best-effort-pairs"].never_started == 1 and res["best-effort-pairs"].placed == 0
    assert res["gputopo"].placed == 1 and res["gputopo"].admission_failures == 0
    # gputopo keeps the NVLink pair 4-5 in the set: the ring is still SYS (6 GB/s) but best-ring
    # of an empty node for 3 GPUs is SYS too, so it counts as best
    assert res["gputopo"].best_ring_share == 1.0


def test_fragmentation_at_first_failure_spread_vs_binpack() -> None:
    """Fill mode: two 1-GPU pods, then an 8-GPU pod, on two 8-GPU nodes."""
    c = cluster("rtx4090-8-allsys", [("n1", "a", frozenset()), ("n2", "a", frozenset())])
    jobs = [
        job(0, (1,), 0, math.inf),
        job(1, (1,), 1, math.inf),
        job(2, (8,), 2, math.inf),
        job(3, (8,), 3, math.inf),
    ]
    res = by_policy(compare(c, jobs, ("kubelet-default", "best-combo"), RunConfig(mode="fill")))
    spread, packed = res["kubelet-default"], res["best-combo"]
    # spreading puts one pod on each node: the 8-GPU pod fails with 14 GPUs free
    assert spread.free_at_first_failure == 14 and spread.rejected == 2 and spread.placed == 2
    # bin-packing keeps n2 whole; the last 8-GPU pod fails with only 6 free, which is not
    # fragmentation (not enough GPUs in total), so no FGD figure
    assert packed.placed == 3 and packed.rejected == 1 and packed.free_at_first_failure is None
    assert spread.fragmented_jobs == 0.5 and packed.fragmented_jobs == 0.0
    assert spread.queue_delay_mean is None  # fill mode has no queue


def test_queueing_delay_and_departures() -> None:
    c = cluster("hgx-h100", [("n1", "a", frozenset())])
    jobs = [job(0, (8,), 0, 100), job(1, (8,), 10, 50), job(2, (4,), 20, 10), job(3, (4,), 20, 10)]
    r = simulate(c, jobs, "gputopo", RunConfig())
    # job 1 waits until 100; jobs 2 and 3 wait for job 1 (ends at 150), then run side by side
    assert r.placed == 4 and r.never_started == 0
    assert r.queue_delay_mean == pytest.approx((0 + 90 + 130 + 130) / 4)
    assert r.best_ring_share == 1.0 and r.job_time_ratio == pytest.approx(1.0)


def test_ring_metrics_against_the_empty_node_best() -> None:
    # DGX-1: the best pair is an NV2 pair (50 GB/s); best-combo's pair sum finds one too
    c = cluster("dgx1-v100", [("n1", "a", frozenset())])
    jobs = [job(0, (2,), 0, math.inf)]
    res = by_policy(compare(c, jobs, ("gputopo", "best-combo"), RunConfig(mode="fill")))
    assert res["gputopo"].best_ring_share == 1.0 and res["gputopo"].ring_over_best == 1.0
    assert res["best-combo"].best_ring_share == 1.0
    # a 3-GPU pod taken from {1, 4, 6} only: SYS hops, far below the empty-node best of 3
    c2 = cluster("dgx1-v100", [("n1", "a", frozenset({0, 2, 3, 5, 7}))])
    r = simulate(c2, [job(0, (3,), 0, math.inf)], "gputopo", RunConfig(mode="fill"))
    assert r.best_ring_share == 0.0
    assert r.ring_over_best == pytest.approx(6 / 25)  # SYS 6 GB/s vs an NV1 ring of 25 GB/s


def test_same_arrivals_and_seed_give_the_same_answer() -> None:
    c = cluster("dgx1-v100", [(f"n{i}", "ab"[i % 2], frozenset()) for i in range(4)])
    jobs = [job(i, ((1, 2, 4, 8)[i % 4],), submit=i * 5.0, duration=40.0 + i) for i in range(40)]
    a = simulate(c, jobs, "kubelet-default", RunConfig(seed=3), clock=lambda: 0.0)
    b = simulate(c, jobs, "kubelet-default", RunConfig(seed=3), clock=lambda: 0.0)
    assert a == b
    assert a.placed == 40


def test_cluster_state_classes_and_fit() -> None:
    c = cluster("hgx-h100", [("n1", "a", frozenset()), ("n2", "a", frozenset({0}))])
    s = ClusterState(c)
    assert s.free_total == 15 and s.slots(8) == 1 and s.could_fit((8,)) and not s.could_fit((8, 8))
    assert set(s.classes) == {(0, 0xFF), (0, 0xFE)}
    s.take(0, (0,))
    assert s.classes[(0, 0xFE)] == {0, 1}
    with pytest.raises(ValueError, match="not free"):
        s.take(0, (0,))
    s.give(0, (0,))
    assert s.free_total == 15 and s.hist[8] == 1 and s.hist[7] == 1


def test_job_model_profiles() -> None:
    assert set(JobModel().profiles()) == {"cnn", "encoder", "llm"}
    assert set(JobModel(mix="llm").profiles()) == {"llm"}
    assert JobModel(custom=ONE_GB).profiles() == {"custom": ONE_GB}
    assert JobModel(custom=ONE_GB).describe()["profile_mix"] == "custom"
    with pytest.raises(ValueError, match="unknown profile mix"):
        JobModel(mix="nope")
    assert _step(1, 0.0) == 0.2
    assert _step(2, 50.0) == pytest.approx(0.2 + 1.0 * 1e9 / 50e9)


@pytest.mark.parametrize(
    ("policy", "want"),
    [
        ("gputopo", (2,)),  # least disruption: 2's NVLink partner 0 is busy
        ("gang-only", (2,)),
        ("best-combo", (2,)),  # HAMi: least connected to the other free cards
        ("best-effort-pairs", (1,)),  # go-gpuallocator: available[0], breaking the 1-3 pair
    ],
)
def test_single_gpu_choice_per_policy(policy: str, want: tuple[int, ...]) -> None:
    c = cluster("a100-pcie-nvlink-pairs", [("n1", "a", frozenset({0}))])
    p = build_policy(policy, c, AllocatorPool(), random.Random(0))
    assert p.place(ClusterState(c), job(0, (1,))) == [(0, want)]


def test_unknown_policy_is_refused() -> None:
    c = cluster("hgx-h100", [("n1", "a", frozenset())])
    with pytest.raises(ValueError, match="unknown policy"):
        build_policy("fifo", c, AllocatorPool(), random.Random(0))


def test_ideal_is_the_clusters_best_server_not_the_one_landed_on() -> None:
    # One PCIe box (best pair PIX 24 GB/s) and one HGX H100 (NV18 450 GB/s); the H100 is busy,
    # so the 2-GPU job must land on the PCIe box. It reaches that node's best ring, but the
    # job-time estimate still measures it against the H100 pair: landing on slower hardware
    # costs time, whatever the policy.
    c = SimCluster(
        topologies=(load_preset("pcie8-plx"), load_preset("hgx-h100")),
        nodes=(
            SimNode("p1", 0, {HOSTNAME: "p1", LEAF: "a", SPINE: "s"}, frozenset()),
            SimNode("h1", 1, {HOSTNAME: "h1", LEAF: "a", SPINE: "s"}, frozenset(range(8))),
        ),
        levels=DEFAULT_LEVELS,
    )
    r = simulate(c, [job(0, (2,), 0, 100.0)], "gputopo", RunConfig(comm=JobModel(custom=ONE_GB)))
    assert r.best_ring_share == 1.0  # the node's own best pair
    # the PIX pair runs at PCIe's measured 20 GB/s, the NV18 pair at 450 x 0.8
    want = _step(2, 20.0) / _step(2, 360.0)
    assert want > 1.1 and r.job_time_ratio == pytest.approx(want)


def test_a_gang_that_fits_one_big_node_is_measured_against_that_node() -> None:
    """Two 8-GPU pods fit one 16-GPU DGX-2: that is the ideal, so no policy can beat it (the
    ideal used to assume one node per pod, and gputopo's one-node answer came out at 0.77x)."""
    c = cluster("dgx2-v100", [("n1", "a", frozenset()), ("n2", "a", frozenset())])
    config = RunConfig(comm=JobModel(custom=ONE_GB))
    res = by_policy(compare(c, [job(0, (8, 8), 0, 100)], ("gputopo", "kubelet-default"), config))
    assert res["gputopo"].job_time_ratio == pytest.approx(1.0)
    # least-allocated spreads the pods over both nodes: the ring crosses the leaf on the NICs
    # near 8 of 16 GPUs (4 of 8 x 100 Gb/s IB at 0.92 = 46 GB/s) instead of staying on the
    # NV6 NVSwitch (150 x 0.8 = 120 GB/s); 16 GPUs, 1 GB, 0.2 s compute
    assert res["kubelet-default"].job_time_ratio == pytest.approx(_step(16, 46.0) / _step(16, 120.0))


def test_a_pod_larger_than_any_node_is_not_fragmentation() -> None:
    """A 9-GPU pod (an Alibaba row, say) fits no 8-GPU node however the GPUs are packed:
    rejecting it on an empty cluster must not count as the first fragmentation failure."""
    c = cluster("hgx-h100", [("n1", "a", frozenset()), ("n2", "a", frozenset())])
    jobs = [job(0, (9,), 0, math.inf), job(1, (1,), 1, math.inf), job(2, (8,), 2, math.inf)]
    for r in compare(c, jobs, POLICIES, RunConfig(mode="fill")):
        assert r.rejected == 1 and r.placed == 2, r.policy
        assert r.free_at_first_failure is None and r.fragmented_jobs == 0.0, r.policy
    replay = simulate(c, [job(0, (9,), 0, 10), job(1, (8,), 1, 10)], "gputopo", RunConfig())
    assert replay.never_started == 1 and replay.placed == 1
    assert replay.free_at_first_failure is None and replay.fragmented_jobs == 0.0


def test_an_empty_label_value_is_no_shared_domain() -> None:
    """`leaf: ""` is a valid label, and the planner (network.domain_of) reads it as no leaf;
    the simulator's metrics read it as one leaf named "" and credited gangs with it."""
    c = SimCluster(
        topologies=(load_preset("hgx-h100"),),
        nodes=tuple(SimNode(n, 0, {HOSTNAME: n, LEAF: "", SPINE: "s"}) for n in ("n1", "n2")),
        levels=DEFAULT_LEVELS,
    )
    assert c.domain(0, LEAF) != c.domain(1, LEAF) and c.common_level([0, 1]) == SPINE
    r = simulate(c, [job(0, (8, 8), 0, 100)], "gputopo", RunConfig())
    assert r.gangs == 1 and r.gangs_one_leaf == 0.0 and r.gangs_one_spine == 1.0
    assert r.job_time_ratio == pytest.approx(1.0)  # no leaf holds two nodes: spine is the ideal


def test_fill_reports_demand_placed_and_allocated_share() -> None:
    """The FGD paper's fill figures: spreading strands GPUs, so it places less of the demand
    and ends with fewer GPUs allocated than packing, even where it placed as many jobs."""
    c = cluster("rtx4090-8-allsys", [("n1", "a", frozenset()), ("n2", "a", frozenset())])
    jobs = [job(0, (1,), 0, math.inf), job(1, (1,), 1, math.inf), job(2, (8,), 2, math.inf)]
    res = by_policy(compare(c, jobs, ("kubelet-default", "best-combo"), RunConfig(mode="fill")))
    spread, packed = res["kubelet-default"], res["best-combo"]
    assert spread.gpus_total == packed.gpus_total == 16
    assert spread.demand_placed == pytest.approx(2 / 10) and packed.demand_placed == pytest.approx(1.0)
    assert spread.allocated_at_end == pytest.approx(2 / 16) and packed.allocated_at_end == pytest.approx(
        10 / 16
    )
    assert spread.allocated_at_first_failure == pytest.approx(2 / 16)
    assert packed.allocated_at_first_failure is None  # nothing failed


def test_queueing_splits_who_waited_from_how_long() -> None:
    c = cluster("hgx-h100", [("n1", "a", frozenset())])
    jobs = [job(0, (8,), 0, 100), job(1, (8,), 10, 50), job(2, (4,), 20, 10), job(3, (4,), 20, 10)]
    r = simulate(c, jobs, "gputopo", RunConfig())
    assert r.queued_share == pytest.approx(3 / 4)
    assert r.queue_delay_mean_queued == pytest.approx((90 + 130 + 130) / 3)
    assert r.queue_delay_mean == pytest.approx(r.queued_share * r.queue_delay_mean_queued)
    assert r.queue_delay_p95 is not None and r.queue_delay_p99 is not None
    assert r.queue_delay_p95 <= r.queue_delay_p99 <= 130
    assert r.allocated_at_end is None  # replay ends with every job gone: no fill figure


def test_queueing_split_by_job_size_says_who_waits() -> None:
    # one H100 node: an 8-GPU job runs 0..100; a 1-GPU job (t=10) and a 4-GPU job (t=20) wait
    # for it; a 2-pod gang of 1 GPU each (t=20, 2 GPUs: multi) too; a 1-GPU job at t=200 does not wait
    c = cluster("hgx-h100", [("n1", "a", frozenset())])
    jobs = [
        job(0, (8,), 0, 100),
        job(1, (1,), 10, 10),
        job(2, (4,), 20, 10),
        job(3, (1, 1), 20, 10),
        job(4, (1,), 200, 10),
    ]
    r = simulate(c, jobs, "kubelet-default", RunConfig())
    assert r.placed == 5
    assert r.queue_delay_mean_single == pytest.approx((90 + 0) / 2)
    assert r.queue_delay_mean_multi == pytest.approx((0 + 80 + 80) / 3)
    # the split is a partition of the mean over every placed job
    assert r.queue_delay_mean == pytest.approx((2 * 45 + 3 * 160 / 3) / 5)
    # per GPU asked: each wait weighs the job's GPUs (8x0 + 1x90 + 4x80 + 2x80 + 1x0) / 16
    assert r.queue_delay_mean_per_gpu == pytest.approx(570 / 16)
    from gputopo.sim.report import render_table

    row = next(
        line for line in render_table([r], {}).splitlines() if line.startswith("queueing delay, mean: 1-GPU")
    )
    assert row.rstrip().endswith("45 s / 53 s")
    # no 1-GPU job in the run: that side is undefined, not 0
    only_multi = simulate(c, jobs[:1], "kubelet-default", RunConfig())
    assert only_multi.queue_delay_mean_single is None and only_multi.queue_delay_mean_multi == 0.0
    # fill mode has no queue: neither side is defined
    filled = simulate(c, [job(0, (1,), 0, math.inf)], "kubelet-default", RunConfig(mode="fill"))
    assert filled.queue_delay_mean_single is None and filled.queue_delay_mean_multi is None
    assert filled.queue_delay_mean_per_gpu is None


def test_table_says_which_way_is_better() -> None:
    from gputopo.sim.report import HIGHER, LOWER, ROWS, render_table

    c = cluster("hgx-h100", [("n1", "a", frozenset())])
    r = simulate(c, [job(0, (8,), 0, 100)], "gputopo", RunConfig())
    lines = render_table([r], {}).splitlines()
    header = next(line for line in lines if line.startswith("metric"))
    assert "better" in header
    start = next(k for k, line in enumerate(lines) if line.startswith("no figure in this run"))
    missing = " ".join(line.strip() for line in lines[start : start + 3])  # wrapped
    for label, better, _ in ROWS:
        assert better in (HIGHER, LOWER, "")
        row = next((line for line in lines if line.startswith(label)), None)
        if row is None:  # a row with no figure is named below the table instead
            assert label in missing, label
        elif better:
            assert better in row, label
    directions = {label: better for label, better, _ in ROWS}
    assert directions["free GPUs at first failure (FGD)"] == LOWER
    assert directions["throughput vs kubelet-default (multi-GPU jobs)"] == HIGHER


def _summary(policy: str, **figures: object) -> Summary:
    """A Summary with made-up figures: the table's layout depends on them, not on a run."""
    base = simulate(
        cluster("hgx-h100", [("n1", "a", frozenset())]), [job(0, (8,), 0, 100)], "gputopo", RunConfig()
    )
    return dataclasses.replace(base, policy=policy, **figures)  # type: ignore[arg-type]


def test_default_table_is_gputopo_the_best_peer_and_kubelet_default_within_120_columns() -> None:
    from gputopo.sim.report import MAX_WIDTH, render_table

    names = ["gputopo", "kubelet-default", "best-effort-pairs", "best-combo", "fgd", "dra-gputopo-sets"]
    throughput = [2.1, 1.0, 1.01, 1.3, 1.2, 1.01]
    results = [
        _summary(
            n,
            throughput_vs_baseline=t,
            job_time_ratio_by_profile={"cnn": 1.0, "encoder": 2.3, "llm": 1.04},
            pods=1000,
            seconds=0.5,
        )
        for n, t in zip(names, throughput, strict=True)
    ]
    header = {"workload": "generator " + "x" * 300}  # a long header line wraps, not the table
    lines = render_table(results, header).splitlines()
    assert max(len(line) for line in lines) <= MAX_WIDTH
    columns = next(line for line in lines if line.startswith("metric")).split()
    assert columns == ["metric", "better", "gputopo", "best-combo", "kubelet-default"]
    assert any(line.startswith("best peer: best-combo") for line in lines)
    # per-profile figures and the simulator's speed are not rows of the default table
    assert not any(line.startswith("job time / ideal:") or "pods/s" in line for line in lines)
    speed = next(line for line in lines if line.startswith("simulator speed"))
    assert "gputopo 2,000" in speed and "fgd" not in speed
    # no row shows n/a in every column: fill-only rows are left out of this replay, and named
    assert not any(line.startswith("GPUs allocated at end (fill)") for line in lines)
    assert "GPUs allocated at end (fill)" in " ".join(line.strip() for line in lines)


def test_wide_table_shows_every_policy_and_profile_in_blocks_that_fit() -> None:
    from gputopo.sim.report import render_table

    names = ["gputopo", "kubelet-default", "best-effort-pairs", "best-combo", "gang-only", "fgd", "kueue-tas"]
    results = [_summary(n, job_time_ratio_by_profile={"cnn": 1.0, "llm": 1.5}) for n in names]
    for width in (120, 90):
        lines = render_table(results, {}, wide=True, width=width).splitlines()
        assert max(len(line) for line in lines) <= width
        headers = [line.split()[2:] for line in lines if line.startswith("metric")]
        assert len(headers) >= 2 and [n for h in headers for n in h] == names
        assert sum(line.startswith("job time / ideal: llm") for line in lines) == len(headers)
    # a terminal wide enough holds the whole table in one block
    assert (
        sum(
            line.startswith("metric") for line in render_table(results, {}, wide=True, width=400).splitlines()
        )
        == 1
    )


class _HintedLedger:
    """A ledger over a counter of free GPUs whose policy refuses job 0 with a queueing hint
    while `hold` says so (and places everything else): what the engine asks, and when."""

    def __init__(self, free: int) -> None:
        self.free_gpus = free
        self.hold = True
        self.asked: list[tuple[int, float]] = []
        self.hint_calls = 0
        self.now = 0.0

    def shape(self, j: Job) -> tuple[int, ...]:
        return j.pods

    def _holds(self) -> bool:
        self.hint_calls += 1
        return self.hold

    def place(
        self, j: Job, hint: Hinted | None = None
    ) -> tuple[list[tuple[int, tuple[int, ...]]], int] | Failure:
        if hint is not None and hint.holds():  # as the engine's ledgers: the policy is not asked
            return hint
        self.asked.append((j.id, self.now))
        if j.id == 0 and self.hold:
            return Hinted("waiting for its own level", holds=self._holds)
        if j.gpus > self.free_gpus:
            return Failure("not enough free GPUs")
        return [(0, tuple(range(j.gpus)))], 0

    def take(self, held: tuple[list[tuple[int, tuple[int, ...]]], int]) -> None:
        self.free_gpus -= sum(len(g) for _, g in held[0])

    def give(self, held: tuple[list[tuple[int, tuple[int, ...]]], int]) -> None:
        self.free_gpus += sum(len(g) for _, g in held[0])

    def free(self) -> int:
        return self.free_gpus

    def tick(self, now: float) -> None:
        self.now = now
        self.hold = now < 250.0  # the gang's wait ends (its spill time, say) at 250 s


def test_a_failure_that_holds_is_not_asked_again_until_its_hint_says_so() -> None:
    """Job 0's answer carries a queueing hint: at every later pass while the hint holds, the
    engine records the same failure (with the free GPUs of that moment) without asking the
    policy; once it does not, the policy is asked and places it."""
    c = cluster("hgx-h100", [("n1", "a", frozenset())])
    jobs = [
        job(0, (8,), submit=0.0, duration=10.0),
        job(1, (1,), submit=0.0, duration=100.0),
        job(2, (1,), submit=50.0, duration=100.0),  # leaves at 150
        job(3, (1,), submit=200.0, duration=100.0),  # leaves at 300
    ]
    ledger = _HintedLedger(free=8)
    rec = Recorder(c, [AllocatorPool().get(t) for t in c.topologies], JobModel())
    failures: list[tuple[int, float, int]] = []
    record = rec.failure

    def failed(j: Job, now: float, free_total: int, admission: bool) -> None:
        failures.append((j.id, now, free_total))
        record(j, now, free_total, admission)

    rec.failure = failed  # type: ignore[method-assign]
    never = run_replay(ledger, jobs, rec, None)
    assert never == 0 and rec.placed == 4
    # job 0 is asked at 0 (hint given), skipped while the hint holds, asked again at 300
    assert [t for i, t in ledger.asked if i == 0] == [0.0, 300.0]
    # every pass that would have asked it (after a departure: not at 50 or 200, when only
    # arrivals came) still records its failure, with that moment's free GPUs
    assert [f for f in failures if f[0] == 0] == [(0, 0.0, 8), (0, 100.0, 7), (0, 150.0, 8)]
    assert ledger.hint_calls == 3  # at 100, 150 (holds) and 300 (does not)


@pytest.mark.parametrize("sharing", [False, True])
@pytest.mark.parametrize(
    ("order", "single_wait", "multi_waits"),
    [("arrival", 180.0, (0.0, 90.0)), ("smallest", 80.0, (0.0, 190.0))],
)
def test_queue_order_decides_who_gets_freed_gpus_first(
    order: str, single_wait: float, multi_waits: tuple[float, float], sharing: bool
) -> None:
    """One 8-GPU node busy until 100 s; an 8-GPU job waits from 10 s, a 1-GPU job from 20 s.
    Oldest first: the 8-GPU job takes the node at 100 s and the 1-GPU job waits for it to end;
    smallest first: the 1-GPU job starts at 100 s and the 8-GPU job waits another 100 s."""
    c = cluster("hgx-h100", [("n1", "a", frozenset())])
    jobs = [job(0, (8,), 0.0, 100.0), job(1, (8,), 10.0, 100.0), job(2, (1,), 20.0, 100.0)]
    for policy in ("gputopo", "kubelet-default"):
        r = simulate(c, jobs, policy, RunConfig(queue_order=order, gpu_sharing=sharing))
        assert r.placed == 3 and r.never_started == 0
        assert r.queue_delay_mean_single == pytest.approx(single_wait), policy
        assert r.queue_delay_mean_multi == pytest.approx(sum(multi_waits) / 2), policy


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 64), max_size=60))
def test_queue_priority_ranks_every_job_once_in_its_order(gpus: list[int]) -> None:
    jobs = [job(i, (g,)) for i, g in enumerate(gpus)]
    assert list(queue_priority(jobs, "arrival")) == list(range(len(jobs)))
    rank = queue_priority(jobs, "smallest")
    assert sorted(rank) == list(range(len(jobs)))  # distinct: shapes are never compared
    for i in range(len(jobs)):  # every pair: fewer GPUs first, the older of two equal ones first
        for j in range(i + 1, len(jobs)):
            assert (rank[i] < rank[j]) == (gpus[i] <= gpus[j]), (i, j)


def test_an_unknown_queue_order_is_refused() -> None:
    with pytest.raises(ValueError, match="queue order must be one of arrival, smallest"):
        RunConfig(queue_order="shortest")
    with pytest.raises(ValueError, match="a fill places jobs in list order"):
        RunConfig(mode="fill", queue_order="smallest")
    with pytest.raises(ValueError, match="queue order must be one of"):
        queue_priority([], "lifo")


class _StaleHintLedger(_HintedLedger):
    """Job 0's hint holds twice, then lets job 0 through (placed), then would hold forever:
    a hint left over from a head that was placed must not answer for the next head."""

    def __init__(self, free: int) -> None:
        super().__init__(free)
        self.calls = 0

    def _holds(self) -> bool:
        self.calls += 1
        return self.calls != 3

    def place(
        self, j: Job, hint: Hinted | None = None
    ) -> tuple[list[tuple[int, tuple[int, ...]]], int] | Failure:
        if hint is not None and hint.holds():
            return hint
        self.asked.append((j.id, self.now))
        if j.id == 0 and not self.asked[:-1]:
            return Hinted("waiting for its own level", holds=self._holds)
        if j.gpus > self.free_gpus:
            return Failure("not enough free GPUs")
        return [(0, tuple(range(j.gpus)))], 0

    def tick(self, now: float) -> None:
        self.now = now


def test_a_hint_answers_only_for_the_head_it_was_given_for() -> None:
    """Two jobs of one shape: job 0 is refused with a hint, which holds at the next two passes
    and not at the third (job 0 is asked and placed); job 4, now the shape's head, is asked
    although the leftover hint would say "holds" (with it, job 4 would never start)."""
    c = cluster("hgx-h100", [("n1", "a", frozenset())])
    jobs = [
        job(0, (8,), submit=0.0, duration=10.0),
        job(1, (1,), submit=0.0, duration=100.0),  # leaves at 100
        job(2, (1,), submit=50.0, duration=100.0),  # leaves at 150
        job(3, (1,), submit=60.0, duration=140.0),  # leaves at 200
        job(4, (8,), submit=70.0, duration=10.0),
    ]
    ledger = _StaleHintLedger(free=8)
    rec = Recorder(c, [AllocatorPool().get(t) for t in c.topologies], JobModel())
    assert run_replay(ledger, jobs, rec, None) == 0 and rec.placed == 5
    assert [t for i, t in ledger.asked if i == 0] == [0.0, 200.0]  # skipped at 100 and 150
    # job 4 is asked as soon as it heads the shape (no room at 200) and when job 0 leaves
    assert [t for i, t in ledger.asked if i == 4] == [200.0, 210.0]


def test_plot_draws_the_headline_figures_and_replaces_a_panel_with_nothing_to_show() -> None:
    from gputopo.sim.plot import FALLBACKS, HEADLINE, choose

    loaded = [
        _summary(
            n,
            throughput_vs_baseline=t,
            gangs=4,
            gangs_one_leaf=0.5,
            queue_delay_mean_per_gpu=q,
            job_time_ratio_by_profile={"cnn": 1.0, "llm": 2.0},
        )
        for n, t, q in (("gputopo", 1.6, 30.0), ("kubelet-default", 1.0, 3600.0))
    ]
    panels, notes = choose(loaded)
    assert panels == list(HEADLINE) and notes == []
    assert [p.title for p in panels] == [
        "throughput of multi-GPU jobs vs kubelet-default",
        "job time / ideal, multi-GPU jobs, by workload profile",
        "gangs inside one leaf",
        "queueing delay, mean per GPU asked",
    ]
    # nobody queued and no gangs: those two panels give way to figures that differ
    idle = [
        dataclasses.replace(r, queue_delay_mean_per_gpu=0.0, gangs=0, gangs_one_leaf=None) for r in loaded
    ]
    panels, notes = choose(idle)
    assert len(panels) == 4 and panels[:2] == list(HEADLINE[:2]) and all(p in FALLBACKS for p in panels[2:])
    assert notes == [
        "gangs inside one leaf: no multi-node job in this workload",
        "queueing delay, mean per GPU asked: 0 under every policy (no job waited)",
    ]


def test_plot_png_is_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from gputopo.sim.plot import write_plot

    results = [_summary(n, job_time_ratio_by_profile={"cnn": 1.0}) for n in ("gputopo", "kubelet-default")]
    write_plot(results, tmp_path / "p.png", "a title " * 60)  # a long title wraps
    head = (tmp_path / "p.png").read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert (int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")) == (1600, 900)
