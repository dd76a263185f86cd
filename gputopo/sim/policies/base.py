"""What a simulated policy answers, and the node ranking the in-node baselines share.

A policy answers "where does this job go?" against a ClusterState: a `Slot` (a node and the GPUs
on it) for each pod, or a `Failure` with its reason (a `Hinted` one also says while asking again
would get the same answer). `Policy` is a node ranking plus an in-node GPU choice plus a gang
mode (kubelet-default, best-effort-pairs, best-combo; `catalog` has the table of all of them).
The sidecar, the peers and the sharing policies answer in the same types and import them from
here, below the catalog that builds every policy, so no policy module imports the catalog.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gputopo.node.allocator import AllocationError, Allocator
from gputopo.node.policy import GpuPolicy
from gputopo.sim.state import ClusterState, SimCluster
from gputopo.sim.workload import Job

#: One pod's placement: node index and GPU indices.
Slot = tuple[int, tuple[int, ...]]


@dataclass(frozen=True)
class Failure:
    """Why a job could not be placed now; `admission` marks a kubelet admission failure
    (the node was chosen but the device plugin's answer was unusable)."""

    reason: str
    admission: bool = False


def _never_holds() -> bool:
    """A Hinted made without a hint: asked again every time, as a plain Failure."""
    return False


@dataclass(frozen=True)
class Hinted(Failure):
    """A Failure with a queueing hint, as a kube-scheduler plugin's QueueingHint says which
    cluster events may make a pod schedulable: while `holds()` returns True, asking the policy
    again for the same job would get this same answer, so the engine need not ask. It reads the
    state as it is when called and may update the policy's own counts of it, as the ask would.
    (A subclass, not a field of every Failure: the baselines build one per failed attempt.)"""

    holds: Callable[[], bool] = field(default=_never_holds, compare=False, repr=False)


class Policy:
    """A node ranking + an in-node GPU choice + a gang mode (the table in `catalog`)."""

    def __init__(
        self,
        name: str,
        cluster: SimCluster,
        allocators: Sequence[Allocator],
        *,
        rank: str,
        gpus: Sequence[GpuPolicy] = (),
        cache_gpus: bool = False,
    ) -> None:
        self.name = name
        self.cluster = cluster
        self.allocators = allocators
        self._rank = rank
        self._gpus = gpus
        # (topology, free mask, size) -> GPUs, or None for a refusal: for deterministic policies
        self._answers: dict[tuple[int, int, int], tuple[int, ...] | None] | None = {} if cache_gpus else None

    # ------------------------------------------------------------------ single pods

    def _best_node(self, state: ClusterState, size: int) -> int | None:
        """kube-scheduler's node score for this policy over one node per equivalence class."""
        best: tuple[float, int] | None = None
        best_node: int | None = None
        for (_, mask), members in state.classes.items():
            free = mask.bit_count()
            if free < size:
                continue
            node = min(members)
            n = state.size[node]
            score = (free - size) / n if self._rank == "least" else (n - free + size) / n
            cand = (score, -node)
            if best is None or cand > best:
                best, best_node = cand, node
        return best_node

    def place_pod(self, state: ClusterState, size: int) -> Slot | Failure:
        node = self._best_node(state, size)
        if node is None:
            return Failure(f"no node has {size} free GPUs")
        tid, mask = state.topo[node], state.mask[node]
        key = (tid, mask, size)
        cache = self._answers
        if cache is not None and key in cache:
            gpus = cache[key]
        else:
            try:
                gpus = self._gpus[tid].choose(mask_list(mask, self.allocators[tid].n), size).indices
            except AllocationError:
                gpus = None
            if cache is not None:
                if len(cache) > 100_000:
                    cache.clear()
                cache[key] = gpus
        if gpus is None:
            return Failure(
                f"device plugin gave no usable set of {size} on {self.cluster.nodes[node].name}", True
            )
        return node, gpus

    # ------------------------------------------------------------------ jobs

    def place(self, state: ClusterState, job: Job) -> list[Slot] | Failure:
        """All pods of the job, or a Failure; the state is left unchanged either way."""
        return place_one_by_one(state, job, self.place_pod)


def place_one_by_one(
    state: ClusterState, job: Job, place_pod: Callable[[ClusterState, int], Slot | Failure]
) -> list[Slot] | Failure:
    """A job's pods one after the other, each where `place_pod` puts it, all or nothing (as
    kube-scheduler's Coscheduling admits a gang whose members it places one by one); the state
    is left unchanged either way."""
    if not job.is_gang:  # nothing to hold while the other members are placed
        got = place_pod(state, job.pods[0])
        return got if isinstance(got, Failure) else [got]
    slots: list[Slot] = []
    try:
        for size in job.pods:
            got = place_pod(state, size)
            if isinstance(got, Failure):
                return got
            state.take(*got)
            slots.append(got)
    finally:
        for node, gpus in slots:
            state.give(node, gpus)
    return slots


def mask_list(mask: int, n: int) -> list[int]:
    return [i for i in range(n) if mask >> i & 1]
