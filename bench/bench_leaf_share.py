"""Why a gang lands in one leaf or not: the leaf share of gang placements over seeds, split into
"how often a leaf could hold the gang when it started" and "how often the policy then took one".

    python bench/bench_leaf_share.py [--trace FILE] [--seeds 10] [POLICY ...]

Replays a trace (default: the Philly excerpt) on the default cluster with each policy and each
seed, and at every gang placement reads the cluster state the policy saw:

* opportunities: placements where some leaf alone had room for every member (for each member
  size s, the leaf's nodes hold as many members of size >= s as `sum(free // s)` allows: the
  planner's own prune condition, exact for equal sizes, the simulator's default gangs);
* taken: of those, the placements that put every member in one leaf;
* free nodes: nodes with room for the gang's largest member at that moment, in all and in the
  leaf that had most of them (how scattered the room was over the leaves);
* pairs lost: placements after which fewer leaves could still hold a gang of the same shape
  than the best choice at the same level would have kept (spills that break up a leaf's room).

The leaf share of gang placements is set mostly by the opportunities, i.e. by where room
happens to be free when a gang can start; that follows the 1-GPU pods (most of the trace) and
run times, and is chaotic on an overloaded trace: read the spread over seeds, not one seed.
"""

from __future__ import annotations

import argparse
import functools
import random
import statistics
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gputopo.network.levels import LEAF
from gputopo.node.allocator import AllocatorPool
from gputopo.sim.clusters import default_cluster
from gputopo.sim.engine import RunConfig, WholeGpus, runner
from gputopo.sim.metrics import Recorder
from gputopo.sim.policies.base import Failure, Slot
from gputopo.sim.policies.catalog import build_policy
from gputopo.sim.state import ClusterState, SimCluster
from gputopo.sim.traces import read_trace
from gputopo.sim.workload import Job

PHILLY = Path(__file__).resolve().parents[2] / "shared/traces/philly-excerpt-15k/philly_jobs_15k.csv"


@dataclass
class Tally:
    gangs: int = 0
    one_leaf: int = 0
    opportunities: int = 0
    taken: int = 0
    free_nodes: int = 0
    free_in_best_leaf: int = 0
    pairs_lost: int = 0
    leaves_touched: Counter[int] = field(default_factory=Counter)


def _leaf_holds(free: Sequence[int], sizes: Sequence[int]) -> bool:
    """The planner's prune condition for one domain (exact for equal sizes)."""
    return sum(free) >= sum(sizes) and all(
        sum(f // s for f in free) >= sum(1 for t in sizes if t >= s) for s in set(sizes)
    )


def _kept(room: Sequence[int], n: int) -> int:
    """Most leaves that can still take n members after n members are taken from them in any
    way, one per node with room (whole-node members)."""

    @functools.cache
    def best(i: int, left: int) -> int:
        if i == len(room):
            return 0 if left == 0 else -len(room) - 1
        return max((room[i] - x >= n) + best(i + 1, left - x) for x in range(min(room[i], left) + 1))

    return best(0, n)


def observe(leaf: Sequence[str], tally: Tally, state: ClusterState, job: Job, got: list[Slot]) -> None:
    free = [m.bit_count() for m in state.mask]
    by_leaf: dict[str, list[int]] = {}
    for i, f in enumerate(free):
        by_leaf.setdefault(leaf[i], []).append(f)
    sizes, g, n = list(job.pods), max(job.pods), len(job.pods)
    touched = {leaf[node] for node, _ in got}
    holds = any(_leaf_holds(fs, sizes) for fs in by_leaf.values())
    tally.gangs += 1
    tally.one_leaf += len(touched) == 1
    tally.opportunities += holds
    tally.taken += holds and len(touched) == 1
    room = Counter(leaf[i] for i, f in enumerate(free) if f >= g)
    tally.free_nodes += sum(room.values())
    tally.free_in_best_leaf += max(room.values(), default=0)
    tally.leaves_touched[len(touched)] += 1
    if len(set(sizes)) == 1 and g == max(state.size):  # whole-node members: one per node
        after = Counter(room)
        for node, _ in got:
            after[leaf[node]] -= 1
        kept = sum(v >= n for v in after.values())
        if holds:  # one leaf, any of those that hold it
            best = max(
                sum(v >= n for k, v in room.items() if k != at) + (room[at] - n >= n)
                for at in room
                if room[at] >= n
            )
        else:
            best = _kept(tuple(room.values()), n)
        tally.pairs_lost += kept < best


def run(cluster: SimCluster, jobs: Sequence[Job], policy_name: str, seed: int) -> Tally:
    """`gputopo.sim.run.simulate`, with every gang placement observed."""
    pool = AllocatorPool()
    config = RunConfig(seed=seed)
    policy = build_policy(policy_name, cluster, pool, random.Random(seed), config.lifecycle, jobs)
    state = ClusterState(cluster)
    leaf = [cluster.domain(i, LEAF) for i in range(len(cluster.nodes))]
    tally = Tally()

    def place(st: ClusterState, job: Job) -> list[Slot] | Failure:
        got = policy.place(st, job)
        if len(job.pods) > 1 and isinstance(got, list):
            observe(leaf, tally, st, job, got)
        return got

    rec = Recorder(cluster, [pool.get(t) for t in cluster.topologies], config.comm)
    runner(config)(WholeGpus(state, place), jobs, rec, None)
    return tally


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", default=str(PHILLY))
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("policies", nargs="*", default=["gputopo", "gang-only", "kueue-tas"])
    args = p.parse_args(argv)
    cluster = default_cluster()
    jobs = list(read_trace(args.trace).jobs)
    print(f"{Path(args.trace).name}, default cluster, seeds 0..{args.seeds - 1}")
    print(
        "policy            one leaf % per seed (mean) | opportunities  taken  free nodes/best leaf  pairs lost"
    )
    for name in args.policies:
        shares, t_all = [], Tally()
        for seed in range(args.seeds):
            t = run(cluster, jobs, name, seed)
            shares.append(100 * t.one_leaf / max(t.gangs, 1))
            for f in (
                "gangs",
                "one_leaf",
                "opportunities",
                "taken",
                "free_nodes",
                "free_in_best_leaf",
                "pairs_lost",
            ):
                setattr(t_all, f, getattr(t_all, f) + getattr(t, f))
        per = " ".join(f"{s:4.1f}" for s in shares)
        print(
            f"{name:17s} {per} ({statistics.mean(shares):.1f}) | "
            f"{100 * t_all.opportunities / t_all.gangs:5.1f} %  {100 * t_all.taken / max(t_all.opportunities, 1):5.1f} %  "
            f"{t_all.free_nodes / t_all.gangs:4.2f} / {t_all.free_in_best_leaf / t_all.gangs:4.2f}  "
            f"{100 * t_all.pairs_lost / t_all.gangs:4.1f} %",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
