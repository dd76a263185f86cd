"""Runs of `simulate --jobs tree`: one tree policy, or every one, over the same tree jobs.

Kept apart from gputopo.sim.trees (the workload, the job-time reading, the figures) because it
builds the policies of gputopo.sim.policies.trees, which import that module: as gputopo.sim.run
sits above the flat policies, this sits above the tree ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from gputopo.node.allocator import AllocatorPool
from gputopo.sim.engine import Ledger, Progress, RunConfig, runner
from gputopo.sim.metrics import Summary
from gputopo.sim.policies.trees import build_tree_policy
from gputopo.sim.state import ClusterState, SimCluster
from gputopo.sim.trees import RackWatch, Tree, TreeLedger, TreeRecorder, typical_tp
from gputopo.sim.workload import Job


def simulate_trees(
    cluster: SimCluster,
    jobs: Sequence[Job],
    trees: Mapping[int, Tree],
    policy_name: str,
    config: RunConfig,
    *,
    pool: AllocatorPool | None = None,
    progress: Progress | None = None,
    clock: Callable[[], float] | None = None,
) -> Summary:
    """One tree policy (gputopo.sim.policies.trees) over the jobs, replayed by the engine."""

    if config.mode != "replay":
        raise ValueError("tree jobs are replayed (the generator's arrivals or a timed trace)")
    tick = clock or time.perf_counter
    pool = pool or AllocatorPool()
    allocators = [pool.get(t) for t in cluster.topologies]
    policy = build_tree_policy(policy_name, cluster, allocators, trees, config.seed)
    state = ClusterState(cluster)
    rec = TreeRecorder(cluster, allocators, config.comm, trees)
    horizon = max((j.submit for j in jobs), default=0.0)
    watch = RackWatch(state, typical_tp(trees), horizon)
    ledger: Ledger = TreeLedger(state, policy.place, watch, trees)
    started = tick()
    never = runner(config)(ledger, jobs, rec, progress)
    summary = rec.summary(policy_name, jobs, never, tick() - started, timed=True)
    extra = rec.tree_figures()
    racks = watch.mean()
    if racks is not None:
        extra["racks_fragmented_mean"] = racks
        extra["racks"] = float(len(watch.racks))
    extra["typical_tp_trays"] = float(watch.need)
    return replace(summary, extra=extra)


def compare_trees(
    cluster: SimCluster,
    jobs: Sequence[Job],
    trees: Mapping[int, Tree],
    policies: Sequence[str],
    config: RunConfig,
    *,
    progress: Callable[[str], Progress] | None = None,
) -> list[Summary]:
    """Every tree policy on the same jobs and seed."""
    pool = AllocatorPool()
    return [
        simulate_trees(
            cluster,
            jobs,
            trees,
            name,
            config,
            pool=pool,
            progress=None if progress is None else progress(name),
        )
        for name in policies
    ]
