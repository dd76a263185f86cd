"""Gang placement (design.md §5): all members of a PodGroup in the smallest network domain.

The gang objective, compared in order:
  (1) the smallest level whose one domain holds every member;
  (2) fewest nodes;
  (3) the best worst-member GPU set, as the node allocator chooses it;
  (3b) fewest sub-domains: among plans equal on (1)-(3), the one whose nodes touch the fewest
       domains of each grouping level inside the chosen one, largest level first (a plan at
       the cluster level: fewest spines, then fewest leaves inside those, ...);
  (4) best fit: the domain left with the fewest free GPUs, so large empty domains stay whole;
  (5) name order.

(3b) is this planner's addition to design.md §5. Without it, a gang that falls back to a
spine or to the whole cluster took its k nodes in node order and scattered over many leaves
and spines, fragmenting every one of them for the next gang; Slurm's tree plugin and Volcano
allocate inside the chosen domain over its sub-domains instead, and so does this.

How a plan is found (docs/gang.md has the long form, with where it is exact):
  * per level, numpy sums free GPUs and member slots (`free // size`) over every domain at
    once and drops the domains that cannot hold the gang, before any allocator is called;
  * fewest nodes (2) fills the nodes with the most room first: exact for equal member sizes;
    for mixed sizes a budgeted exact search, then first-fit decreasing (a heuristic);
  * (3) only runs on the domains that tie on (1) and (2); the k nodes of a domain are picked
    by the largest threshold T such that k nodes can take all members with every member's
    set at least T (exact for equal sizes under per-node sequential allocation);
  * (3b): every node that offers a member at T keeps (3), so the k nodes are chosen level by
    level, largest first, over the sub-domains (best fit as Kueue's BestFit: largest
    sub-domains first, the last one the tightest that completes the gang, none left that
    could be dropped). Fewest possible at the first level below the chosen one, and at each
    further level inside the sub-domains kept, when every usable node offers the same number
    of members (whole-node members always do); otherwise a heuristic. Mixed sizes keep their
    packing's nodes and use (3b) only to rank domains;
  * GPU sets always come from `Allocator.choose` (one objective, one allocator); members that
    share a node get their sets one after the other from what the earlier ones left free.

Pure: no I/O, no clock, no globals. A `ChoiceMemo` owned by the caller may be shared across
calls on the same allocators; everything else lives for one call.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from gputopo.allocator import Choice
from gputopo.network import CLUSTER, HOSTNAME, LevelIndex, NetworkIndex, short_name, validate_levels
from gputopo.policy import GpuPolicy

#: A member's GPU set as the gang compares it across nodes: (ring MB/s, pair-sum MB/s).
Quality = tuple[int, ...]
#: Quality of a set on a node of unknown topology: below every measured set.
UNKNOWN_QUALITY: Quality = ()
#: Score of a node of unknown topology in `node_scores`: the middle of 0..10.
NEUTRAL_SCORE = 5
MAX_SCORE = 10

_NO_K = np.iinfo(np.int64).max
_Kind = tuple[GpuPolicy | None, frozenset[int]]


@dataclass(frozen=True)
class NodeView:
    """What the planner knows of one node at one instant."""

    name: str
    labels: Mapping[str, str]
    gpu_count: int
    free: frozenset[int]  # free GPU indices (healthy, not allocated, not reserved)
    allocator: GpuPolicy | None = (
        None  # the node's policy; None = topology unknown: GPUs are interchangeable, neutral score
    )

    def __post_init__(self) -> None:
        # Free sets are dictionary keys of the planner's memo: a plain set would not hash.
        if type(self.free) is not frozenset:
            object.__setattr__(self, "free", frozenset(self.free))


@dataclass(frozen=True)
class Member:
    pod: str  # "namespace/name"
    gpus: int  # GPUs the pod asks for (nvidia.com/gpu)


@dataclass(frozen=True)
class GangSpec:
    key: str  # "namespace/group-name"
    members: tuple[Member, ...]  # the members to place now (pending ones)
    required_level: str | None = None  # gputopo.io/required-topology (a level's label key)
    preferred_level: str | None = None  # gputopo.io/preferred-topology


@dataclass(frozen=True)
class Placement:
    pod: str
    node: str
    gpus: tuple[int, ...]  # GPU indices the node allocator would give (empty if unknown topology)
    choice: Choice | None = None


@dataclass(frozen=True)
class GangPlan:
    gang: str
    level: str  # the label key of the level whose one domain holds every member
    domain: str  # that domain's label value
    placements: tuple[Placement, ...]
    nodes_used: int = 0  # objective (2)
    worst: Quality = UNKNOWN_QUALITY  # objective (3): the worst member's (ring, pair sum)
    domain_free: int = 0  # objective (4): free GPUs of the domain before the plan
    # tie-break (3b): domains touched at each grouping level inside `level`, largest level first
    # (e.g. (spines, leaves) for a plan at the cluster level); () at the smallest levels
    spans: tuple[int, ...] = ()


@dataclass(frozen=True)
class NoPlan:
    gang: str
    reason: str  # readable: why nothing fits


class ChoiceMemo:
    """Allocator answers per (allocator, free set, size).

    Owned by the caller, never global: one per planning call by default, or one per cluster
    snapshot when the caller wants repeated plans (filter retries, the simulator) to be cheap."""

    def __init__(self) -> None:
        self._answers: dict[tuple[GpuPolicy, frozenset[int], int], Choice] = {}

    def choose(self, allocator: GpuPolicy, free: frozenset[int], size: int) -> Choice:
        key = (allocator, free, size)
        hit = self._answers.get(key)
        if hit is None:
            hit = self._answers[key] = allocator.choose(sorted(free), size)
        return hit

    def __len__(self) -> int:
        return len(self._answers)


def member_quality(choice: Choice | None) -> Quality:
    """How good a member's set is, comparable across nodes: ring bandwidth, then pair sum.

    The node objective's other keys do not carry across nodes: least disruption describes
    the node's leftovers (its tuple changes shape with the number of free GPUs), and the
    index tie-break means nothing between two machines. Leftovers are (4)'s business."""
    if choice is None:
        return UNKNOWN_QUALITY
    return (choice.ring_mbps, choice.pair_sum_mbps)


# --------------------------------------------------------------------------- gang planning


@dataclass
class _Problem:
    """One planning call, aligned on the network index's node positions."""

    spec: GangSpec
    index: NetworkIndex
    views: list[NodeView | None]
    free: np.ndarray  # free GPU count per position (0 where no view)
    sizes: list[int]  # GPUs per member, spec order
    memo: ChoiceMemo
    homogeneous: bool = field(init=False)

    def __post_init__(self) -> None:
        self.homogeneous = len(set(self.sizes)) == 1

    @property
    def total(self) -> int:
        return sum(self.sizes)

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


@dataclass(frozen=True)
class _Candidate:
    """A feasible placement inside one domain, with its objective values."""

    domain: int
    nodes_used: int
    worst: Quality
    spans: tuple[int, ...]  # (3b): domains touched per lower level, largest level first
    domain_free: int
    assignment: tuple[tuple[int, int, Choice | None], ...]  # (member index, node position, choice)

    def rank(self) -> tuple:
        """Sort key: smaller is better — (2) fewest nodes, (3) best worst, (3b) fewest
        sub-domains, (4) fullest, (5) name."""
        return (self.nodes_used, _Desc(self.worst), self.spans, self.domain_free, self.domain)


@dataclass(frozen=True)
class _Desc:
    """Reverses the order of a tuple inside a sort key."""

    value: Quality

    def __lt__(self, other: _Desc) -> bool:  # type: ignore[override]
        return self.value > other.value


@dataclass(frozen=True)
class _Miss:
    """Why a level had no domain for the gang: its roomiest domain, for the reason text."""

    level: str
    domain: str
    free: int
    slots: int
    feasible_aggregate: bool


def plan_gang(
    spec: GangSpec,
    nodes: Sequence[NodeView],
    levels: Sequence[str],
    *,
    index: NetworkIndex | None = None,
    memo: ChoiceMemo | None = None,
    prune: bool = True,
) -> GangPlan | NoPlan:
    """Plan every member at once under the gang objective of design.md §5.

    `index` (built from the same node names and labels, e.g. once per snapshot) saves
    rebuilding the domain grouping; nodes it lists but `nodes` lacks count as full.
    `prune=False` skips the aggregate capacity check and evaluates every domain in full —
    the same answer, slowly; it exists for the benchmark baseline and as a test oracle.
    Anything wrong with the gang itself is a NoPlan with its reason; a malformed node list
    or level list (the caller's own data) raises ValueError."""
    levels = validate_levels(levels)
    problem = _spec_problem(spec)
    if problem:
        return NoPlan(spec.key, problem)
    tried = _levels_to_try(spec, levels)
    if isinstance(tried, str):
        return NoPlan(spec.key, tried)
    if index is None:
        index = NetworkIndex.build(((v.name, v.labels) for v in nodes), levels)
    elif index.levels != levels:
        raise ValueError(f"network index was built for levels {list(index.levels)}, not {list(levels)}")
    views: list[NodeView | None] = [None] * len(index.nodes)
    counts = [0] * len(index.nodes)
    largest = 0
    for v in nodes:
        pos = index.position.get(v.name)
        if pos is None:
            raise ValueError(f"node {v.name!r} is not in the network index")
        views[pos] = v
        counts[pos] = len(v.free)
        largest = max(largest, v.gpu_count)
    free = np.array(counts, dtype=np.int64)
    sizes = [m.gpus for m in spec.members]
    if max(sizes) > largest:
        big = max(spec.members, key=lambda m: m.gpus)
        return NoPlan(spec.key, f"pod {big.pod} asks for {big.gpus} GPUs; the largest node has {largest}")
    pb = _Problem(spec, index, views, free, sizes, memo if memo is not None else ChoiceMemo())
    miss: _Miss | None = None
    for level in tried:
        found = _plan_level(pb, level, prune)
        if isinstance(found, GangPlan):
            return found
        miss = found
    assert miss is not None
    return NoPlan(spec.key, _reason(pb, miss))


def _spec_problem(spec: GangSpec) -> str:
    if not spec.members:
        return f"gang {spec.key} has no pending members to place"
    seen: set[str] = set()
    for m in spec.members:
        if not isinstance(m.gpus, int) or isinstance(m.gpus, bool) or m.gpus < 1:
            return f"pod {m.pod} asks for {m.gpus!r} GPUs; gang members must ask for at least 1"
        if m.pod in seen:
            return f"pod {m.pod} is listed twice in gang {spec.key}"
        seen.add(m.pod)
    return ""


def _levels_to_try(spec: GangSpec, levels: tuple[str, ...]) -> list[str] | str:
    """Required: that level only. Preferred (default: the smallest): that level, each larger
    one, and at last the whole cluster."""
    for what, level in (("required", spec.required_level), ("preferred", spec.preferred_level)):
        if level is not None and level not in levels:
            return f"{what} topology {level!r} is not one of the network levels: {', '.join(levels)}"
    if spec.required_level is not None:
        return [spec.required_level]
    start = levels.index(spec.preferred_level) if spec.preferred_level is not None else 0
    return [*levels[start:], CLUSTER]


def _plan_level(pb: _Problem, level: str, prune: bool) -> GangPlan | _Miss:
    lx = pb.index.level(level)
    dfree = pb.index.free_per_domain(level, pb.free)
    slots = pb.index.free_per_domain(level, pb.free // max(pb.sizes))
    ok = dfree >= pb.total  # necessary: GPUs, and slots of every size
    for s in sorted(set(pb.sizes)):
        need = sum(1 for g in pb.sizes if g >= s)
        ok &= pb.index.free_per_domain(level, pb.free // s) >= need
    if prune:
        domains = np.flatnonzero(ok)
        if pb.homogeneous:
            bound = _min_nodes(lx.domain_id, lx.count, pb.free // pb.sizes[0], len(pb.sizes))
        else:
            bound = _min_nodes(lx.domain_id, lx.count, pb.free, pb.total)
        domains = domains[np.argsort(bound[domains], kind="stable")]
    else:
        domains = np.arange(lx.count)
        bound = np.zeros(lx.count, dtype=np.int64)
    best_k = _NO_K
    tied: list[tuple[int, int, list[tuple[int, list[int]]]]] = []  # (domain, k, packing)
    for d in domains.tolist():
        if bound[d] > best_k:
            break
        if prune and pb.homogeneous:
            k, packing = int(bound[d]), []  # exact already; _evaluate_equal picks the nodes
        else:
            found = _pack(pb, lx.members[d])
            if found is None:
                continue
            k, packing = len(found), found
        if k < best_k:
            best_k, tied = k, []
        if k == best_k:
            tied.append((d, k, packing))
    if not tied:
        top = int(np.lexsort((np.arange(lx.count), -dfree, -slots, ~ok))[0])
        return _Miss(level, lx.names[top], int(dfree[top]), int(slots[top]), bool(ok[top]))
    lower = _lower_levels(pb.index, level)
    cands = [_evaluate(pb, d, k, packing, lx.members[d], int(dfree[d]), lower) for d, k, packing in tied]
    best = min(cands, key=_Candidate.rank)
    placements = [Placement("", "", ())] * len(pb.sizes)
    for i, pos, choice in best.assignment:
        view = pb.views[pos]
        assert view is not None
        gpus = choice.indices if choice is not None else ()
        placements[i] = Placement(pb.spec.members[i].pod, view.name, gpus, choice)
    return GangPlan(
        gang=pb.spec.key,
        level=level,
        domain=lx.names[best.domain],
        placements=tuple(placements),
        nodes_used=best.nodes_used,
        worst=best.worst,
        domain_free=best.domain_free,
        spans=best.spans,
    )


def _min_nodes(domain_id: np.ndarray, count: int, amount: np.ndarray, need: int) -> np.ndarray:
    """Per domain, the fewest nodes whose `amount`s sum to `need` (largest first); _NO_K if none.

    One lexsort over all nodes instead of a Python loop per domain."""
    order = np.lexsort((-amount, domain_id))
    sid, samt = domain_id[order], amount[order]
    cs = np.cumsum(samt)
    starts = np.searchsorted(sid, np.arange(count))
    before = np.concatenate(([0], cs))[starts]
    within = cs - before[sid]
    rank = np.arange(len(sid)) - starts[sid] + 1
    hit = np.flatnonzero(within >= need)
    out = np.full(count, _NO_K, dtype=np.int64)
    first_dom, first = np.unique(sid[hit], return_index=True)
    out[first_dom] = rank[hit][first]
    return out


def _pack(pb: _Problem, positions: np.ndarray) -> list[tuple[int, list[int]]] | None:
    """Fewest nodes of the domain that take every member: (position, member indices) pairs,
    each node's members in the order they choose their GPUs (biggest first, then spec order).

    Nodes with the most room fill first, ties in name order. Equal sizes: exact. Mixed sizes:
    exact up to 64 members and 20,000 search steps per domain, else first-fit decreasing (a
    heuristic that can use a node more than needed, or miss a packing of a nearly full domain)."""
    room = sorted(
        ((int(pb.free[p]), int(p)) for p in positions.tolist() if pb.free[p] > 0), key=lambda t: (-t[0], t[1])
    )
    order = sorted(range(len(pb.sizes)), key=lambda i: (-pb.sizes[i], i))
    if pb.homogeneous:
        g, done = pb.sizes[0], 0
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
            return _pack_mixed_exact(pb, room, order)
        except _BudgetSpent:
            pass
    return _pack_first_fit(pb, room, order)


class _BudgetSpent(Exception):
    """The exact mixed-size search ran out of steps; first-fit decreasing answers instead."""


#: Mixed-size gangs up to this many members get an exact (budgeted) packing search.
_EXACT_MIXED_MEMBERS = 64
#: Search steps per domain before falling back to first-fit decreasing.
_EXACT_MIXED_STEPS = 20_000


def _pack_mixed_exact(
    pb: _Problem, room: list[tuple[int, int]], order: list[int]
) -> list[tuple[int, list[int]]] | None:
    """Fewest nodes for mixed sizes, exactly, or _BudgetSpent when the step budget runs out.

    If k nodes can hold the gang, the k roomiest can (give each used node's load to a roomier
    one), so for k = the lower bound upwards this only asks "do the members fit in the top k?":
    a depth-first search, biggest member first, that never tries two nodes with the same room
    left for the same member."""
    total = sum(pb.sizes)
    smallest = min(pb.sizes)
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
        if _fit(pb.sizes, order, 0, left, bins, steps):
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
    pb: _Problem, room: list[tuple[int, int]], order: list[int]
) -> list[tuple[int, list[int]]] | None:
    """First-fit decreasing onto the roomiest nodes: fast, possibly a node more than needed."""
    opened: list[tuple[int, list[int], list[int]]] = []  # (position, [free left], members)
    nxt = 0
    for i in order:
        g = pb.sizes[i]
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


def _evaluate(
    pb: _Problem,
    d: int,
    k: int,
    packing: list[tuple[int, list[int]]],
    positions: np.ndarray,
    dfree: int,
    lower: Sequence[LevelIndex],
) -> _Candidate:
    if pb.homogeneous:
        return _evaluate_equal(pb, d, k, positions, dfree, lower)
    # Mixed sizes: keep the first-fit-decreasing packing; biggest members choose first.
    assignment: list[tuple[int, int, Choice | None]] = []
    for pos, members in packing:
        for i, choice in zip(members, pb.choices(pos, [pb.sizes[i] for i in members]), strict=True):
            assignment.append((i, pos, choice))
    worst = min(member_quality(c) for _, _, c in assignment)
    spans = _spans(lower, [pos for pos, _ in packing])
    return _Candidate(d, len(packing), worst, spans, dfree, tuple(assignment))


def _evaluate_equal(
    pb: _Problem, d: int, k: int, positions: np.ndarray, dfree: int, lower: Sequence[LevelIndex]
) -> _Candidate:
    """The k nodes of the domain that maximise the worst member's set (equal sizes).

    Each node's members choose one after the other, so its i-th member's set is known and
    `floor[i]` (the worst of the first i+1) only falls. For a threshold T a node offers the
    members whose floor reaches T; the best plan is the largest T at which the k roomiest
    nodes still take everyone. Any k nodes whose offers at T add up to n keep (1)-(3), so
    `_select_nodes` picks them for (3b); with no level to keep together, the order is most
    members offered, fewer free GPUs (best fit), then name.
    Nodes with the same allocator and free set are worked out once."""
    g, n = pb.sizes[0], len(pb.sizes)
    # kind (allocator, free set) -> (floor, choices, positions in name order)
    kinds: dict[_Kind, tuple[list[Quality], list[Choice | None], list[int]]] = {}
    for p in positions.tolist():
        if pb.free[p] < g:
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

    def offer(floor: list[Quality], t: Quality) -> int:
        count = 0  # floor only falls: count its prefix >= t
        for q in floor:
            if q < t:
                break
            count += 1
        return count

    def fits(t: Quality) -> bool:
        nodes_left, members = k, 0
        for cnt, many in sorted(((offer(f, t), len(ps)) for f, _, ps in kinds.values()), reverse=True):
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
    t = thresholds[lo]
    # Every node that offers a member at t: its position, members offered, free GPUs and kind.
    table = [(ps, offer(floor, t), len(free), choices) for (_, free), (floor, choices, ps) in kinds.items()]
    table = [row for row in table if row[1] > 0]
    if lower:
        lens = [len(ps) for ps, _, _, _ in table]
        pos = np.fromiter(itertools.chain.from_iterable(ps for ps, _, _, _ in table), np.int64, sum(lens))
        weight = np.repeat(np.array([cnt for _, cnt, _, _ in table], dtype=np.int64), lens)
        nfree = np.repeat(np.array([f for _, _, f, _ in table], dtype=np.int64), lens)
        kind = np.repeat(np.arange(len(table), dtype=np.int64), lens)
        chosen = _select_nodes(pos, weight, nfree, kind, k, n, lower)
    else:  # nothing to keep together: the k first by the node order (small domains: plain Python)
        top = heapq.nsmallest(k, ((-cnt, f, p, row) for row, (ps, cnt, f, _) in enumerate(table) for p in ps))
        chosen = [(p, row) for _, _, p, row in top]
    assignment: list[tuple[int, int, Choice | None]] = []
    for p, row in chosen:
        _, cnt, _, choices = table[row]
        for c in choices[: min(cnt, n - len(assignment))]:
            assignment.append((len(assignment), p, c))
    assert len(assignment) == n, "k nodes were proven to hold every member"
    worst = min(member_quality(c) for _, _, c in assignment)
    spans = _spans(lower, [p for p, _ in chosen])
    return _Candidate(d, k, worst, spans, dfree, tuple(assignment))


# --------------------------------------------------------------------------- fewest sub-domains


def _lower_levels(index: NetworkIndex, level: str) -> list[LevelIndex]:
    """The network levels strictly inside `level`'s domains, largest first, that group nodes:
    not the hostname level, nor one nobody labels (their domains are the nodes themselves,
    whose count is objective (2))."""
    levels = index.levels if level == CLUSTER else index.levels[: index.levels.index(level)]
    lower = (index.level(lv) for lv in reversed(levels) if lv != HOSTNAME)
    return [lx for lx in lower if lx.count < len(index.nodes)]


def _spans(lower: Sequence[LevelIndex], positions: Sequence[int]) -> tuple[int, ...]:
    """Tie-break (3b): how many domains of each lower level (largest first) the nodes touch."""
    at = np.asarray(positions, dtype=np.int64)
    return tuple(len(np.unique(lx.domain_id[at])) for lx in lower)


def _select_nodes(
    pos: np.ndarray,
    weight: np.ndarray,
    free: np.ndarray,
    kind: np.ndarray,
    k: int,
    n: int,
    lower: Sequence[LevelIndex],
) -> list[tuple[int, int]]:
    """k nodes whose offered members (`weight`) sum to at least n, spanning few sub-domains:
    (position, kind) pairs, ordered by (most members offered, fewest free GPUs, name).

    Level by level, largest first, the candidates shrink to the sub-domains `_fewest_groups`
    keeps (a level whose domains are single candidates, or one domain, has nothing to keep
    together and is skipped); then the top k of what is left are taken by the node order,
    which is also the order members are assigned in. Every node with weight > 0 reaches the
    plan's threshold, so (3) holds whichever k are taken; feasibility is kept at every step."""
    for lx in lower:
        uniq, group = np.unique(lx.domain_id[pos], return_inverse=True)
        if len(uniq) in (1, len(pos)):
            continue
        group = group.reshape(-1)
        keep = np.isin(group, _fewest_groups(group, len(uniq), weight, free, k, n))
        pos, weight, free, kind = pos[keep], weight[keep], free[keep], kind[keep]
    top = np.lexsort((pos, free, -weight))[:k]
    return list(zip(pos[top].tolist(), kind[top].tolist(), strict=True))


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


def _describe(sizes: Sequence[int]) -> str:
    counts: dict[int, int] = {}
    for g in sizes:
        counts[g] = counts.get(g, 0) + 1
    parts = [
        f"{n} pod{'s' if n > 1 else ''} x {g} GPU{'s' if g > 1 else ''}"
        for g, n in sorted(counts.items(), reverse=True)
    ]
    total = sum(sizes)
    return " + ".join(parts) + (f" = {total} GPUs" if len(parts) > 1 or counts[sizes[0]] > 1 else "")


def _reason(pb: _Problem, miss: _Miss) -> str:
    """Why the last level tried failed: the whole cluster, or the required level."""
    what = _describe(pb.sizes)
    n, g = len(pb.sizes), max(pb.sizes)
    room = (
        f"room for {miss.slots} of the {n} pods"
        if pb.homogeneous
        else f"room for {miss.slots} pods of {g} GPUs"
    )
    tail = " (the free GPUs are too fragmented to pack the pods)" if miss.feasible_aggregate else ""
    if miss.level == CLUSTER:
        return (
            f"the whole cluster cannot hold gang {pb.spec.key} ({what}): {miss.free} free GPUs, {room}{tail}"
        )
    return (
        f"no {short_name(miss.level)} domain can hold gang {pb.spec.key} ({what}); "
        f"best {miss.level}={miss.domain} has {miss.free} free GPUs, {room}{tail}"
    )


# --------------------------------------------------------------------------- single pods


def _single_key(free: frozenset[int], choice: Choice, gpus: int) -> tuple:
    """Order of nodes for one pod, larger first: ring of its set, then best fit (fewest GPUs
    left free: the emptier nodes stay whole for big jobs), then the node objective's least
    disruption (same leftover count, so the tuples compare like for like), then pair sum."""
    return (choice.ring_mbps, -(len(free) - gpus), choice.disruption, choice.pair_sum_mbps)


def node_scores(gpus: int, nodes: Sequence[NodeView], *, memo: ChoiceMemo | None = None) -> dict[str, int]:
    """Prioritize for a single pod: each node scored 0..10 by the best GPU set it can give
    (node objective), then by least disruption of what stays free. Nodes that cannot fit get 0.

    Scores are ranks, scaled over the nodes given: the best distinct key gets 10, the worst
    fitting one 1, the rest evenly between; unknown-topology nodes that fit get 5 (neutral)."""
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
        raise ValueError(f"a pod must ask for at least 1 GPU to be scored, got {gpus!r}")
    memo = memo if memo is not None else ChoiceMemo()
    scores: dict[str, int] = {}
    # Nodes of one server type with the same free GPUs share a key: work per kind, not per node.
    kinds: dict[tuple[GpuPolicy, frozenset[int]], list[str]] = {}
    for v in nodes:
        if len(v.free) < gpus:
            scores[v.name] = 0
        elif v.allocator is None:
            scores[v.name] = NEUTRAL_SCORE
        else:
            kinds.setdefault((v.allocator, v.free), []).append(v.name)
    keyed = {(a, free): _single_key(free, memo.choose(a, free, gpus), gpus) for a, free in kinds}
    distinct = sorted(set(keyed.values()), reverse=True)
    span = len(distinct) - 1
    rank = {key: r for r, key in enumerate(distinct)}
    for kind, names in kinds.items():
        r = rank[keyed[kind]]
        score = MAX_SCORE if span == 0 else 1 + round((MAX_SCORE - 1) * (span - r) / span)
        for name in names:
            scores[name] = score
    return scores


def place_pod(
    pod: str, gpus: int, nodes: Iterable[NodeView], *, memo: ChoiceMemo | None = None
) -> Placement | None:
    """The single best node and GPU set for one pod, or None when no node has room.

    Nodes of known topology come first, ordered as in `node_scores` but without its rounding;
    then unknown-topology nodes by best fit. Ties: name order."""
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
        raise ValueError(f"a pod must ask for at least 1 GPU to be placed, got {gpus!r}")
    memo = memo if memo is not None else ChoiceMemo()
    best: tuple | None = None
    best_place: Placement | None = None
    for v in nodes:
        if len(v.free) < gpus:
            continue
        if v.allocator is None:
            key: tuple = (0, -len(v.free))
            place = Placement(pod, v.name, ())
        else:
            choice = memo.choose(v.allocator, v.free, gpus)
            key = (1, _single_key(v.free, choice, gpus))
            place = Placement(pod, v.name, choice.indices, choice)
        if best is None or key > best or (key == best and v.name < best_place.node):  # type: ignore[union-attr]
            best, best_place = key, place
    return best_place
