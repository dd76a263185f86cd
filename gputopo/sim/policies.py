"""The placement policies compared by the simulator: gputopo and the ones people run today.

A policy answers "where does this job go?" against a ClusterState: a node for each pod and
the GPUs on it, or a Failure with its reason. Each policy is a node ranking (what the
scheduler does) plus an in-node GPU choice (what the device plugin answers) plus a gang mode:

| policy            | node ranking                   | GPUs in the node              | gangs                     |
|-------------------|--------------------------------|-------------------------------|---------------------------|
| kubelet-default   | least allocated (spread)       | kubelet's (random) map order  | members one by one, all or nothing |
| best-effort-pairs | least allocated (spread)       | go-gpuallocator best-effort, NVSwitch-blind | same          |
| best-combo        | most allocated (HAMi binpack)  | HAMi best combination         | same                      |
| gang-only         | kube-scheduler + extender score | gputopo Allocator            | same: no network levels   |
| gputopo           | kube-scheduler + extender score | gputopo Allocator            | the sidecar's GangTracker |
| fgd               | least growth of expected fragmentation (FGD) | kubelet's (random) order | members one by one, all or nothing |
| kueue-tas         | least allocated (single pods)  | go-gpuallocator best-effort   | Kueue TAS BestFit over the levels |
| dra-first-fit     | least allocated (spread)       | DRA first fit over per-GPU devices (NVIDIA's driver) | members one by one, all or nothing |
| dra-gputopo-sets  | least allocated (spread)       | DRA first free set device in gputopo's published order | same |

Every policy admits a gang all or nothing (as kube-scheduler's GangScheduling/Coscheduling
do); without that the comparison would measure deadlocks, not placement. `gang-only` is
therefore gputopo with the network-aware planner switched off, isolating what the network
levels add. docs/simulator.md gives the reasons for each modelling choice. The in-node GPU
choice of every row is a `gputopo.policy.GpuPolicy` from the core's registry — the same objects
the device plugin runs with `--policy` — so the simulator models no allocator of its own.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gputopo.allocator import AllocationError, Allocator, AllocatorPool
from gputopo.policy import GpuPolicy, policy_by_name
from gputopo.sim.state import ClusterState, SimCluster
from gputopo.sim.workload import Job

if TYPE_CHECKING:
    from gputopo.sim.sidecar import Lifecycle, SidecarPolicy

POLICIES: tuple[str, ...] = (
    "gputopo",
    "kubelet-default",
    "best-effort-pairs",
    "best-combo",
    "gang-only",
    "fgd",
    "kueue-tas",
    "dra-first-fit",
    "dra-gputopo-sets",
)
BASELINE = "kubelet-default"

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
    """A node ranking + an in-node GPU choice + a gang mode (see the module table)."""

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
                gpus = self._gpus[tid].choose(_mask_list(mask, self.allocators[tid].n), size).indices
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


def _mask_list(mask: int, n: int) -> list[int]:
    return [i for i in range(n) if mask >> i & 1]


def build_policy(
    name: str,
    cluster: SimCluster,
    pool: AllocatorPool,
    rng: random.Random,
    lifecycle: Lifecycle | None = None,
    jobs: Sequence[Job] = (),
) -> Policy | SidecarPolicy:
    """A fresh policy (its own caches; `rng` feeds kubelet's random order and kube-scheduler's
    random choice among equal scores; `lifecycle` shapes the sidecar's gang lifecycle; `jobs` is
    the workload `fgd` assumes known, learned online when empty)."""
    topos = cluster.topologies
    allocators = [pool.get(t) for t in topos]
    if name in ("kubelet-default", "best-effort-pairs", "best-combo"):
        # faithful: go-gpuallocator's padding answer stays an admission failure, as on real nodes
        gpus = [policy_by_name(name, t, pool=pool, rng=rng, faithful=True) for t in topos]
        rank = "most" if name == "best-combo" else "least"
        # kubelet's order is drawn afresh each time; the others answer alike for alike questions
        return Policy(name, cluster, allocators, rank=rank, gpus=gpus, cache_gpus=name != "kubelet-default")
    if name in ("gputopo", "gang-only"):
        # as deployed: kube-scheduler's choice over the extender's scores, gangs through the
        # sidecar's GangTracker (gputopo/sim/sidecar.py); GPUs from the Allocator
        from gputopo.sim.sidecar import SidecarPolicy

        return SidecarPolicy(name, cluster, allocators, rng, planner=name == "gputopo", lifecycle=lifecycle)
    if name in ("fgd", "kueue-tas"):  # the stronger peers (gputopo/sim/peers.py)
        from gputopo.sim.peers import FgdPolicy, KueueTasPolicy

        if name == "fgd":
            kubelet = [policy_by_name("kubelet-default", t, pool=pool, rng=rng) for t in topos]
            return FgdPolicy(cluster, allocators, kubelet, jobs)
        pairs = [policy_by_name("best-effort-pairs", t, pool=pool, faithful=True) for t in topos]
        return KueueTasPolicy(cluster, allocators, pairs)
    if name in (
        "dra-first-fit",
        "dra-gputopo-sets",
    ):  # kube-scheduler's DRA allocator (gputopo/sim/drapeers.py)
        from gputopo.sim.drapeers import DraFirstFit, DraGputopoSets

        chooser = DraFirstFit if name == "dra-first-fit" else DraGputopoSets
        return Policy(
            name, cluster, allocators, rank="least", gpus=[chooser(a) for a in allocators], cache_gpus=True
        )
    raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})")
