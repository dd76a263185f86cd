"""Gang tie-break (3b), fewest sub-domains: among plans equal on objectives (1)-(3), the nodes
that touch the fewest domains of each grouping level inside the chosen domain.

Used by `gputopo.gang.planner`: `lower_levels` names the levels that group nodes inside a domain,
`count_spans` measures a plan, `select_nodes` picks k nodes that keep the gang together (best
fit over the sub-domains, as Kueue's BestFit and Slurm's tree plugin). Pure: no I/O, no clock,
no globals.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gputopo.network.levels import CLUSTER, HOSTNAME, LevelIndex, NetworkIndex


def lower_levels(index: NetworkIndex, level: str) -> list[LevelIndex]:
    """The network levels strictly inside `level`'s domains, largest first, that group nodes:
    not the hostname level, nor one nobody labels (their domains are the nodes themselves,
    whose count is objective (2))."""
    levels = index.levels if level == CLUSTER else index.levels[: index.levels.index(level)]
    lower = (index.level(lv) for lv in reversed(levels) if lv != HOSTNAME)
    return [lx for lx in lower if lx.count < len(index.nodes)]


def count_spans(lower: Sequence[LevelIndex], positions: Sequence[int]) -> tuple[int, ...]:
    """Tie-break (3b): how many domains of each lower level (largest first) the nodes touch."""
    if not lower:
        return ()
    at = np.asarray(positions, dtype=np.int64)
    return tuple(len(set(lx.domain_id[at].tolist())) for lx in lower)


def select_nodes(
    pos: np.ndarray,
    weight: np.ndarray,
    free: np.ndarray,
    kind: np.ndarray,
    k: int,
    n: int,
    lower: Sequence[LevelIndex],
    cost: np.ndarray | None = None,
) -> list[tuple[int, int]]:
    """k nodes whose offered members (`weight`) sum to at least n, spanning few sub-domains:
    (position, kind) pairs, ordered by (most members offered, least `cost` to future demand
    when given, fewest free GPUs, name).

    Level by level, largest first, the candidates shrink to the sub-domains `_fewest_groups`
    keeps (a level whose domains are single candidates, or one domain, has nothing to keep
    together and is skipped); then the top k of what is left are taken by the node order,
    which is also the order members are assigned in. Every node with weight > 0 reaches the
    plan's threshold, so (3) holds whichever k are taken; feasibility is kept at every step."""
    if 0 < len(pos) <= SMALL_CANDIDATES and int(weight.min()) == int(weight.max()):
        costs = None if cost is None else cost.tolist()
        return select_equal(pos.tolist(), int(weight[0]), free.tolist(), kind.tolist(), k, n, lower, costs)
    for lx in lower:
        ids = lx.domain_id[pos].tolist()
        uniq = sorted(set(ids))
        if len(uniq) in (1, len(pos)):
            continue
        at = {u: i for i, u in enumerate(uniq)}
        group = np.array([at[u] for u in ids], dtype=np.int64)  # sub-domain of each candidate
        chosen = np.zeros(len(uniq), dtype=bool)
        chosen[_fewest_groups(group, len(uniq), weight, free, k, n)] = True
        keep = chosen[group]
        pos, weight, free, kind = pos[keep], weight[keep], free[keep], kind[keep]
        if cost is not None:
            cost = cost[keep]
    top = np.lexsort((pos, free, -weight) if cost is None else (pos, free, cost, -weight))[:k]
    return list(zip(pos[top].tolist(), kind[top].tolist(), strict=True))


#: Up to this many candidates offering the same number of members each (whole-node members
#: always do), `select_nodes` runs in plain Python: numpy's cost per call dominates there.
SMALL_CANDIDATES = 256


def select_equal(
    pos: list[int],
    w: int,
    free: list[int],
    kind: list[int],
    k: int,
    n: int,
    lower: Sequence[LevelIndex],
    cost: list[float] | None = None,
    domain_ids: Sequence[Sequence[int]] | None = None,
) -> list[tuple[int, int]]:
    """`select_nodes` when every candidate offers `w` members: the same steps on lists (and
    the same node order: equal weights, then the cost when given, then free GPUs, then name).
    `domain_ids`: each lower level's `domain_id` as plain ints, when the caller keeps them."""
    for j, lx in enumerate(lower):
        if domain_ids is not None:
            of = domain_ids[j]
            ids = [of[p] for p in pos]
        else:
            domain_id = lx.domain_id
            ids = [int(domain_id[p]) for p in pos]
        uniq = sorted(set(ids))
        if len(uniq) in (1, len(pos)):
            continue
        at = {u: i for i, u in enumerate(uniq)}
        group = [at[u] for u in ids]
        kept = set(_fewest_groups_equal(group, len(uniq), w, free, k, n))
        keep = [i for i, g in enumerate(group) if g in kept]
        pos, free, kind = [pos[i] for i in keep], [free[i] for i in keep], [kind[i] for i in keep]
        if cost is not None:
            cost = [cost[i] for i in keep]
    if cost is None:
        top = sorted(range(len(pos)), key=lambda i: (free[i], pos[i]))[:k]
    else:
        c = cost
        top = sorted(range(len(pos)), key=lambda i: (c[i], free[i], pos[i]))[:k]
    return [(pos[i], kind[i]) for i in top]


def _fewest_groups_equal(group: list[int], count: int, w: int, free: list[int], k: int, n: int) -> list[int]:
    """`_fewest_groups` when every candidate offers `w` members: a sub-domain's capacity is
    w x min(its nodes, k), and a union of sub-domains holds the gang when w x min(nodes, k)
    reaches n."""
    size, gfree = [0] * count, [0] * count
    for g, f in zip(group, free, strict=True):
        size[g] += 1
        gfree[g] += f
    cap = [w * min(s, k) for s in size]

    def holds(nodes: int) -> bool:
        return min(nodes, k) * w >= n

    taken: list[int] = []
    acc = 0  # candidates of the sub-domains taken
    for g in sorted(range(count), key=lambda g: (-cap[g], gfree[g], g)):
        if not holds(acc + size[g]):
            taken.append(g)
            acc += size[g]
            continue
        out = set(taken)
        tightest = sorted(range(count), key=lambda h: (cap[h], gfree[h], h))
        last = next(h for h in tightest if h not in out and holds(acc + size[h]))
        taken.append(last)
        acc += size[last]
        for h in list(taken):
            if holds(acc - size[h]):
                taken.remove(h)
                acc -= size[h]
        return taken
    raise AssertionError("the candidates were proven to hold the gang")  # pragma: no cover


def _top_sum(hist: list[int], k: int) -> int:
    """Members the k best nodes hold, from a histogram of nodes per members offered."""
    total, left = 0, k
    for w in range(len(hist) - 1, 0, -1):
        take = min(hist[w], left)
        total += take * w
        left -= take
        if left == 0:
            break
    return total


def _fewest_groups(
    group: np.ndarray, count: int, weight: np.ndarray, free: np.ndarray, k: int, n: int
) -> list[int]:
    """Sub-domains (indices into 0..count-1) whose nodes still hold the gang on k nodes.

    Best fit, as Kueue's BestFit and Slurm's tree plugin do it. A sub-domain's capacity is
    what its k best nodes hold; its free GPUs are those of its usable nodes. The largest
    sub-domains are taken first (ties: fewer free GPUs, then name) until the k best nodes
    of those taken hold all n members; the last one is then swapped for the tightest
    sub-domain not yet taken that also completes the gang (smallest capacity, then fewest
    free GPUs, then name), so big empty sub-domains stay
    whole. Last, each taken sub-domain (largest first) is dropped if the rest still hold
    the gang. When every node offers the same number of members, capacities add up and the
    largest-first prefix is the fewest sub-domains possible; otherwise the union's k best
    nodes can hold less than the sum of the parts and the count is a heuristic, though no
    sub-domain of the answer can be left out."""
    order = np.lexsort((group, -weight))  # by sub-domain, heaviest node first
    sg = group[order]
    starts = np.searchsorted(sg, np.arange(count))
    rank = np.arange(len(sg)) - starts[sg]
    cap = np.bincount(sg, weights=np.where(rank < k, weight[order], 0), minlength=count).astype(np.int64)
    gfree = np.bincount(group, weights=free, minlength=count).astype(np.int64)
    width = int(weight.max()) + 1
    hist = np.bincount(group * width + weight, minlength=count * width).reshape(count, width)
    ids = np.arange(count)
    rows = hist.tolist()

    def holds(base: list[int], sign: int, g: int) -> bool:  # base +/- sub-domain g
        return _top_sum([a + sign * b for a, b in zip(base, rows[g], strict=True)], k) >= n

    taken: list[int] = []
    acc = [0] * width
    for g in np.lexsort((ids, gfree, -cap)).tolist():
        if not holds(acc, 1, g):
            taken.append(g)
            acc = [a + b for a, b in zip(acc, rows[g], strict=True)]
            continue
        out = set(taken)
        last = next(h for h in np.lexsort((ids, gfree, cap)).tolist() if h not in out and holds(acc, 1, h))
        taken.append(last)
        acc = [a + b for a, b in zip(acc, rows[last], strict=True)]
        for h in list(taken):
            if holds(acc, -1, h):
                taken.remove(h)
                acc = [a - b for a, b in zip(acc, rows[h], strict=True)]
        return taken
    raise AssertionError("the candidates were proven to hold the gang")  # pragma: no cover
