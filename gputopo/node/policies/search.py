"""In-node GPU choice of the allocators people run today, written from their published behaviour.

Each function answers one GetPreferredAllocation-like question for a set of free GPUs and a
size; they take the pair-point matrix of `pairpoints` (or nothing), never bandwidths, because
that is what the modelled systems see. Facts: node-anchors.md §1.5 (kubelet), §2.3 (NVIDIA
go-gpuallocator best-effort), §4 (HAMi topology-aware). No code of those projects is copied.
`gputopo.node.policies.baselines` wraps each in a `GpuPolicy` (tables once, answers cached, keys scored
by the exact allocator); the functions stay separate so tests can check them against the
published expectations of the systems they model.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from functools import cache

import numpy as np

#: A chosen group; None marks go-gpuallocator's padding placeholder (a nil device).
Group = tuple[int | None, ...]


def kubelet_order(free: Sequence[int], size: int, rng: random.Random) -> tuple[int, ...]:
    """No preferred allocation: kubelet takes the first `size` IDs of a Go map's iteration,
    which is effectively a random order; `rng` stands in for it so runs are reproducible."""
    if size <= 0 or size > len(free):
        return ()
    return tuple(sorted(rng.sample(list(free), size)))


def best_effort(
    points: np.ndarray,
    available: Sequence[int],
    size: int,
    required: Sequence[int] = (),
    *,
    exclude_padding: bool = False,
) -> Group:
    """go-gpuallocator's best-effort policy; () when its guards refuse.

    It scores every partition of `available` (padded with placeholders up to a multiple of
    `size`, the padding kept in one group) by the sum of its groups' pair points, keeps the first
    best partition that has a padding-free group holding `required`, then returns that
    partition's best group holding `required` (first wins). Nothing stops that group from being
    the padded one: the result may contain None, which the real plugin dereferences and panics on
    (go-gpuallocator PR #80). `exclude_padding=True` is that PR's fix: the final pick skips the
    padded group (the best partition always has a padding-free group holding `required`).
    Ties follow the order of `available`."""
    avail = list(available)
    req = list(required)
    if size <= 0 or len(avail) < size or len(req) > size or len(req) > len(avail):
        return ()
    if any(r not in avail for r in req):
        return ()
    if size == 1:
        return (req[0],) if req else (avail[0],)
    pad = (-len(avail)) % size
    pts = tuple(tuple(int(x) for x in row) for row in points)
    return _best_effort_search(pts, tuple(avail), pad, size, frozenset(req), exclude_padding)


def _group_score(pts: tuple[tuple[int, ...], ...], group: Sequence[int]) -> int:
    return sum(pts[a][b] for a, b in itertools.combinations(group, 2))


def _best_effort_search(
    pts: tuple[tuple[int, ...], ...],
    avail: tuple[int, ...],
    pad: int,
    size: int,
    req: frozenset[int],
    exclude_padding: bool = False,
) -> Group:
    """Exact first-seen maximum over the depth-first partition enumeration, by memoised search.

    A partition is built by seeding each group with the first remaining item and choosing the
    rest in combination order, placeholders last; the first-seen maximum of that walk equals
    taking, at every step, the first child whose subtree reaches the largest total."""
    items: tuple[int | None, ...] = avail + (None,) * pad

    @cache
    def best(remaining: tuple[int, ...], sat: bool) -> tuple[int, tuple[tuple[int, ...], ...]] | None:
        # remaining: positions into `items` still unassigned (in order)
        if not remaining:
            return (0, ()) if sat else None
        seed, rest = remaining[0], remaining[1:]
        pads_left = sum(1 for p in remaining if items[p] is None)
        found: tuple[int, tuple[tuple[int, ...], ...]] | None = None
        for combo in itertools.combinations(rest, size - 1):
            n_pad = sum(1 for p in combo if items[p] is None)
            if n_pad not in (0, pads_left):
                continue
            group = (seed, *combo)
            real = [items[p] for p in group if items[p] is not None]
            now_sat = sat or (n_pad == 0 and req.issubset(real))
            left = tuple(p for p in rest if p not in combo)
            sub = best(left, now_sat)
            if sub is None:
                continue
            total = _group_score(pts, real) + sub[0]  # type: ignore[arg-type]
            if found is None or total > found[0]:
                found = (total, (group, *sub[1]))
        return found

    result = best(tuple(range(len(items))), False)
    if result is None:
        return ()
    pick: Group = ()
    pick_score = -1
    for group in result[1]:
        members = [items[p] for p in group]
        real = [m for m in members if m is not None]
        if not req.issubset(real) or (exclude_padding and len(real) < len(members)):
            continue
        score = _group_score(pts, real)
        if score > pick_score:
            pick, pick_score = tuple(members), score
    return pick


def best_combo(
    points: np.ndarray, candidates: Sequence[int], size: int, required: Sequence[int] = ()
) -> tuple[int, ...]:
    """HAMi's topology-aware fit; () when fewer than `size` candidates.

    One card: the candidate least connected to the other candidates (smallest sum of points,
    first wins), so well-linked groups stay whole. Several: the combination of candidates with
    the largest pair-point sum over all C(k, size), first in combination order wins; no look-ahead.
    HAMi's scheduler has no must-include set (it decides before kubelet asks); `required` is how
    kubelet's must-include reaches it when it runs as a device plugin's policy: only combinations
    holding every required card are scored (() when that is impossible)."""
    cands = list(candidates)
    req = set(required)
    if size <= 0 or len(cands) < size or len(req) > size or not req <= set(cands):
        return ()
    if len(cands) == size:
        return tuple(sorted(cands))
    if size == 1:
        if req:
            return (next(iter(req)),)
        best_card, best_sum = cands[0], None
        for c in cands:
            s = sum(int(points[c][d]) for d in cands if d != c)
            if best_sum is None or s < best_sum:
                best_card, best_sum = c, s
        return (best_card,)
    best_set: tuple[int, ...] = ()
    best_score = -1
    for combo in itertools.combinations(cands, size):
        if req and not req.issubset(combo):
            continue
        s = sum(int(points[a][b]) for a, b in itertools.combinations(combo, 2))
        if s > best_score:
            best_set, best_score = combo, s
    return tuple(sorted(best_set))
