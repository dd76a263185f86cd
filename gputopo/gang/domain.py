"""One domain's gang plan (`gputopo.gang.planner`): the planning call's data, a domain's candidate plan
with its objective values, and how a domain is worked out, with the bounds and memos that
skip work whose result cannot win.

`planner._plan_level` finds, per level, the domains that tie on (1) the level and (2) fewest
nodes (for equal sizes on small clusters `level_bounds`, `packing.equal_bounds` memoised per
domain); `evaluate` works one out: for equal member sizes `_evaluate_equal` (the largest
threshold T such that k nodes take every member with each set at least T, then the k nodes
by (3b) and the node order) over the domain's node kinds (`_domain_kinds`, memoised), for
mixed sizes the packing's nodes. `evaluate_promising` skips a tied domain whose `worst_cap`
(a bound on (3) read off its node kinds) is below a plan already found, and `contenders`
leaves out of (4)'s pricing every candidate already behind on (2)-(3b). Pure: no I/O, no
clock, no globals; the memos live in the caller's `PlanMemo` (`gputopo.gang.memo`), keyed on
what their answers depend on and bounded by the views they hold.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from gputopo.gang.candidate import Candidate
from gputopo.gang.memo import CountGetter, Firsts, Kind, Kinds, PlanMemo, Views
from gputopo.gang.packing import NO_K, fewest
from gputopo.gang.spread import count_spans, select_nodes
from gputopo.network.levels import LevelIndex, NetworkIndex
from gputopo.network.nodeview import NodeView, Quality, member_quality
from gputopo.node.allocator import Choice
from gputopo.pod.objective import ClusterObjective

#: `Problem.since`.
Since = tuple[list[NodeView | None], list[int]] | None


@dataclass
class Problem:
    """One planning call, aligned on the network index's node positions."""

    index: NetworkIndex
    views: list[NodeView | None]
    # free GPU count per position (0 where no view), read as `free`; None: made from `counts`
    # when first read (the single-offer path reads lists only)
    free_array: np.ndarray | None
    counts: list[int]  # free GPUs per position, as a list (plain-Python loops read it)
    sizes: list[int]  # GPUs per member, spec order
    memo: PlanMemo
    roomiest: int = 0  # most free GPUs of one node
    objective: ClusterObjective | None = None
    homogeneous: bool = field(init=False)
    total: int = field(init=False)  # GPUs of all members
    single: object = field(default=None, init=False)  # `gang.singleoffer`'s per-call work
    # the views list of the memo's previous call (by identity) and the positions whose view
    # is another object now (`planner._layout`); None: not known, compare every position
    since: Since = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.homogeneous = len(set(self.sizes)) == 1
        self.total = sum(self.sizes)

    @property
    def free(self) -> np.ndarray:
        """Free GPU count per position (0 where no view)."""
        if self.free_array is None:
            self.free_array = np.array(self.counts, dtype=np.int64)
        return self.free_array

    def choices(self, pos: int, sizes: Sequence[int]) -> list[Choice | None]:
        """Sets for members of `sizes` placed on one node one after the other."""
        view = self.views[pos]
        assert view is not None
        if view.allocator is None:
            return [None] * len(sizes)
        free = view.free
        out: list[Choice | None] = []
        for g in sizes:
            choice = self.memo.choose(view.allocator, free, g)
            out.append(choice)
            free = free.difference(choice.indices)
        return out


def contenders(cands: list[Candidate], lead: Candidate) -> list[Candidate]:
    """The candidates that can still win once (4)'s cost is known, in their order.

    `rank` is lexicographic and the cost is its fourth key, after (2), (3) and (3b); `lead`
    is a candidate with the least (2)-(3b) (the least `rank` at a cost of 0 for all). A
    candidate behind `lead` on (2)-(3b) ranks after it whatever either one costs, so it cannot
    be the least; every candidate that can is kept, in the order of `cands`, and the least of
    these by the full rank is the least of all. Pricing the others (`plan_cost`) is skipped."""
    head = (lead.nodes_used, lead.worst, lead.spans)
    return [c for c in cands if (c.nodes_used, c.worst, c.spans) == head]


def evaluate_promising(
    pb: Problem,
    level: str,
    tied: list[tuple[int, int, list[tuple[int, list[int]]]]],
    lx: LevelIndex,
    dfree: np.ndarray,
    lower: Sequence[LevelIndex],
) -> list[Candidate]:
    """The tied domains' candidates (equal sizes, fewest nodes `k` each), in `tied`'s order,
    less those that cannot win: a domain whose `worst_cap` is below the worst member of a
    candidate already found would rank after it on (3) whatever its (3b) and (4), and every
    tied domain has the same (2). Domains are worked out highest bound first, so the first
    bound below the best worst found ends the search."""
    own_memo_for(pb)
    views = pb.views
    members = member_lists(pb.memo, lx)
    seen: list[tuple[Views, Kinds]] = []
    caps: list[Quality | None] = []
    for d, k, _ in tied:
        positions = members[d]
        held = tuple([views[p] for p in positions])
        kinds, firsts = _domain_kinds(pb, held, positions)
        seen.append((held, kinds))
        caps.append(worst_cap(firsts, k))
    found: dict[int, Candidate] = {}
    best: Quality | None = None
    # highest bound first; a domain without one (None) is always worked out, so it goes first
    for i in sorted(range(len(tied)), key=lambda i: (caps[i] is None, caps[i] or ()), reverse=True):
        cap = caps[i]
        if best is not None and cap is not None and cap < best:
            break
        d, k, packing = tied[i]
        found[i] = c = evaluate(pb, level, d, k, packing, lx.members[d], int(dfree[d]), lower, seen[i])
        if best is None or c.worst > best:
            best = c.worst
    return [found[i] for i in sorted(found)]


def level_bounds(pb: Problem, lx: LevelIndex) -> tuple[np.ndarray, list[int], np.ndarray]:
    """`packing.equal_bounds` for `pb`'s members (one size) over `lx`'s domains, each domain's
    part memoised on its nodes' free GPU counts: per domain its free GPUs and its fewest nodes
    are a function of those counts, the size and the member count alone, and gangs planned one
    after another meet the same counts in every domain but the few that changed."""
    own_memo_for(pb)
    g, n = pb.sizes[0], len(pb.sizes)
    need, counts, memo = n * g, pb.counts, pb.memo
    dfree: list[int] = []
    bound: list[int] = []
    for get in _count_getters(memo, lx):
        t = get(counts)
        key = (g, n, t)
        hit = memo.bounds.get(key)
        if hit is None:
            f = sum(t)
            slots = [c // g for c in t if c >= g]
            hit = memo.bounds[key] = (f, fewest(slots, n) if slots and f >= need else int(NO_K))
            memo.held += 1
        f, b = hit
        dfree.append(f)
        bound.append(b)
    passing = sorted((d for d, b in enumerate(bound) if b != NO_K), key=bound.__getitem__)
    return np.array(dfree, dtype=np.int64), passing, np.array(bound, dtype=np.int64)


def _count_getters(memo: PlanMemo, lx: LevelIndex) -> list[CountGetter]:
    """Per domain of `lx`, a function picking its nodes' entries out of a per-position list
    (made once per index and level)."""
    hit = memo.getters.get(lx.level)
    if hit is not None and hit[0] is lx:
        return hit[1]
    getters: list[CountGetter] = []
    for m in member_lists(memo, lx):
        if len(m) == 1:  # itemgetter of one index answers the item, not a tuple of it
            getters.append(_picker(m[0]))
        else:
            getters.append(operator.itemgetter(*m))
    memo.getters[lx.level] = (lx, getters)
    return getters


def _picker(p: int) -> Callable[[list[int]], tuple[int, ...]]:
    def pick(c: list[int]) -> tuple[int, ...]:
        return (c[p],)

    return pick


def member_lists(memo: PlanMemo, lx: LevelIndex) -> list[list[int]]:
    """`lx.members` as lists (made once per index and level: the memo was reset for the index)."""
    hit = memo.members.get(lx.level)
    if hit is not None and hit[0] is lx:
        return hit[1]
    lists = [m.tolist() for m in lx.members]
    memo.members[lx.level] = (lx, lists)
    return lists


def own_memo_for(pb: Problem) -> None:
    """Empty the memo's entries when they were made for another index or hold too many views
    (they are keyed on positions of one index): `PlanMemo.own`."""
    pb.memo.own(pb.index)


def evaluate(
    pb: Problem,
    level: str,
    d: int,
    k: int,
    packing: list[tuple[int, list[int]]],
    positions: np.ndarray,
    dfree: int,
    lower: Sequence[LevelIndex],
    known: tuple[Views, Kinds] | None = None,
) -> Candidate:
    """One domain's candidate. `known`: the domain's views and `_domain_kinds`, when the caller
    already has them (equal sizes only)."""
    if pb.homogeneous:
        # Equal sizes: the answer is a function of the domain's node views (their free sets
        # and allocators), the index and the shape; gangs planned one after another mostly
        # meet the same views in every domain but the few that changed.
        memo = pb.memo
        if known is None:
            own_memo_for(pb)
            held = tuple([pb.views[p] for p in positions.tolist()])
        else:
            held = known[0]
        key = (level, d, pb.sizes[0], len(pb.sizes), k, cost_key(pb.objective), *map(id, held))
        hit = memo.candidates.get(key)
        if hit is not None and len(hit[0]) == len(held) and all(map(operator.is_, hit[0], held)):
            return hit[1]
        kinds = known[1] if known is not None else _domain_kinds(pb, held, positions.tolist())[0]
        got = _evaluate_equal(pb, d, k, kinds, dfree, lower)
        memo.candidates[key] = (held, got)
        memo.held += len(held)
        return got
    # Mixed sizes: keep the first-fit-decreasing packing; biggest members choose first.
    assignment: list[tuple[int, int, Choice | None]] = []
    for pos, members in packing:
        for i, choice in zip(members, pb.choices(pos, [pb.sizes[i] for i in members]), strict=True):
            assignment.append((i, pos, choice))
    worst = min(member_quality(c) for _, _, c in assignment)
    spans = count_spans(lower, [pos for pos, _ in packing])
    return Candidate(d, len(packing), worst, spans, dfree, tuple(assignment))


def cost_key(objective: ClusterObjective | None) -> tuple[object, ...]:
    """What the node order's costs (`ClusterObjective.take_cost`) depend on besides the sets:
    the objective itself and its weight, the mix (its identity, not only its version: two mixes
    count versions alike) and the servers it learned. Part of every memo key of an answer that
    orders by those costs, so a memo shared by planners of different objectives stays right."""
    if objective is None:
        return ()
    return (objective, objective.mix, objective.mix.version, objective.frag_weight, objective.learned)


def _cost(objective: ClusterObjective | None, kind: Kind, choices: list[Choice | None], cnt: int) -> float:
    """What a node of `kind` offering its first `cnt` members' sets costs future demand (0
    without an objective or a topology): the node order's key after members offered."""
    policy, free = kind
    if objective is None or policy is None:
        return 0.0
    taken = [i for c in choices[:cnt] if c is not None for i in c.indices]
    return round(objective.take_cost(policy, free, taken), 6)


def _domain_kinds(pb: Problem, held: Views, positions: list[int]) -> tuple[Kinds, Firsts]:
    """The domain's nodes with room for a member of `pb`'s size, by kind, with the sets of up
    to `n` members each (`_evaluate_equal`'s first step), and their `Firsts`.

    A function of the node views and the member size alone, save for the number of members
    worked out per node, min(its slots, n): a node's first m sets are the same whatever n >= m
    (each member chooses from what the earlier ones left). So it is memoised on the views'
    identity and the size, with the n it was worked out for: any gang of at most that many
    members reads it, cut down to its own n (a no-op when no node got more than n sets), the
    same lists a fresh pass would build; one of more members works it out again. The caller
    has reset the memo for this index."""
    g, n = pb.sizes[0], len(pb.sizes)
    memo = pb.memo
    key = (g, *map(id, held))
    hit = memo.kinds.get(key)
    if hit is not None and len(hit[0]) == len(held) and all(map(operator.is_, hit[0], held)):
        upto, longest, cached, firsts = hit[1]
        if upto >= n and longest <= n:
            return cached, firsts
        if upto > n:
            return {kind: (f[:n], c[:n], ps) for kind, (f, c, ps) in cached.items()}, firsts
    kinds: Kinds = {}
    free = pb.counts
    for p in positions:
        if free[p] < g:
            continue
        view = pb.views[p]
        assert view is not None
        kind = (view.allocator, view.free)
        entry = kinds.get(kind)
        if entry is None:
            choices = pb.choices(p, [g] * min(len(view.free) // g, n))
            floor: list[Quality] = []
            for c in choices:
                q = member_quality(c)
                floor.append(q if not floor or q < floor[-1] else floor[-1])
            entry = kinds[kind] = (floor, choices, [])
        entry[2].append(p)
    firsts = sorted(((floor[0], len(ps)) for floor, _, ps in kinds.values()), reverse=True)
    longest = max((len(c) for _, c, _ in kinds.values()), default=0)
    memo.kinds[key] = (held, (n, longest, kinds, firsts))
    memo.held += len(held)
    return kinds, firsts


def _evaluate_equal(
    pb: Problem, d: int, k: int, kinds: Kinds, dfree: int, lower: Sequence[LevelIndex]
) -> Candidate:
    """The k nodes of the domain that maximise the worst member's set (equal sizes).

    Each node's members choose one after the other, so its i-th member's set is known and
    `floor[i]` (the worst of the first i+1) only falls. For a threshold T a node offers the
    members whose floor reaches T; the best plan is the largest T at which the k roomiest
    nodes still take everyone. Any k nodes whose offers at T add up to n keep (1)-(3), so
    `select_nodes` picks them for (3b); with no level to keep together, the order is most
    members offered, least cost to future demand (with an objective), fewer free GPUs (best
    fit), then name.
    Nodes with the same allocator and free set are worked out once."""
    n = len(pb.sizes)
    t = _threshold(kinds, k, n)
    # Every kind that offers a member at t: its positions, members offered, free GPUs, sets,
    # floor, and cost to future demand.
    table: list[tuple[list[int], int, int, list[Choice | None], list[Quality], float]] = []
    for kind, (floor, choices, ps) in kinds.items():
        cnt = _offer(floor, t)
        if cnt > 0:
            table.append((ps, cnt, len(kind[1]), choices, floor, _cost(pb.objective, kind, choices, cnt)))
    if lower:
        lens = [len(r[0]) for r in table]
        pos = np.fromiter(itertools.chain.from_iterable(r[0] for r in table), np.int64, sum(lens))
        weight = np.repeat(np.array([r[1] for r in table], dtype=np.int64), lens)
        nfree = np.repeat(np.array([r[2] for r in table], dtype=np.int64), lens)
        kind_ids = np.repeat(np.arange(len(table), dtype=np.int64), lens)
        order = np.repeat(np.array([r[5] for r in table], dtype=np.float64), lens)
        chosen = select_nodes(pos, weight, nfree, kind_ids, k, n, lower, order)
    else:  # nothing to keep together: the k first by the node order (small domains: plain Python)
        # sorted()[:k] is heapq.nsmallest(k, ...) (its documented equivalent), faster on few
        top = sorted([(-r[1], r[5], r[2], p, row) for row, r in enumerate(table) for p in r[0]])[:k]
        chosen = [(p, row) for _, _, _, p, row in top]
    assignment: list[tuple[int, int, Choice | None]] = []
    worst: Quality | None = None
    for p, row in chosen:
        _, cnt, _, choices, floor, _ = table[row]
        take = min(cnt, n - len(assignment))
        for c in choices[:take]:
            assignment.append((len(assignment), p, c))
        # the worst of a node's first `take` sets is its floor there (the running worst)
        if take and (worst is None or floor[take - 1] < worst):
            worst = floor[take - 1]
    assert len(assignment) == n and worst is not None, "k nodes were proven to hold every member"
    spans = count_spans(lower, [p for p, _ in chosen])
    return Candidate(d, k, worst, spans, dfree, tuple(assignment))


def _offer(floor: list[Quality], t: Quality) -> int:
    """Members a node of this floor offers at threshold t (floor only falls: its prefix >= t)."""
    count = 0
    for q in floor:
        if q < t:
            break
        count += 1
    return count


def _threshold(kinds: Kinds, k: int, n: int) -> Quality:
    """The largest threshold T at which k nodes take all n members (`_evaluate_equal`).

    When no node offers a second member (every floor has one entry), a node offers a member at
    T exactly when its first set reaches T, and k nodes take the n members (so k >= n) at T
    exactly when n nodes' first sets reach T: the largest such T among the floors' values is
    the n-th best first set, as `worst_cap` counts (whole-node members always get here).
    Otherwise the binary search over the floors' values, `_searched_threshold`."""
    if all(len(floor) == 1 for floor, _, _ in kinds.values()):
        t = worst_cap(sorted(((floor[0], len(ps)) for floor, _, ps in kinds.values()), reverse=True), n)
        assert t is not None, "k nodes were proven to have room"
        return t
    return _searched_threshold(kinds, k, n)


def _searched_threshold(kinds: Kinds, k: int, n: int) -> Quality:
    """`_threshold` by a binary search over the floors' values (fits is monotone in T)."""

    def fits(t: Quality) -> bool:
        nodes_left, members = k, 0
        for cnt, many in sorted(((_offer(f, t), len(ps)) for f, _, ps in kinds.values()), reverse=True):
            take = min(many, nodes_left)
            members += cnt * take
            nodes_left -= take
            if nodes_left == 0:
                break
        return members >= n

    thresholds = sorted({q for floor, _, _ in kinds.values() for q in floor})
    lo, hi = 0, len(thresholds) - 1  # the lowest threshold fits: k is feasible
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(thresholds[mid]):
            lo = mid
        else:
            hi = mid - 1
    return thresholds[lo]


def worst_cap(firsts: Firsts, k: int) -> Quality | None:
    """An upper bound on the worst member of any equal-size plan that uses the fewest nodes,
    `k`, of a domain whose nodes with room for a member have the `firsts` of `_domain_kinds`.

    Why it holds: with k the fewest nodes that can take the members, every one of the plan's
    k nodes takes at least one member (else k - 1 would do), and each node's members take
    their sets one after the other, so its first member gets the set the allocator chooses
    from all its free GPUs: `floor[0]` of its kind. The worst member is at most that on each
    of the k nodes, so at most the k-th best `floor[0]` over the domain's nodes with room.
    Nodes of unknown topology offer UNKNOWN_QUALITY, below every measured set, as the
    planner's members there do. None (no bound: work the domain out) where fewer than k
    nodes have room, which the caller's k rules out."""
    left = k
    for first, many in firsts:
        left -= many
        if left <= 0:
            return first
    return None
