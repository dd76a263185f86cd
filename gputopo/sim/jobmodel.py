"""The simulator's reading of the job-time model (gputopo.jobtime.model, gputopo.jobtime.profiles).

A trace's duration is the job's time at an ideal placement; the job runs
`duration * step(actual) / step(ideal)` where both steps come from the core model for the job's
profile. `JobModel` is the run's configuration of it (which profile mix, or one custom
profile; the oversubscription table); `JobTimer` answers per placed job, with caches per
GPU set, per shape and per (profile, GPUs, bandwidths), because the simulator places
hundreds of thousands of jobs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

from gputopo.jobtime.model import (
    DEFAULT_OVERSUBSCRIPTION,
    Nics,
    comm_s,
    inter_busbw_gbps,
    intra_busbw_gbps,
    nics_for,
    nics_used,
    oversubscription,
    step_s,
)
from gputopo.jobtime.profiles import PROFILE_MIXES, PROFILES, Profile, ProfileMix, mix64
from gputopo.network.levels import ACCELERATOR, HOSTNAME
from gputopo.node.allocator import Allocator
from gputopo.sim.state import SimCluster

CUSTOM = "custom"
#: Keeps "which jobs declare" apart from "which profile a job runs" (both hash the job id).
_DECLARE_SALT = 0x6A09E667F3BCC909


@dataclass(frozen=True)
class JobModel:
    """Configuration of the job-time model for one run (see the module docstring)."""

    mix: str = "default"
    seed: int = 0
    custom: Profile | None = None  # when set, every job runs this profile (--allreduce-gb ...)
    oversubscription: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_OVERSUBSCRIPTION))
    #: share of jobs whose pods declare their profile (gputopo.io/profile) to the scheduler
    #: (--declared-share): the sidecar then weighs their placements by it, not by the mix
    declared_share: float = 0.0

    def __post_init__(self) -> None:
        if self.custom is None and self.mix not in PROFILE_MIXES:
            raise ValueError(f"unknown profile mix {self.mix!r} (known: {', '.join(PROFILE_MIXES)})")
        if not (math.isfinite(self.declared_share) and 0 <= self.declared_share <= 1):
            raise ValueError(f"the declared share must be between 0 and 1, got {self.declared_share!r}")

    def declared(self, job_id: int) -> Profile | None:
        """The profile job `job_id`'s pods declare, None for the jobs that declare none. Which
        jobs declare is seeded and stateless (a hash of the id, apart from the profile draw),
        so every policy sees the same jobs declare, and a larger share keeps the smaller
        share's jobs. The profile declared is the one the job runs (`JobTimer.profile_of`)."""
        if self.declared_share <= 0:
            return None
        if (
            self.declared_share < 1
            and mix64(job_id ^ mix64(self.seed ^ _DECLARE_SALT)) / 2.0**64 >= self.declared_share
        ):
            return None
        if self.custom is not None:
            return self.custom
        return PROFILES[self._mix.profile_of(job_id)]

    @cached_property
    def _mix(self) -> ProfileMix:
        return ProfileMix(PROFILE_MIXES[self.mix], self.seed)

    def profiles(self) -> dict[str, Profile]:
        """The profiles jobs of this run can get."""
        if self.custom is not None:
            return {CUSTOM: self.custom}
        return {name: PROFILES[name] for name in PROFILE_MIXES[self.mix]}

    def describe(self) -> dict[str, object]:
        """The model's settings for the report."""
        return {
            "profile_mix": CUSTOM if self.custom is not None else self.mix,
            "shares": {CUSTOM: 1.0} if self.custom is not None else dict(PROFILE_MIXES[self.mix]),
            "profiles": {k: p.to_dict() for k, p in self.profiles().items()},
            "oversubscription": dict(self.oversubscription),
        }


class JobTimer:
    """Stretch factors (actual / ideal job time) for one run on one cluster."""

    def __init__(self, model: JobModel, cluster: SimCluster, allocators: Sequence[Allocator]) -> None:
        self.model = model
        self.cluster = cluster
        self.allocators = allocators
        self._table = MappingProxyType(dict(model.oversubscription))
        self._mix = None if model.custom is not None else ProfileMix(PROFILE_MIXES[model.mix], model.seed)
        self._profiles = model.profiles()
        self.nics: list[Nics] = [
            nics_for(cluster.topologies[n.topology].name, n.labels) for n in cluster.nodes
        ]
        self._node_gpus = [cluster.topologies[n.topology].n for n in cluster.nodes]
        self._intra: dict[tuple[int, tuple[int, ...]], float] = {}
        self._best_intra: dict[int, float] = {}
        self._ideal_inter: dict[tuple[int, int, str | None], float] = {}
        self._stretch: dict[tuple[str, int, float, float], float] = {}
        self._accel: dict[int, float] = {}
        self.ideal_level = ideal_levels(cluster)
        self._typical: dict[tuple[str, tuple[int, ...]], float] = {}

    def profile_of(self, job_id: int) -> str:
        return CUSTOM if self._mix is None else self._mix.profile_of(job_id)

    def intra(self, tid: int, gpus: tuple[int, ...]) -> float:
        key = (tid, gpus)
        hit = self._intra.get(key)
        if hit is None:
            alloc = self.allocators[tid]
            hit = self._intra[key] = intra_busbw_gbps(alloc.topology, gpus, alloc.ring_mbps(gpus))
        return hit

    def best_intra(self, size: int) -> float:
        """The best busbw any empty node of the cluster gives `size` GPUs (the allocator's set)."""
        hit = self._best_intra.get(size)
        if hit is None:
            best = 0.0
            for tid, alloc in enumerate(self.allocators):
                if alloc.n >= size:
                    chosen = alloc.choose(range(alloc.n), size).indices
                    best = max(best, self.intra(tid, tuple(chosen)))
            hit = self._best_intra[size] = best if best > 0 else math.inf
        return hit

    def accelerator(self, tid: int) -> float:
        """Busbw of a hop between nodes of one NVLink domain: the node's NVLink pair figure."""
        hit = self._accel.get(tid)
        if hit is None:
            alloc = self.allocators[tid]
            hit = self._accel[tid] = (
                self.best_intra(2)
                if alloc.n < 2
                else self.intra(tid, tuple(alloc.choose(range(alloc.n), 2).indices))
            )
        return hit

    def busbw(self, slots: Sequence[tuple[int, tuple[int, ...]]], level: str | None) -> float:
        """The job's all-reduce busbw in this placement (inf: one GPU, nothing to reduce)."""
        bw = math.inf
        for node, gpus in slots:
            if len(gpus) > 1:
                bw = min(bw, self.intra(self.cluster.nodes[node].topology, gpus))
        if level is None or level != HOSTNAME:
            counts: dict[int, int] = {}
            for node, gpus in slots:
                counts[node] = counts.get(node, 0) + len(gpus)
            if len(counts) > 1:
                if level == ACCELERATOR:
                    for node in counts:
                        bw = min(bw, self.accelerator(self.cluster.nodes[node].topology))
                else:
                    members = [(g, self._node_gpus[n], self.nics[n]) for n, g in counts.items()]
                    bw = min(bw, inter_busbw_gbps(members, level, table=self._table))
        return bw

    def ideal_busbw(self, pods: Sequence[int], nodes: int, level: str | None) -> float:
        """The same job on one ideal domain: best intra-node sets, the fewest nodes, the best
        NICs of the cluster for that many GPUs per node, the ideal level's oversubscription."""
        bw = math.inf
        for size in set(pods):
            if size > 1:
                bw = min(bw, self.best_intra(size))
        if nodes > 1 and level != HOSTNAME:
            per_node = -(-sum(pods) // nodes)
            key = (per_node, max(pods), level)
            hit = self._ideal_inter.get(key)
            if hit is None:
                if level == ACCELERATOR:
                    hit = max(
                        (self.accelerator(t) for t, a in enumerate(self.allocators) if a.n >= max(pods)),
                        default=math.inf,
                    )
                else:
                    best = 0.0
                    for i, total in enumerate(self._node_gpus):
                        if total >= max(pods):
                            g = min(per_node, total)
                            best = max(best, self.nics[i].node_gbytes(nics_used(g, total, self.nics[i])))
                    hit = best / oversubscription(level, self._table) if best > 0 else math.inf
                self._ideal_inter[key] = hit
            bw = min(bw, hit)
        return bw

    def typical_stretch(self, job_id: int, pods: Sequence[int]) -> float:
        """The job's stretch on an average GPU of this cluster: the mean, over the nodes that can
        hold its largest pod and weighted by their GPUs, of its stretch on nodes of that kind,
        each at its best set, on the fewest such nodes, with their NICs, at the smallest level
        with that many nodes. No policy is asked: it is the cluster's hardware, not a placement,
        that makes a comm-heavy job on PCIe servers with one NIC run 5x its ideal time; the
        generator's offered load (`gputopo.sim.workload.at_cluster_speed`) counts work at this
        speed, so `--load 0.5` keeps about half the cluster busy whatever servers it has."""
        gpus = sum(pods)
        if gpus < 2:
            return 1.0
        profile = self.profile_of(job_id)
        key = (profile, tuple(sorted(pods)))
        hit = self._typical.get(key)
        if hit is not None:
            return hit
        largest = max(pods)
        fewest = min(len(pods), -(-gpus // max(self._node_gpus)))
        ideal = self.ideal_busbw(pods, fewest, self.ideal_level(fewest, largest))
        total = weighted = 0.0
        for i, node in enumerate(self.cluster.nodes):
            n = self._node_gpus[i]
            if n < largest:
                continue
            tid = node.topology
            alloc = self.allocators[tid]
            bw = math.inf
            for size in set(pods):
                if size > 1:
                    bw = min(bw, self.intra(tid, tuple(alloc.choose(range(n), size).indices)))
            nodes = min(len(pods), -(-gpus // n))
            if nodes > 1:
                level = self.ideal_level(nodes, largest)
                if level == ACCELERATOR:  # one NVLink domain: its pair figure, as busbw() reads it
                    bw = min(bw, self.accelerator(tid))
                else:
                    members = [(-(-gpus // nodes), n, self.nics[i])] * nodes
                    bw = min(bw, inter_busbw_gbps(members, level, table=self._table))
            weighted += n * self.stretch(profile, gpus, bw, ideal)
            total += n
        hit = self._typical[key] = weighted / total if total else 1.0
        return hit

    def stretch(self, profile: str, gpus: int, busbw: float, ideal: float) -> float:
        """step(actual) / step(ideal) of `profile` on `gpus` GPUs; never below 1 (an ideal that
        the placement beats, e.g. a tie broken by the cache, counts as ideal)."""
        key = (profile, gpus, busbw, ideal)
        hit = self._stretch.get(key)
        if hit is None:
            p = self._profiles[profile]
            actual = step_s(p.compute_s, p.overlap, comm_s(p.grad_bytes, gpus, busbw))
            best = step_s(p.compute_s, p.overlap, comm_s(p.grad_bytes, gpus, max(busbw, ideal)))
            hit = actual / best if best > 0 else 1.0
            if len(self._stretch) > 500_000:
                self._stretch.clear()
            self._stretch[key] = hit
        return hit


def ideal_levels(cluster: SimCluster) -> Callable[[int, int], str | None]:
    """For m nodes of pods up to `pod_gpus` GPUs: the smallest level (above one node) with a
    domain of at least m nodes that can hold such a pod. Counting every node would promise a
    gang of 8-GPU pods the NVLink domain of 4-GPU GB200 trays, an ideal no policy can reach."""
    per_size: dict[int, list[tuple[str, int]]] = {}

    def sizes(pod_gpus: int) -> list[tuple[str, int]]:
        hit = per_size.get(pod_gpus)
        if hit is None:
            fits = [i for i, n in enumerate(cluster.nodes) if cluster.topologies[n.topology].n >= pod_gpus]
            hit = per_size[pod_gpus] = []
            for level in cluster.levels:
                if level == HOSTNAME:
                    continue
                counts: dict[str, int] = {}
                for i in fits:
                    d = cluster.domain(i, level)
                    counts[d] = counts.get(d, 0) + 1
                hit.append((level, max(counts.values(), default=0)))
        return hit

    def ideal(m: int, pod_gpus: int = 1) -> str | None:
        if m <= 1:
            return HOSTNAME
        for level, biggest in sizes(pod_gpus):
            if biggest >= m:
                return level
        return None

    return ideal
