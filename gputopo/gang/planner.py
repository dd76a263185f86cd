"""Gang placement (design.md §5): all members of a PodGroup in one network domain.

Across levels, with the cluster objective and no required level, the plan is the one the
measured job-time model predicts best (`gputopo.gang.predict`: good enough within the band,
then least cost, then the smaller level), among the best plans of the smallest level that has
one and of each larger level that could beat it; without an objective, or `level_first`, the
smallest level's. Inside one level, compared in order:
  (1) the level (the walk up the levels above);
  (2) fewest nodes;
  (3) the best worst-member GPU set, as the node allocator chooses it;
  (3b) fewest sub-domains: among plans equal on (1)-(3), the one whose nodes touch the fewest
       domains of each grouping level inside the chosen one, largest level first (a plan at
       the cluster level: fewest spines, then fewest leaves inside those, ...);
  (4) with a cluster objective, the least cost to future demand (`gang.cost`); then best fit:
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

This module owns the plan and its objective; one domain worked out (and the bounds that skip
domains that cannot win) is `gputopo.gang.domain`, a level where no node takes two members
(whole-node members) in one pass is `gputopo.gang.singleoffer`, fewest nodes (2) is `gputopo.gang.packing`, fewest
sub-domains (3b) is `gputopo.gang.spread`, and a pod outside any gang is `gputopo.pod.placement`'s.
Pure: no I/O, no clock, no globals. A `PlanMemo` (`gputopo.gang.memo`) owned by the caller may be
shared across calls on the same allocators (it keeps the allocator answers, and answers that are
a function of the node views with those views, e.g. `_layout`'s); everything else lives for one
call.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from itertools import compress
from typing import cast

import numpy as np

from gputopo.gang import singleoffer
from gputopo.gang.candidate import Candidate
from gputopo.gang.cost import plan_cost
from gputopo.gang.domain import Problem, Since, contenders, evaluate, evaluate_promising, level_bounds
from gputopo.gang.memo import Layout, PlanMemo
from gputopo.gang.packing import NO_K, SMALL_NODES, min_nodes, pack
from gputopo.gang.predict import bounds_busbw, choose, cost_of, predict_kept
from gputopo.gang.reasons import Miss, no_plan_reason
from gputopo.gang.spec import GangPlan, GangSpec, Member, NoPlan, SubGroup
from gputopo.gang.spread import lower_levels
from gputopo.gang.tree import plan_tree
from gputopo.network.levels import CLUSTER, LevelIndex, NetworkIndex, validate_levels
from gputopo.network.nodeview import NodeView, Placement
from gputopo.pod.objective import ClusterObjective

#: The data (gputopo.gang.spec) is re-exported: callers plan and read plans through this module.
__all__ = ["GangPlan", "GangSpec", "Member", "NoPlan", "SubGroup", "plan_gang"]

# --------------------------------------------------------------------------- gang planning


def plan_gang(
    spec: GangSpec,
    nodes: Sequence[NodeView],
    levels: Sequence[str],
    *,
    index: NetworkIndex | None = None,
    memo: PlanMemo | None = None,
    prune: bool = True,
    objective: ClusterObjective | None = None,
    level_first: bool = False,
) -> GangPlan | NoPlan:
    """Plan every member at once under the gang objective of design.md §5.

    `index` (built from the same node names and labels, e.g. once per snapshot) saves
    rebuilding the domain grouping; nodes it lists but `nodes` lacks count as full.
    `objective` orders the domains (1)-(3b) leave equal by what they cost future demand (4),
    `gang.cost.plan_cost`, before best fit; without one, (4) is best fit alone.
    With `objective`, a gang without a required level gets the plan of the level whose
    predicted job time and cost are best (`gang.predict`), not the smallest level's;
    `level_first=True` keeps the smallest level's plan (the rule before the prediction: the
    benchmark's baseline and the simulator's ablation).
    `prune=False` skips the aggregate capacity check and evaluates every domain in full —
    the same answer, slowly; it exists for the benchmark baseline and as a test oracle.
    Anything wrong with the gang itself is a NoPlan with its reason; a malformed node list
    or level list (the caller's own data) raises ValueError."""
    if index is None or type(levels) is not tuple or levels != index.levels:
        levels = validate_levels(levels)  # an index's own levels were validated when it was built
    problem = _spec_problem(spec)
    if problem:
        return NoPlan(spec.key, problem)
    if spec.groups:  # a tree (sub-groups with their own levels): gputopo.gang.tree
        return plan_tree(spec, nodes, levels, plan_gang, index=index, memo=memo, objective=objective)
    tried = _levels_to_try(spec, levels)
    if isinstance(tried, str):
        return NoPlan(spec.key, tried)
    if index is None:
        index = NetworkIndex.build(((v.name, v.labels) for v in nodes), levels)
    elif index.levels != levels:
        raise ValueError(f"network index was built for levels {list(index.levels)}, not {list(levels)}")
    memo = memo if memo is not None else PlanMemo()
    sizes = [m.gpus for m in spec.members]
    views, counts, largest, since = _layout(nodes, index, memo, objective, max(sizes))
    if max(sizes) > largest:
        big = max(spec.members, key=lambda m: m.gpus)
        return NoPlan(spec.key, f"pod {big.pod} asks for {big.gpus} GPUs; the largest node has {largest}")
    pb = Problem(index, views, None, counts, sizes, memo, max(counts), objective)  # `free`: when read
    pb.since = since
    miss: Miss | None = None
    for k, level in enumerate(tried):
        # Only the last level's miss reaches the reason: the others skip working it out.
        found = _plan_level(spec, pb, level, prune, explain=k == len(tried) - 1)
        if isinstance(found, GangPlan):
            if objective is None or level_first or spec.required_level is not None:
                return found
            return _by_job_time(spec, pb, tried[k:], found, prune, objective)
        miss = found
    assert miss is not None
    return NoPlan(spec.key, no_plan_reason(spec.key, pb.sizes, miss))


def _layout(
    nodes: Sequence[NodeView],
    index: NetworkIndex,
    memo: PlanMemo,
    objective: ClusterObjective | None,
    need: int,
) -> tuple[list[NodeView | None], list[int], int, Since]:
    """Per index position its view (None where `nodes` lacks one) and free GPUs, the largest
    node's GPU count, and what changed since the last call (`Problem.since`, None: unknown);
    with `objective`, when that node holds the largest member (`need`, else the plan is a
    NoPlan), every node's allocator learned before any cost (efficiencies are against the
    best of every node).

    A function of the views (frozen), so the last answer is kept in the memo (for this index)
    with the nodes it was made from: plans asked one after another get the same views on all
    nodes but the few that changed, and only those are read again, when they keep their
    names (and the names are distinct: a name given twice takes the last view, as a full pass
    does). The objective learned them already when it is the same one: learning only adds."""
    memo.own(index)
    last = memo.layout
    changed = _changed_nodes(nodes, last)
    since: Since = None
    if last is not None and changed is not None:
        lay, moved = _relaid(last, nodes, changed, index)
        since = (last.views, moved)
    else:
        lay = _laid(nodes, index)
    if objective is not None and lay.largest >= need:
        _learn_new(objective, nodes, last, changed)
        lay.learner = objective
    if since is not None or len({v.name for v in nodes}) == len(nodes):  # see above: distinct names
        memo.held += len(nodes) if last is None else 0  # a new entry (an entry found is replaced)
        memo.layout = lay
    return lay.views, lay.counts, lay.largest, since


def _changed_nodes(nodes: Sequence[NodeView], last: Layout | None) -> list[int] | None:
    """The positions in `nodes` whose view is another object than in `last`'s nodes list, when
    the lists align and every such position keeps its node's name; else None."""
    if last is None or len(last.nodes) != len(nodes):
        return None
    changed = list(compress(range(len(nodes)), map(operator.is_not, nodes, last.nodes)))
    if [nodes[i].name for i in changed] != [last.nodes[i].name for i in changed]:
        return None
    return changed


def _relaid(
    last: Layout, nodes: Sequence[NodeView], changed: list[int], index: NetworkIndex
) -> tuple[Layout, list[int]]:
    """`last` with the `changed` nodes read again (its lists copied), and their index positions."""
    views, counts, gpus = last.views.copy(), last.counts.copy(), last.gpus.copy()
    position = index.position
    moved: list[int] = []
    regrown = False  # a node's GPU count changed: the largest is found again
    for i in changed:
        v = nodes[i]
        pos = position[v.name]
        moved.append(pos)
        views[pos] = v
        counts[pos] = len(v.free)
        if gpus[i] != v.gpu_count:
            gpus[i], regrown = v.gpu_count, True
    largest = max(gpus, default=0) if regrown else last.largest
    return Layout(tuple(nodes), views, counts, gpus, largest), moved


def _laid(nodes: Sequence[NodeView], index: NetworkIndex) -> Layout:
    """The layout of `nodes` read in full; ValueError for a node the index lacks."""
    views: list[NodeView | None] = [None] * len(index.nodes)
    counts = [0] * len(index.nodes)
    position = index.position
    try:
        for v in nodes:
            pos = position[v.name]
            views[pos] = v
            counts[pos] = len(v.free)
    except KeyError as e:
        raise ValueError(f"node {e.args[0]!r} is not in the network index") from None
    gpus = [v.gpu_count for v in nodes]
    return Layout(tuple(nodes), views, counts, gpus, max(gpus, default=0))


def _learn_new(
    objective: ClusterObjective, nodes: Sequence[NodeView], last: Layout | None, changed: list[int] | None
) -> None:
    """`_learn` of the nodes' allocators; only of the `changed` nodes' new ones when `last` (the
    layout they were compared with) was learned by this objective: the kept nodes' are learned."""
    if last is None or changed is None or last.learner is not objective:
        _learn(objective, nodes)
        return
    fresh = [nodes[i] for i in changed if nodes[i].allocator is not last.nodes[i].allocator]
    if fresh:
        _learn(objective, fresh)


def _learn(objective: ClusterObjective, nodes: Sequence[NodeView]) -> None:
    """`objective.learn` of the nodes' allocators (a few distinct ones, from one pool)."""
    policies = {v.allocator for v in nodes}
    policies.discard(None)
    objective.learn({p.exact for p in policies if p is not None})


def _by_job_time(
    spec: GangSpec,
    pb: Problem,
    levels: Sequence[str],
    first: GangPlan,
    prune: bool,
    objective: ClusterObjective,
) -> GangPlan:
    """`first` (the plan of `levels[0]`, the smallest level with one) or a larger level's plan,
    by the gang's predicted job time and cost (`gang.predict`). A larger level is planned only
    when its bound (at its own oversubscription) could beat the best bandwidth found so far."""
    objective = objective.declared(spec.profile)
    table = objective.oversubscription
    plans = [first]
    where = _where(first)
    kept = pb.memo.busbw
    preds = [predict_kept(kept, where, objective, pb.views, pb.index, first.level, first.placements, table)]
    best = preds[0].busbw_gbps
    seen = {where}
    bounds = bounds_busbw(objective, pb.sizes, pb.total, levels[1:], table)
    for level, bound in zip(levels[1:], bounds, strict=True):
        if best >= bound:
            continue  # no plan of this level can be faster (an operator's table may be lower above)
        found = _plan_level(spec, pb, level, prune, explain=False)
        if not isinstance(found, GangPlan):
            continue
        where = _where(found)
        if where in seen:
            continue  # the same nodes and sets: the same prediction, the smaller level kept
        seen.add(where)
        plans.append(found)
        preds.append(predict_kept(kept, where, objective, pb.views, pb.index, level, found.placements, table))
        best = max(best, preds[-1].busbw_gbps)
    pick, why = choose(
        objective.comm,
        objective.band,
        pb.total,
        preds,
        lambda i: cost_of(objective, pb.views, pb.index, plans[i].placements),
        spec.preferred_level,
    )
    # `replace(plans[pick], why=why)` without its per-field introspection: every field as it is
    return GangPlan(**{**vars(plans[pick]), "why": why})


def _where(plan: GangPlan) -> frozenset[tuple[str, tuple[int, ...]]]:
    """The nodes and GPU sets of a plan, whoever gets which."""
    return frozenset((p.node, p.gpus) for p in plan.placements)


def _spec_problem(spec: GangSpec) -> str:
    """Why the gang itself cannot be planned ("" when it can)."""
    members = spec.members
    for m in members:  # the common case first: every size a plain int >= 1, every pod once
        if type(m.gpus) is not int or m.gpus < 1:  # a bool or an int subclass too: the full check
            break
    else:
        if members and len({m.pod for m in members}) == len(members):
            return ""
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


def _plan_level(
    spec: GangSpec, pb: Problem, level: str, prune: bool, explain: bool = True
) -> GangPlan | Miss | None:
    """The best plan inside one domain of `level`, else why not (None when not `explain`)."""
    lx = pb.index.level(level)
    if prune and not explain and lx.count == len(pb.views) and pb.total > pb.roomiest:
        return None  # every domain is one node, and none has room for the whole gang
    if prune and singleoffer.applies(pb):  # no node takes two members: one pass, the same plan
        singles = singleoffer.candidates(pb, lx, _lower(pb, level))
        if singles:
            return _best_plan(spec, pb, level, lx, singles)
        if not explain:
            return None
    small = None
    if prune and pb.homogeneous and len(pb.views) <= SMALL_NODES:
        small = level_bounds(pb, lx)  # packing.equal_bounds, memoised per domain
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
    lower = _lower(pb, level)
    if prune and pb.homogeneous and len(tied) > 1:
        cands = evaluate_promising(pb, level, tied, lx, dfree, lower)
    else:
        cands = [
            evaluate(pb, level, d, k, packing, lx.members[d], int(dfree[d]), lower) for d, k, packing in tied
        ]
    return _best_plan(spec, pb, level, lx, cands)


def _lower(pb: Problem, level: str) -> list[LevelIndex]:
    """`spread.lower_levels(pb.index, level)`, a function of the index and the level: made once
    per level and kept in the memo (which `_layout` reset for this index)."""
    hit = pb.memo.lower.get(level)
    if hit is not None and hit[0] is pb.index:
        return hit[1]
    lower = lower_levels(pb.index, level)
    pb.memo.lower[level] = (pb.index, lower)
    return lower


def _best_plan(spec: GangSpec, pb: Problem, level: str, lx: LevelIndex, cands: list[Candidate]) -> GangPlan:
    """The plan of the best candidate: (2)-(3b), then (4)'s cost among those still level."""
    best = cands[0] if len(cands) == 1 else min(cands, key=Candidate.rank)  # one: the single-offer path's
    if pb.objective is not None and len(cands) > 1:
        objective = pb.objective
        rivals = contenders(cands, best)
        if len(rivals) > 1:
            best = min(
                rivals,
                key=lambda c: c.rank(
                    c.cost if c.cost is not None else plan_cost(objective, pb.views, c.assignment)
                ),
            )
    placements: list[Placement | None] = [None] * len(pb.sizes)  # every member is assigned once
    views, members = pb.views, spec.members
    for i, pos, choice in best.assignment:
        view = views[pos]
        assert view is not None
        gpus = choice.indices if choice is not None else ()
        placements[i] = Placement(members[i].pod, view.name, gpus, choice)
    return GangPlan(
        gang=spec.key,
        level=level,
        domain=lx.names[best.domain],
        placements=cast("tuple[Placement, ...]", tuple(placements)),
        nodes_used=best.nodes_used,
        worst=best.worst,
        domain_free=best.domain_free,
        spans=best.spans,
    )
