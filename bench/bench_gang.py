"""Gang planning time on a 5,000-node fat tree: 16 x 8 and 128 x 8 GPU gangs, a mixed one, and
a 400 x 8 one that no spine can hold (so the nodes are chosen across spines and leaves).

The cluster is generated (10 spines x 25 leaves x 20 nodes of DGX A100 / HGX H100 / DGX-1,
30 % of the nodes partly or fully busy); each run plans on one of a few differently busy
variants of it, so repeated runs are not one cached answer. Three ways per gang, same process:

  naive          prune=False: every domain of every level packed and scored in Python (baseline)
  pruned         the planner as the scheduler calls it per request: index built inside the call
  pruned+index   the same with the per-snapshot NetworkIndex passed in (labels change rarely)
  obj:level1st   pruned+index with the cluster objective, the smallest level's plan (the rule
                 before the job-time prediction, gputopo.gang.predict)
  obj:jobtime    the same choosing among levels by predicted job time, as the sidecar does now

Printed: p50/p99 milliseconds and each variant's p50 speed-up over naive. Target: 128 x 8
planned in under 100 ms. Run: .venv/bin/python bench/bench_gang.py [--runs 30]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from gputopo.gang.planner import GangPlan, GangSpec, Member, NoPlan, plan_gang
from gputopo.network.cluster import ClusterSnapshot, generate_cluster
from gputopo.network.levels import LEAF, SPINE, NetworkIndex
from gputopo.network.nodeview import NodeView
from gputopo.node.allocator import AllocatorPool
from gputopo.pod.objective import ClusterObjective, DemandMix

MIX = {"dgx-a100": 2.0, "hgx-h100": 1.0, "dgx1-v100": 1.0}
TARGET_MS = {"128x8": 100.0}


def gangs() -> dict[str, GangSpec]:
    def equal(count: int, gpus: int) -> GangSpec:
        return GangSpec("ml/bench", tuple(Member(f"ml/w{i}", gpus) for i in range(count)))

    mixed = GangSpec("ml/mixed", (Member("ml/launcher", 2), *(Member(f"ml/w{i}", 8) for i in range(31))))
    return {"16x8": equal(16, 8), "128x8": equal(128, 8), "1x2+31x8": mixed, "400x8": equal(400, 8)}


Plan = Callable[[tuple[NodeView, ...]], GangPlan | NoPlan]


def timed(fn: Plan, views: list[tuple[NodeView, ...]], runs: int) -> tuple[np.ndarray, GangPlan | NoPlan]:
    """Milliseconds per call, cycling through the cluster variants, after one warm-up call
    (allocator tables and caches, as in a running scheduler) whose plan is returned."""
    first = fn(views[0])
    samples = []
    for i in range(runs):
        v = views[i % len(views)]
        started = time.perf_counter()
        fn(v)
        samples.append((time.perf_counter() - started) * 1000)
    return np.array(samples), first


def spread(plan: GangPlan, index: NetworkIndex) -> str:
    """How many spines and leaves the plan's nodes touch (the planner's tie-break (3b))."""
    nodes = {p.node for p in plan.placements}
    spines = {index.domain(n, SPINE) for n in nodes}
    leaves = {index.domain(n, LEAF) for n in nodes}
    return f"{len(spines)} spine{'s' if len(spines) > 1 else ''} / {len(leaves)} lea{'ves' if len(leaves) > 1 else 'f'}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=30, help="timed runs per variant (naive: a third)")
    args = parser.parse_args()
    pool = AllocatorPool()
    variants: list[ClusterSnapshot] = [
        generate_cluster(10, 25, 20, MIX, seed=seed, busy_fraction=0.3, pool=pool) for seed in range(4)
    ]
    index = variants[0].index  # same names and labels in every variant
    views = [v.node_views() for v in variants]
    levels = variants[0].levels
    objective = ClusterObjective(DemandMix())
    print(
        f"cluster: {len(variants[0].nodes)} nodes, {len(pool)} server types, 30 % busy, {len(variants)} variants"
    )
    print(
        f"{'gang':<10}{'variant':<14}{'runs':>6}{'p50 ms':>9}{'p99 ms':>9}{'vs naive':>10}  plan on variant 0"
    )
    for name, spec in gangs().items():
        ways: dict[str, Plan] = {
            "naive": lambda v, spec=spec: plan_gang(spec, v, levels, prune=False),
            "pruned": lambda v, spec=spec: plan_gang(spec, v, levels),
            "pruned+index": lambda v, spec=spec: plan_gang(spec, v, levels, index=index),
            # as the sidecar calls it: with the cluster objective, the level rule first (before
            # gang.predict) and by predicted job time (now); the cost ratio is the second's
            "obj:level1st": lambda v, spec=spec: plan_gang(
                spec, v, levels, index=index, objective=objective, level_first=True
            ),
            "obj:jobtime": lambda v, spec=spec: plan_gang(spec, v, levels, index=index, objective=objective),
        }
        p50_naive = p50_level = 0.0
        for way, fn in ways.items():
            runs = max(args.runs // 3, 3) if way == "naive" else args.runs
            samples, out = timed(fn, views, runs)
            p50, p99 = np.percentile(samples, 50), np.percentile(samples, 99)
            if way == "naive":
                p50_naive = p50
            if way == "obj:level1st":
                p50_level = p50
            where = (
                f"{out.level.rpartition('/')[2]}={out.domain}, {out.nodes_used} nodes, {spread(out, index)}"
                if isinstance(out, GangPlan)
                else f"no plan: {out.reason}"
            )
            print(f"{name:<10}{way:<14}{runs:>6}{p50:>9.1f}{p99:>9.1f}{p50_naive / p50:>9.1f}x  {where}")
            if way == "obj:jobtime":
                print(
                    f"{'':<10}cost of the job-time choice: {p50 / p50_level:.2f}x the level rule's p50 (target <= 2x)"
                )
            if way == "pruned" and name in TARGET_MS:
                verdict = "met" if p99 < TARGET_MS[name] else "MISSED"
                print(
                    f"{'':<10}target: p99 under {TARGET_MS[name]:.0f} ms even without a prebuilt index: {verdict}"
                )
    for name, spec in gangs().items():
        same = all(plan_gang(spec, v, levels) == plan_gang(spec, v, levels, prune=False) for v in views)
        print(f"{name}: pruned and naive plans {'agree' if same else 'DIFFER (a bug)'} on every variant")


if __name__ == "__main__":
    main()
