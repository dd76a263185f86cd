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
choice of every row is a `gputopo.node.policy.GpuPolicy` from the core's registry — the same objects
the device plugin runs with `--policy` — so the simulator models no allocator of its own.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gputopo.node.allocator import AllocatorPool
from gputopo.node.policy import policy_by_name
from gputopo.sim.policies.base import Policy
from gputopo.sim.state import SimCluster
from gputopo.sim.workload import Job

if TYPE_CHECKING:
    from gputopo.sim.policies.sidecar import Lifecycle, SidecarPolicy

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
        # sidecar's GangTracker (gputopo/sim/policies/sidecar.py); GPUs from the Allocator
        from gputopo.sim.policies.sidecar import SidecarPolicy

        return SidecarPolicy(name, cluster, allocators, rng, planner=name == "gputopo", lifecycle=lifecycle)
    if name in ("fgd", "kueue-tas"):  # the stronger peers (gputopo/sim/policies/peers.py)
        from gputopo.sim.policies.peers import FgdPolicy, KueueTasPolicy

        if name == "fgd":
            kubelet = [policy_by_name("kubelet-default", t, pool=pool, rng=rng) for t in topos]
            return FgdPolicy(cluster, allocators, kubelet, jobs)
        pairs = [policy_by_name("best-effort-pairs", t, pool=pool, faithful=True) for t in topos]
        return KueueTasPolicy(cluster, allocators, pairs)
    if name in (
        "dra-first-fit",
        "dra-gputopo-sets",
    ):  # kube-scheduler's DRA allocator (gputopo/sim/policies/drapeers.py)
        from gputopo.sim.policies.drapeers import DraFirstFit, DraGputopoSets

        chooser = DraFirstFit if name == "dra-first-fit" else DraGputopoSets
        return Policy(
            name, cluster, allocators, rank="least", gpus=[chooser(a) for a in allocators], cache_gpus=True
        )
    raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})")
