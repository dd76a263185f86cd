"""Brute-force oracle of the node objective (design.md §2), written straight from its text.

Deliberately independent of gputopo.node.allocator: ring bandwidth by backtracking search for a
Hamiltonian cycle at each threshold, leftover groups by exhaustive packing, candidates by
itertools. Slow (fine for <= 8 GPUs), obviously correct, used by tests and as the benchmark
baseline.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import combinations

from gputopo.node.topology import Topology

SIZES = (8, 4, 2)


class Oracle:
    def __init__(self, topology: Topology) -> None:
        self.n = topology.n
        self.bw = [[int(topology.bandwidth_mbps[i][j]) for j in range(self.n)] for i in range(self.n)]
        self.ring = lru_cache(maxsize=None)(self._ring)

    def _has_cycle(self, nodes: tuple[int, ...], t: int) -> bool:
        start, rest = nodes[0], set(nodes[1:])

        def extend(last: int, left: set[int]) -> bool:
            if not left:
                return self.bw[last][start] >= t
            for nxt in sorted(left):
                if self.bw[last][nxt] >= t:
                    left.remove(nxt)
                    ok = extend(nxt, left)
                    left.add(nxt)
                    if ok:
                        return True
            return False

        return extend(start, rest)

    def _ring(self, nodes: tuple[int, ...]) -> int:
        if len(nodes) <= 1:
            return 0
        if len(nodes) == 2:
            return self.bw[nodes[0]][nodes[1]]
        values = sorted({self.bw[a][b] for a, b in combinations(nodes, 2)}, reverse=True)
        for t in values:
            if self._has_cycle(nodes, t):
                return t
        return 0

    def pair_sum(self, nodes: tuple[int, ...]) -> int:
        return sum(self.bw[a][b] for a, b in combinations(nodes, 2))

    def _pack(self, rest: tuple[int, ...], m: int, t: int) -> int:
        if len(rest) < m:
            return 0
        first, others = rest[0], rest[1:]
        best = self._pack(others, m, t)
        for group in combinations(others, m - 1):
            g = (first, *group)
            if self.ring(g) >= t:
                left = tuple(x for x in others if x not in group)
                best = max(best, 1 + self._pack(left, m, t))
        return best

    def disruption(self, rest: tuple[int, ...]) -> tuple[tuple[int, int, int], ...]:
        out = []
        for m in SIZES:
            if m <= len(rest):
                best = max(self.ring(g) for g in combinations(rest, m))
                out.append((m, best, self._pack(rest, m, best)))
        return tuple(out)

    def key(self, chosen: tuple[int, ...], free: tuple[int, ...]) -> tuple[int, ...]:
        rest = tuple(sorted(set(free) - set(chosen)))
        flat: list[int] = [self.ring(chosen)]
        for _m, best, count in self.disruption(rest):
            flat += [best, count]
        flat.append(self.pair_sum(chosen))
        flat += [-i for i in chosen]
        return tuple(flat)

    def candidates(
        self, free: tuple[int, ...], size: int, must: tuple[int, ...] = ()
    ) -> list[tuple[int, ...]]:
        others = sorted(set(free) - set(must))
        return [tuple(sorted((*must, *extra))) for extra in combinations(others, size - len(must))]

    def choose(self, free: tuple[int, ...], size: int, must: tuple[int, ...] = ()) -> tuple[int, ...]:
        free = tuple(sorted(free))
        return max(self.candidates(free, size, must), key=lambda s: self.key(s, free))

    def best_ring(self, free: tuple[int, ...], size: int, must: tuple[int, ...] = ()) -> int:
        return max(self.ring(s) for s in self.candidates(tuple(sorted(free)), size, must))


def brute_force_choose(
    topology: Topology, free: tuple[int, ...], size: int, must: tuple[int, ...] = ()
) -> tuple[int, ...]:
    """One-shot brute force (the benchmark baseline: no tables, no caching across calls)."""
    return Oracle(topology).choose(tuple(free), size, tuple(must))
