"""Bounds that let the gang planner skip a domain whose plan cannot win (`gputopo.gang`).

Domains that tie on the gang objective's (1) level and (2) fewest nodes are each worked out in
full (`gang._evaluate_equal`: thresholds, costs, the k nodes) and then compared on (3), the best
worst-member set. `worst_cap` bounds (3) from above for one domain with a dictionary lookup per
node, so a domain whose bound is below a plan already found is never worked out: it would rank
after that plan whatever its (3b) spans and (4) cost. Pure: no I/O, no clock, no globals.
"""

from __future__ import annotations

from collections.abc import Sequence

from gputopo.nodeview import UNKNOWN_QUALITY, ChoiceMemo, NodeView, Quality, member_quality


def worst_cap(
    views: Sequence[NodeView | None], free: Sequence[int], positions: Sequence[int], g: int, k: int, memo: ChoiceMemo
) -> Quality | None:
    """An upper bound on the worst member of any equal-size plan (members of `g` GPUs) that
    uses the fewest nodes, `k`, of the domain whose node positions are `positions`.

    Why it holds: with k the fewest nodes that can take the members, every one of the plan's
    k nodes takes at least one member (else k - 1 would do), and each node's members take
    their sets one after the other, so its first member gets the set the allocator chooses
    from all its free GPUs (`memo.choose(allocator, free, g)`). The worst member is at most
    that first member's quality on each of the k nodes, so at most the k-th best such
    quality over the domain's nodes with room for a member. Nodes of unknown topology offer
    UNKNOWN_QUALITY, below every measured set, as the planner's members there do. None
    (no bound: work the domain out) where fewer than k nodes have room, which the caller's k
    rules out."""
    firsts: list[Quality] = []
    for p in positions:
        if free[p] < g:
            continue
        view = views[p]
        assert view is not None
        alloc = view.allocator
        firsts.append(UNKNOWN_QUALITY if alloc is None else member_quality(memo.choose(alloc, view.free, g)))
    if len(firsts) < k:
        return None
    firsts.sort(reverse=True)
    return firsts[k - 1]
