"""The node objective (design.md §2) and the exact allocator that maximises it.

Why tables: a node has at most 16 GPUs, so every subset of its GPUs fits in a 16-bit mask and
there are at most 65,536 of them. We compute, once per topology, the ring bandwidth of every
subset, its pair sum, and for every possible "what stays free" set R the least-disruption key
(best ring an m-subset of R reaches, and how many disjoint m-subsets reach it). A request is
then a vectorised lookup over the candidate sets — exact, independent of the order the IDs were
offered in, and well under a millisecond for 8 GPUs. This is the one implementation of the
objective: the plugin, the scheduler sidecar, the CLI and the simulator all call it.

The objective, larger first: (1) ring bandwidth of S, (2) least disruption of R = F \\ S for
m = 8, 4, 2 (m <= |R|): (best ring of an m-subset of R, number of disjoint m-subsets reaching
it), (3) pair sum of S, (4) lexicographically smallest sorted indices.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from gputopo.node.topology import Topology

#: Largest node the exact tables support (2^16 subsets).
MAX_GPUS = 16
#: Group sizes whose future availability "least disruption" protects, most important first.
DISRUPTION_SIZES: tuple[int, ...] = (8, 4, 2)
_CACHE_LIMIT = 1 << 16
#: Nodes up to this size get every no-must-include answer tabulated at build (3^n pairs).
FAST_TABLE_MAX_GPUS = 8
_INF = np.int64(1 << 60)


class AllocationError(ValueError):
    """A request that cannot be answered (size out of range, must-include not free, …).

    `kind` names the rule that refused it, so a daemon can word the reason in its own protocol's
    terms (kubelet's field names) without parsing the message: `index`, `size`, `too_few`,
    `must_not_free`, `must_over_size`, or `refused` (a policy that cannot answer this request)."""

    def __init__(self, message: str, kind: str = "refused") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class Choice:
    """A candidate set S drawn from the free set F, with its objective keys (larger is better)."""

    indices: tuple[int, ...]
    ring_mbps: int
    disruption: tuple[tuple[int, int, int], ...]
    pair_sum_mbps: int

    def key(self) -> tuple[int, ...]:
        """Comparable objective key: larger is better; the last part prefers smaller indices."""
        flat: list[int] = [self.ring_mbps]
        for _m, best, count in self.disruption:
            flat += [best, count]
        flat.append(self.pair_sum_mbps)
        flat += [-i for i in self.indices]
        return tuple(flat)

    def explain(self) -> dict[str, object]:
        """The keys in readable units, for logs and the CLI."""
        return {
            "gpus": list(self.indices),
            "ring_gbps": self.ring_mbps / 1000,
            "leftover": [
                {"size": m, "best_ring_gbps": best / 1000, "groups": count}
                for m, best, count in self.disruption
            ],
            "pair_sum_gbps": self.pair_sum_mbps / 1000,
        }


class Allocator:
    """Exact GetPreferredAllocation for one topology (n <= 16 GPUs). Build once, call often.

    It is the `gputopo` policy of `gputopo.node.policy.GpuPolicy`; the baselines of
    `gputopo.node.policies` score their own picks with its tables (`score_masks`).

    Construction costs O(2^n · n^2) vectorised work (milliseconds for 8 GPUs, well under a
    second for 16); every query afterwards is a table lookup. Answers are cached per
    (free set, must-include set, size), so repeated questions — the simulator's and the
    scheduler's bread and butter — cost a dictionary lookup.
    """

    name = "gputopo"

    def __init__(self, topology: Topology) -> None:
        n = topology.n
        if n > MAX_GPUS:
            raise AllocationError(f"nodes of more than {MAX_GPUS} GPUs are not supported (got {n})")
        self.topology = topology
        self._n = n
        self._full = (1 << n) - 1
        bw = np.asarray(topology.bandwidth_mbps, dtype=np.int64)
        self._bw = bw
        masks = np.arange(1 << n, dtype=np.int64)
        bits = ((masks[:, None] >> np.arange(n, dtype=np.int64)[None, :]) & 1).astype(np.int64)
        self._pop = bits.sum(axis=1)
        self._low = _lowest_bit_index(masks, n)
        self._by_pop: list[np.ndarray] = [masks[self._pop == k] for k in range(n + 1)]
        self._rev = _bit_reverse(masks, n)
        self._pair_sum = ((bits @ bw) * bits).sum(axis=1) // 2
        self._ring = self._ring_table(bw, masks)
        # best_ring_mbps per size: asked per candidate node by the cluster objective
        self._best_ring = tuple(int(self._ring[self._by_pop[k]].max()) for k in range(n + 1))
        self._best: dict[int, np.ndarray] = {}
        self._count: dict[int, np.ndarray] = {}
        for m in DISRUPTION_SIZES:
            if m <= n - 1:
                self._best[m] = self._best_subset_table(m, masks)
                self._count[m] = self._count_table(m, masks)
        self._cache: dict[tuple[int, int, int], Choice] = {}
        # best S for every (free set, size) without must-include: the common request, answered
        # by one lookup. Filled at build up to 8 GPUs (3^8 = 6,561 (F, S) pairs, one lexsort);
        # on larger nodes the (F, size) answers are cached as they are asked (`_cache`).
        self._fast = self._fast_table(masks) if n <= FAST_TABLE_MAX_GPUS else None
        self._lists = _Lists.of(self, n)

    # ----------------------------------------------------------------- public queries

    @property
    def n(self) -> int:
        return self._n

    @property
    def exact(self) -> Allocator:
        """Itself: the exact allocator is its own scorer (`policy.GpuPolicy.exact`)."""
        return self

    def choose(self, free: Iterable[int], size: int, must: Iterable[int] = ()) -> Choice:
        """The best set of `size` GPU indices from `free`, containing `must`."""
        free_mask, must_mask = self._validate(free, size, must)
        key = (free_mask, must_mask, size)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        if must_mask == 0 and self._fast is not None:
            choice = self._choice(int(self._fast[free_mask * (self._n + 1) + size]), free_mask)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = choice
            return choice
        cands = self._candidates(free_mask, must_mask, size)
        for column in self._key_columns(free_mask, size):
            if len(cands) == 1:
                break
            vals = column(cands)
            cands = cands[vals == vals.max()]
        choice = self._choice(int(cands[0]), free_mask)
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[key] = choice
        return choice

    def rank(self, free: Iterable[int], size: int, must: Iterable[int] = (), top: int = 5) -> list[Choice]:
        """The `top` best candidates in objective order (the first equals choose())."""
        free_mask, must_mask = self._validate(free, size, must)
        cands = self._candidates(free_mask, must_mask, size)
        columns = [column(cands) for column in self._key_columns(free_mask, size)]
        order = np.lexsort(tuple(-c for c in reversed(columns)))
        return [self._choice(int(cands[i]), free_mask) for i in order[: max(top, 0)]]

    def evaluate(self, chosen: Iterable[int], free: Iterable[int]) -> Choice:
        """Objective keys of a given set S taken from F (S ⊆ F)."""
        s_mask = self._mask(chosen, "chosen")
        f_mask = self._mask(free, "free")
        if s_mask & ~f_mask:
            raise AllocationError("chosen GPUs must be a subset of the free GPUs")
        if s_mask == 0:
            raise AllocationError("chosen set is empty")
        return self._choice(s_mask, f_mask)

    def groups(self, free: Iterable[int]) -> tuple[tuple[int, int, int], ...]:
        """What a free set offers groups of 8, 4 and 2 (those that fit): (size, best ring MB/s
        an m-subset reaches, how many disjoint m-subsets reach it) — the least-disruption key of
        `free` itself, so a caller can price what a placement takes away."""
        f_mask = self._mask(free, "free")
        left = f_mask.bit_count()
        out = tuple((m, best[f_mask], count[f_mask]) for m, best, count in self._lists.leftover if m <= left)
        whole = [m for m in DISRUPTION_SIZES if m == self._n == left]  # a whole node is one group of n
        return tuple((m, self._lists.ring[f_mask], 1) for m in whole) + out

    def validate(self, free: Iterable[int], size: int, must: Iterable[int] = ()) -> tuple[int, int]:
        """(free mask, must mask) of a well-formed request, else AllocationError: the checks every
        policy shares, so all of them refuse the same requests with the same reasons."""
        return self._validate(free, size, must)

    def score_masks(self, chosen_mask: int, free_mask: int) -> Choice:
        """Objective keys of a set another policy picked, from masks `validate` returned (the
        chosen mask must be a non-empty subset of the free mask; not re-checked here)."""
        return self._choice(chosen_mask, free_mask)

    def ring_mbps(self, indices: Iterable[int]) -> int:
        """Ring bandwidth of a set: the weakest hop of its best ring (0 for one GPU)."""
        return int(self._ring[self._mask(indices, "indices")])

    def pair_sum_mbps(self, indices: Iterable[int]) -> int:
        return int(self._pair_sum[self._mask(indices, "indices")])

    def best_ring_mbps(self, size: int) -> int:
        """Best ring bandwidth any `size`-subset of an empty node reaches."""
        if not 1 <= size <= self._n:
            raise AllocationError(f"size must be between 1 and {self._n}, got {size}")
        return self._best_ring[size]

    # ----------------------------------------------------------------- request path

    def _mask(self, indices: Iterable[int], what: str) -> int:
        mask = 0
        n = self._n
        for i in indices:
            if type(i) is int and 0 <= i < n:  # fast path: a plain int in range
                mask |= 1 << i
                continue
            if not isinstance(i, (int, np.integer)) or isinstance(i, bool) or not 0 <= i < n:
                raise AllocationError(f"{what}: GPU index {i!r} is not in 0..{n - 1}", "index")
            mask |= 1 << int(i)
        return mask

    def _validate(self, free: Iterable[int], size: int, must: Iterable[int]) -> tuple[int, int]:
        free_mask = self._mask(free, "free")
        must_mask = self._mask(must, "must")
        if not isinstance(size, (int, np.integer)) or isinstance(size, bool):
            raise AllocationError(f"size must be an integer, got {size!r}", "size")
        nfree = free_mask.bit_count()
        if size < 1:
            raise AllocationError(f"size must be at least 1, got {size}", "size")
        if size > nfree:
            raise AllocationError(f"size {size} is more than the {nfree} free GPUs", "too_few")
        if must_mask & ~free_mask:
            raise AllocationError("must-include GPUs must be free", "must_not_free")
        if must_mask.bit_count() > size:
            raise AllocationError(
                f"{must_mask.bit_count()} must-include GPUs exceed size {size}", "must_over_size"
            )
        return free_mask, must_mask

    def _candidates(self, free_mask: int, must_mask: int, size: int) -> np.ndarray:
        cands = self._by_pop[size]
        sel = ((cands & ~free_mask) == 0) & ((cands & must_mask) == must_mask)
        out: np.ndarray = cands[sel]  # numpy types a boolean-mask index as Any
        return out

    def _key_columns(self, free_mask: int, size: int) -> list[Callable[[np.ndarray], np.ndarray]]:
        """Functions from candidate masks to one key column each, in objective order."""
        left = free_mask.bit_count() - size
        columns: list[Callable[[np.ndarray], np.ndarray]] = [lambda c: self._ring[c]]
        for m in DISRUPTION_SIZES:
            if m <= left:
                best, count = self._best[m], self._count[m]
                columns.append(_leftover_column(best, free_mask))
                columns.append(_leftover_column(count, free_mask))
        columns.append(lambda c: self._pair_sum[c])
        columns.append(lambda c: self._rev[c])
        return columns

    def _choice(self, s_mask: int, f_mask: int) -> Choice:
        r_mask = f_mask & ~s_mask
        left = r_mask.bit_count()
        lists = self._lists
        disruption = tuple((m, best[r_mask], count[r_mask]) for m, best, count in lists.leftover if m <= left)
        return Choice(
            indices=lists.indices[s_mask]
            if lists.indices
            else tuple(i for i in range(self._n) if s_mask >> i & 1),
            ring_mbps=lists.ring[s_mask],
            disruption=disruption,
            pair_sum_mbps=lists.pair_sum[s_mask],
        )

    # ----------------------------------------------------------------- tables (built once)

    def _ring_table(self, bw: np.ndarray, masks: np.ndarray) -> np.ndarray:
        """Ring bandwidth of every subset: a bottleneck Hamiltonian-cycle DP over subsets.

        path[mask, v] = the best weakest hop of a path that starts at mask's lowest GPU, visits
        exactly mask and ends at v; the ring closes with the hop v -> lowest GPU."""
        n = self._n
        size = 1 << n
        path = np.full((size, n), -1, dtype=np.int64)
        for v in range(n):
            path[1 << v, v] = _INF
        us = np.arange(n, dtype=np.int64)
        for k in range(1, n):
            layer = self._by_pop[k]
            low = self._low[layer]
            for v in range(n):
                vals = path[layer, v]
                ok = vals >= 0
                if not ok.any():
                    continue
                lv, val, lowv = layer[ok], vals[ok], low[ok]
                step = (((lv[:, None] >> us[None, :]) & 1) == 0) & (us[None, :] > lowv[:, None])
                rows, cols = np.nonzero(step)
                if len(rows) == 0:
                    continue
                target = lv[rows] | (np.int64(1) << cols)
                new = np.minimum(val[rows], bw[v, cols])
                path[target, cols] = np.maximum(path[target, cols], new)
        ring = np.zeros(size, dtype=np.int64)
        low_all = self._low
        for v in range(n):
            closing = np.minimum(path[:, v], bw[v, np.maximum(low_all, 0)])
            usable = (path[:, v] >= 0) & (low_all != v) & (((masks >> v) & 1) == 1)
            ring = np.where(usable, np.maximum(ring, closing), ring)
        ring[self._pop <= 1] = 0
        return ring

    def _fast_table(self, masks: np.ndarray) -> np.ndarray:
        """answer[F * (n + 1) + size] = the objective's best S ⊆ F of that size (no must-include).

        Every pair S ⊆ F (3^n of them) gets the same key columns `choose` compares, in the same
        order; within one (F, size) group the leftover size is fixed, so a disruption column that
        `choose` leaves out is a constant there and may be filled with 0. One lexsort over the
        pairs then puts each group's best first: the same answer as the search, by construction
        (a property test compares the two on every (F, size))."""
        n = self._n
        f_all = np.repeat(masks, len(masks))
        s_all = np.tile(masks, len(masks))
        keep = ((s_all & ~f_all) == 0) & (s_all != 0)
        f, s = f_all[keep], s_all[keep]
        r = f & ~s
        left = self._pop[r]
        size = self._pop[s]
        columns: list[np.ndarray] = [self._ring[s]]
        for m in DISRUPTION_SIZES:
            if m in self._best:
                use = m <= left
                columns.append(np.where(use, self._best[m][r], 0))
                columns.append(np.where(use, self._count[m][r], 0))
        columns += [self._pair_sum[s], self._rev[s]]
        group = f * (n + 1) + size
        order = np.lexsort((*(-c for c in reversed(columns)), group))
        first = np.unique(group[order], return_index=True)[1]
        answer = np.zeros(len(masks) * (n + 1), dtype=np.int64)
        answer[group[order][first]] = s[order][first]
        return answer

    def _best_subset_table(self, m: int, masks: np.ndarray) -> np.ndarray:
        """best[R] = the best ring any m-subset of R reaches (-1 if |R| < m): a subset-max
        transform over the ring table restricted to m-subsets."""
        best = np.where(self._pop == m, self._ring, -1)
        for i in range(self._n):
            has = masks[((masks >> i) & 1) == 1]
            best[has] = np.maximum(best[has], best[has ^ (1 << i)])
        return best

    def _count_table(self, m: int, masks: np.ndarray) -> np.ndarray:
        """count[R] = the most disjoint m-subsets of R whose ring reaches best[R].

        Where |R| < 2m the answer is 1 (the best is reached by definition). Elsewhere a packing
        DP over subsets, one per threshold value that occurs: pack[R] is the larger of leaving
        R's lowest GPU out, or putting it in a qualifying m-subset and packing the rest."""
        best = self._best[m]
        count = np.where(self._pop >= m, 1, 0).astype(np.int64)
        big = self._pop >= 2 * m  # the whole node too: `groups` prices a free set, not only a leftover
        if not big.any():
            return count
        subs = self._by_pop[m]
        sub_low = self._low[subs]
        sub_ring = self._ring[subs]
        for t in np.unique(best[big]):
            pack = np.zeros(1 << self._n, dtype=np.int64)
            good = sub_ring >= t
            for p in range(m, self._n + 1):
                layer = self._by_pop[p]
                low = self._low[layer]
                value = pack[layer ^ (np.int64(1) << low)]
                for x in range(self._n):
                    rows = np.nonzero(low == x)[0]
                    cand_subs = subs[(sub_low == x) & good]
                    if len(rows) == 0 or len(cand_subs) == 0:
                        continue
                    lx = layer[rows]
                    inside = (lx[:, None] & cand_subs[None, :]) == cand_subs[None, :]
                    if not inside.any():
                        continue
                    rest = pack[lx[:, None] ^ cand_subs[None, :]] + 1
                    value[rows] = np.maximum(value[rows], np.where(inside, rest, 0).max(axis=1))
                pack[layer] = value
            hit = big & (best == t)
            count[hit] = pack[hit]
        return count


@dataclass(frozen=True, slots=True)
class _Lists:
    """The tables a Choice is read from, as Python lists: building a Choice reads about ten
    entries, and a list lookup costs a tenth of a numpy scalar lookup plus its int()."""

    ring: list[int]
    pair_sum: list[int]
    leftover: tuple[tuple[int, list[int], list[int]], ...]
    indices: list[tuple[int, ...]]  # every mask's sorted indices; empty above 8 GPUs (64 Ki tuples)

    @staticmethod
    def of(alloc: Allocator, n: int) -> _Lists:
        return _Lists(
            ring=alloc._ring.tolist(),
            pair_sum=alloc._pair_sum.tolist(),
            leftover=tuple(
                (m, alloc._best[m].tolist(), alloc._count[m].tolist())
                for m in DISRUPTION_SIZES
                if m in alloc._best
            ),
            indices=[tuple(i for i in range(n) if mask >> i & 1) for mask in range(1 << n)]
            if n <= FAST_TABLE_MAX_GPUS
            else [],
        )


def _lowest_bit_index(masks: np.ndarray, n: int) -> np.ndarray:
    low = np.full(len(masks), -1, dtype=np.int64)
    for i in reversed(range(n)):
        low = np.where(((masks >> i) & 1) == 1, i, low)
    return low


def _bit_reverse(masks: np.ndarray, n: int) -> np.ndarray:
    """Bit i -> bit n-1-i: among equal-size sets, the largest reversed mask is the one whose
    sorted indices are lexicographically smallest — the objective's final tie-break."""
    out = np.zeros(len(masks), dtype=np.int64)
    for i in range(n):
        out |= ((masks >> i) & 1) << (n - 1 - i)
    return out


class AllocatorPool:
    """One Allocator per distinct bandwidth matrix.

    Building an Allocator is O(2^n) work while a cluster has thousands of nodes of a handful
    of server models; nodes whose matrices are equal share one (the answers are GPU indices,
    so the UUIDs of the topology that built it do not matter). An explicit object owned by
    its caller, never a module-level cache."""

    def __init__(self) -> None:
        self._by_matrix: dict[bytes, Allocator] = {}

    def get(self, topology: Topology) -> Allocator:
        bw = topology.bandwidth_mbps
        key = bw.shape[0].to_bytes(2, "little") + bw.tobytes()
        alloc = self._by_matrix.get(key)
        if alloc is None:
            alloc = self._by_matrix[key] = Allocator(topology)
        return alloc

    def __len__(self) -> int:
        return len(self._by_matrix)


def _leftover_column(table: np.ndarray, free_mask: int) -> Callable[[np.ndarray], np.ndarray]:
    """Key column: `table`'s value for what each candidate mask leaves free."""
    return lambda c: table[free_mask & ~c]
