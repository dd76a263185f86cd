"""Jobs as trees on NVL72 racks (`simulate --jobs tree`, docs/simulator.md "Jobs as trees on
NVL72"; issue 29 item 5).

A large-model run on GB200 NVL72 racks is a tree, not a flat gang: pods of one 4-GPU tray,
tensor-parallel (TP) groups of k trays that must share one NVLink domain (their all-reduces
run in every layer, on the critical path), and data-parallel (DP) replicas (the TP groups)
that should share a leaf. This module turns the generator's or a trace's jobs into such trees,
prices each placement with the tensor x data parallel model of gputopo.jobtime.parallel
(per TP group: a group inside one NVLink domain all-reduces over NVLink, a group split across
domains pays the network, as the model's straddling groups do), and records the figures the
tree comparison prints: TP groups inside one NVLink domain, jobs inside one leaf, throughput
by the job-time model, queueing, and racks left fragmented.

The tree rule (`tree_shape`): a job of G > 4 GPUs asks for n = ceil(G / 4) trays; its TP group
is the largest divisor k of n with 2 <= k <= min(18, n / 2) (two or more replicas where the
job has room for them, as data-parallel training keeps at least two), k = n (one replica)
when n <= 18 has no such divisor, and n grows by one tray until a divisor exists otherwise.
Helios' 16-GPU job is 2 replicas of 2 trays, its 64-GPU job 2 of 8, its 144-GPU job 2 of 18
(a whole rack each). A job of 4 GPUs or fewer stays one pod.

Pure: no I/O, no globals (gputopo.sim.treerun runs the tree policies over it).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, replace

from gputopo.jobtime.model import (
    best_busbw_gbps,
    comm_s,
    inter_busbw_gbps,
    nics_for,
    nics_used,
    oversubscription,
)
from gputopo.jobtime.parallel import PARALLEL_PROFILES, TP_ALLREDUCES_PER_LAYER, ParallelProfile
from gputopo.network.levels import ACCELERATOR, HOSTNAME, LEAF
from gputopo.node.allocator import Allocator
from gputopo.sim.engine import Place, WholeGpus
from gputopo.sim.jobmodel import JobModel
from gputopo.sim.metrics import Recorder
from gputopo.sim.state import ClusterState, SimCluster
from gputopo.sim.workload import Job

#: GPUs of one tree pod: one GB200 compute tray.
TRAY_GPUS = 4
#: Trays of one NVL72 NVLink domain: the largest TP group that fits one.
MAX_TP_TRAYS = 18
#: What every tree job trains (its TP size set per job): Llama 2 70B's shape from
#: gputopo.jobtime.parallel, the model whose TP all-reduces the published numbers there price.
TREE_PROFILE = "llama-70b"


@dataclass(frozen=True)
class Tree:
    """A job's tree: `trays` pods of one tray each, TP groups of `tp` consecutive pods."""

    trays: int
    tp: int

    def __post_init__(self) -> None:
        if not (self.trays >= 2 and 2 <= self.tp <= self.trays and self.trays % self.tp == 0):
            raise ValueError(f"a tree needs trays >= 2 split into TP groups of 2+ trays, got {self}")

    @property
    def replicas(self) -> int:
        return self.trays // self.tp

    def groups(self) -> list[range]:
        """The pods of each TP group, by rank (Megatron's order: a group's ranks are adjacent)."""
        return [range(j * self.tp, (j + 1) * self.tp) for j in range(self.replicas)]


def tree_shape(gpus: int) -> Tree | None:
    """The tree of a job of `gpus` GPUs by the module docstring's rule; None for a single pod."""
    if gpus <= TRAY_GPUS:
        return None
    n = -(-gpus // TRAY_GPUS)
    while True:
        for k in range(min(MAX_TP_TRAYS, max(2, n // 2)), 1, -1):
            if n % k == 0:
                return Tree(n, k)
        if n <= MAX_TP_TRAYS:
            return Tree(n, n)
        n += 1


def as_trees(jobs: Sequence[Job]) -> tuple[list[Job], dict[int, Tree]]:
    """The jobs with every job of more than 4 GPUs made a tree of 4-GPU pods (same id, arrival
    and duration), and the trees by job id; smaller jobs are kept as they are."""
    out: list[Job] = []
    trees: dict[int, Tree] = {}
    for job in jobs:
        tree = tree_shape(job.gpus)
        if tree is None:
            out.append(job)
            continue
        trees[job.id] = tree
        out.append(replace(job, pods=(TRAY_GPUS,) * tree.trays, milli=1000))
    return out, trees


def typical_tp(trees: Mapping[int, Tree]) -> int:
    """The workload's typical TP group in trays: the group size the median tray of all TP
    groups belongs to (each group weighs its trays, as the capacity it asks for), the group a
    partly used rack should still hold; 2 when there are none. The plain median over groups
    would be the 8-GPU job's 2 trays, which any rack with two free trays holds."""
    sizes = sorted(size for t in trees.values() for size in [t.tp] * t.trays)
    return sizes[len(sizes) // 2] if sizes else 2


# ----------------------------------------------------------------------- the job-time model


class TreeTimer:
    """Step time of a tree job in a placement, by gputopo.jobtime.parallel's model, over
    its ideal: the same job with every TP group inside one NVLink domain of the cluster's best
    server and the job at the smallest level of the cluster that has room for it.

    Per TP group, as `parallel_step_time` prices a group (the slowest group sets the pace):
    inside one node the allocator's best set of its size; across nodes of one NVLink domain
    the domain's pair bandwidth (NVLink through the NVSwitch trays); across domains the
    network between its nodes (`inter_busbw_gbps`, the published NIC and fabric figures) at
    the group's own common level. The data-parallel rings (one per TP rank) run over NVLink
    when the whole job is in one NVLink domain, else over each node's NICs shared by the
    rings crossing it, at the job's common level's oversubscription."""

    def __init__(
        self,
        cluster: SimCluster,
        allocators: Sequence[Allocator],
        oversub: Mapping[str, float] | None = None,
        profile: ParallelProfile | None = None,
    ) -> None:
        self.cluster = cluster
        self.allocators = allocators
        self.table = oversub
        self.profile = profile or PARALLEL_PROFILES[TREE_PROFILE]
        self._best: dict[tuple[int, int], float] = {}
        self._nics = [nics_for(cluster.topologies[n.topology].name, n.labels) for n in cluster.nodes]
        self._ideal: dict[Tree, float] = {}
        # the best server (highest pair bandwidth) and, per level, the largest domain's GPUs
        self._top = max(range(len(allocators)), key=lambda t: (self.best(t, 2), allocators[t].n))
        self._room: dict[str, int] = {}
        for level in cluster.levels:
            per: dict[str, int] = {}
            for i, node in enumerate(cluster.nodes):
                d = cluster.domain(i, level)
                per[d] = per.get(d, 0) + cluster.topologies[node.topology].n
            self._room[level] = max(per.values())

    def best(self, tid: int, size: int) -> float:
        key = (tid, size)
        hit = self._best.get(key)
        if hit is None:
            alloc = self.allocators[tid]
            hit = self._best[key] = best_busbw_gbps(alloc, min(size, alloc.n))
        return hit

    def stretch(self, tree: Tree, slots: Sequence[tuple[int, tuple[int, ...]]]) -> float:
        """Step time in this placement over the ideal (>= 1 up to rounding)."""
        ideal = self._ideal.get(tree)
        if ideal is None:
            ideal = self._ideal[tree] = self._ideal_step(tree)
        return max(1.0, self.step(tree, [n for n, _ in slots]) / ideal)

    def step(self, tree: Tree, nodes: Sequence[int]) -> float:
        """One step of `tree` with pod i on node `nodes[i]`."""
        cluster, topo = self.cluster, [n.topology for n in self.cluster.nodes]
        t = tree.tp * TRAY_GPUS
        tp_bw = math.inf
        for group in tree.groups():
            per: dict[int, int] = {}
            for i in group:
                per[nodes[i]] = per.get(nodes[i], 0) + TRAY_GPUS
            bw = min(self.best(topo[n], g) for n, g in per.items())
            if len(per) > 1:
                if cluster.common_level(list(per)) == ACCELERATOR:
                    bw = min(bw, *(self.best(topo[n], 2) for n in per))
                else:
                    level = cluster.common_level(list(per))
                    parts = [(g, cluster.topologies[topo[n]].n, self._nics[n]) for n, g in per.items()]
                    bw = min(bw, inter_busbw_gbps(parts, level, table=self.table))
            tp_bw = min(tp_bw, bw)
        job: dict[int, int] = {}
        for n in nodes:
            job[n] = job.get(n, 0) + TRAY_GPUS
        level = HOSTNAME if len(job) == 1 else cluster.common_level(list(job))
        dp_bw = math.inf
        if tree.replicas > 1:
            pair = min(self.best(topo[n], 2) for n in job)
            if level in (HOSTNAME, ACCELERATOR):
                dp_bw = pair
            else:
                share = min(
                    self._nics[n].node_gbytes(nics_used(g, cluster.topologies[topo[n]].n, self._nics[n]))
                    / min(g, t)
                    for n, g in job.items()
                )
                dp_bw = min(pair, share / oversubscription(level, self.table))
        return self._step_s(tree, tp_bw, dp_bw)

    def _step_s(self, tree: Tree, tp_bw: float, dp_bw: float) -> float:
        """`parallel_step_time`'s step: compute / t, the TP all-reduces of every layer (not
        overlapped), the DP all-reduce of 1/t of the gradients beyond what `overlap` hides."""
        p = self.profile
        t = tree.tp * TRAY_GPUS
        compute = p.compute_s / t
        tp = TP_ALLREDUCES_PER_LAYER * p.layers * comm_s(p.tp_bytes, t, tp_bw)
        dp = comm_s(p.grad_bytes / t, tree.replicas, dp_bw)
        return compute + tp + max(0.0, dp - p.overlap * compute)

    def _ideal_step(self, tree: Tree) -> float:
        """Every TP group inside one NVLink domain of the best server, the job at the smallest
        level with a domain of enough GPUs (the same DP pricing as `step`)."""
        top = self._top
        n = self.allocators[top].n
        t = tree.tp * TRAY_GPUS
        tp_bw = self.best(top, t) if t <= n else min(self.best(top, n), self.best(top, 2))
        gpus = tree.trays * TRAY_GPUS
        level = next((lv for lv in self.cluster.levels if self._room[lv] >= gpus), None)
        dp_bw = math.inf
        if tree.replicas > 1:
            if level in (HOSTNAME, ACCELERATOR):
                dp_bw = self.best(top, 2)
            else:
                nics = nics_for(self.cluster.topologies[top].name)
                g = min(n, gpus)
                share = nics.node_gbytes(nics_used(g, n, nics)) / min(g, t)
                dp_bw = min(self.best(top, 2), share / oversubscription(level, self.table))
        return self._step_s(tree, tp_bw, dp_bw)


# ----------------------------------------------------------------------- what a run records


class TreeRecorder(Recorder):
    """The simulator's Recorder plus the tree figures; tree jobs are timed by `TreeTimer`, the
    other jobs (single pods) by the run's job-time model as in every other run."""

    def __init__(
        self,
        cluster: SimCluster,
        allocators: Sequence[Allocator],
        comm: JobModel,
        trees: Mapping[int, Tree],
    ) -> None:
        super().__init__(cluster, allocators, comm)
        self.trees = trees
        self.tree_timer = TreeTimer(cluster, allocators, comm.oversubscription)
        self.tp_groups = self.tp_inside = 0
        self.tree_jobs = self.tree_leaf = 0
        self.tree_ideal_gpu_s = self.tree_actual_gpu_s = 0.0
        self.tree_delays: list[float] = []

    def placed_job(self, job: Job, slots: Sequence[tuple[int, tuple[int, ...]]], now: float) -> float:
        tree = self.trees.get(job.id)
        if tree is None:
            return super().placed_job(job, slots, now)
        self.placed += 1
        self.pods += len(slots)
        self.placed_gpus += job.gpus
        self.delays.append(now - job.submit)
        self.job_gpus.append(job.gpus)
        self.tree_delays.append(now - job.submit)
        nodes = [n for n, _ in slots]
        for group in tree.groups():
            self.tp_groups += 1
            self.tp_inside += self._same([nodes[i] for i in group], ACCELERATOR)
        self.tree_jobs += 1
        self.tree_leaf += self._same(nodes, LEAF)
        if len(set(nodes)) > 1:
            self.gangs += 1
            self.gang_leaf += self._same(nodes, LEAF)
            self.gang_spine += self._same(nodes, "network.topology.nvidia.com/spine")
        stretch = self.tree_timer.stretch(tree, slots)
        weight = job.duration if math.isfinite(job.duration) else 1.0
        ideal = job.gpus * weight
        self.ideal_gpu_s += ideal
        self.actual_gpu_s += ideal * stretch
        self.tree_ideal_gpu_s += ideal
        self.tree_actual_gpu_s += ideal * stretch
        return stretch

    def tree_figures(self) -> dict[str, float]:
        """The tree rows of the report (Summary.extra); a figure with nothing to count is left out."""
        out: dict[str, float] = {"tree_jobs_placed": float(self.tree_jobs)}
        if self.tp_groups:
            out["tp_groups_inside_nvlink"] = self.tp_inside / self.tp_groups
        if self.tree_jobs:
            out["tree_jobs_inside_leaf"] = self.tree_leaf / self.tree_jobs
        if self.tree_actual_gpu_s:
            out["tree_efficiency"] = self.tree_ideal_gpu_s / self.tree_actual_gpu_s
        if self.tree_delays:
            out["tree_queue_delay_mean"] = sum(self.tree_delays) / len(self.tree_delays)
        return out


# ----------------------------------------------------------------------- racks left fragmented


class RackWatch:
    """Racks left fragmented, averaged over time: a rack (a multi-node NVLink domain) is
    fragmented when it is partly used and its whole free trays (nodes with every GPU free) are
    at least one but fewer than the workload's typical TP group (`typical_tp`): trays nobody's
    next typical group can use without straddling racks. Averaged over [first arrival, last
    arrival], weighting each state by how long it lasted (the drain after the last arrival,
    when every policy empties the cluster, is left out)."""

    def __init__(self, state: ClusterState, need: int, horizon: float) -> None:
        self.state = state
        self.need = need
        self.horizon = horizon
        cluster = state.cluster
        by: dict[str, list[int]] = {}
        for i, node in enumerate(cluster.nodes):
            if node.labels.get(ACCELERATOR):
                by.setdefault(cluster.domain(i, ACCELERATOR), []).append(i)
        self.racks = [nodes for nodes in by.values() if len(nodes) > 1]
        self.area = 0.0
        self.last = 0.0
        self.pending: int | None = None
        self.started = False
        self.first = 0.0

    def count(self) -> int:
        mask, size = self.state.mask, self.state.size
        out = 0
        for nodes in self.racks:
            whole = sum(1 for n in nodes if mask[n].bit_count() == size[n])
            used = any(mask[n].bit_count() != size[n] for n in nodes)
            out += used and 0 < whole < self.need
        return out

    def before_give(self) -> None:
        if self.pending is None:
            self.pending = self.count()

    def tick(self, now: float) -> None:
        count = self.pending if self.pending is not None else self.count()
        self.pending = None
        if not self.started:
            self.started, self.last, self.first = True, now, now
            return
        end = min(now, self.horizon)
        if end > self.last:
            self.area += count * (end - self.last)
            self.last = end

    def mean(self) -> float | None:
        if not self.racks or not self.started:
            return None
        span = self.horizon - self.first
        return self.area / span if span > 0 else float(self.count())


class TreeLedger(WholeGpus):
    """Whole GPUs placed by a tree policy; jobs of one shape and tree queue together, and the
    rack watch sees every change."""

    def __init__(
        self,
        state: ClusterState,
        place: Place,
        watch: RackWatch,
        trees: Mapping[int, Tree],
    ) -> None:
        super().__init__(state, place)
        self.watch = watch
        self.trees = trees

    def shape(self, job: Job) -> Hashable:
        tree = self.trees.get(job.id)
        return job.pods if tree is None else (job.pods, tree.tp)

    def give(self, held: tuple[list[tuple[int, tuple[int, ...]]], int]) -> None:
        self.watch.before_give()
        super().give(held)

    def tick(self, now: float) -> None:
        self.watch.tick(now)
        super().tick(now)
