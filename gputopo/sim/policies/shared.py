"""The policies that share GPUs under `gputopo simulate --gpu-sharing`, each by its own rule.

| policy          | stands for (under sharing)            | node                          | GPU of a fractional pod |
|-----------------|---------------------------------------|-------------------------------|-------------------------|
| kubelet-default | HAMi, node and GPU policies `spread`   | least allocated milli-GPUs after the pod | the least used GPU that fits |
| best-combo      | HAMi, node and GPU policies `binpack` | most allocated milli-GPUs after the pod | the most used GPU that fits |
| fgd             | Alibaba's FGD (Weng et al., ATC '23)  | least growth of expected fragmentation | the one whose share leaves the least |

Whole-GPU pods keep each policy's in-node GPU choice (kubelet's order, HAMi's best combination)
on the GPUs no share touches; only the node ranking counts milli-GPUs. Node choice reads the
ShareBook's classes (nodes with the same sorted free vector), ties go to the first node.

FGD's fragmentation of a node for a task (num_gpu d, gpu_milli u), on the node's free milli-GPUs
per GPU: all of them when the task cannot go there (fewer than d GPUs fully free for a
whole-GPU task; no GPU with u free for a fractional one), else those on GPUs the task cannot
use (partly used GPUs for a whole-GPU task, GPUs with less than u free for a fractional one).
A node's fragmentation is the expectation over the target workload (the (d, u) counts of the
job list, or learned online); FGD takes the node and, for a fractional pod, the GPU whose
placement grows it least (ties: the fuller GPU, then the first). Integers throughout, so equal
growths tie exactly.
"""

from __future__ import annotations

import random
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Sequence

from gputopo.node.allocator import Allocator, AllocatorPool
from gputopo.node.policy import GpuPolicy, policy_by_name
from gputopo.sim.policies.base import Failure, Policy, Slot
from gputopo.sim.sharing import WHOLE, ShareBook
from gputopo.sim.state import ClusterState, SimCluster
from gputopo.sim.workload import Job

RULES = ("spread", "binpack", "fgd")
#: Cached fragmentation answers before a cache is emptied (bounds memory on long runs).
MAX_CACHE = 200_000


def task_counts(jobs: Iterable[Job]) -> Counter[tuple[int, int]]:
    """FGD's target workload under sharing: how many tasks of each (GPUs, milli-GPUs per GPU)
    the job list has (every gang member one task)."""
    out: Counter[tuple[int, int]] = Counter()
    for job in jobs:
        if job.milli < WHOLE:
            out[(1, job.milli)] += 1
        else:
            out.update((size, WHOLE) for size in job.pods)
    return out


def fragmentation(free: Sequence[int], task: tuple[int, int]) -> int:
    """FGD's fragmentation of a node with `free` milli-GPUs per GPU (sorted ascending) for one
    task: the free capacity the task cannot use there (module docstring)."""
    size, milli = task
    total = sum(free)
    if milli >= WHOLE:
        full = len(free) - bisect_left(free, WHOLE)
        return total if full < size else total - WHOLE * full
    if not free or free[-1] < milli:
        return total
    return sum(free[: bisect_left(free, milli)])


class SharedPolicy(Policy):
    """A node rule over milli-GPUs + a GPU rule for shares; whole pods through Policy.place_pod."""

    def __init__(
        self,
        name: str,
        cluster: SimCluster,
        allocators: Sequence[Allocator],
        gpus: Sequence[GpuPolicy],
        book: ShareBook,
        rule: str,
        *,
        cache_gpus: bool,
        jobs: Sequence[Job] = (),
    ) -> None:
        if rule not in RULES:
            raise ValueError(f"unknown sharing rule {rule!r}")
        super().__init__(name, cluster, allocators, rank=rule, gpus=gpus, cache_gpus=cache_gpus)
        self.book = book
        self.rule = rule
        self._online = not jobs
        self._tasks = task_counts(jobs)
        self._frag: dict[tuple[int, ...], int] = {}
        self._growth: dict[tuple[tuple[int, ...], int, int], tuple[int, int]] = {}

    # ------------------------------------------------------------------ FGD

    def expected(self, free: tuple[int, ...]) -> int:
        """Sum over the workload's tasks of count * fragmentation (sorted `free`)."""
        hit = self._frag.get(free)
        if hit is None:
            if len(self._frag) > MAX_CACHE:
                self._frag.clear()
            hit = self._frag[free] = sum(c * fragmentation(free, t) for t, c in self._tasks.items())
        return hit

    def growth(self, key: tuple[int, ...], size: int, milli: int) -> tuple[int, int]:
        """(growth of expected fragmentation, free milli-GPUs of the GPU taken) for the best
        placement of one pod on a node whose sorted free vector is `key`; the pod must fit."""
        memo = (key, size, milli)
        hit = self._growth.get(memo)
        if hit is not None:
            return hit
        before = self.expected(key)
        if milli >= WHOLE:  # any `size` fully free GPUs: all leave the same vector
            after = tuple(sorted((0,) * size + key[: len(key) - size]))
            hit = (self.expected(after) - before, WHOLE)
        else:
            options = []
            for x in sorted(set(key)):
                if x >= milli:
                    rest = list(key)
                    rest.remove(x)
                    options.append((self.expected(tuple(sorted([*rest, x - milli]))) - before, x))
            hit = min(options)
        if len(self._growth) > MAX_CACHE:
            self._growth.clear()
        self._growth[memo] = hit
        return hit

    # ------------------------------------------------------------------ node choice

    def _choose(self, size: int, milli: int) -> tuple[int, int] | None:
        """(node, free milli-GPUs of the GPU a share goes to) or None when no node has room;
        `milli` 1000 = `size` whole GPUs."""
        best: tuple[float, int, int] | None = None
        demand = milli if milli < WHOLE else WHOLE * size
        for key, members in self.book.classes.items():
            if milli < WHOLE:
                if key[-1] < milli:
                    continue
            elif len(key) - bisect_left(key, WHOLE) < size:
                continue
            node = min(members)
            cap = WHOLE * len(key)
            cand: tuple[float, int, int]
            if self.rule == "fgd":
                grow, x = self.growth(key, size, milli)
                cand = (grow, node, x)
            elif self.rule == "spread":  # least allocated after the pod, then the least used GPU
                x = key[-1] if milli < WHOLE else WHOLE
                cand = (-(sum(key) - demand) / cap, node, x)
            else:  # binpack: most allocated after the pod, then the most used GPU that fits
                x = key[bisect_left(key, milli)] if milli < WHOLE else WHOLE
                cand = (-(cap - sum(key) + demand) / cap, node, x)
            if best is None or cand < best:
                best = cand
        return None if best is None else (best[1], best[2])

    def _best_node(self, state: ClusterState, size: int) -> int | None:
        """Whole pods (Policy.place_pod): the node by this rule over milli-GPUs."""
        got = self._choose(size, WHOLE)
        return None if got is None else got[0]

    # ------------------------------------------------------------------ jobs

    def place(self, state: ClusterState, job: Job) -> list[Slot] | Failure:
        """All pods of the job (a share of one GPU for a fractional pod), or a Failure; nothing
        is taken (the caller takes the slots through the book)."""
        if self._online:
            self._tasks.update(task_counts([job]))
            self._frag.clear()
            self._growth.clear()
        if job.milli < WHOLE:
            got = self._choose(1, job.milli)
            if got is None:
                return Failure(f"no GPU has {job.milli} milli-GPUs free")
            node, x = got
            return [(node, (self.book.vec[node].index(x),))]
        if not state.could_fit(job.pods):
            return Failure("not enough free GPUs")
        if not job.is_gang:
            pod = self.place_pod(state, job.pods[0])
            return pod if isinstance(pod, Failure) else [pod]
        slots: list[Slot] = []
        try:
            for size in job.pods:  # members one by one, all or nothing, through the book
                pod = self.place_pod(state, size)
                if isinstance(pod, Failure):
                    return pod
                self.book.take(*pod)
                slots.append(pod)
        finally:
            for node, gpus in slots:
                self.book.give(node, gpus)
        return slots


def build_shared_policy(
    name: str,
    cluster: SimCluster,
    pool: AllocatorPool,
    rng: random.Random,
    book: ShareBook,
    jobs: Sequence[Job] = (),
) -> SharedPolicy:
    """The sharing form of `kubelet-default`, `best-combo` or `fgd`, with the in-node choice for
    whole pods that `catalog.build_policy` gives the same name."""
    topos = cluster.topologies
    allocators = [pool.get(t) for t in topos]
    if name == "kubelet-default":
        gpus = [policy_by_name(name, t, pool=pool, rng=rng, faithful=True) for t in topos]
        return SharedPolicy(name, cluster, allocators, gpus, book, "spread", cache_gpus=False)
    if name == "best-combo":
        gpus = [policy_by_name(name, t, pool=pool, rng=rng, faithful=True) for t in topos]
        return SharedPolicy(name, cluster, allocators, gpus, book, "binpack", cache_gpus=True)
    if name == "fgd":
        gpus = [policy_by_name("kubelet-default", t, pool=pool, rng=rng) for t in topos]
        return SharedPolicy(name, cluster, allocators, gpus, book, "fgd", cache_gpus=False, jobs=jobs)
    raise ValueError(f"policy {name!r} does not share GPUs")
