"""Run one policy on a workload, or compare several on the same one.

`simulate` hands a run to the event loop (`engine`) over whole GPUs, or under `--gpu-sharing`
to `simulate_shared` over the share book (`sharing`); `compare` runs every policy on the same
jobs and seed and adds each one's throughput against kubelet-default. This module sits above
the event loop, the sharing ledger and the policies, so none of those imports another to hand
a run over.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from gputopo.node.allocator import AllocatorPool
from gputopo.sim.engine import Progress, RunConfig, WholeGpus, runner
from gputopo.sim.metrics import Recorder, Summary
from gputopo.sim.policies.base import Failure, Hinted, Slot
from gputopo.sim.policies.catalog import BASELINE, build_policy
from gputopo.sim.policies.shared import build_shared_policy
from gputopo.sim.sharing import WHOLE, ShareBook, ShareLedger, ShareRecorder, shares
from gputopo.sim.state import ClusterState, SimCluster
from gputopo.sim.workload import Job


def simulate(
    cluster: SimCluster,
    jobs: Sequence[Job],
    policy_name: str,
    config: RunConfig,
    *,
    pool: AllocatorPool | None = None,
    progress: Progress | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Summary:
    """Run one policy; `jobs` must be in submission order (fill mode: in arrival order)."""
    if config.mode not in ("replay", "fill"):
        raise ValueError(f"unknown mode {config.mode!r}")
    pool = pool or AllocatorPool()
    lifecycle = config.lifecycle
    if config.mode == "fill":  # nothing ever leaves: a gang waiting for its level would wait forever
        lifecycle = replace(lifecycle, spill_after_s=0.0)
    if config.gpu_sharing:  # its own bookkeeping (a share ledger), off the default run's path
        shared = replace(config, lifecycle=lifecycle)
        return simulate_shared(cluster, jobs, policy_name, shared, pool=pool, progress=progress, clock=clock)
    rng = random.Random(config.seed)
    policy = build_policy(policy_name, cluster, pool, rng, lifecycle, jobs)
    state = ClusterState(cluster)
    rec = Recorder(cluster, [pool.get(t) for t in cluster.topologies], config.comm)
    started = clock()
    ledger = WholeGpus(state, policy.place)
    never = runner(config)(ledger, jobs, rec, progress)
    if progress is not None:
        progress(sum(len(j.pods) for j in jobs))  # the end, whatever never started
    summary = rec.summary(
        policy_name,
        jobs,
        never,
        clock() - started,
        timed=config.mode == "replay",
        free_at_end=state.free_total if config.mode == "fill" else None,
    )
    figures = getattr(policy, "figures", None)  # the sidecar path's lifecycle figures
    return replace(summary, extra=figures()) if figures is not None else summary


def simulate_shared(
    cluster: SimCluster,
    jobs: Sequence[Job],
    policy_name: str,
    config: RunConfig,
    *,
    pool: AllocatorPool,
    progress: Callable[[int], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Summary:
    """One policy under --gpu-sharing (`simulate` hands over when the RunConfig asks for
    it): a sharing policy places fractional pods by its share rule, the others as whole GPUs;
    every take and give goes through the ShareBook."""

    mode = config.mode
    rng = random.Random(config.seed)
    state = ClusterState(cluster)
    book = ShareBook(state)
    if shares(policy_name):
        policy = build_shared_policy(policy_name, cluster, pool, rng, book, jobs)

        def place(job: Job, hint: Hinted | None) -> tuple[list[Slot], int] | Failure:
            if hint is not None and hint.holds():
                return hint
            got = policy.place(state, job)
            return got if isinstance(got, Failure) else (got, min(job.milli, WHOLE))

        figures = None
    else:
        whole = build_policy(policy_name, cluster, pool, rng, config.lifecycle, jobs)

        def place(job: Job, hint: Hinted | None) -> tuple[list[Slot], int] | Failure:
            if not state.could_fit(job.pods):
                return Failure("not enough free GPUs")
            if hint is not None and hint.holds():
                return hint
            got = whole.place(state, job)
            return got if isinstance(got, Failure) else (got, WHOLE)

        figures = getattr(whole, "figures", None)
    rec = ShareRecorder(cluster, [pool.get(t) for t in cluster.topologies], config.comm)
    started = clock()
    never = runner(config)(ShareLedger(book, place), jobs, rec, progress)
    if progress is not None:
        progress(sum(len(j.pods) for j in jobs))
    summary = rec.shared_summary(
        policy_name,
        jobs,
        never,
        clock() - started,
        timed=mode == "replay",
        free_end=book.free_milli if mode == "fill" else None,
    )
    return replace(summary, extra=figures()) if figures is not None else summary


def compare(
    cluster: SimCluster,
    jobs: Sequence[Job],
    policies: Sequence[str],
    config: RunConfig,
    *,
    progress: Callable[[str], Progress] | None = None,
) -> list[Summary]:
    """Every policy on the same jobs and seed; adds throughput relative to kubelet-default."""
    pool = AllocatorPool()
    results = [
        simulate(
            cluster, jobs, name, config, pool=pool, progress=None if progress is None else progress(name)
        )
        for name in policies
    ]
    base = next((r for r in results if r.policy == BASELINE), None)
    if base is None or not base.efficiency:
        return results
    out = []
    for r in results:
        ratio = None if r.efficiency is None else r.efficiency / base.efficiency
        out.append(Summary(**{**r.__dict__, "throughput_vs_baseline": ratio}))
    return out
