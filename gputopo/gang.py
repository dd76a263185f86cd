"""Gang placement (design.md §5): all members of a PodGroup in the smallest network domain.

The gang objective, compared in order:
  (1) the smallest level whose one domain holds every member;
  (2) fewest nodes;
  (3) the best worst-member GPU set, as the node allocator chooses it;
  (3b) fewest sub-domains: among plans equal on (1)-(3), the one whose nodes touch the fewest
       domains of each grouping level inside the chosen one, largest level first (a plan at
       the cluster level: fewest spines, then fewest leaves inside those, ...);
  (4) with a cluster objective, the least cost to future demand (`gangcost`); then best fit:
      the domain left with the fewest free GPUs, so large empty domains stay whole;
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

This module owns the plan and its objective; fewest nodes (2) is `gputopo.packing`, fewest
sub-domains (3b) is `gputopo.spread`, and a pod outside any gang is `gputopo.placement`'s.
Pure: no I/O, no clock, no globals. A `ChoiceMemo` owned by the caller may be shared across
calls on the same allocators; everything else lives for one call.
"""

from __future__ import annotations

import heapq
import itertools
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from gputopo.allocator import Choice
from gputopo.clusterobjective import ClusterObjective
from gputopo.gangbound import worst_cap
from gputopo.gangcost import plan_cost
from gputopo.gangreason import Miss, no_plan_reason
from gputopo.network import CLUSTER, LevelIndex, NetworkIndex, validate_levels
from gputopo.nodeview import UNKNOWN_QUALITY, ChoiceMemo, NodeView, Placement, Quality, member_quality
from gputopo.packing import NO_K, SMALL_NODES, equal_bounds, min_nodes, pack
from gputopo.policy import GpuPolicy
from gputopo.spread import count_spans, lower_levels, select_nodes

# The names callers import from here (the node view, the memo and the placement are shared
# with single-pod placement, gputopo.placement, and live in gputopo.nodeview).
__all__ = [
    "UNKNOWN_QUALITY",
    "ChoiceMemo",
    "GangPlan",
    "GangSpec",
    "Member",
    "NoPlan",
    "NodeView",
    "Placement",
    "Quality",
    "member_quality",
    "plan_gang",
]

_Kind = tuple[GpuPolicy | None, frozenset[int]]


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
    roomiest: int = 0  # most free GPUs of one node
    objective: ClusterObjective | None = None
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

    def rank(self, cost: float = 0.0) -> tuple[int, _Desc, tuple[int, ...], float, int, int]:
        """Sort key: smaller is better — (2) fewest nodes, (3) best worst, (3b) fewest
        sub-domains, (4) least cost to future demand (`gangcost`), then fullest, (5) name."""
        return (self.nodes_used, _Desc(self.worst), self.spans, cost, self.domain_free, self.domain)


def _contenders(cands: list[_Candidate], lead: _Candidate) -> list[_Candidate]:
    """The candidates that can still win once (4)'s cost is known, in their order.

    `rank` is lexicographic and the cost is its fourth key, after (2), (3) and (3b); `lead`
    is a candidate with the least (2)-(3b) (the least `rank` at a cost of 0 for all). A
    candidate behind `lead` on (2)-(3b) ranks after it whatever either one costs, so it cannot
    be the least; every candidate that can is kept, in the order of `cands`, and the least of
    these by the full rank is the least of all. Pricing the others (`plan_cost`) is skipped."""
    head = (lead.nodes_used, lead.worst, lead.spans)
    return [c for c in cands if (c.nodes_used, c.worst, c.spans) == head]


@dataclass(frozen=True)
class _Desc:
    """Reverses the order of a tuple inside a sort key."""

    value: Quality

    def __lt__(self, other: _Desc) -> bool:
        return self.value > other.value


def plan_gang(
    spec: GangSpec,
    nodes: Sequence[NodeView],
    levels: Sequence[str],
    *,
    index: NetworkIndex | None = None,
    memo: ChoiceMemo | None = None,
    prune: bool = True,
    objective: ClusterObjective | None = None,
) -> GangPlan | NoPlan:
    """Plan every member at once under the gang objective of design.md §5.

    `index` (built from the same node names and labels, e.g. once per snapshot) saves
    rebuilding the domain grouping; nodes it lists but `nodes` lacks count as full.
    `objective` orders the domains (1)-(3b) leave equal by what they cost future demand (4),
    `gangcost.plan_cost`, before best fit; without one, (4) is best fit alone.
    `prune=False` skips the aggregate capacity check and evaluates every domain in full —
    the same answer, slowly; it exists for the benchmark baseline and as a test oracle.
    Anything wrong with the gang itself is a NoPlan with its reason; a malformed node list
    or level list (the caller's own data) raises ValueError."""
    if index is None or type(levels) is not tuple or levels != index.levels:
        levels = validate_levels(levels)  # an index's own levels were validated when it was built
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
    position = index.position
    try:
        at = [position[v.name] for v in nodes]
    except KeyError as e:
        raise ValueError(f"node {e.args[0]!r} is not in the network index") from None
    for pos, v in zip(at, nodes, strict=True):
        views[pos] = v
        counts[pos] = len(v.free)
    largest = max((v.gpu_count for v in nodes), default=0)
    free = np.array(counts, dtype=np.int64)
    sizes = [m.gpus for m in spec.members]
    if max(sizes) > largest:
        big = max(spec.members, key=lambda m: m.gpus)
        return NoPlan(spec.key, f"pod {big.pod} asks for {big.gpus} GPUs; the largest node has {largest}")
    if objective is not None:  # before any cost: efficiencies are against the best of every node
        objective.learn({v.allocator.exact for v in nodes if v.allocator is not None})
    memo = memo if memo is not None else ChoiceMemo()
    pb = _Problem(spec, index, views, free, sizes, memo, max(counts), objective)
    miss: Miss | None = None
    for k, level in enumerate(tried):
        # Only the last level's miss reaches the reason: the others skip working it out.
        found = _plan_level(pb, level, prune, explain=k == len(tried) - 1)
        if isinstance(found, GangPlan):
            return found
        miss = found
    assert miss is not None
    return NoPlan(spec.key, no_plan_reason(spec.key, pb.sizes, miss))


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


def _plan_level(pb: _Problem, level: str, prune: bool, explain: bool = True) -> GangPlan | Miss | None:
    """The best plan inside one domain of `level`, else why not (None when not `explain`)."""
    lx = pb.index.level(level)
    if prune and not explain and lx.count == len(pb.views) and pb.total > pb.roomiest:
        return None  # every domain is one node, and none has room for the whole gang
    small = None
    if prune and pb.homogeneous and len(pb.views) <= SMALL_NODES:
        small = equal_bounds(lx.domain_id, lx.count, pb.free, pb.sizes[0], len(pb.sizes))
    if small is not None and not small[1] and not explain:
        return None  # no domain passes the necessary check: nothing to evaluate or explain
    if small is not None and small[1]:  # the same answer as below, on lists (small clusters)
        dfree, domains, bound = small
    else:
        dfree = pb.index.free_per_domain(level, pb.free)
        ok = dfree >= pb.total  # necessary: GPUs, and slots of every size
        for s in sorted(set(pb.sizes)):
            if prune and not explain and not ok.any():
                return None  # no domain passes the necessary check: nothing to evaluate or explain
            need = sum(1 for g in pb.sizes if g >= s)
            ok &= pb.index.free_per_domain(level, pb.free // s) >= need
        if prune and not explain and not ok.any():
            return None
        if prune:
            passing = np.flatnonzero(ok)
            if pb.homogeneous:
                bound = min_nodes(lx.domain_id, lx.count, pb.free // pb.sizes[0], len(pb.sizes))
            else:
                bound = min_nodes(lx.domain_id, lx.count, pb.free, pb.total)
            domains = passing[np.argsort(bound[passing], kind="stable")].tolist()
        else:
            domains = list(range(lx.count))
            bound = np.zeros(lx.count, dtype=np.int64)
    best_k = NO_K
    tied: list[tuple[int, int, list[tuple[int, list[int]]]]] = []  # (domain, k, packing)
    for d in domains:
        if bound[d] > best_k:
            break
        if prune and pb.homogeneous:
            k, packing = int(bound[d]), []  # exact already; _evaluate_equal picks the nodes
        else:
            found = pack(pb.free, pb.sizes, lx.members[d])
            if found is None:
                continue
            k, packing = len(found), found
        if k < best_k:
            best_k, tied = k, []
        if k == best_k:
            tied.append((d, k, packing))
    if not tied:
        if not explain:
            return None
        slots = pb.index.free_per_domain(level, pb.free // max(pb.sizes))
        top = int(np.lexsort((np.arange(lx.count), -dfree, -slots, ~ok))[0])
        return Miss(level, lx.names[top], int(dfree[top]), int(slots[top]), bool(ok[top]))
    lower = lower_levels(pb.index, level)
    if prune and pb.homogeneous and len(tied) > 1:
        cands = _evaluate_promising(pb, level, tied, lx, dfree, lower)
    else:
        cands = [
            _evaluate(pb, level, d, k, packing, lx.members[d], int(dfree[d]), lower) for d, k, packing in tied
        ]
    best = min(cands, key=_Candidate.rank)
    if pb.objective is not None and len(cands) > 1:
        objective = pb.objective
        rivals = _contenders(cands, best)
        if len(rivals) > 1:
            best = min(rivals, key=lambda c: c.rank(plan_cost(objective, pb.views, c.assignment)))
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


def _evaluate_promising(
    pb: _Problem,
    level: str,
    tied: list[tuple[int, int, list[tuple[int, list[int]]]]],
    lx: LevelIndex,
    dfree: np.ndarray,
    lower: Sequence[LevelIndex],
) -> list[_Candidate]:
    """The tied domains' candidates (equal sizes, fewest nodes `k` each), in `tied`'s order,
    less those that cannot win: a domain whose `worst_cap` is below the worst member of a
    candidate already found would rank after it on (3) whatever its (3b) and (4), and every
    tied domain has the same (2). Domains are worked out highest bound first, so the first
    bound below the best worst found ends the search."""
    free = pb.free.tolist()
    g = pb.sizes[0]
    caps = [worst_cap(pb.views, free, lx.members[d].tolist(), g, k, pb.memo) for d, k, _ in tied]
    found: dict[int, _Candidate] = {}
    best: Quality | None = None
    # highest bound first; a domain without one (None) is always worked out, so it goes first
    for i in sorted(range(len(tied)), key=lambda i: (caps[i] is None, caps[i] or ()), reverse=True):
        cap = caps[i]
        if best is not None and cap is not None and cap < best:
            break
        d, k, packing = tied[i]
        found[i] = c = _evaluate(pb, level, d, k, packing, lx.members[d], int(dfree[d]), lower)
        if best is None or c.worst > best:
            best = c.worst
    return [found[i] for i in sorted(found)]


#: Node views the domain evaluations of one memo may hold before they are dropped.
_DOMAIN_VIEWS_HELD = 200_000


def _evaluate(
    pb: _Problem,
    level: str,
    d: int,
    k: int,
    packing: list[tuple[int, list[int]]],
    positions: np.ndarray,
    dfree: int,
    lower: Sequence[LevelIndex],
) -> _Candidate:
    if pb.homogeneous:
        # Equal sizes: the answer is a function of the domain's node views (their free sets
        # and allocators), the index and the shape; gangs planned one after another mostly
        # meet the same views in every domain but the few that changed.
        memo = pb.memo
        if memo.domains_for is not pb.index or memo.domains_held > _DOMAIN_VIEWS_HELD:
            memo.domains.clear()
            memo.domains_for, memo.domains_held = pb.index, 0
        held = tuple([pb.views[p] for p in positions.tolist()])
        mix = -1 if pb.objective is None else pb.objective.mix.version  # the node order's costs
        key = (level, d, pb.sizes[0], len(pb.sizes), k, mix, *map(id, held))
        hit = memo.domains.get(key)
        if hit is not None and len(hit[0]) == len(held) and all(map(operator.is_, hit[0], held)):
            assert isinstance(hit[1], _Candidate)
            return hit[1]
        got = _evaluate_equal(pb, d, k, positions, dfree, lower)
        memo.domains[key] = (held, got)
        memo.domains_held += len(held)
        return got
    # Mixed sizes: keep the first-fit-decreasing packing; biggest members choose first.
    assignment: list[tuple[int, int, Choice | None]] = []
    for pos, members in packing:
        for i, choice in zip(members, pb.choices(pos, [pb.sizes[i] for i in members]), strict=True):
            assignment.append((i, pos, choice))
    worst = min(member_quality(c) for _, _, c in assignment)
    spans = count_spans(lower, [pos for pos, _ in packing])
    return _Candidate(d, len(packing), worst, spans, dfree, tuple(assignment))


def _costs(
    pb: _Problem, kinds: list[_Kind], table: list[tuple[list[int], int, int, list[Choice | None]]]
) -> list[float]:
    """Per kind of node: what its offered members' sets cost future demand (0 without an
    objective or a topology): the node order's key after members offered."""
    objective = pb.objective
    if objective is None:
        return [0.0] * len(table)
    out = []
    for (policy, free), (_, cnt, _, choices) in zip(kinds, table, strict=True):
        taken = [i for c in choices[:cnt] if c is not None for i in c.indices]
        out.append(round(objective.take_cost(policy, free, taken), 6) if policy is not None and cnt else 0.0)
    return out


def _evaluate_equal(
    pb: _Problem, d: int, k: int, positions: np.ndarray, dfree: int, lower: Sequence[LevelIndex]
) -> _Candidate:
    """The k nodes of the domain that maximise the worst member's set (equal sizes).

    Each node's members choose one after the other, so its i-th member's set is known and
    `floor[i]` (the worst of the first i+1) only falls. For a threshold T a node offers the
    members whose floor reaches T; the best plan is the largest T at which the k roomiest
    nodes still take everyone. Any k nodes whose offers at T add up to n keep (1)-(3), so
    `select_nodes` picks them for (3b); with no level to keep together, the order is most
    members offered, least cost to future demand (with an objective), fewer free GPUs (best
    fit), then name.
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
    cost = _costs(pb, list(kinds), table)
    table, cost = [r for r in table if r[1] > 0], [c for r, c in zip(table, cost, strict=True) if r[1] > 0]
    if lower:
        lens = [len(ps) for ps, _, _, _ in table]
        pos = np.fromiter(itertools.chain.from_iterable(ps for ps, _, _, _ in table), np.int64, sum(lens))
        weight = np.repeat(np.array([cnt for _, cnt, _, _ in table], dtype=np.int64), lens)
        nfree = np.repeat(np.array([f for _, _, f, _ in table], dtype=np.int64), lens)
        kind_ids = np.repeat(np.arange(len(table), dtype=np.int64), lens)
        order = np.repeat(np.array(cost, dtype=np.float64), lens)
        chosen = select_nodes(pos, weight, nfree, kind_ids, k, n, lower, order)
    else:  # nothing to keep together: the k first by the node order (small domains: plain Python)
        top = heapq.nsmallest(
            k, ((-cnt, cost[row], f, p, row) for row, (ps, cnt, f, _) in enumerate(table) for p in ps)
        )
        chosen = [(p, row) for _, _, _, p, row in top]
    assignment: list[tuple[int, int, Choice | None]] = []
    for p, row in chosen:
        _, cnt, _, choices = table[row]
        for c in choices[: min(cnt, n - len(assignment))]:
            assignment.append((len(assignment), p, c))
    assert len(assignment) == n, "k nodes were proven to hold every member"
    worst = min(member_quality(c) for _, _, c in assignment)
    spans = count_spans(lower, [p for p, _ in chosen])
    return _Candidate(d, k, worst, spans, dfree, tuple(assignment))
