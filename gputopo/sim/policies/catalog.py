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

Every policy admits a gang all or nothing (as kube-scheduler's GangScheduling/Coscheduling
do); without that the comparison would measure deadlocks, not placement. `gang-only` is
therefore gputopo with the network-aware planner switched off, isolating what the network
levels add. docs/simulator.md gives the reasons for each modelling choice. The in-node GPU
choice of every row is a `gputopo.node.policy.GpuPolicy` from the core's registry — the same objects
the device plugin runs with `--policy` — so the simulator models no allocator of its own.

`SIM_POLICIES` is the simulator's one table of rows: one per in-node policy of the core's
`REGISTRY` (built from its `SimSpec`: node ranking, caching, sharing rule), then the rows that
stand for a whole scheduler rather than an in-node choice (`PEERS`). Building a row, listing
the rows and knowing which of them share GPUs all read it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gputopo.node.allocator import Allocator, AllocatorPool
from gputopo.node.policy import REGISTRY, GpuPolicy, InNodePolicy, policy_by_name
from gputopo.sim.policies.base import Policy
from gputopo.sim.state import SimCluster
from gputopo.sim.workload import Job

if TYPE_CHECKING:
    from gputopo.sim.policies.sidecar import Lifecycle, SidecarPolicy


@dataclass(frozen=True)
class Build:
    """What building one row of the simulator reads: the cluster, the shared allocator tables,
    the run's random source (kubelet's random order, kube-scheduler's random choice among equal
    scores), the sidecar's gang lifecycle, and the workload (FGD's target, learned online when
    empty)."""

    cluster: SimCluster
    pool: AllocatorPool
    rng: random.Random
    lifecycle: Lifecycle | None = None
    jobs: Sequence[Job] = ()

    def allocators(self) -> list[Allocator]:
        return [self.pool.get(t) for t in self.cluster.topologies]

    def gpus(self, row: SimPolicy) -> list[GpuPolicy]:
        """The row's in-node policy, one per topology of the cluster."""
        return [
            policy_by_name(row.gpus, t, pool=self.pool, rng=self.rng, faithful=row.faithful)
            for t in self.cluster.topologies
        ]


@dataclass(frozen=True)
class SimPolicy:
    """One row of the simulator's comparison.

    `gpus` names the in-node policy (core registry) that answers its pods' GPUs; `faithful`
    keeps that policy's known crash as an admission failure, as on real nodes; `rank` is the
    node ranking of a plain `Policy` row; `cache`: its in-node answers may be cached (alike
    questions, alike answers); `share_rule`: how it places a fractional pod under
    `--gpu-sharing` (gputopo/sim/policies/shared.py), None when it hands out whole GPUs only."""

    name: str
    build: Callable[[SimPolicy, Build], Policy | SidecarPolicy]
    gpus: str
    faithful: bool = True
    rank: str = ""
    cache: bool = False
    share_rule: str | None = None


def _ranked(row: SimPolicy, b: Build) -> Policy | SidecarPolicy:
    """A node ranking + the in-node choice + members one by one (kubelet, NVIDIA's plugin, HAMi)."""
    return Policy(row.name, b.cluster, b.allocators(), rank=row.rank, gpus=b.gpus(row), cache_gpus=row.cache)


def _sidecar(row: SimPolicy, b: Build, *, planner: bool = True) -> Policy | SidecarPolicy:
    """As deployed: kube-scheduler's choice over the extender's scores, gangs through the
    sidecar's GangTracker (gputopo/sim/policies/sidecar.py); GPUs from the Allocator."""
    from gputopo.sim.policies.sidecar import SidecarPolicy

    return SidecarPolicy(row.name, b.cluster, b.allocators(), b.rng, planner=planner, lifecycle=b.lifecycle)


def _sidecar_without_planner(row: SimPolicy, b: Build) -> Policy | SidecarPolicy:
    return _sidecar(row, b, planner=False)


def _fgd(row: SimPolicy, b: Build) -> Policy | SidecarPolicy:
    from gputopo.sim.policies.peers import FgdPolicy  # the stronger peers (gputopo/sim/policies/peers.py)

    return FgdPolicy(b.cluster, b.allocators(), b.gpus(row), b.jobs)


def _kueue_tas(row: SimPolicy, b: Build) -> Policy | SidecarPolicy:
    from gputopo.sim.policies.peers import KueueTasPolicy

    return KueueTasPolicy(b.cluster, b.allocators(), b.gpus(row))


def _in_node_row(policy: InNodePolicy) -> SimPolicy:
    """The row of one in-node policy, from what its registry entry says the simulator needs."""
    spec = policy.sim
    build = _sidecar if spec.rank == "extender" else _ranked
    return SimPolicy(
        policy.name, build, policy.name, rank=spec.rank, cache=spec.deterministic, share_rule=spec.share_rule
    )


def _dra(row: SimPolicy, b: Build) -> Policy | SidecarPolicy:
    """kube-scheduler's own DRA allocator (gputopo/sim/policies/drapeers.py): LeastAllocated
    nodes, and on each the first devices in slice order that satisfy the claim: per-GPU devices
    (`dra-first-fit`, NVIDIA-style attributes) or gputopo's published set devices."""
    from gputopo.sim.policies.drapeers import DraFirstFit, DraGputopoSets

    chooser = DraFirstFit if row.gpus == "dra-first-fit" else DraGputopoSets
    allocators = b.allocators()
    return Policy(
        row.name,
        b.cluster,
        allocators,
        rank=row.rank,
        gpus=[chooser(a) for a in allocators],
        cache_gpus=row.cache,
    )


#: The rows that stand for a whole scheduler rather than an in-node choice (`gpus` of a DRA row
#: names its DRA allocator, not a core policy).
PEERS: tuple[SimPolicy, ...] = (
    SimPolicy("gang-only", _sidecar_without_planner, "gputopo"),
    # FGD's in-node choice is kubelet's order as the daemons run it (no modelled crash)
    SimPolicy("fgd", _fgd, "kubelet-default", faithful=False, share_rule="fgd"),
    SimPolicy("kueue-tas", _kueue_tas, "best-effort-pairs"),
    SimPolicy("dra-first-fit", _dra, "dra-first-fit", rank="least", cache=True),
    SimPolicy("dra-gputopo-sets", _dra, "dra-gputopo-sets", rank="least", cache=True),
)
#: Every row, in the order the simulator runs and reports them.
SIM_POLICIES: tuple[SimPolicy, ...] = (*map(_in_node_row, REGISTRY), *PEERS)
POLICIES: tuple[str, ...] = tuple(row.name for row in SIM_POLICIES)
BASELINE = "kubelet-default"


def sim_policy(name: str) -> SimPolicy:
    """The row called `name`, else ValueError naming the known ones."""
    for row in SIM_POLICIES:
        if row.name == name:
            return row
    raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})")


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
    row = sim_policy(name)
    return row.build(row, Build(cluster, pool, rng, lifecycle, jobs))
