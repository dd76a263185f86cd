"""What the simulator measures per policy, accumulated as jobs are placed.

Ring figures compare each multi-GPU pod's GPU set with the best ring bandwidth its node could
offer when empty (both from gputopo.allocator, the one node objective). Gang figures say
whether every pod of a multi-node job landed in one leaf / one spine. Fragmentation is FGD's:
free GPUs at the moment the first job could not be placed although enough GPUs were
free. Job times come from the measured job-time model (gputopo.sim.jobmodel over
gputopo.jobtime.model), per job profile.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from gputopo.network.levels import HOSTNAME, LEAF, SPINE
from gputopo.node.allocator import Allocator
from gputopo.sim.jobmodel import JobModel, JobTimer
from gputopo.sim.state import SimCluster
from gputopo.sim.workload import Job


@dataclass(frozen=True)
class Summary:
    """One policy's results; None where a figure is undefined (e.g. no multi-GPU pod ran)."""

    policy: str
    jobs: int
    placed: int
    rejected: int
    never_started: int
    multi_gpu_pods: int
    best_ring_share: float | None  # share of multi-GPU pods at the empty-node best ring
    ring_over_best: float | None  # mean ring / best ring over multi-GPU pods
    gangs: int
    gangs_one_leaf: float | None
    gangs_one_spine: float | None
    free_at_first_failure: int | None  # free GPUs at the first failure with enough free (FGD)
    first_failure_time: float | None
    fragmented_jobs: float  # share of jobs that failed at least once with enough GPUs free
    queue_delay_mean: float | None
    queue_delay_p95: float | None
    queue_delay_p99: float | None
    queued_share: float | None  # share of placed jobs that waited at all (delay > 0)
    queue_delay_mean_queued: float | None  # mean delay of those that waited
    job_time_ratio: float | None  # GPU-weighted mean of actual/ideal job time, multi-GPU jobs
    efficiency: float | None  # GPU-weighted ideal/actual time, multi-GPU jobs
    throughput_vs_baseline: float | None  # efficiency / baseline efficiency
    admission_failures: int
    pods: int
    seconds: float
    gpus_total: int = 0  # GPUs of the cluster (healthy, as simulated)
    allocated_at_first_failure: float | None = None  # share of GPUs in use when the first job failed
    allocated_at_end: float | None = None  # share of GPUs in use when the run ended (fill: when full)
    demand_placed: float | None = None  # share of the GPUs asked for by all jobs that got placed
    milli_gpus: bool = False  # --gpu-sharing: free_at_first_failure and the shares count milli-GPUs
    queue_delay_mean_single: float | None = None  # mean queueing delay of placed 1-GPU jobs
    queue_delay_mean_multi: float | None = None  # ... of placed jobs of 2 GPUs or more (gangs too)
    #: mean queueing delay per GPU asked (each job weighs its GPUs): the plain mean counts a
    #: 1-GPU job as much as a 64-GPU gang, so a policy that starves large jobs on an overloaded
    #: cluster wins it; this one weighs the demand each wait holds back
    queue_delay_mean_per_gpu: float | None = None
    #: job_time_ratio per workload profile (gputopo.jobtime.profiles) of the run's mix
    job_time_ratio_by_profile: dict[str, float] = field(default_factory=dict)
    extra: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class Recorder:
    """Accumulates one policy's figures; owned by one run."""

    def __init__(self, cluster: SimCluster, allocators: Sequence[Allocator], comm: JobModel) -> None:
        self.cluster = cluster
        self.allocators = allocators
        self.comm = comm
        self.timer = JobTimer(comm, cluster, allocators)
        self.profile_gpu_s: dict[str, list[float]] = {}  # profile -> [ideal, actual] GPU-seconds
        self._ring: dict[tuple[int, tuple[int, ...]], int] = {}
        self._best: dict[tuple[int, int], int] = {}
        self.multi_pods = self.best_hits = 0
        self.ratio_sum = 0.0
        self.gangs = self.gang_leaf = self.gang_spine = 0
        self.first_failure: tuple[float, int] | None = None
        self.delays: list[float] = []
        self.job_gpus: list[int] = []  # per entry of `delays`: the job's GPUs (1-GPU split, weights)
        self.ideal_gpu_s = self.actual_gpu_s = 0.0
        self.placed = self.rejected = self.admission_failures = self.pods = 0
        # Fewest nodes a gang could use: pods share a node when it is big enough (a DGX-2
        # holds two 8-GPU pods), so the ideal must not assume one node per pod.
        self._largest_node = max(t.n for t in cluster.topologies)
        self._fragmented: set[int] = set()
        self.gpus_total = sum(cluster.topologies[n.topology].n for n in cluster.nodes)
        self.placed_gpus = 0

    def ring(self, tid: int, gpus: tuple[int, ...]) -> int:
        key = (tid, gpus)
        hit = self._ring.get(key)
        if hit is None:
            hit = self._ring[key] = self.allocators[tid].ring_mbps(gpus)
        return hit

    def best(self, tid: int, size: int) -> int:
        key = (tid, size)
        hit = self._best.get(key)
        if hit is None:
            hit = self._best[key] = self.allocators[tid].best_ring_mbps(size)
        return hit

    def cluster_best(self, size: int) -> int:
        """The best ring any empty node of the cluster offers for `size` GPUs: the ideal a
        placement is measured against. It does not depend on where the job landed, so a
        policy that puts a ring-bound job on a slower server type pays for it."""
        key = (-1, size)
        hit = self._best.get(key)
        if hit is None:
            hit = self._best[key] = max(
                (self.best(tid, size) for tid, a in enumerate(self.allocators) if a.n >= size), default=0
            )
        return hit

    def failure(self, job: Job, now: float, free_total: int, admission: bool) -> None:
        """A job could not be placed. Only a failure with enough free GPUs in total counts for
        fragmentation: a 160-GPU gang failing on a busy cluster says nothing about packing,
        and neither does a pod larger than every node."""
        if admission:
            self.admission_failures += 1
        if job.gpus <= free_total and max(job.pods) <= self._largest_node:
            self._fragmented.add(job.id)
            if self.first_failure is None:
                self.first_failure = (now, free_total)

    def placed_job(self, job: Job, slots: Sequence[tuple[int, tuple[int, ...]]], now: float) -> float:
        """Record a placement; returns the stretch factor (actual / ideal job time)."""
        self.placed += 1
        self.pods += len(slots)
        self.placed_gpus += job.gpus
        self.delays.append(now - job.submit)
        self.job_gpus.append(job.gpus)
        nodes = [n for n, _ in slots]
        for node, gpus in slots:
            if len(gpus) < 2:
                continue
            tid = self.cluster.nodes[node].topology
            ring, best = self.ring(tid, gpus), self.best(tid, len(gpus))
            self.multi_pods += 1
            self.best_hits += ring >= best
            self.ratio_sum += ring / best if best else 1.0
        level: str | None = HOSTNAME
        ideal_level: str | None = HOSTNAME
        fewest_nodes = 1
        if job.is_gang:
            self.gangs += 1
            self.gang_leaf += self._same(nodes, LEAF)
            self.gang_spine += self._same(nodes, SPINE)
            level = self.cluster.common_level(nodes) if len(set(nodes)) > 1 else HOSTNAME
            fewest_nodes = min(len(slots), -(-job.gpus // self._largest_node))
            ideal_level = self.timer.ideal_level(fewest_nodes, max(job.pods))
        if job.gpus < 2:
            return 1.0
        timer = self.timer
        profile = timer.profile_of(job.id)
        stretch = timer.stretch(
            profile,
            job.gpus,
            timer.busbw(slots, level),
            timer.ideal_busbw(job.pods, fewest_nodes, ideal_level),
        )
        weight = job.duration if math.isfinite(job.duration) else 1.0  # fill: one unit of time
        self.ideal_gpu_s += job.gpus * weight
        self.actual_gpu_s += job.gpus * weight * stretch
        acc = self.profile_gpu_s.get(profile)
        if acc is None:
            acc = self.profile_gpu_s[profile] = [0.0, 0.0]
        acc[0] += job.gpus * weight
        acc[1] += job.gpus * weight * stretch
        return stretch

    def _same(self, nodes: Sequence[int], level: str) -> bool:
        return len({self.cluster.domain(n, level) for n in nodes}) == 1

    def summary(
        self,
        policy: str,
        jobs: Sequence[Job],
        never_started: int,
        seconds: float,
        timed: bool,
        free_at_end: int | None = None,
    ) -> Summary:
        def share(num: float, den: int) -> float | None:
            return num / den if den else None

        delays = np.asarray(self.delays) if timed and self.delays else None
        waited = delays[delays > 0] if delays is not None else None
        sizes = np.asarray(self.job_gpus, dtype=np.float64) if delays is not None else None
        ones = None if sizes is None else sizes < 2

        def mean_of(sel: np.ndarray | None) -> float | None:
            return None if delays is None or sel is None or not sel.any() else float(delays[sel].mean())

        demand = sum(j.gpus for j in jobs)
        total = self.gpus_total
        return Summary(
            policy=policy,
            jobs=len(jobs),
            placed=self.placed,
            rejected=self.rejected,
            never_started=never_started,
            multi_gpu_pods=self.multi_pods,
            best_ring_share=share(self.best_hits, self.multi_pods),
            ring_over_best=share(self.ratio_sum, self.multi_pods),
            gangs=self.gangs,
            gangs_one_leaf=share(self.gang_leaf, self.gangs),
            gangs_one_spine=share(self.gang_spine, self.gangs),
            free_at_first_failure=None if self.first_failure is None else self.first_failure[1],
            first_failure_time=None if self.first_failure is None else self.first_failure[0],
            fragmented_jobs=len(self._fragmented) / len(jobs) if jobs else 0.0,
            queue_delay_mean=None if delays is None else float(delays.mean()),
            queue_delay_p95=None if delays is None else float(np.percentile(delays, 95)),
            queue_delay_p99=None if delays is None else float(np.percentile(delays, 99)),
            queued_share=None if delays is None or waited is None else len(waited) / len(delays),
            queue_delay_mean_queued=None if waited is None or not len(waited) else float(waited.mean()),
            job_time_ratio=None if not self.ideal_gpu_s else self.actual_gpu_s / self.ideal_gpu_s,
            efficiency=None if not self.actual_gpu_s else self.ideal_gpu_s / self.actual_gpu_s,
            throughput_vs_baseline=None,
            admission_failures=self.admission_failures,
            pods=self.pods,
            seconds=seconds,
            gpus_total=total,
            allocated_at_first_failure=None
            if self.first_failure is None or not total
            else 1 - self.first_failure[1] / total,
            allocated_at_end=None if free_at_end is None or not total else 1 - free_at_end / total,
            demand_placed=share(self.placed_gpus, demand),
            queue_delay_mean_single=mean_of(ones),
            queue_delay_mean_multi=None if ones is None else mean_of(~ones),
            queue_delay_mean_per_gpu=None
            if delays is None or sizes is None or not sizes.sum()
            else float((delays * sizes).sum() / sizes.sum()),
            job_time_ratio_by_profile={
                p: actual / ideal for p, (ideal, actual) in sorted(self.profile_gpu_s.items()) if ideal
            },
        )
