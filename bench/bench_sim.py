"""Simulator speed: pods per second for 10k and 100k generated pods, per policy.

Printed as a table with each policy's ratio against the `kubelet-default` run of the same
size in the same process (the cheapest policy: random GPU order, no search), so the numbers
compare across machines. Run: .venv/bin/python bench/bench_sim.py [--sizes 10000,100000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from gputopo.allocator import AllocatorPool
from gputopo.sim.clusters import default_cluster
from gputopo.sim.engine import RunConfig, simulate
from gputopo.sim.policies import BASELINE, POLICIES
from gputopo.sim.workload import generate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="10000,100000", help="comma list of pod counts")
    parser.add_argument("--load", type=float, default=0.7)
    args = parser.parse_args()
    cluster = default_cluster()
    print(f"cluster: {len(cluster.nodes)} nodes / {cluster.capacity} GPUs, load {args.load}")
    print(f"{'pods':>8}  {'policy':<18}{'seconds':>9}{'pods/s':>10}{'vs ' + BASELINE:>22}")
    for size in (int(s) for s in args.sizes.split(",")):
        jobs = generate(
            size,
            capacity_gpus=cluster.capacity,
            load=args.load,
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


if __name__ == "__main__":
    main()
