"""Simulator speed: simulated pods per second per policy, side by side in one process.

Two tables.

  * Workloads (the default): each run exactly as `gputopo simulate` builds it
    (gputopo.sim.cli.prepare; every policy in the CLI's order with one allocator pool, as
    gputopo.sim.run.compare runs them) on the default generator run, the Philly and Helios
    excerpts and the mixed-leaf and gb200-nvl presets. Rates are pods per second of the
    process's CPU time (other work on a shared machine does not count), each policy's best
    over `--repeat` comparisons; the last column is each policy's rate over the fastest
    *baseline*'s (every policy but gputopo and its ablation gang-only), and a verdict line says
    whether gputopo reaches issue 10's "at least half of the fastest baseline's rate".
  * Sizes (`--sizes 10000,100000`): generated pods at `--load`, each policy's ratio against
    the `kubelet-default` run of the same size (the cheapest policy: random GPU order, no
    search), so the numbers compare across machines.

Run: .venv/bin/python bench/bench_sim.py [--workloads default,philly,helios,mixed-leaf,gb200-nvl]
     [--repeat 3] [--sizes 10000,100000] [--load 0.7]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import numpy as np

from gputopo.node.allocator import AllocatorPool
from gputopo.sim.cli import add_arguments, prepare
from gputopo.sim.clusters import default_cluster
from gputopo.sim.engine import RunConfig
from gputopo.sim.policies.catalog import BASELINE, POLICIES
from gputopo.sim.run import simulate
from gputopo.sim.workload import generate

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT.parent / "shared" / "traces"
#: `gputopo simulate` arguments of each workload of the first table.
WORKLOADS: dict[str, list[str]] = {
    "default": [],
    "philly": ["--trace", str(TRACES / "philly-excerpt-15k" / "philly_jobs_15k.csv")],
    "helios": ["--trace", str(TRACES / "helios-excerpt-15k" / "helios_jobs_15k.csv")],
    "mixed-leaf": ["--cluster-preset", "mixed-leaf"],
    "gb200-nvl": ["--cluster-preset", "gb200-nvl"],
}
SELF = "gputopo"
#: Not baselines: gputopo itself and its ablation (gputopo without the gang planner).
NOT_BASELINES = (SELF, "gang-only")
#: Issue 10: gputopo at least half as fast as the fastest baseline on the default run.
TARGET = 0.5


def workloads_table(names: list[str], repeat: int) -> None:
    parser = argparse.ArgumentParser(prog="gputopo simulate")
    add_arguments(parser)
    for name in names:
        cluster, jobs, header, config, policies = prepare(parser.parse_args(WORKLOADS[name]))
        rates: dict[str, list[float]] = {p: [] for p in policies}
        # As gputopo.sim.run.compare: one pool, the CLI's order. The pool lives across the
        # comparisons: built anew each time, its tables would be filled in every comparison by
        # whichever policy runs first (gputopo) and found warm by the rest.
        pool = AllocatorPool()
        for _ in range(repeat):
            for p in policies:
                gc.collect()  # no policy pays for the garbage of the one before it
                r = simulate(cluster, jobs, p, config, pool=pool, clock=time.process_time)
                rates[p].append(r.pods / r.seconds)
        best = {p: max(v) for p, v in rates.items()}
        fastest = max((p for p in policies if p not in NOT_BASELINES), key=best.__getitem__)
        print(f"== {name}: {header['workload']}; {header['cluster']}; best CPU time of {repeat}")
        print(f"{'policy':<20}{'pods/s':>10}{'vs ' + fastest:>26}")
        for p in policies:
            print(f"{p:<20}{best[p]:>10,.0f}{best[p] / best[fastest]:>25.2f}x")
        ratio = best[SELF] / best[fastest]
        mark = "✓" if ratio >= TARGET else "✗"
        print(f"{SELF} / fastest baseline ({fastest}): {ratio:.2f} {mark} (target >= {TARGET:.2f})\n")
        sys.stdout.flush()


def sizes_table(sizes: list[int], load: float) -> None:
    cluster = default_cluster()
    print(f"cluster: {len(cluster.nodes)} nodes / {cluster.capacity} GPUs, load {load}")
    print(f"{'pods':>8}  {'policy':<18}{'seconds':>9}{'pods/s':>10}{'vs ' + BASELINE:>22}")
    for size in sizes:
        jobs = generate(
            size,
            capacity_gpus=cluster.capacity,
            load=load,
            rng=np.random.default_rng(0),
            max_gpus=cluster.capacity,
        )
        pods = sum(len(j.pods) for j in jobs)
        pool = AllocatorPool()
        rates: dict[str, float] = {}
        for name in (BASELINE, *[p for p in POLICIES if p != BASELINE]):
            started = time.perf_counter()
            simulate(cluster, jobs, name, RunConfig(), pool=pool)
            seconds = time.perf_counter() - started
            rates[name] = pods / seconds
            print(
                f"{pods:>8,}  {name:<18}{seconds:>9.2f}{rates[name]:>10,.0f}"
                f"{rates[name] / rates[BASELINE]:>21.2f}x"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma list (empty: skip the table)")
    parser.add_argument("--repeat", type=int, default=3, help="comparisons per workload (best of)")
    parser.add_argument("--sizes", default="", help="comma list of generated pod counts (empty: skip)")
    parser.add_argument("--load", type=float, default=0.7, help="offered load of the sizes table")
    args = parser.parse_args()
    names = [n for n in args.workloads.split(",") if n]
    for n in names:
        if n not in WORKLOADS:
            parser.error(f"--workloads: unknown {n!r} (known: {', '.join(WORKLOADS)})")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if names:
        workloads_table(names, args.repeat)
    if args.sizes:
        sizes_table([int(s) for s in args.sizes.split(",")], args.load)


if __name__ == "__main__":
    main()
