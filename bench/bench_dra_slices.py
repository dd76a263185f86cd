"""Which GPU sets to publish as DRA devices: device counts and the allocator-rule outcome.

For every preset and set size, over every free-GPU state (all 2^n on nodes up to 8 GPUs, a
seeded sample on 16), what kube-scheduler's first fit gets from the slices of each choice:

* `levels+fill` (what gputopo publishes): ring-bandwidth levels, best first, whole while they
  fit in one slice (64 devices with counters), the next one cut to fill the slice, spread out;
* `levels`: the whole levels only (a best level larger than a slice cut the same way);
* `best`: only the best ring level (cut the same way);
* `top64`: the first 64 sets in the allocator's ranking for each state, no level rule, no spread
  (which sets exist then changes with use: unsafe in a cluster, docs/dra.md; shown as a bound);
* `all`: every k-subset (exact by construction; the cost is devices and slices).

Each is scored published fresh (for the state itself: the daemon republishes after every
prepare), one behind (published for a state, then a first claim of the same size allocated and
a second one asked before the republication: two pods scheduled back to back) and stale
(published on the empty node, never republished: the worst case). Columns:
`avail` = states with >= k free GPUs where first fit finds a device; `best` = allocations whose
ring equals the best ring of any k free GPUs; `exact` = allocations equal to the exact
allocator's choice. Run: `python bench/bench_dra_slices.py [--sample 2000]` (markdown table).
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable, Sequence
from math import comb

from gputopo.node import draslices
from gputopo.node.allocator import Allocator
from gputopo.node.topofile import list_presets, load_preset

Order = list[tuple[int, ...]]


def _levels_fill(alloc: Allocator, n: int, free: Sequence[int], k: int) -> Order:
    return [s.gpus for s in draslices.choose_sets(alloc, range(n), free, k, 64)]


def _levels(alloc: Allocator, n: int, free: Sequence[int], k: int) -> Order:
    return [s.gpus for s in draslices.choose_sets(alloc, range(n), free, k, 64, fill=False)]


def _best(alloc: Allocator, n: int, free: Sequence[int], k: int) -> Order:
    sets = draslices.choose_sets(alloc, range(n), free, k, 64, fill=False)
    top = sets[0].ring_mbps if sets else 0
    return [s.gpus for s in sets if s.ring_mbps == top]


def _top64(alloc: Allocator, n: int, free: Sequence[int], k: int) -> Order:
    ranked = [c.indices for c in alloc.rank(free, k, top=64)] if len(free) >= k else []
    seen = set(ranked)
    rest = [c.indices for c in alloc.rank(range(n), k, top=64) if c.indices not in seen]
    return (ranked + rest)[:64]


POLICIES: dict[str, Callable[[Allocator, int, Sequence[int], int], Order]] = {
    "levels+fill": _levels_fill,
    "levels": _levels,
    "best": _best,
    "top64": _top64,
}


def _first_fit(order: Order, free: frozenset[int]) -> tuple[int, ...] | None:
    for s in order:
        if free.issuperset(s):
            return s
    return None


def measure(name: str, sample: int, seed: int) -> list[str]:
    topo = load_preset(name)
    alloc = Allocator(topo)
    n = topo.n
    states: list[frozenset[int]]
    if n <= 8:
        states = [frozenset(i for i in range(n) if m >> i & 1) for m in range(1 << n)]
    else:
        rng = random.Random(seed)
        states = [frozenset(i for i in range(n) if rng.random() < rng.random()) for _ in range(sample)]
    rows = []
    for k in (2, 4, 8, 16):
        if k > n:
            continue
        rows.append(
            f"| {name} | {k} | all | {comb(n, k)} | {-(-comb(n, k) // 64)} | 100 / 100 / 100 | 100 / 100 / 100 |"
        )
        for pname, policy in POLICIES.items():
            stale_order = policy(alloc, n, range(n), k)
            cells = []
            for mode in ("fresh", "behind", "stale"):
                eligible = found = best = exact = 0
                for free0 in states:
                    free = free0
                    if mode == "stale":
                        order = stale_order
                    else:
                        if len(free0) < k:
                            continue
                        order = policy(alloc, n, sorted(free0), k)
                        if mode == "behind":  # a second claim before the first one's republication
                            first = _first_fit(order, free0)
                            if first is None:
                                continue
                            free = free0 - set(first)
                    if len(free) < k:
                        continue
                    eligible += 1
                    got = _first_fit(order, free)
                    if got is None:
                        continue
                    found += 1
                    choice = alloc.choose(sorted(free), k)
                    best += alloc.ring_mbps(got) == choice.ring_mbps
                    exact += got == choice.indices
                cells.append(
                    "n/a"
                    if not eligible
                    else f"{100 * found / eligible:.1f} / {100 * best / max(found, 1):.1f}"
                    f" / {100 * exact / max(found, 1):.1f}"
                )
            rows.append(f"| {name} | {k} | {pname} | {len(stale_order)} | 1 | {' | '.join(cells)} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=1000, help="free states sampled on 16-GPU nodes")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--preset", action="append", help="preset(s) to measure (default: all)")
    args = parser.parse_args()
    print(
        "| preset | k | choice | devices | slices | fresh avail / best / exact % "
        "| one behind avail / best / exact % | stale avail / best / exact % |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in args.preset or list_presets():
        for row in measure(name, args.sample, args.seed):
            print(row, flush=True)


if __name__ == "__main__":
    main()
