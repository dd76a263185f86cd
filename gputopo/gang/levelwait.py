"""When a gang should wait for its own level instead of spilling to a slower one.

`planner.plan_gang` answers with the smallest level whose one domain holds the gang *now*. When
the gang's domains of that size are busy, that is a larger level: a gang of whole-node members
that fits a leaf runs across the spines at half its leaf bandwidth, across the cluster at an
eighth (docs/simulator.md's levels), so it holds its GPUs 1.3x to 3x as long. Measured on the
simulator (docs/objective.md, "gang levels"), that is what cost the throughput on the gb200-nvl
preset: a handful of long gangs that spilled to the cluster level held the scarce 8-GPU nodes
three times as long, so later gangs spilled too. Kueue TAS's BestFit does the same (its
"preferred" level falls back at once), and was ahead of gputopo there only by which few long
gangs happened to spill.

The wait is opt-in (issue 18): the tracker's `spill_after_s` is 0 unless the operator sets
--gang-spill-after or the gang's pods set gputopo.io/topology-wait, and with 0 a gang is placed
now in the smallest level that holds it, as Kueue's, KAI's and Volcano's "preferred" levels are.
The numbers above came from an unmeasured job-time model (`gputopo/sim/comm.py`), which
published NCCL measurements show to be far too pessimistic about larger levels, so they no
longer set a default. Re-measured on the measured model (docs/objective.md, "The opt-in wait,
re-measured"), the wait still wins on communication-heavy mixes and not on a CNN-only one.

The rule, applied by the lifecycle (`gang.tracker.GangTracker`) to a gang none of whose members is
bound yet, when a wait is asked for: its *own level* is the smallest level of the plan's label
family (`carried`) it could use on the offered nodes if every GPU were free (the best this gang can get anywhere, as the single-pod objective measures a pod
against the best ring its size gets anywhere); a plan at a larger level is not taken while the
gang has waited less than the tracker's `spill_after_s`. Past that it takes what there is, so no
gang waits forever for capacity that other work keeps busy. A required level is strict already,
and a gang with members bound is never held back (its bound members would wait with it).

Pure: no I/O, no clock, no globals.
"""

from __future__ import annotations

import operator
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress

import numpy as np

from gputopo.gang.planner import GangPlan, GangSpec
from gputopo.network.levels import CLUSTER, HOSTNAME, NetworkIndex, short_name
from gputopo.network.nodeview import NodeView


def level_rank(index: NetworkIndex, level: str) -> int:
    """Position of `level` from the smallest (the node) up to the whole cluster."""
    return len(index.levels) if level == CLUSTER else index.levels.index(level)


def carried(plan: GangPlan, views: Mapping[str, NodeView], index: NetworkIndex) -> set[str]:
    """The levels every node of the plan carries a label of (the node level always): the
    levels of the plan's own family. A node carries one family of labels (Topograph's, the
    GPU clique, ...), and to it another family's levels are one-node domains that say nothing
    about its speed, so only these are a level the gang could wait for."""
    out = {HOSTNAME}
    nodes = [views[p.node].labels for p in plan.placements if p.node in views]
    for level in index.levels:
        if level != HOSTNAME and nodes and all(labels.get(level) for labels in nodes):
            out.add(level)
    return out


def fits_now(
    spec: GangSpec, nodes: Sequence[NodeView], index: NetworkIndex, levels: Sequence[str]
) -> list[bool]:
    """Per level of `levels`: whether some domain passes the planner's first check with the
    GPUs free now (GPUs, and slots of the members' size): exact for members of one size, the
    only case the lifecycle asks about."""
    if len({m.gpus for m in spec.members}) == 1 and spec.members[0].gpus > 0:
        return _fits_now_equal(spec.members[0].gpus, len(spec.members), nodes, index, levels)
    per = np.zeros(len(index.nodes), dtype=np.int64)
    for v in nodes:
        pos = index.position.get(v.name)
        if pos is not None:
            per[pos] = len(v.free)
    return [_passes(spec, per, index, level) for level in levels]


def _fits_now_equal(
    size: int, count: int, nodes: Sequence[NodeView], index: NetworkIndex, levels: Sequence[str]
) -> list[bool]:
    """`fits_now` for `count` members of `size` GPUs each, in plain Python: a waiting gang is
    asked this at every change of the cluster, and numpy's cost per call dominates on the
    few nodes with room. With one size, "the GPUs and the slots" is the slots alone (a slot
    holds `size` GPUs), so a domain passes when its nodes' slots reach `count`."""
    slots: dict[int, int] = {}
    position = index.position
    for v in nodes:
        f = len(v.free)
        if f >= size:  # a slot (size > 0): only these divide
            pos = position.get(v.name)
            if pos is not None:
                slots[pos] = f // size
    if sum(slots.values()) < count:  # no domain holds more than the whole cluster
        return [False] * len(levels)
    out = []
    for level in levels:
        lx = index.level(level)
        if lx.count == 1:  # one domain (the whole cluster): it holds every slot, and they are enough
            out.append(True)
            continue
        domain_id = lx.domain_id.tolist()  # plain ints: no numpy scalar per node
        acc: dict[int, int] = {}
        hit = False
        for pos, k in slots.items():
            d = domain_id[pos]
            acc[d] = total = acc.get(d, 0) + k
            if total >= count:
                hit = True
                break
        out.append(hit)
    return out


@dataclass(slots=True)
class _Kept:
    """What `SlotCount` keeps per (index, member size)."""

    index: NetworkIndex
    nodes: tuple[NodeView, ...]  # the last call's views, in its order
    slots: list[int]  # per index position: free GPUs // size (0 below one slot)
    total: int  # their sum
    per_level: dict[str, tuple[list[int], list[int]]]  # level -> (domain per position, slots per domain)


class SlotCount:
    """`fits_now` for members of one size, kept from one call to the next: a waiting gang's
    check is asked at every change of the cluster over views that are the last call's but for
    a few nodes, and every view is frozen, so per (index, member size) the last nodes and each
    position's slots (free GPUs // size, 0 below one slot), their sum and, per level asked,
    every domain's sum are kept, and only the nodes that are another object since are read
    again. Kept only for nodes of distinct names (a name given twice takes, in a full pass,
    the last view with a slot), and only while the changed nodes keep their names."""

    #: (index, size) entries kept; past this many they are dropped.
    HELD = 64

    def __init__(self) -> None:
        self._kept: dict[tuple[int, int], _Kept] = {}  # (id(index), size) -> what is kept

    def fits(
        self, size: int, count: int, nodes: Sequence[NodeView], index: NetworkIndex, levels: Sequence[str]
    ) -> list[bool]:
        """`_fits_now_equal(size, count, nodes, index, levels)`, the same answer."""
        key = (id(index), size)
        hit = self._kept.get(key)
        if hit is None or hit.index is not index or not self._update(hit, size, nodes, index):
            hit = self._fresh(key, size, nodes, index)
            if hit is None:
                return _fits_now_equal(size, count, nodes, index, levels)
        if hit.total < count:  # no domain holds more than the whole cluster
            return [False] * len(levels)
        per_level = hit.per_level
        out = []
        for level in levels:
            sums = per_level.get(level)
            if sums is None:
                sums = per_level[level] = _domain_sums(index, level, hit.slots)
            out.append(max(sums[1]) >= count)
        return out

    def _fresh(
        self, key: tuple[int, int], size: int, nodes: Sequence[NodeView], index: NetworkIndex
    ) -> _Kept | None:
        """A new entry for `nodes` (None, and nothing kept, when a name is given twice)."""
        if len({v.name for v in nodes}) != len(nodes):
            return None
        slots = [0] * len(index.nodes)
        position = index.position
        for v in nodes:
            f = len(v.free)
            if f >= size:
                pos = position.get(v.name)
                if pos is not None:
                    slots[pos] = f // size
        if len(self._kept) >= self.HELD:
            self._kept.clear()
        hit = self._kept[key] = _Kept(index, tuple(nodes), slots, sum(slots), {})  # the index keeps its id
        return hit

    @staticmethod
    def _update(hit: _Kept, size: int, nodes: Sequence[NodeView], index: NetworkIndex) -> bool:
        """Bring `hit` to `nodes` by the positions whose view is another object; False (and
        `hit` untouched) when they do not align with the kept nodes by name."""
        last = hit.nodes
        if len(last) != len(nodes):
            return False
        changed = list(compress(range(len(nodes)), map(operator.is_not, nodes, last)))
        if not changed:
            return True
        for i in changed:
            if nodes[i].name != last[i].name:
                return False
        slots, per_level, total = hit.slots, hit.per_level, hit.total
        position = index.position
        for i in changed:
            v = nodes[i]
            pos = position.get(v.name)
            if pos is None:
                continue
            f = len(v.free)
            delta = (f // size if f >= size else 0) - slots[pos]
            if delta:
                slots[pos] += delta
                total += delta
                for domain_id, acc in per_level.values():
                    acc[domain_id[pos]] += delta
        hit.nodes, hit.total = tuple(nodes), total
        return True


def _domain_sums(index: NetworkIndex, level: str, slots: list[int]) -> tuple[list[int], list[int]]:
    """`level`'s domain per position (plain ints), and per domain its positions' `slots` summed."""
    lx = index.level(level)
    domain_id: list[int] = lx.domain_id.tolist()
    acc = [0] * lx.count
    for pos, d in enumerate(domain_id):
        acc[d] += slots[pos]
    return domain_id, acc


class OwnLevels:
    """The tracker's "wait for the own level?" answers. A gang's own level depends on the
    offered nodes' capacity and labels only, fixed by an index and an offer (the sidecar
    builds a new index when its nodes change), so it is kept per (index, offer, member sizes,
    levels, levels counted): a waiting gang is asked again at every change of the cluster."""

    def __init__(self) -> None:
        #: key -> (own level, carried by every offered node, the index the key's id is of)
        self._memo: dict[tuple[object, ...], tuple[str | None, bool, NetworkIndex]] = {}
        #: `carried` per (index, the plan's node views) by identity -> (what the ids are of, answer)
        self._carries: dict[tuple[int, ...], tuple[tuple[object, ...], frozenset[str]]] = {}
        self._slots = SlotCount()  # `fits_now` kept from one call to the next

    def _carried(self, plan: GangPlan, views: Mapping[str, NodeView], index: NetworkIndex) -> frozenset[str]:
        """`carried`, a function of the index and the labels of the plan's nodes' views (frozen):
        kept on their identity, so a plan over nodes seen before reads no labels."""
        held = (index, *[views.get(p.node) for p in plan.placements])
        key = tuple(map(id, held))
        hit = self._carries.get(key)
        if hit is not None and all(map(operator.is_, hit[0], held)):
            return hit[1]
        if len(self._carries) > 10_000:
            self._carries.clear()
        got = frozenset(carried(plan, views, index))
        self._carries[key] = (held, got)  # the objects keep their ids theirs
        return got

    def level(
        self,
        spec: GangSpec,
        offer: frozenset[str],
        offered: Sequence[NodeView],
        index: NetworkIndex,
        among: frozenset[str] | None = None,
    ) -> tuple[str | None, bool]:
        """`own_level` over `offered` (the views of `offer`), and whether every offered node
        carries a label of it."""
        sizes = tuple(sorted([m.gpus for m in spec.members]))
        key = (id(index), offer, sizes, spec.preferred_level, spec.required_level, among)
        hit = self._memo.get(key)
        if hit is None or hit[2] is not index:
            if len(self._memo) > 10_000:
                self._memo.clear()
            own = own_level(spec, offered, index, among)
            by_all = own == HOSTNAME or (own is not None and all(v.labels.get(own) for v in offered))
            hit = self._memo[key] = (own, by_all, index)  # the index keeps its id its own
        return hit[0], hit[1]

    def waits(
        self,
        spec: GangSpec,
        offer: frozenset[str],
        offered: Sequence[NodeView],
        index: NetworkIndex,
        since: float,
        now: float,
        spill_after_s: float,
    ) -> LevelWait | None:
        """Why a gang with no member bound, first filtered at `since`, waits for its own level,
        found without planning; or None: plan, then `hold`. Only where it is the same answer:
        members of one size (the capacity check is exact), and an own level that every
        offered node carries (so it is the plan's family's too)."""
        if now - since >= spill_after_s or len({m.gpus for m in spec.members}) != 1:
            return None
        own, carried_by_all = self.level(spec, offer, offered, index)
        if own is None or own == CLUSTER or not carried_by_all:
            return None
        size, levels = spec.members[0].gpus, (own, CLUSTER)
        if size > 0:  # kept from the last call: only the nodes that changed are read
            here, anywhere = self._slots.fits(size, len(spec.members), offered, index, levels)
        else:
            here, anywhere = fits_now(spec, offered, index, levels)
        if here or not anywhere:
            return None  # the plan is at its own level, or the planner says why nothing fits
        return LevelWait(spec, own, index, since, spill_after_s)

    def hold(
        self,
        spec: GangSpec,
        plan: GangPlan,
        offer: frozenset[str],
        offered: Sequence[NodeView],
        views: Mapping[str, NodeView],
        index: NetworkIndex,
        waited: float,
        spill_after_s: float,
    ) -> GangPlan | str:
        """The plan of a gang with no member bound, or why it waits for a domain of its own
        level (of the plan's label family, `carried`)."""
        if waited >= spill_after_s:
            return plan
        own, _ = self.level(spec, offer, offered, index, self._carried(plan, views, index))
        if own is None or level_rank(index, plan.level) <= level_rank(index, own):
            return plan
        return wait_reason(spec, own, spill_after_s, waited)


@dataclass(frozen=True)
class LevelWait:
    """A gang of members of one size waiting for one domain of `level` (`GangTracker._waits`).

    For the same members and offer the answer can only change when the gang `spills(now)`,
    when some domain of `level` reaches `count` slots (free GPUs // `size`, per offered node),
    or when the offered nodes together no longer have `count` slots (the planner then says why
    nothing fits). Placements only take slots and frees only add them on their own nodes, so a
    caller that asks again at every change of the cluster (the simulator) can tell from the
    nodes that changed whether asking could answer otherwise (`GangTracker.repeat_wait`)."""

    spec: GangSpec
    level: str
    index: NetworkIndex = field(compare=False, repr=False)  # whose domains of `level` are meant
    since: float = 0.0  # the gang's first filter (`GangTracker.first_seen`)
    spill_after_s: float = 0.0

    @property
    def size(self) -> int:
        return self.spec.members[0].gpus

    @property
    def count(self) -> int:
        return len(self.spec.members)

    def spills(self, now: float) -> bool:
        """Whether the gang has waited long enough to take a larger level (as `_waits` asks)."""
        return now - self.since >= self.spill_after_s

    def reason(self, now: float) -> str:
        return wait_reason(self.spec, self.level, self.spill_after_s, now - self.since)


def wait_reason(spec: GangSpec, own: str, spill_after_s: float, waited: float) -> str:
    """The reason a gang waiting for its own level is given (the same, however it was found)."""
    return (
        f"waiting for one {short_name(own)} domain to hold all {len(spec.members)} members "
        f"(no such domain has room now; after {spill_after_s:g}s of waiting it takes a larger "
        f"level, {waited:.0f}s so far)"
    )


def _passes(spec: GangSpec, per: np.ndarray, index: NetworkIndex, level: str) -> bool:
    sizes = [m.gpus for m in spec.members]
    ok = index.free_per_domain(level, per) >= sum(sizes)
    for s in sorted(set(sizes)):
        if not ok.any():
            return False
        need = sum(1 for g in sizes if g >= s)
        ok &= index.free_per_domain(level, per // s) >= need
    return bool(ok.any())


def own_level(
    spec: GangSpec, nodes: Sequence[NodeView], index: NetworkIndex, among: Collection[str] | None = None
) -> str | None:
    """The smallest level the gang may use (its preferred one or larger, then the cluster;
    only those in `among` when given) with a domain of `nodes` that, every GPU free, has the
    GPUs and the slots of every member size the planner checks first; None when even the whole
    set of nodes has not (or for a required level, which waits by itself). Exact for members
    of one size; necessary for mixed sizes."""
    if spec.required_level is not None or not spec.members:
        return None
    levels = index.levels
    if spec.preferred_level is not None and spec.preferred_level not in levels:
        return None  # the planner reports the bad level
    start = levels.index(spec.preferred_level) if spec.preferred_level is not None else 0
    capacity = np.zeros(len(index.nodes), dtype=np.int64)
    for v in nodes:
        pos = index.position.get(v.name)
        if pos is not None:
            capacity[pos] = v.gpu_count
    sizes = [m.gpus for m in spec.members]
    total = sum(sizes)
    for level in (*levels[start:], CLUSTER):
        if among is not None and level != CLUSTER and level not in among:
            continue
        ok = index.free_per_domain(level, capacity) >= total
        for s in sorted(set(sizes)):
            if not ok.any():
                break
            need = sum(1 for g in sizes if g >= s)
            ok &= index.free_per_domain(level, capacity // s) >= need
        if ok.any():
            return level
    return None
