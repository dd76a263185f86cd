"""Hierarchical gangs (docs/gang.md "Gangs as trees"): a gang whose members sit in sub-groups,
each with its own level, to any depth, placed all or nothing.

A large-model run is a tree: tensor-parallel groups that must stay inside one NVLink domain,
replicas that should share a leaf, the whole job inside a spine. Kubernetes 1.37's
CompositePodGroup, KAI's `subGroups[]`, Kueue's slices and Volcano's partitions all say so
(`gputopo.gang.sources` maps each to `SubGroup`s). The planner here places the tree:

* the root (the gang) in one domain of its level: a required level, or the smallest level from
  the preferred one up (then each larger one, then the whole cluster) whose domain holds it,
  domains tried fullest first (best fit: large empty domains stay whole);
* inside it, each sub-group, largest first, in one domain of its own level *inside its parent's
  domain*: a required level is never straddled; a preferred one falls back level by level, per
  sub-group; a sub-group's domains are tried fullest first, a few of them, with the capacity
  its earlier siblings took already taken (greedy over siblings, with a bounded retry of the
  sub-group's next domain when its children do not fit);
* a sub-group without children is a flat gang planned by `plan_gang` over its parent's domain
  (fewest nodes, best worst member, the GPU set inside every node chosen jointly, and with the
  cluster objective, the level by predicted job time); members directly in a group are planned
  the same way over the group's domain, after its sub-groups;
* with the cluster objective, by predicted job time (`_rank`): a sub-group with members of its
  own and a required level is read as a tensor-parallel group (`predict.tp_efficiency`: its
  per-layer all-reduces are on the critical path, at the busbw `predict.group_busbw` reads off
  its GPU sets and the hop between its nodes). The flat plan's domain is a candidate; unless it
  is within the objective's band of the best busbw any learned server gives the group
  (`predict.bound_busbw`), the flat plan in the first domain of each other kind (the server
  models in it: an HGX server is its own NVLink domain, a GB200 rack another kind) is one too,
  and the first candidate within the band of the best is taken. So "fewest nodes" no longer
  sends a 2-tray group to an 8-GPU server whose NVLink is slower beyond the band. The root's
  candidates are gathered the same way: the first domain of each kind per level, from the
  preferred level up, until one is within the band of the groups' bounds; the first within the
  band of the best is taken (the smaller level, then fullest first, among good-enough ones).

The plan says where every sub-group went and why (`GangPlan.tree`, worded by
`gputopo.gang.explain`: its domain, how its level came about, a fall-back's cause, the flat
planner's predicted-job-time reason); a tree that does not fit names the sub-group that could
not be placed (`NoPlan.group`, and in its reason), since "does not fit" alone leaves an operator
guessing which of a dozen sub-groups is the problem.

A flat gang (no sub-groups) never comes here: `plan_gang` plans it exactly as before. Members
already bound (`GangSpec.bound`) pin each sub-group with a required level to the domain they
are in, so a re-plan never splits it. What this does not do: search jointly across siblings
(a placement that needs the second sub-group to go first is missed when the first one's
greedy choice blocks it; the bounded retries cover the common case); weigh the cost to future
demand among good-enough candidates as flat gangs' levels are (`predict.choose`), or what a
placement leaves in a domain (a remainder smaller than a typical sub-group): both were measured
on the simulator's NVL72 trees and made queueing worse (docs/simulator.md "Jobs as trees on
NVL72").

Pure: no I/O, no clock, no globals.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gputopo.gang import explain, predict
from gputopo.gang.memo import PlanMemo
from gputopo.gang.spec import GangPlan, GangSpec, Member, NoPlan, Placed, SubGroup
from gputopo.network.levels import CLUSTER, HOSTNAME, NetworkIndex, short_name, validate_levels
from gputopo.network.nodeview import UNKNOWN_QUALITY, NodeView, Placement, Quality
from gputopo.pod.objective import ClusterObjective

#: Domains tried per sub-group with children (and per root level) before it counts as not
#: fitting: a bound on the work of a tree that does not fit, not on where it can go (the
#: fullest domains that can hold it come first).
MAX_DOMAINS = 8
#: Orders in which siblings are placed, the second tried when the first does not fit: the most
#: constrained first (the smallest required level, then the largest), then the largest first.
ORDERS = ("constrained", "largest")
#: Deepest tree accepted (KAI and the Workload API nest a few levels; this guards the recursion).
MAX_DEPTH = 16


@dataclass
class _Tree:
    """One planning call: the spec's tree, indexed, and the state the placement works on."""

    spec: GangSpec
    levels: tuple[str, ...]
    index: NetworkIndex
    memo: PlanMemo
    objective: ClusterObjective | None
    flat: FlatPlanner  # `plan_gang`, handed in by `plan_tree`'s caller
    groups: dict[str, SubGroup]
    children: dict[str, list[str]]  # group ("" the root) -> child sub-groups with members
    direct: dict[str, list[int]]  # group -> indices of its own members
    total: dict[str, int]  # group -> GPUs of every member of its subtree
    bound: dict[str, set[str]]  # group -> nodes of bound members of its subtree
    order: str = "constrained"  # sibling order: see `_kids`
    free: dict[str, NodeView] = field(default_factory=dict)  # node -> its view, capacity taken
    placed: dict[str, Placed] = field(default_factory=dict)  # sub-group -> where it went, why
    stuck: str = ""  # the sub-group whose placement failed last ("": none, or the root's domains)


#: Plans a flat gang (`gputopo.gang.planner.plan_gang`, handed in by its caller so that the two
#: planners do not import each other).
FlatPlanner = Callable[..., GangPlan | NoPlan]


def plan_tree(
    spec: GangSpec,
    nodes: Sequence[NodeView],
    levels: Sequence[str],
    flat: FlatPlanner,
    *,
    index: NetworkIndex | None = None,
    memo: PlanMemo | None = None,
    objective: ClusterObjective | None = None,
) -> GangPlan | NoPlan:
    """Plan every pending member of a gang with sub-groups (module docstring), or NoPlan with
    the reason. A malformed tree (a parent that does not exist, a cycle, a member in an unknown
    sub-group, a level that is not configured) is a NoPlan naming it."""
    levels = validate_levels(levels)
    problem = _tree_problem(spec, levels)
    if problem:
        return NoPlan(spec.key, problem)
    if index is None:
        index = NetworkIndex.build(((v.name, v.labels) for v in nodes), levels)
    tree = _index(spec, levels, index, memo if memo is not None else PlanMemo(), objective, flat)
    tree.free = {v.name: v for v in nodes}
    root_levels = (
        [spec.required_level]
        if spec.required_level is not None
        else [*levels[levels.index(spec.preferred_level) if spec.preferred_level else 0 :], CLUSTER]
    )
    asked = _asked(spec.required_level, spec.preferred_level)
    total = tree.total[""]
    ranked = objective is not None and bool(_tp_groups(tree))  # rank the root's candidates
    cands: list[_Cand] = []
    stop = False  # the last candidate is `_good_enough`: no later one could be taken
    why, fell = "", ""
    for i, level in enumerate(root_levels):
        domains = _domains(
            tree, level, sorted(tree.free), total, tree.bound[""], cap=None if ranked else MAX_DOMAINS
        )
        if not domains:
            why = f"no {_short(level)} domain has the tree's {total} GPUs free"
            tree.stuck = ""
        kinds: set[frozenset[str]] = set()  # server models of the domains that gave a candidate
        tries = 0
        for domain, names in domains:
            kind = _kind(tree.free, names) if ranked else frozenset()
            if kind in kinds:
                continue  # the first domain of each kind, in the packing order, is its candidate
            if tries >= MAX_DOMAINS:
                break
            tries += 1
            for order in ORDERS:
                kept = dict(tree.free)
                tree.placed, tree.order = {}, order
                within = _within(level, domain)
                got = _place(tree, "", names, 0, within)
                if isinstance(got, dict):
                    if not ranked:
                        return _plan(tree, level, domain, got, asked, fell if i else "")
                    cand = _Cand(level, domain, got, tree.placed, tree.free, kept, fell if i else "")
                    tree.free = dict(kept)
                    kinds.add(kind)
                    if all(_where(c.got) != _where(got) for c in cands):
                        cands.append(cand)
                        stop = _good_enough(tree, cand)
                    break
                why = got
                tree.free = kept
            if stop:
                break
        if stop:
            break
        if i == 0 and spec.preferred_level is not None:
            fell = _fell_back(level, bool(domains), total)
    if cands:
        pick, effs = _rank(tree, cands, stop)
        c = cands[pick]
        tree.free, tree.placed = c.free, c.placed
        return _plan(tree, c.level, c.domain, c.got, asked, c.fell or _ranked_why(cands, effs, pick))
    return NoPlan(spec.key, f"gang {spec.key} does not fit as a tree: {why}", tree.stuck)


@dataclass
class _Cand:
    """One candidate placement of a whole tree (the root's level and domain) or of one leaf
    sub-group (its domain), with the free GPUs before and after, ranked by `_rank`."""

    level: str
    domain: str
    got: dict[int, Placement]
    placed: dict[str, Placed]  # the tree's sub-groups, as it placed them (a root candidate)
    free: dict[str, NodeView]  # the free GPUs once it is placed
    before: dict[str, NodeView]  # the free GPUs before it was placed
    fell: str = ""  # why the root is not at its preferred level
    plan: GangPlan | None = None  # a leaf sub-group's flat plan
    bws: dict[str, tuple[int, float]] | None = None  # `_group_bw`'s answer, once asked


def _where(got: Mapping[int, Placement]) -> frozenset[tuple[int, str, tuple[int, ...]]]:
    """A candidate's members, nodes and GPU sets: two alike predict alike."""
    return frozenset((i, p.node, p.gpus) for i, p in got.items())


def _tp_groups(tree: _Tree) -> list[str]:
    """The sub-groups read as tensor-parallel groups: with members of their own and a required
    level (their all-reduces must stay inside one domain of it: `predict.tp_efficiency`)."""
    return [
        g
        for g, sub in tree.groups.items()
        if tree.direct[g] and sub.required_level is not None and tree.total[g]
    ]


def _kind(free: Mapping[str, NodeView], names: Sequence[str]) -> frozenset[str]:
    """The server models of a domain's nodes: domains of one kind predict alike."""
    models = set()
    for n in names:
        a = free[n].allocator
        models.add(a.exact.topology.name if a is not None else "")
    return frozenset(models)


def _group_bw(tree: _Tree, c: _Cand) -> dict[str, tuple[int, float]]:
    """Each tensor-parallel group's (GPUs, predicted all-reduce busbw) in a candidate
    (`predict.group_busbw`: the GPU sets inside each node, the hop between its nodes)."""
    assert tree.objective is not None
    if c.bws is not None:
        return c.bws
    out = {}
    for g in _tp_groups(tree):
        got = [c.got[i] for i in tree.direct[g] if i in c.got]
        if got:
            bw = predict.group_busbw(
                tree.objective, c.before, tree.index, got, tree.objective.oversubscription
            )
            out[g] = (tree.total[g], bw)
    c.bws = out
    return out


def _bound(tree: _Tree, g: str) -> float:
    """The best busbw any learned server gives group `g`'s members (`predict.bound_busbw`)."""
    assert tree.objective is not None
    return predict.bound_busbw(
        tree.objective, [tree.spec.members[i].gpus for i in tree.direct[g]], tree.total[g]
    )


def _good_enough(tree: _Tree, c: _Cand) -> bool:
    """Every group of the candidate within the band of its `_bound`: no candidate found later
    can be taken over it (the search stops there)."""
    assert tree.objective is not None
    floor = 1.0 - tree.objective.band
    return all(
        predict.tp_efficiency(n, bw, _bound(tree, g)) >= floor for g, (n, bw) in _group_bw(tree, c).items()
    )


def _rank(tree: _Tree, cands: Sequence[_Cand], stopped: bool = False) -> tuple[int, list[float]]:
    """The candidate taken, and each one's predicted efficiency: the first (in the packing
    order: the smaller level, then the planner's own domain order) whose efficiency is within
    the objective's band of the best candidate's. A candidate's efficiency is its slowest
    tensor-parallel group's step time at the best candidate's busbw for that group over its
    step time here (`predict.tp_efficiency`). `stopped`: the search stopped at the last
    candidate (`_good_enough`), so the best is read as each group's `_bound` (a candidate not
    looked for could reach it)."""
    assert tree.objective is not None
    bws = [_group_bw(tree, c) for c in cands]
    best: dict[str, float] = {}
    for b in bws:
        for g, (_, bw) in b.items():
            best[g] = max(best.get(g, 0.0), bw, _bound(tree, g) if stopped else 0.0)
    effs = [
        min((predict.tp_efficiency(n, bw, best[g]) for g, (n, bw) in b.items()), default=1.0) for b in bws
    ]
    floor = 1.0 - tree.objective.band
    return next(i for i, e in enumerate(effs) if e >= floor), effs


def _ranked_why(cands: Sequence[_Cand], effs: Sequence[float], pick: int) -> str:
    """Why a later candidate was taken over the first ("" when the first was)."""
    if not pick:
        return ""
    others = ", ".join(
        f"{_within(o.level, o.domain)} {effs[i]:.0%}" for i, o in enumerate(cands) if i != pick
    )
    return f"predicted tensor-parallel efficiency {effs[pick]:.0%} against {others}"


def _asked(required: str | None, preferred: str | None) -> tuple[str, str | None]:
    """(how, level) a node of the tree asks for its level: required wins, as for flat gangs."""
    if required is not None:
        return "required", required
    if preferred is not None:
        return "preferred", preferred
    return "", None


def _within(level: str, domain: str) -> str:
    """A domain as a reason names it: "gpu.clique=cl.0", or "cluster"."""
    return "cluster" if level == CLUSTER else f"{_short(level)}={domain}"


def _fell_back(level: str, had_room: bool, gpus: int) -> str:
    """Why a group is not at its preferred level: the reason the `Placed` carries."""
    if not had_room:
        return f"no {_short(level)} domain had its {gpus} GPUs free"
    return f"no {_short(level)} domain with its {gpus} GPUs free could hold its sub-groups"


def _short(level: str) -> str:
    return "cluster" if level == CLUSTER else short_name(level)


def _tree_problem(spec: GangSpec, levels: tuple[str, ...]) -> str:
    """Why the tree cannot be planned ("" when it can)."""
    names = [g.name for g in spec.groups]
    if len(set(names)) != len(names) or "" in names:
        return f"gang {spec.key}: sub-group names must be distinct and not empty"
    known = set(names)
    for g in spec.groups:
        if g.parent and g.parent not in known:
            return f"gang {spec.key}: sub-group {g.name!r} names parent {g.parent!r}, which it does not have"
        for what, level in (("required", g.required_level), ("preferred", g.preferred_level)):
            if level is not None and level not in levels:
                return f"sub-group {g.name!r}: {what} topology {level!r} is not one of the network levels"
    parent = {g.name: g.parent for g in spec.groups}
    for g in spec.groups:  # every chain reaches the root within MAX_DEPTH
        at, depth = g.name, 0
        while at:
            at, depth = parent[at], depth + 1
            if depth > min(MAX_DEPTH, len(parent)):
                return (
                    f"gang {spec.key}: sub-group {g.name!r} is in a cycle or nested deeper than {MAX_DEPTH}"
                )
    for m in spec.members:
        if m.group and m.group not in known:
            return f"pod {m.pod} names sub-group {m.group!r}, which gang {spec.key} does not have"
    for what, level in (("required", spec.required_level), ("preferred", spec.preferred_level)):
        if level is not None and level not in levels:
            return f"{what} topology {level!r} is not one of the network levels: {', '.join(levels)}"
    return ""


def _index(
    spec: GangSpec,
    levels: tuple[str, ...],
    index: NetworkIndex,
    memo: PlanMemo,
    objective: ClusterObjective | None,
    flat: FlatPlanner,
) -> _Tree:
    groups = {g.name: g for g in spec.groups}
    direct: dict[str, list[int]] = {"": [], **{g: [] for g in groups}}
    for i, m in enumerate(spec.members):
        direct[m.group].append(i)
    total = dict.fromkeys(direct, 0)
    bound: dict[str, set[str]] = {g: set() for g in direct}
    for g, members in direct.items():  # add each member's GPUs to its group and every ancestor
        for i in members:
            at: str | None = g
            while at is not None:
                total[at] += spec.members[i].gpus
                at = groups[at].parent if at else None
    for g, node in spec.bound:
        at2: str | None = g if g in direct else ""
        while at2 is not None:
            bound[at2].add(node)
            at2 = groups[at2].parent if at2 else None
    children: dict[str, list[str]] = {g: [] for g in direct}
    for sub in groups.values():
        if total[sub.name] > 0:  # a sub-group with nothing pending needs no room
            children[sub.parent].append(sub.name)
    for kids in children.values():
        kids.sort(key=lambda k: (-total[k], k))
    return _Tree(spec, levels, index, memo, objective, flat, groups, children, direct, total, bound)


def _domains(
    tree: _Tree, level: str, names: Sequence[str], need: int, bound: set[str], cap: int | None = MAX_DOMAINS
) -> list[tuple[str, list[str]]]:
    """The domains of `level` among `names` that could hold `need` GPUs and every bound node,
    fullest first (the fewest free GPUs that still hold it), name order among equals, at most
    `cap` of them."""
    by: dict[str, list[str]] = {}
    for n in names:
        by.setdefault(CLUSTER if level == CLUSTER else tree.index.domain(n, level), []).append(n)
    pinned = {
        CLUSTER if level == CLUSTER else tree.index.domain(n, level)
        for n in bound
        if n in tree.index.position
    }
    if len(pinned) > 1:
        return []
    out = []
    for d, members in by.items():
        if pinned and d not in pinned:
            continue
        room = sum(len(tree.free[n].free) for n in members)
        if room >= need:
            out.append((room, d, members))
    out.sort(key=lambda x: (x[0], x[1]))
    return [(d, members) for _, d, members in out[:cap]]


def _place(tree: _Tree, group: str, names: list[str], depth: int, within: str) -> dict[int, Placement] | str:
    """Every pending member of `group`'s subtree inside `names` (one domain of its level,
    `within` in words), or why not. Takes the capacity it uses out of `tree.free`; the caller
    restores it on failure."""
    out: dict[int, Placement] = {}
    for child in _kids(tree, group):
        got = _place_child(tree, child, names, depth + 1, within)
        if isinstance(got, str):
            return got
        out.update(got)
    own = tree.direct[group]
    if own:
        flat = _flat(tree, group or tree.spec.key, own, names, None, None)
        if isinstance(flat, str):
            if not group:
                tree.stuck = ""
                return f"the gang's own {len(own)} pods cannot be placed in {within}: {flat}"
            return _stuck(tree, group, within, flat)
        out.update(flat[0])
    return out


def _stuck(tree: _Tree, name: str, within: str, why: str) -> str:
    """The reason naming sub-group `name` as the one that could not be placed inside `within`
    (and noted as such in `tree.stuck`, for `NoPlan.group`): what it asks (its subtree's pods
    and GPUs, its level) and the planner's own reason."""
    tree.stuck = path = _path(tree, name)
    g = tree.groups[name]
    asked, level = _asked(g.required_level, g.preferred_level)
    return explain.stuck_text(path, _pods_below(tree, name), tree.total[name], asked, level, within, why)


def _pods_below(tree: _Tree, name: str) -> int:
    return len(tree.direct[name]) + sum(_pods_below(tree, k) for k in tree.children[name])


def _path(tree: _Tree, name: str) -> str:
    """`name`'s path from the root ("parent/child")."""
    chain: list[str] = []
    at = name
    while at and len(chain) <= MAX_DEPTH:
        chain.append(at)
        at = tree.groups[at].parent
    return "/".join(reversed(chain))


def _kids(tree: _Tree, group: str) -> list[str]:
    """`group`'s sub-groups in the order they are placed (`ORDERS`): the most constrained first
    (a sub-group that must sit in one node or one NVLink domain has the fewest places, and a
    looser sibling can go around it), the largest first among equals; or the largest first."""
    kids = tree.children[group]
    if tree.order == "largest" or len(kids) < 2:
        return kids  # `_index` sorted them largest first
    rank = {level: i for i, level in enumerate(tree.levels)}

    def key(k: str) -> tuple[int, int, str]:
        g = tree.groups[k]
        return (rank[g.required_level] if g.required_level is not None else len(rank), -tree.total[k], k)

    return sorted(kids, key=key)


def _place_child(
    tree: _Tree, name: str, names: list[str], depth: int, within: str
) -> dict[int, Placement] | str:
    g = tree.groups[name]
    asked = _asked(g.required_level, g.preferred_level)
    own = tree.direct[name]
    if not tree.children[name]:  # a leaf: one flat gang over the parent's domain
        pinned = _pinned(tree, name, names)
        before = dict(tree.free)
        flat = _flat(tree, name, own, pinned, g.required_level, g.preferred_level)
        if isinstance(flat, str):
            return _stuck(tree, name, within, flat)
        if tree.objective is not None and g.required_level is not None:
            flat = _leaf_ranked(tree, name, own, pinned, flat, before)
        got, plan = flat
        level, domain = _landed(tree, got, g)
        why = plan.why
        if asked[0] == "preferred" and level != g.preferred_level and not why:
            why = f"no {_short(g.preferred_level or CLUSTER)} domain in {within} had room for its {len(own)} pods"
        tree.placed[name] = _placed(tree, name, level, domain, got, asked, why)
        return got
    if g.required_level is not None:
        tried = [g.required_level]
    else:
        start = tree.levels.index(g.preferred_level) if g.preferred_level is not None else 0
        tried = [*tree.levels[start:], CLUSTER]
    total = tree.total[name]
    why, fell = "", ""
    for i, level in enumerate(tried):
        domains = _domains(tree, level, names, total, tree.bound[name])
        if not domains:
            why = _stuck(tree, name, within, f"no {_short(level)} domain in it has its {total} GPUs free")
        for domain, members in domains:
            kept = dict(tree.free)
            sub = _place(tree, name, members, depth, _within(level, domain))
            if isinstance(sub, dict):
                tree.placed[name] = _placed(tree, name, level, domain, sub, asked, fell if i else "")
                return sub
            why = sub
            tree.free = kept
        if i == 0 and g.preferred_level is not None:
            fell = _fell_back(level, bool(domains), total)
    return why


def _leaf_ranked(
    tree: _Tree,
    name: str,
    own: list[int],
    names: list[str],
    first: tuple[dict[int, Placement], GangPlan],
    before: dict[str, NodeView],
) -> tuple[dict[int, Placement], GangPlan]:
    """A leaf sub-group with a required level, in the domain of that level its predicted job
    time ranks first (`_rank`), not only where the flat planner's packing order (fewest nodes
    first) put it: `first`, the flat plan over every domain, unless it is `_good_enough`, then
    the flat plan in the first domain (fullest first) of each other kind (server models).
    Leaves `tree.free` as the candidate taken leaves it."""
    g = tree.groups[name]
    level = g.required_level
    assert level is not None
    landed = _landed(tree, first[0], g)[1]
    if len(_kind(before, names)) < 2 or all(tree.index.domain(n, level) == landed for n in names):
        return first  # one server model, or one domain of its level: no other kind to rank
    cands = [_Cand(level, landed, first[0], {}, tree.free, before, plan=first[1])]
    if _good_enough(tree, cands[0]):
        return first
    after, tree.free = tree.free, dict(before)
    by = _domains(tree, level, names, tree.total[name], set(), cap=None)
    tree.free = after
    seen = {_kind(before, members) for d, members in by if d == landed}
    for d, members in by:
        kind = _kind(before, members)
        if kind in seen or len(cands) > MAX_DOMAINS:
            continue
        seen.add(kind)
        tree.free = dict(before)
        flat = _flat(tree, name, own, members, level, None)
        if not isinstance(flat, str):
            cands.append(_Cand(level, d, flat[0], {}, tree.free, before, plan=flat[1]))
    pick, effs = _rank(tree, cands)
    c = cands[pick]
    tree.free = c.free
    assert c.plan is not None
    why = _ranked_why(cands, effs, pick)
    return c.got, (replace(c.plan, why=why) if why else c.plan)


def _placed(
    tree: _Tree,
    name: str,
    level: str,
    domain: str,
    got: Mapping[int, Placement],
    asked: tuple[str, str | None],
    why: str,
) -> Placed:
    return Placed(
        name=name,
        parent=tree.groups[name].parent if name else "",
        level=level,
        domain="cluster" if level == CLUSTER else domain,
        nodes=tuple(sorted({p.node for p in got.values()})),
        asked=asked[0],
        asked_level=asked[1],
        why=why,
        pods=tuple(sorted(tree.spec.members[i].pod for i in tree.direct[name] if i in got)),
        gpus=tree.total[name],
    )


def _pinned(tree: _Tree, name: str, names: list[str]) -> list[str]:
    """`names` cut to the domain of the sub-group's required level that holds its bound members
    (all of `names` when it has none or no required level)."""
    g, bound = tree.groups[name], tree.bound[name]
    if g.required_level is None or not bound:
        return names
    level = g.required_level
    where = {tree.index.domain(n, level) for n in bound if n in tree.index.position}
    if len(where) != 1:
        return []
    (d,) = where
    return [n for n in names if tree.index.domain(n, level) == d]


def _flat(
    tree: _Tree,
    label: str,
    members: list[int],
    names: list[str],
    required: str | None,
    preferred: str | None,
) -> tuple[dict[int, Placement], GangPlan] | str:
    """`members` as one flat gang over `names`' current free GPUs; takes what it places. The
    flat plan comes back too: its `why` (the predicted job time that chose its level) is the
    sub-group's."""
    spec = tree.spec
    flat = GangSpec(
        f"{spec.key}/{label}",
        tuple(Member(spec.members[i].pod, spec.members[i].gpus) for i in members),
        required_level=required,
        preferred_level=preferred,
        profile=spec.profile,
    )
    views = [tree.free[n] for n in names]
    if not views:
        return f"sub-group {label!r}: no node left in its domain"
    plan = tree.flat(flat, views, tree.levels, index=tree.index, memo=tree.memo, objective=tree.objective)
    if isinstance(plan, NoPlan):
        return plan.reason
    by_pod = {spec.members[i].pod: i for i in members}
    out: dict[int, Placement] = {}
    taken: dict[str, set[int]] = {}
    for p in plan.placements:
        out[by_pod[p.pod]] = p
        taken.setdefault(p.node, set()).update(p.gpus)
    for node, gpus in taken.items():
        v = tree.free[node]
        left = v.free - gpus if gpus else frozenset(sorted(v.free)[_gpus_of(plan, node) :])
        tree.free[node] = NodeView(v.name, v.labels, v.gpu_count, left, v.allocator)
    return out, plan


def _gpus_of(plan: GangPlan, node: str) -> int:
    """GPUs a plan takes on a node of unknown topology (its placements carry no indices)."""
    return sum(1 for p in plan.placements if p.node == node and not p.gpus)


def _landed(tree: _Tree, got: Mapping[int, Placement], g: SubGroup) -> tuple[str, str]:
    """Where a leaf sub-group went: (level, domain) of the level it asked for, or of the
    smallest level whose one domain holds it."""
    nodes = sorted({p.node for p in got.values()})
    for level in (g.required_level or g.preferred_level, *tree.levels):
        if level is None:
            continue
        if level == HOSTNAME and len(nodes) == 1:
            return level, nodes[0]
        domains = {tree.index.domain(n, level) for n in nodes}
        if len(domains) == 1:
            return level, domains.pop()
    return CLUSTER, "cluster"


def _plan(
    tree: _Tree,
    level: str,
    domain: str,
    got: Mapping[int, Placement],
    asked: tuple[str, str | None],
    fell: str,
) -> GangPlan:
    placements = tuple(got[i] for i in range(len(tree.spec.members)))
    worst: Quality = UNKNOWN_QUALITY
    qualities = [(p.choice.ring_mbps, p.choice.pair_sum_mbps) for p in placements if p.choice is not None]
    if qualities:
        worst = min(qualities)
    root = _placed(tree, "", level, domain, got, asked, fell)
    where = {name: _path(tree, name).split("/") for name in tree.placed}
    placed = tuple([root, *(tree.placed[n] for n in sorted(tree.placed, key=where.__getitem__))])
    why = explain.plan_text(placed)
    return GangPlan(
        gang=tree.spec.key,
        level=level,
        domain=domain,
        placements=placements,
        nodes_used=len({p.node for p in placements}),
        worst=worst,
        why=why,
        tree=placed,
    )
