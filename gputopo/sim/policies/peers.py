"""Two stronger peers for the simulator: Alibaba's FGD and Kueue's topology-aware scheduling.

`fgd` — fragmentation gradient descent (Weng et al., "Beware of Fragmentation: Scheduling
GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC '23). A node's
fragmentation for a task is the free GPU capacity that task cannot use there; for whole-GPU
pods that is all of the node's free GPUs when it has fewer than the task asks, else nothing.
The node's fragmentation is the expectation of that over the target workload (the popularity
of each pod size); FGD puts each pod on the node whose fragmentation grows least. In the node
it is GPU-topology-blind (kubelet's order). The target workload is what FGD assumes known: the
pod sizes of the job list the policy is built with; built without one, it learns the sizes
online from the pods it has been asked to place so far. With `simulate --gpu-sharing` the
sharing form in gputopo/sim/policies/shared.py measures fragmentation in milli-GPUs instead.

`kueue-tas` — Kueue's Topology Aware Scheduling (KEP-2724, `pkg/cache/tas_flavor_snapshot.go`)
with its default BestFit profile for gangs: domains counted in pods that fit, the top-down
search for the lowest level with a domain that holds the whole gang (a "preferred" request at
the smallest network level above the node; at the top level, several domains), then level by
level downwards the domains by decreasing free capacity, the tightest one that holds what is
left for the last. Single pods get kube-scheduler's LeastAllocated; GPUs in the node NVIDIA's
pair allocator (go-gpuallocator best-effort, as its device plugin answers).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from gputopo.network.levels import HOSTNAME
from gputopo.node.allocator import AllocationError, Allocator
from gputopo.node.policy import GpuPolicy
from gputopo.sim.policies.base import Failure, Policy, Slot, mask_list
from gputopo.sim.state import ClusterState, SimCluster
from gputopo.sim.workload import Job


def pod_size_counts(jobs: Iterable[Job]) -> Counter[int]:
    """How many pods of each GPU count the workload has: FGD's task popularity (every pod of
    a gang is one task, as the scheduler sees it)."""
    out: Counter[int] = Counter()
    for job in jobs:
        out.update(job.pods)
    return out


def fragmentation_table(counts: Mapping[int, int], largest: int) -> list[int]:
    """`table[f]` = the expected fragmentation of a node with `f` free GPUs, times the number of
    tasks: f * (tasks larger than f). Integers, so equal growths compare equal exactly."""
    table = []
    for free in range(largest + 1):
        table.append(free * sum(c for size, c in counts.items() if size > free))
    return table


class FgdPolicy(Policy):
    """Node choice by the least growth of expected fragmentation; kubelet's order in the node."""

    def __init__(
        self,
        cluster: SimCluster,
        allocators: Sequence[Allocator],
        gpus: Sequence[GpuPolicy],
        jobs: Sequence[Job] = (),
    ) -> None:
        super().__init__("fgd", cluster, allocators, rank="fgd", gpus=gpus)
        self._largest = max(t.n for t in cluster.topologies)
        self._online = not jobs
        self._counts = pod_size_counts(jobs)
        self._table = fragmentation_table(self._counts, self._largest)

    def place(self, state: ClusterState, job: Job) -> list[Slot] | Failure:
        if self._online:  # no workload given: the distribution is what has arrived so far
            self._counts.update(job.pods)
            self._table = fragmentation_table(self._counts, self._largest)
        return super().place(state, job)

    def _best_node(self, state: ClusterState, size: int) -> int | None:
        table = self._table
        best: tuple[int, int] | None = None
        for (_, mask), members in state.classes.items():
            free = mask.bit_count()
            if free < size:
                continue
            node = min(members)
            cand = (table[free - size] - table[free], node)  # growth, then the first node
            if best is None or cand < best:
                best = cand
        return None if best is None else best[1]


def best_fit_domains(
    rooms: Sequence[int], count: int, names: Sequence[str] | None = None
) -> list[tuple[int, int]]:
    """Kueue's BestFit over one level: `rooms[i]` pods fit in domain i; returns (domain, pods)
    for `count` pods, or [] when they do not fit in all of them together.

    Domains are taken by decreasing room (ties by name, as Kueue sorts by label values); once a
    domain holds all that is left, the tightest domain from there on that still holds it is
    used instead (the first of equal rooms). Rooms 3,3,2,1 and 7 pods give 3+3+1."""
    if count <= 0 or sum(max(r, 0) for r in rooms) < count:
        return []
    keys = names if names is not None else [f"{i:09d}" for i in range(len(rooms))]
    order = sorted(range(len(rooms)), key=lambda i: (-rooms[i], keys[i]))
    out: list[tuple[int, int]] = []
    left = count
    for k, i in enumerate(order):
        if rooms[i] <= 0:
            break
        if rooms[i] >= left:
            best = i
            for j in order[k:]:  # decreasing rooms: the last that still fits is the tightest
                if rooms[j] >= left and rooms[j] != rooms[best]:
                    best = j
            out.append((best, left))
            return out
        out.append((i, rooms[i]))
        left -= rooms[i]
    return []  # unreachable: the rooms were counted above


class KueueTasPolicy(Policy):
    """Kueue TAS BestFit for gangs, LeastAllocated for single pods, go-gpuallocator in the node."""

    def __init__(
        self, cluster: SimCluster, allocators: Sequence[Allocator], gpus: Sequence[GpuPolicy]
    ) -> None:
        super().__init__("kueue-tas", cluster, allocators, rank="least", gpus=gpus, cache_gpus=True)
        # Kueue's levels run from the top (spine) down to the node; ours smallest first. A
        # Kueue Topology lists the levels the nodes carry: a level no node is labelled with
        # would make every node its own top domain, so it is left out.
        carried = [
            level
            for level in cluster.levels
            if level == HOSTNAME or any(node.labels.get(level) for node in cluster.nodes)
        ]
        self._levels = tuple(reversed(carried))
        n = len(cluster.nodes)
        self._domains = [[cluster.domain(i, level) for i in range(n)] for level in self._levels]
        self._node_of = {name: i for i, name in enumerate(self._domains[-1])}  # the node level

    def place(self, state: ClusterState, job: Job) -> list[Slot] | Failure:
        if not job.is_gang:
            return super().place(state, job)
        slots: list[Slot] = []
        try:
            # one Kueue PodSet per pod size (a gang's remainder pod is a second PodSet), largest
            # first, each admitted against the usage the earlier ones assumed
            for size, count in sorted(Counter(job.pods).items(), reverse=True):
                got = self._podset(state, size, count)
                if isinstance(got, Failure):
                    return got
                slots.extend(got)
        finally:
            for node, gpus in slots:
                state.give(node, gpus)
        return slots

    def _podset(self, state: ClusterState, size: int, count: int) -> list[Slot] | Failure:
        """Place `count` pods of `size` GPUs, taking them in `state` (the caller gives back)."""
        cap = [m.bit_count() // size for m in state.mask]  # NodeResourcesFit-style counting
        nodes = self._assign(cap, count)
        if not nodes:
            return Failure(f"no topology domain set holds {count} pods of {size} GPUs")
        out: list[Slot] = []
        for node, pods in nodes:
            for _ in range(pods):
                tid, mask = state.topo[node], state.mask[node]
                try:
                    gpus = self._gpus[tid].choose(mask_list(mask, self.allocators[tid].n), size).indices
                except AllocationError:
                    return Failure(
                        f"device plugin gave no usable set of {size} on {self.cluster.nodes[node].name}", True
                    )
                state.take(node, gpus)
                out.append((node, gpus))
        return out

    def _assign(self, cap: Sequence[int], count: int) -> list[tuple[int, int]]:
        """Kueue's two phases: up from the requested level to one with a domain that holds the
        gang (at the top, several domains together), then down level by level to the nodes."""
        top = len(self._levels) - 1
        level = max(top - 1, 0)  # "preferred": the smallest level above the node
        while True:
            names, rooms, paths = self._rooms(level, cap, None)
            if any(r >= count for r in rooms) or level == 0:
                picked = [(names[i], pods) for i, pods in best_fit_domains(rooms, count, paths)]
                break
            level -= 1
        while picked and level < top:
            parents = {name for name, _ in picked}
            names, rooms, paths = self._rooms(level + 1, cap, (level, parents))
            picked = [(names[i], pods) for i, pods in best_fit_domains(rooms, count, paths)]
            level += 1
        return [(self._node_of[name], pods) for name, pods in picked]

    def _rooms(
        self, level: int, cap: Sequence[int], within: tuple[int, set[str]] | None
    ) -> tuple[list[str], list[int], list[str]]:
        """Pods that fit per domain of `level` (only those under the `within` parents), with
        each domain's path from the top: Kueue orders equal rooms by those label values."""
        rooms: dict[str, int] = {}
        paths: dict[str, str] = {}
        for node, name in enumerate(self._domains[level]):
            if within is not None and self._domains[within[0]][node] not in within[1]:
                continue
            rooms[name] = rooms.get(name, 0) + cap[node]
            if name not in paths:
                paths[name] = "\x00".join(self._domains[k][node] for k in range(level + 1))
        names = sorted(rooms)
        return names, [rooms[n] for n in names], [paths[n] for n in names]
