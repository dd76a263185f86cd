"""Gang objective (2), fewest nodes: how few nodes of one domain can take every member.

Used by `gputopo.gang.planner` per candidate domain. Equal member sizes are packed exactly by filling
the roomiest nodes first; mixed sizes get a budgeted exact search, then first-fit decreasing
(a heuristic). Works on free-GPU counts only: GPU sets are chosen later, by the allocator.
Pure: no I/O, no clock, no globals.
"""

from __future__ import annotations

import numpy as np

#: "No number of nodes suffices" in `min_nodes`' answer (sorts after every real count).
NO_K = np.iinfo(np.int64).max


#: Up to this many nodes `min_nodes` runs in plain Python: numpy's cost per call dominates there.
SMALL_NODES = 256


def min_nodes(domain_id: np.ndarray, count: int, amount: np.ndarray, need: int) -> np.ndarray:
    """Per domain, the fewest nodes whose `amount`s sum to `need` (largest first); NO_K if none.

    One lexsort over all nodes instead of a Python loop per domain (a plain loop on small
    clusters: `min_nodes_small`, the same answer)."""
    if len(domain_id) <= SMALL_NODES:
        return min_nodes_small(domain_id, count, amount, need)
    order = np.lexsort((-amount, domain_id))
    sid, samt = domain_id[order], amount[order]
    cs = np.cumsum(samt)
    starts = np.searchsorted(sid, np.arange(count))
    before = np.concatenate(([0], cs))[starts]
    within = cs - before[sid]
    rank = np.arange(len(sid)) - starts[sid] + 1
    hit = np.flatnonzero(within >= need)
    out = np.full(count, NO_K, dtype=np.int64)
    # `sid[hit]` is sorted: each domain's first hit is where the domain id changes
    hit_dom = sid[hit]
    first = np.empty(len(hit), dtype=bool)
    first[:1] = True
    np.not_equal(hit_dom[1:], hit_dom[:-1], out=first[1:])
    out[hit_dom[first]] = rank[hit[first]]
    return out


def min_nodes_small(domain_id: np.ndarray, count: int, amount: np.ndarray, need: int) -> np.ndarray:
    """`min_nodes` by a loop over the nodes: each domain's amounts, largest first, until `need`."""
    per: list[list[int]] = [[] for _ in range(count)]
    for d, a in zip(domain_id.tolist(), amount.tolist(), strict=True):
        if a > 0 or need <= 0:  # nodes without room never complete a positive need
            per[d].append(a)
    return np.array([fewest(got, need) if got else int(NO_K) for got in per], dtype=np.int64)


def fewest(amounts: list[int], need: int) -> int:
    """How many of `amounts`, largest first, reach `need` (NO_K if all of them do not)."""
    acc = 0
    for rank, a in enumerate(sorted(amounts, reverse=True), 1):
        acc += a
        if acc >= need:
            return rank
    return int(NO_K)


def equal_bounds(
    domain_id: np.ndarray, count: int, free: np.ndarray | list[int], g: int, n: int
) -> tuple[np.ndarray, list[int], np.ndarray]:
    """For n members of g GPUs each, in one loop over the nodes (small clusters): per domain its
    free GPUs; the domains that pass the necessary check (n x g free GPUs, n member slots), by
    fewest nodes then id; and the fewest nodes per domain (NO_K for those that do not pass).
    The gang planner's numpy steps give the same. `free` may be the per-node list already."""
    dfree = [0] * count
    slots: list[list[int]] = [[] for _ in range(count)]
    for d, f in zip(domain_id.tolist(), free.tolist() if isinstance(free, np.ndarray) else free, strict=True):
        dfree[d] += f
        if f >= g:
            slots[d].append(f // g)
    need = n * g
    bound = [fewest(got, n) if got and dfree[d] >= need else int(NO_K) for d, got in enumerate(slots)]
    passing = sorted((d for d, b in enumerate(bound) if b != NO_K), key=bound.__getitem__)
    return np.array(dfree, dtype=np.int64), passing, np.array(bound, dtype=np.int64)


def pack(free: np.ndarray, sizes: list[int], positions: np.ndarray) -> list[tuple[int, list[int]]] | None:
    """Fewest nodes of the domain that take every member: (position, member indices) pairs,
    each node's members in the order they choose their GPUs (biggest first, then spec order).

    Nodes with the most room fill first, ties in name order. Equal sizes: exact. Mixed sizes:
    exact up to 64 members and 20,000 search steps per domain, else first-fit decreasing (a
    heuristic that can use a node more than needed, or miss a packing of a nearly full domain)."""
    room = sorted(
        ((int(free[p]), int(p)) for p in positions.tolist() if free[p] > 0), key=lambda t: (-t[0], t[1])
    )
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    if len(set(sizes)) == 1:
        g, done = sizes[0], 0
        out: list[tuple[int, list[int]]] = []
        for f, p in room:
            if done == len(order) or f < g:
                break
            take = min(f // g, len(order) - done)
            out.append((p, order[done : done + take]))
            done += take
        return out if done == len(order) else None
    if len(order) <= _EXACT_MIXED_MEMBERS:
        try:
            return _pack_mixed_exact(sizes, room, order)
        except _BudgetSpent:
            pass
    return _pack_first_fit(sizes, room, order)


class _BudgetSpent(Exception):
    """The exact mixed-size search ran out of steps; first-fit decreasing answers instead."""


#: Mixed-size gangs up to this many members get an exact (budgeted) packing search.
_EXACT_MIXED_MEMBERS = 64
#: Search steps per domain before falling back to first-fit decreasing.
_EXACT_MIXED_STEPS = 20_000


def _pack_mixed_exact(
    sizes: list[int], room: list[tuple[int, int]], order: list[int]
) -> list[tuple[int, list[int]]] | None:
    """Fewest nodes for mixed sizes, exactly, or _BudgetSpent when the step budget runs out.

    If k nodes can hold the gang, the k roomiest can (give each used node's load to a roomier
    one), so for k = the lower bound upwards this only asks "do the members fit in the top k?":
    a depth-first search, biggest member first, that never tries two nodes with the same room
    left for the same member."""
    total = sum(sizes)
    smallest = min(sizes)
    steps = [_EXACT_MIXED_STEPS]
    acc = 0
    for k, (f, _) in enumerate(room, start=1):
        acc += f
        if f < smallest:
            break
        if acc < total:
            continue
        left = [f for f, _ in room[:k]]
        bins: list[list[int]] = [[] for _ in range(k)]
        if _fit(sizes, order, 0, left, bins, steps):
            return [(room[b][1], bins[b]) for b in range(k) if bins[b]]
    return None


def _fit(
    sizes: list[int], order: list[int], j: int, left: list[int], bins: list[list[int]], steps: list[int]
) -> bool:
    if j == len(order):
        return True
    steps[0] -= 1
    if steps[0] < 0:
        raise _BudgetSpent
    i = order[j]
    g = sizes[i]
    tried: set[int] = set()
    for b, room in enumerate(left):
        if room < g or room in tried:
            continue
        tried.add(room)
        left[b] -= g
        bins[b].append(i)
        if _fit(sizes, order, j + 1, left, bins, steps):
            return True
        left[b] += g
        bins[b].pop()
    return False


def _pack_first_fit(
    sizes: list[int], room: list[tuple[int, int]], order: list[int]
) -> list[tuple[int, list[int]]] | None:
    """First-fit decreasing onto the roomiest nodes: fast, possibly a node more than needed."""
    opened: list[tuple[int, list[int], list[int]]] = []  # (position, [free left], members)
    nxt = 0
    for i in order:
        g = sizes[i]
        for _, left, members in opened:
            if left[0] >= g:
                left[0] -= g
                members.append(i)
                break
        else:
            if nxt >= len(room) or room[nxt][0] < g:
                return None
            f, p = room[nxt]
            nxt += 1
            opened.append((p, [f - g], [i]))
    return [(p, members) for p, _, members in opened]
