"""Gang planning when no node can take a second member (`gputopo.gang.planner`'s single-offer path).

Members of one size g on nodes that each have fewer than 2g free GPUs (whole-node members,
the common case: 8-GPU members on 8-GPU servers) are the general search of
`gputopo.gang.domain` with most of its steps collapsed, worked out here in one pass per level
instead of per domain through that module's memos:

  * every node with g free GPUs offers exactly one member, its set the allocator's choice of
    g out of its free GPUs, so (2) fewest nodes is n in every domain with n such nodes, and
    no other domain passes (n nodes of g or more free GPUs are also the n x g GPUs);
  * (3) a domain's best worst member is the n-th best of those nodes' sets (`worst_cap`'s
    bound, which `_threshold` reads off single offers); the domains below the best of these
    rank after it whatever their (3b) and (4), so only the ones equal to it are worked out;
  * each of those takes its n nodes among the ones reaching that threshold as
    `gang.domain._evaluate_equal` does: by (3b) with `select_nodes` over the same table of node
    kinds in the same order, else by (least cost to future demand, fewest free GPUs, name).

  * the best of those by the candidate rank's remaining keys ((3b), (4)'s plan cost, fewest
    free GPUs, domain order) is the one candidate handed on: the plan is the one
    `planner._best_plan` picks among every domain's `gang.domain.evaluate`
    (tests/test_gang_fastpaths.py checks it against that path).

Pure: no I/O, no clock, no globals; what one call works out per node lives on its `Problem`,
and what is a function of the node views alone (offers, rooms, picks) is kept in the caller's
`PlanMemo` with the views it was made from, so the next call reads only the changed nodes.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import cast

import numpy as np

from gputopo.gang import spread
from gputopo.gang.candidate import Candidate
from gputopo.gang.cost import DIGITS
from gputopo.gang.domain import Problem, cost_key, member_lists, own_memo_for
from gputopo.gang.memo import Kind, Offer, PlanMemo, Room, ViewList
from gputopo.network.levels import LevelIndex
from gputopo.network.nodeview import UNKNOWN_QUALITY, NodeView, Quality
from gputopo.node.allocator import Choice


def applies(pb: Problem) -> bool:
    """Equal member sizes and no node with room for two members (the roomiest has < 2g)."""
    return pb.homogeneous and pb.roomiest < 2 * pb.sizes[0]


class _Call:
    """What one planning call works out per node and per kind, shared by every level (a plain
    class: one is made per call)."""

    __slots__ = ("costs", "offers")

    def __init__(self, offers: list[Offer | None]) -> None:
        self.offers = offers  # per node position, its one offer (None without g free GPUs)
        self.costs: dict[Kind, float] = {}  # `_take_cost` per kind


def offers(pb: Problem) -> list[Offer | None]:
    """Per node position, its one offer (None without g free GPUs), worked out once per call
    and shared by every level; nodes of one kind share one allocator answer."""
    return _call(pb).offers


def _call(pb: Problem) -> _Call:
    if pb.single is not None:
        return cast("_Call", pb.single)
    g, counts, views, memo = pb.sizes[0], pb.counts, pb.views, pb.memo
    # A node's offer is a function of its view (frozen: its allocator and free set) and g, so
    # the last call's offers for this g are kept (`PlanMemo.offers`, for this index) and only
    # the positions whose view is another object are worked out again: gangs planned one
    # after another meet the same views on all nodes but the few that changed.
    own_memo_for(pb)
    last = memo.offers.get(g)
    todo = None if last is None else _changed(pb, last[0])
    out: list[Offer | None]
    if last is not None and todo is not None:
        out = list(last[1])
    else:
        out = [None] * len(counts)
        todo = list(range(len(counts)))
        memo.held += len(views) if last is None else 0  # an entry found is replaced
    seen: dict[Kind, Offer] = {}
    for p in todo:
        view = views[p]
        if view is None or counts[p] < g:  # positions without a view count 0 free GPUs
            out[p] = None
            continue
        kind = (view.allocator, view.free)
        offer = seen.get(kind)
        if offer is None:
            if view.allocator is None:
                offer = (UNKNOWN_QUALITY, None, kind)
            else:
                c = memo.choose(view.allocator, view.free, g)
                offer = (c.ring_mbps, c.pair_sum_mbps), c, kind
            seen[kind] = offer
        out[p] = offer
    memo.offers[g] = (views, out)  # `views` (never changed) keeps its id its own
    pb.single = call = _Call(out)
    return call


def _changed(pb: Problem, held: ViewList) -> list[int] | None:
    """The positions whose view is another object in `pb.views` than in `held` (a views list
    of an earlier call): `planner._layout`'s when `held` is the one it compared with, else by
    comparing every position; None when the lists do not align."""
    if pb.since is not None and pb.since[0] is held:
        return pb.since[1]
    views = pb.views
    if len(held) != len(views):
        return None
    return [p for p in range(len(views)) if views[p] is not held[p]]


def candidates(pb: Problem, lx: LevelIndex, lower: Sequence[LevelIndex]) -> list[Candidate]:
    """The best candidate of `lx`'s domains, as `planner._best_plan` would choose among every
    domain's `gang.domain.evaluate` ([it], or [] when no domain has n nodes with room).

    Every domain that passes uses n nodes (2), and one whose n-th best set is below the best
    domain's ranks after it on (3) whatever follows, so only the domains tied on (3) are
    worked out; among those the candidate rank's remaining keys decide: (3b) fewest
    sub-domains, (4) the plan's cost (with an objective: the rivals tied on (2)-(3b) are
    priced, and only they can win), fewest free GPUs, domain order. `applies(pb)` must hold."""
    own_memo_for(pb)
    n = len(pb.sizes)
    offered = offers(pb)
    rooms = _rooms(pb, lx, offered)
    best: Quality | None = None
    tops: list[tuple[int, Room]] = []
    for d, r in enumerate(rooms):
        if len(r[0]) < n:
            continue
        t = r[1][n - 1]
        if best is None or t > best:
            best, tops = t, [(d, r)]
        elif t == best:
            tops.append((d, r))
    if best is None:
        return []
    # what `_pick` depends on besides the domain's views (its room's key) and the level's
    # `lower`: the shape, the threshold, and the objective's take costs
    asked = (n, best, *cost_key(pb.objective))
    lead: tuple[tuple[int, ...], float, int, int, list[int], float | None] | None = None
    for d, (room, _, dfree, picks) in tops:
        got = picks.get(asked)
        if got is None:
            if len(picks) >= _PICKS_HELD:
                picks.clear()
            got = picks[asked] = _pick(pb, room, best, lower)
        chosen, cost, spans = got
        key = (spans, cost or 0.0, dfree, d, chosen, cost)
        if lead is None or key[:4] < lead[:4]:
            lead = key
    assert lead is not None
    spans, _, dfree, d, chosen, cost = lead
    assignment = tuple([(i, p, offered[p][1]) for i, p in enumerate(chosen)])  # type: ignore[index]
    worst = min([offered[p][0] for p in chosen])  # type: ignore[index]
    return [Candidate(d, n, worst, spans, dfree, assignment, cost)]


#: `_pick` answers kept per domain (for as long as its views are the same).
_PICKS_HELD = 32


def _rooms(pb: Problem, lx: LevelIndex, offered: list[Offer | None]) -> list[Room]:
    """`Room` per domain of `lx`. A function of the domain's views and the member size, so
    kept per (size, level) with the views they were made from (`PlanMemo.rooms`, for this
    index): only the domains with a view that is another object since are worked out again.
    The caller has reset the memo for this index (`own_memo_for`)."""
    memo, views, counts = pb.memo, pb.views, pb.counts
    g = pb.sizes[0]
    members = member_lists(memo, lx)
    key = (g, lx.level)
    hit = memo.rooms.get(key)
    todo: dict[int, list[int]] | range
    per: list[Room]
    changed = None if hit is None else _changed(pb, hit[0])
    if hit is not None and changed is not None and len(hit[1]) == len(members):
        per = list(hit[1])
        ids = _domain_ids(memo, lx)
        todo = {}
        for p in changed:  # the changed positions of each domain with one
            d = ids[p]
            got = todo.get(d)
            if got is None:
                todo[d] = [p]
            else:
                got.append(p)
    else:
        per = [([], [], 0, {})] * len(members)
        todo = range(len(members))
        memo.held += len(views) if hit is None else 0  # an entry found is replaced
    for d in todo:
        positions = members[d]
        moved = todo[d] if hit is not None and type(todo) is dict else None
        # `_pick`'s answers read only the room's nodes and their offers' kinds (an offer is a
        # function of its kind and g): a domain whose changed nodes neither came into nor left
        # the room nor changed kind in it (a single pod on a node already short of g free GPUs,
        # one freed but still short) keeps them
        picks = per[d][3] if moved is not None and _same_offers(hit[0], views, moved, g) else {}  # type: ignore[index]
        if moved is not None and len(moved) * _MOVED_SHARE < len(positions):
            # A large domain with few changed nodes: the last answer brought up to date at those
            # nodes (the same lists as from scratch: the room in position order, the qualities
            # best first, the free GPUs summed), each node's last offer read off its last view
            # as `_call` read it.
            assert hit is not None
            was = hit[0]
            room, best_first, dfree, _ = per[d]
            best_first = best_first.copy()
            gone: set[int] = set()
            came: list[int] = []
            for p in moved:
                old_view = was[p]
                old_count = 0 if old_view is None else len(old_view.free)
                dfree += counts[p] - old_count
                old = None if old_view is None or old_count < g else _quality(memo, old_view, g)
                new = offered[p]
                if old is not None:
                    best_first.remove(old)
                if new is not None:
                    best_first.append(new[0])
                if old is not None and new is None:
                    gone.add(p)
                elif old is None and new is not None:
                    came.append(p)
            best_first.sort(reverse=True)
            if gone or came:
                room = sorted([p for p in room if p not in gone] + came)
            per[d] = (room, best_first, dfree, picks)
            continue
        room = [p for p in positions if offered[p] is not None]
        best_first = sorted([offered[p][0] for p in room], reverse=True)  # type: ignore[index]
        per[d] = (room, best_first, sum([counts[p] for p in positions]), picks)
    memo.rooms[key] = (views, per)  # `views` (never changed) keeps its id its own
    return per


#: A domain of more than this many nodes per changed node is brought up to date, not read again.
_MOVED_SHARE = 4


def _same_offers(was: ViewList, views: ViewList, moved: list[int], g: int) -> bool:
    """Whether every position in `moved` offers a member of `g` GPUs in `views` exactly when it
    did in `was`, and then of the same kind (server and free set): the room and every offer
    `_pick` reads are the same (`_call`'s offer is a function of the kind and g)."""
    for p in moved:
        old, new = was[p], views[p]
        had = old is not None and len(old.free) >= g
        if had != (new is not None and len(new.free) >= g):
            return False
        if had and (old.allocator is not new.allocator or old.free != new.free):  # type: ignore[union-attr]
            return False
    return True


def _quality(memo: PlanMemo, view: NodeView, g: int) -> Quality:
    """The quality of the one offer of a node with `view` (g free GPUs or more), as `_call`
    works it out: the allocator's choice of g (kept in the memo), or unknown."""
    if view.allocator is None:
        return UNKNOWN_QUALITY
    c = memo.choose(view.allocator, view.free, g)
    return (c.ring_mbps, c.pair_sum_mbps)


def _domain_ids(memo: PlanMemo, lx: LevelIndex) -> list[int]:
    """`lx.domain_id` as a list (made once per index and level, as `member_lists`)."""
    hit = memo.domain_ids.get(lx.level)
    if hit is not None and hit[0] is lx:
        return hit[1]
    ids: list[int] = lx.domain_id.tolist()
    memo.domain_ids[lx.level] = (lx, ids)
    return ids


def _pick(
    pb: Problem, room: list[int], t: Quality, lower: Sequence[LevelIndex]
) -> tuple[list[int], float | None, tuple[int, ...]]:
    """A domain's n nodes among `room` whose set reaches t (`_evaluate_equal` with k = n), in
    the order members are assigned, the plan's `plan_cost` (None without an objective), and
    its (3b) `count_spans` over `lower`."""
    n = len(pb.sizes)
    call = _call(pb)
    offered = call.offers
    rows: dict[Kind, list[int]] = {}  # kinds, first seen first
    for p in room:
        offer = offered[p]
        assert offer is not None
        if offer[0] >= t:
            ps = rows.get(offer[2])
            if ps is None:
                rows[offer[2]] = [p]
            else:
                ps.append(p)
    table = list(rows.items())
    cache = call.costs
    taken: list[float] = []  # `_take_cost` per row, inline: once per kind and call
    for kind, ps in table:
        hit = cache.get(kind)
        if hit is None:
            hit = _take_cost(pb, call, kind, offered[ps[0]][1])  # type: ignore[index]
        taken.append(hit)
    costs = [round(c, DIGITS) for c in taken]  # the node order's key, as `gang.domain._cost`
    if lower:
        ids = [_domain_ids(pb.memo, lx) for lx in lower]
        lens = [len(ps) for _, ps in table]
        total = sum(lens)
        if 0 < total <= spread.SMALL_CANDIDATES:  # `select_nodes`' own test: its list path, on lists
            pos: list[int] = []
            nfree: list[int] = []
            kinds: list[int] = []
            order: list[float] = []
            for row, (kind, ps) in enumerate(table):  # every row's nodes, in the rows' order
                m = len(ps)
                pos += ps
                nfree += [len(kind[1])] * m
                kinds += [row] * m
                order += [costs[row]] * m
            picked = spread.select_equal(pos, 1, nfree, kinds, n, n, lower, order, ids)
        else:
            at = np.fromiter(itertools.chain.from_iterable(ps for _, ps in table), np.int64, total)
            weight = np.ones(total, dtype=np.int64)
            free = np.repeat(np.array([len(kind[1]) for kind, _ in table], dtype=np.int64), lens)
            kind_ids = np.repeat(np.arange(len(table), dtype=np.int64), lens)
            cost = np.repeat(np.array(costs, dtype=np.float64), lens)
            picked = spread.select_nodes(at, weight, free, kind_ids, n, n, lower, cost)
        chosen = [p for p, _ in picked]
        spans = tuple([len({of[p] for p in chosen}) for of in ids])  # `count_spans`, on plain ints
    else:  # the node order: least cost, fewest free GPUs, name (positions are in name order)
        top = sorted([(costs[row], len(kind[1]), p, row) for row, (kind, ps) in enumerate(table) for p in ps])
        picked = [(p, row) for _, _, p, row in top[:n]]
        chosen = [p for p, _ in picked]
        spans = ()
    if pb.objective is None:
        return chosen, None, spans
    # plan_cost: the unrounded take costs summed in the assignment's order, then rounded
    total_cost = 0.0
    for _, row in picked:
        total_cost += taken[row]
    return chosen, round(total_cost, DIGITS), spans


def _take_cost(pb: Problem, call: _Call, kind: Kind, choice: Choice | None) -> float:
    """`ClusterObjective.take_cost` of a node of `kind` giving its one member `choice` (0 without
    an objective or a topology), once per kind and call (`call`: this one's `_call`)."""
    policy, free = kind
    if pb.objective is None or policy is None or choice is None:
        return 0.0
    cache = call.costs
    hit = cache.get(kind)
    if hit is None:
        hit = cache[kind] = pb.objective.take_cost(policy, free, choice.indices)
    return hit
