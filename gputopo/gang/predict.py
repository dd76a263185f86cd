"""A gang plan's predicted job time, and the choice between the plans of different levels.

The planner finds, level by level, the best plan inside one domain of each level
(`gputopo.gang.planner`: fewest nodes, best worst member, fewest sub-domains, least cost). Which
level's plan the gang gets used to be the smallest level that had one. The measured job-time
model (gputopo.jobtime, docs/jobtime.md) says that is often wrong: two HGX servers in two
leaves of one spine run an encoder or LLM gang several times faster than two PCIe boxes with
one 100 Gb/s NIC under one leaf, since the fabric is non-blocking up to the spine. So the
levels' plans are now ranked by what the model predicts for each (docs/objective.md, "Gangs"):

  1. **good enough**: the plan's expected efficiency (the gang's step time at the best plan
     found over its step time here, expected over the workload mix, or over the gang's own
     declared profile) within `band` of the best (1.0). A user's preferred level comes first
     when its plan is good enough; otherwise it is only one candidate among the others.
  2. **least cost** among those, in GPU-seconds of ideal work per second: the plan's cost to
     future demand (`gang.cost.plan_cost`: value lost, growth of fragmentation) plus what the
     gang itself loses by running below the best plan (its GPUs x (1 - efficiency));
  3. the smaller level (it keeps the larger domains whole).

The prediction reads each member's GPU set on its server (`intra_busbw_gbps`), the GPUs of the
gang per node and the nodes' NICs (`inter_busbw_gbps`, the least-populated node sets the pace),
and the oversubscription of the smallest level holding every node: the same reading as the
simulator's `JobTimer.busbw` (tests/test_gang_predict.py holds them equal).

A tree's tensor-parallel sub-groups (`gputopo.gang.tree`) are read with `tp_efficiency` (the
`llama-70b` shape of gputopo.jobtime.parallel: compute / t plus the group's per-layer
all-reduces) at `group_busbw`, since their traffic is not hidden behind compute as a
data-parallel gradient all-reduce mostly is.

A larger level is planned only when it could beat the best plan found so far on the model's
bandwidth: its bound (`bound_busbw`) is the best set any learned server gives each member's
size (`ClusterObjective.best_busbw`) and, for a gang no server holds whole, the best model's
NICs at that level's oversubscription. A gang that fits one domain of its smallest level on the
cluster's best servers (the common case) costs one level's planning, as before.

Pure: no I/O, no clock, no globals.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gputopo.gang.cost import DIGITS, plan_cost
from gputopo.jobtime.model import (
    NIC_COUNT_LABEL,
    NIC_FABRIC_LABEL,
    NIC_GBPS_LABEL,
    Nics,
    comm_s,
    inter_busbw_gbps,
    nics_for,
    oversubscription,
)
from gputopo.jobtime.parallel import PARALLEL_PROFILES, TP_ALLREDUCES_PER_LAYER
from gputopo.network.levels import ACCELERATOR, CLUSTER, HOSTNAME, NetworkIndex, short_name
from gputopo.network.nodeview import NodeView, Placement
from gputopo.node.allocator import Choice
from gputopo.pod.objective import ClusterObjective, CommProfile


@dataclass(frozen=True)
class Prediction:
    """What the model says of one candidate plan (one per level planned)."""

    level: str  # the level the plan was searched at (CLUSTER: the whole cluster)
    busbw_gbps: float  # the gang's all-reduce bus bandwidth there (inf: nothing to reduce)


def common_level(
    index: NetworkIndex, positions: Sequence[int], lists: Mapping[str, list[int]] | None = None
) -> str | None:
    """The smallest configured level whose one domain holds every node position (HOSTNAME for
    one node; None when no level does), as the simulator's `SimCluster.common_level` reads it.
    `lists`: each level's domain ids as a plain list (`ClusterObjective.domain_lists`), faster
    to index a few positions of than the numpy arrays."""
    unique = set(positions)
    if len(unique) == 1:
        return HOSTNAME
    for level in index.levels:
        ids = lists[level] if lists is not None else index.level(level).domain_id
        first = None
        for p in unique:
            d = ids[p]
            if first is None:
                first = d
            elif d != first:
                break
        else:
            return level
    return None


def plan_busbw(
    objective: ClusterObjective,
    views: Sequence[NodeView | None],
    position: Mapping[str, int],
    placements: Sequence[Placement],
    spans: str | None,
    table: Mapping[str, float] | None = None,
) -> float:
    """The gang's all-reduce busbw (GB/s) in this placement: the slowest of every member's set
    inside its node and, on several nodes, the network between them at `spans`' oversubscription
    (inside one NVLink domain, the accelerator level, the NVLink pair figure of each node).
    A node of unknown topology counts as neutral inside (nothing known to be slow) and gets the
    fallback NICs, as an unlabelled PCIe box would."""
    return _busbw_at(objective, views, [position[p.node] for p in placements], placements, spans, table)


def _busbw_at(
    objective: ClusterObjective,
    views: Sequence[NodeView | None],
    at: Sequence[int],
    placements: Sequence[Placement],
    spans: str | None,
    table: Mapping[str, float] | None,
) -> float:
    """`plan_busbw` with each placement's node position already looked up (`at`)."""
    bw = math.inf
    per_node: dict[int, int] = {}
    set_busbw = objective.set_busbw
    for pos, p in zip(at, placements, strict=True):
        given = p.gpus
        per_node[pos] = per_node.get(pos, 0) + len(given)
        if len(given) > 1:
            view = views[pos]
            if view is not None and view.allocator is not None:
                bw = min(bw, set_busbw(view.allocator.exact, given))
    if len(per_node) < 2:
        return bw
    if spans == ACCELERATOR:
        for pos in per_node:
            view = views[pos]
            if view is not None and view.allocator is not None and view.allocator.exact.n >= 2:
                alloc = view.allocator.exact
                bw = min(bw, objective.set_busbw(alloc, alloc.choose(range(alloc.n), 2).indices))
        return bw
    members = set()  # the slowest node sets the pace: alike nodes are read once
    for pos, gpus in per_node.items():
        view = views[pos]
        assert view is not None  # a placement's node has a view
        model = view.allocator.exact.topology.name if view.allocator is not None else ""
        members.add((gpus, view.gpu_count, _nics(objective, model, view.labels)))
    return min(bw, inter_busbw_gbps(list(members), spans, table=table))


#: `nics_for` answers by (server model, the node's NIC labels): a cluster has a handful of them.
_NIC_LABELS = (NIC_COUNT_LABEL, NIC_GBPS_LABEL, NIC_FABRIC_LABEL)


def _nics(objective: ClusterObjective, model: str, labels: Mapping[str, str]) -> Nics:
    """`nics_for`, kept in the objective's memo per (model, NIC labels): a pure function of them,
    and a cluster has a handful."""
    count, gbps, fabric = _NIC_LABELS
    key = (model, labels.get(count), labels.get(gbps), labels.get(fabric))
    memo = objective.nic_memo
    hit = memo.get(key)
    if hit is None:
        if len(memo) > 4096:
            memo.clear()
        hit = memo[key] = nics_for(model, labels)
    return hit


def bound_busbw(
    objective: ClusterObjective,
    sizes: Sequence[int],
    total: int,
    level: str | None = None,
    table: Mapping[str, float] | None = None,
) -> float:
    """The most a plan of these member sizes (`total` GPUs) can reach: each member at the best
    set of its size on any server the objective learned and, for a gang no learned server
    holds whole, the network at the best server model's NICs, all of them driven, with no
    oversubscription (or an NVLink pair, the hop inside a multi-node NVLink domain). NICs are read from the models' defaults (`PRESET_NICS`), not from each
    node's labels: a cluster whose labels claim more than its models' defaults gets a bound
    that can stop the walk up the levels early (a faster larger level is then missed). With
    `level`, the network part is divided by that level's oversubscription: a plan searched at
    a level is read as spanning it (one that fits a smaller level was that level's to find)."""
    servers = objective.servers
    whole = bool(servers) and total > max(a.n for a in servers)
    key = (
        frozenset(g for g in sizes if g > 1),
        whole,
        level,
        None if table is None else tuple(sorted(table.items())),
    )
    hit = objective.bound_memo.get(key)
    if hit is not None:
        return hit
    bw = math.inf
    for g in key[0]:
        bw = min(bw, objective.best_busbw(g))
    if whole:
        nics = max(n.node_gbytes(n.count) for n in (nics_for(a.topology.name) for a in servers))
        if level is not None:
            nics /= oversubscription(None if level == CLUSTER else level, table)
        # inside one NVLink domain the hop between nodes is a node's NVLink pair figure
        bw = min(bw, max(nics, objective.best_busbw(2)))
    if len(objective.bound_memo) > 4096:
        objective.bound_memo.clear()
    objective.bound_memo[key] = bw
    return bw


def bounds_busbw(
    objective: ClusterObjective,
    sizes: Sequence[int],
    total: int,
    levels: Sequence[str],
    table: Mapping[str, float] | None = None,
) -> tuple[float, ...]:
    """`bound_busbw` of each of `levels` (the planner's walk up them), kept in the same memo as
    one answer per (member sizes, levels, table): one key per gang instead of one per level."""
    key = (
        "#levels",
        frozenset(g for g in sizes if g > 1),
        total,
        tuple(levels),
        None if table is None else tuple(sorted(table.items())),
    )
    memo = objective.bounds_memo
    hit = memo.get(key)
    if hit is None:
        hit = tuple([bound_busbw(objective, sizes, total, level, table) for level in levels])
        if len(memo) > 4096:
            memo.clear()
        memo[key] = hit
    return hit


def predict(
    objective: ClusterObjective,
    views: Sequence[NodeView | None],
    index: NetworkIndex,
    level: str,
    placements: Sequence[Placement],
    table: Mapping[str, float] | None = None,
) -> Prediction:
    """The model's reading of one candidate plan searched at `level`."""
    position = index.position
    at = [position[p.node] for p in placements]
    spans = common_level(index, at, objective.domain_lists(index))
    return Prediction(level, _busbw_at(objective, views, at, placements, spans, table))


#: `predict_kept`'s answers held per memo before it is emptied (a few hundred distinct plans
#: repeat in a long run: the same shape on the same free nodes).
BUSBW_HELD = 4096


def predict_kept(
    busbw: dict[tuple[object, ...], tuple[object, tuple[object, ...], float]],
    where: frozenset[tuple[str, tuple[int, ...]]],
    objective: ClusterObjective,
    views: Sequence[NodeView | None],
    index: NetworkIndex,
    level: str,
    placements: Sequence[Placement],
    table: Mapping[str, float] | None = None,
) -> Prediction:
    """`predict`, its bandwidth kept in `busbw` (a `PlanMemo`'s, for `index`) per (objective,
    `where`: the plan's nodes and sets, `planner._where`). The bandwidth is a function of those,
    the index (the spanned level), `table`, and each node's server, labels (NICs) and GPU count,
    never of its free GPUs: the planner's walk up the levels meets the same plans again (a gang
    shape on the same free nodes), and an answer is read back only when the table is the same
    object and every node's server, labels and GPU count are the same as when it was made."""
    position = index.position
    at = [position[p.node] for p in placements]
    nodes = tuple([_read(views[i]) for i in at])
    key = (objective, where)
    hit = busbw.get(key)
    if hit is not None and hit[0] is table and hit[1] == nodes:
        return Prediction(level, hit[2])
    spans = common_level(index, at, objective.domain_lists(index))
    bw = _busbw_at(objective, views, at, placements, spans, table)
    if len(busbw) >= BUSBW_HELD:
        busbw.clear()
    busbw[key] = (table, nodes, bw)
    return Prediction(level, bw)


def _read(view: NodeView | None) -> tuple[object, ...]:
    """What `_busbw_at` reads of a node besides its sets: its server, labels and GPU count."""
    return (None,) if view is None else (view.allocator, view.labels, view.gpu_count)


def cost_of(
    objective: ClusterObjective,
    views: Sequence[NodeView | None],
    index: NetworkIndex,
    placements: Sequence[Placement],
) -> float:
    """`plan_cost` of a candidate (GPU-seconds of ideal work per second): asked by `choose` only
    when two or more candidates are good enough, since it decides nothing otherwise."""
    position = index.position
    assignment: list[tuple[int, int, Choice | None]] = [
        (i, position[p.node], p.choice) for i, p in enumerate(placements)
    ]
    return plan_cost(objective, views, assignment)


def efficiencies(comm: CommProfile, gpus: int, preds: Sequence[Prediction]) -> list[float]:
    """Each candidate's expected efficiency against the best candidate (1.0 at the best)."""
    best = max(p.busbw_gbps for p in preds)
    return [comm.efficiency(gpus, p.busbw_gbps, best) for p in preds]


def choose(
    comm: CommProfile,
    band: float,
    gpus: int,
    preds: Sequence[Prediction],
    cost: Callable[[int], float],
    preferred: str | None = None,
) -> tuple[int, str]:
    """The index of the candidate the objective takes (module docstring), and why, in words.

    `preds` are in level order, smallest first; `cost(i)` is candidate i's `cost_of`;
    `preferred` is the user's preferred level (its candidate, when there is one, is the first)."""
    if len(preds) == 1:
        return 0, _why(preds, [1.0], 0, [0])
    effs = efficiencies(comm, gpus, preds)
    floor = 1.0 - band
    good = [i for i, e in enumerate(effs) if e >= floor]
    if preferred is not None and preds[0].level == preferred and 0 in good:
        pick = 0
        why = f"preferred level {short_name(preferred)}: its plan is within {band:.0%} of the best predicted"
    else:
        pick = (
            good[0]
            if len(good) == 1
            else min(good, key=lambda i: (round(cost(i) + gpus * (1.0 - effs[i]), DIGITS), i))
        )
        why = _why(preds, effs, pick, good)
    return pick, why


def _why(preds: Sequence[Prediction], effs: Sequence[float], pick: int, good: Sequence[int]) -> str:
    p = preds[pick]
    where = "the whole cluster" if p.level == CLUSTER else f"one {short_name(p.level)}"
    if len(preds) == 1:
        return f"planned in {where}: no larger level could predict a faster job"
    others = ", ".join(
        f"{'cluster' if q.level == CLUSTER else short_name(q.level)} {effs[i]:.0%}"
        for i, q in enumerate(preds)
        if i != pick
    )
    if pick == min(good) and len(good) > 1:
        return f"planned in {where}: predicted efficiency {effs[pick]:.0%} (others: {others}), the least cost"
    return f"planned in {where}: predicted efficiency {effs[pick]:.0%} against {others}"


#: The tensor-parallel traffic a tree's sub-group is read with (`tp_efficiency`): the preset
#: of gputopo.jobtime.parallel the NVL72 tree runs of the simulator train (`llama-70b`).
TP_PROFILE = "llama-70b"


def tp_efficiency(gpus: int, busbw_gbps: float, best_gbps: float, profile: str = TP_PROFILE) -> float:
    """Ideal step time over actual of a tensor-parallel group of `gpus` GPUs whose all-reduces
    run at `busbw_gbps` against `best_gbps` (gputopo.jobtime.parallel: compute / t plus the
    group's per-layer all-reduces, which nothing hides); 1.0 at the best, never above 1. A
    sub-group a tree requires inside one domain is read as such a group: its traffic, unlike a
    data-parallel gradient all-reduce (`CommProfile.efficiency`), is on the critical path."""
    if gpus < 2 or busbw_gbps >= best_gbps:
        return 1.0
    p = PARALLEL_PROFILES[profile]
    compute = p.compute_s / gpus

    def step(bw: float) -> float:
        return compute + TP_ALLREDUCES_PER_LAYER * p.layers * comm_s(p.tp_bytes, gpus, max(bw, 1e-3))

    return step(best_gbps) / step(busbw_gbps)


def group_busbw(
    objective: ClusterObjective,
    views: Mapping[str, NodeView],
    index: NetworkIndex,
    placements: Sequence[Placement],
    table: Mapping[str, float] | None = None,
) -> float:
    """`plan_busbw` of some placements (a tree's sub-group) read with `views` by node name (the
    free GPUs before they were placed), spanning the smallest level holding their nodes."""
    names = sorted({p.node for p in placements})
    local = {n: i for i, n in enumerate(names)}
    spans = common_level(index, [index.position[n] for n in names], objective.domain_lists(index))
    return plan_busbw(objective, [views[n] for n in names], local, placements, spans, table)
