"""Single pods in the simulated sidecar: kube-scheduler's choice given the extender's scores,
worked out per class of identical nodes (a topology and a free mask; `ClusterState.classes`).

The plain path would ask `placement.node_scores` (with the cluster objective) of every node on
every pod. Here a class's parts of its score are kept while the objective learns no new server
(`_part`), a good-enough class's key per demand mix version (`_good_key`), and per set of classes
which of them are at kube-scheduler's best total (`place_pod`): only the state's order (which
decides ties) and the classes' members are read fresh. tests/test_sim_pod_fastpath.py checks
every answer against the plain path.

`PodClasses` is the single-pod half of `gputopo.sim.policies.sidecar.SidecarPolicy` (a mixin): the policy
owns the objective, the allocators, the ring wait and the random stream read here.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from gputopo.jobtime.profiles import Profile
from gputopo.network.levels import NetworkIndex
from gputopo.network.nodeview import ChoiceMemo, NodeView
from gputopo.node.allocator import Allocator, Choice
from gputopo.pod import kubesched
from gputopo.pod.leafpack import Leaves
from gputopo.pod.objective import ClusterObjective
from gputopo.pod.placement import MAX_SCORE, node_scores, scores_in_order
from gputopo.pod.ringwait import RingWait
from gputopo.sim.policies.base import Failure, Slot
from gputopo.sim.state import ClusterState, SimCluster

#: The most classes for which only the best distinct key gets MAX_SCORE (`scores_in_order`):
#: `_best_classes` then looks at the classes with that key alone.
_ALONE_AT_TOP = next(
    k - 1 for k in range(2, 66) if sorted(scores_in_order([(i,) for i in range(k)]))[-2] >= MAX_SCORE
)
#: The least total of a node at the extender's top score (LeastAllocated 0): a point less of
#: the score (x200 after the extender's weight) is more than LeastAllocated's 0..100 can make up.
_TOP_TOTAL = kubesched.total_score(MAX_SCORE, 0, 1)
assert kubesched.total_score(MAX_SCORE - 1, 1, 1) < _TOP_TOTAL
#: A class's parts of its single-pod score (`PodClasses._part`).
_Part = tuple[float, Choice, tuple[object, ...], tuple[int, ...], tuple[int, ...], Allocator, frozenset[int]]
#: What `_best_classes` reads of a set of classes with room that no mix changes (`PodClasses._frame`).
_Frame = tuple[tuple[tuple[int, int], ...], list[_Part], list[int]]


class PodClasses:
    """The single-pod half of the simulated sidecar (module docstring)."""

    cluster: SimCluster
    allocators: Sequence[Allocator]
    rng: random.Random
    objective: ClusterObjective
    ring_wait: RingWait
    _memo: ChoiceMemo
    #: the cluster's leaves (`gputopo.pod.leafpack`), by node index (`_init_leaves`)
    _leaves: Leaves

    def _init_leaves(self, net: NetworkIndex) -> None:
        """The leaves of the cluster's network index, renumbered from the index's node positions
        to the simulator's node indices (the policy's `__init__` calls it)."""
        by_position = Leaves.of(net)
        position = [net.position[node.name] for node in self.cluster.nodes]
        at = {p: i for i, p in enumerate(position)}
        self._leaves = Leaves(
            tuple(by_position.leaf[p] for p in position),
            tuple(tuple(sorted(at[p] for p in m)) for m in by_position.members),
        )

    def _init_pods(self) -> None:
        """The caches of this half, empty (the policy's `__init__` calls it)."""
        self._views: dict[tuple[int, int], NodeView] = {}  # (node, free mask) -> `_view`
        #: (pod size, the classes present) -> the classes at kube-scheduler's best total, for
        #: the demand mix version `_tops_version` (`place_pod`); `_by_room` the same keyed on
        #: the classes with room
        self._tops: dict[tuple[int, frozenset[tuple[int, int]]], tuple[tuple[int, int], ...]] = {}
        self._by_room: dict[tuple[int, frozenset[tuple[int, int]]], tuple[tuple[int, int], ...]] = {}
        self._tops_version = -1
        self._parts: dict[tuple[tuple[int, int], int], _Part] = {}  # (class, size) -> `_part`
        self._totals: dict[tuple[int, int], tuple[int, ...]] = {}  # (GPUs left, GPUs) -> `_part`'s totals
        self._parts_learned = -1
        #: (pod size, the classes present) -> `_ring_split`'s answer (pure in them: never renewed)
        self._rings: dict[tuple[int, frozenset[tuple[int, int]]], tuple[list[tuple[int, int]], bool]] = {}
        self._good: dict[tuple[tuple[int, int], int], tuple[object, ...]] = {}  # see `_good_key`
        self._ring_ok: dict[tuple[tuple[int, int], int], bool] = {}  # see `_ring_good`
        #: `_by_room`'s answers that hold for every mix version (`_best_classes`), and `_tops`'
        #: (`place_pod` copies them back after a new version)
        self._static: dict[tuple[int, frozenset[tuple[int, int]]], tuple[tuple[int, int], ...]] = {}
        self._fixed: dict[tuple[int, frozenset[tuple[int, int]]], tuple[tuple[int, int], ...]] = {}
        #: (pod size, the classes with room) -> what `_best_classes` reads of them that does not
        #: depend on the mix (`_frame`)
        self._frames: dict[tuple[int, frozenset[tuple[int, int]]], _Frame] = {}

    def _view(self, node: int, mask: int) -> NodeView:
        """The view of `node` with free mask `mask` (both halves ask for them; kept, bounded)."""
        key = (node, mask)
        hit = self._views.get(key)
        if hit is None:
            spec = self.cluster.nodes[node]
            n = self.cluster.topologies[spec.topology].n
            if len(self._views) > 100_000:
                self._views.clear()
            free = frozenset(i for i in range(n) if mask >> i & 1)
            hit = self._views[key] = NodeView(spec.name, spec.labels, n, free, self.allocators[spec.topology])
        return hit

    def place_pod(
        self, state: ClusterState, size: int, waiting: int | None = None, profile: Profile | None = None
    ) -> Slot | Failure:
        """kube-scheduler's choice among the nodes with room, given the extender's scores; the
        pod of job `waiting` (a single pod, not a gang member) is held to the nodes that give it
        their best ring while `ring_wait` says so, as the sidecar's filter holds it."""
        # Which classes kube-scheduler's best total falls on is a function of the pod size, the
        # set of classes present (the classes with room follow from it), the demand mix version
        # and the servers the objective knows (`_best_classes`), not of the classes' members: it
        # is kept per set, and only the order (the state's, which decides ties) and the counts
        # are read fresh.
        classes = state.classes
        objective = self.objective
        if objective.mix.version != self._tops_version or objective.learned != self._parts_learned:
            self._renew()
        held: list[tuple[int, int]] | None = None  # the classes the ring wait leaves, if it holds
        key = (size, frozenset(classes))
        if waiting is not None and size > 1:
            good, declined = self._rings.get(key) or self._ring_split(classes, key)
            if declined and self.ring_wait.held(waiting, True, state.now):
                if not good:
                    return Failure(f"waiting for a node that gives {size} GPUs its best ring")
                held = good
        top: tuple[tuple[int, int], ...] | None
        if profile is not None and size > 1:  # the pod declared what it trains: scored for that
            room = held if held is not None else [c for c in classes if c[1].bit_count() >= size]
            top = self._declared_top(classes, room, size, profile)
        else:
            top = self._top_of_room(held, size) if held is not None else self._tops.get(key)
        if top is None:
            if len(self._tops) > 50_000:
                self._tops.clear()
                self._by_room.clear()
            top = self._fixed.get(key)  # an answer no mix version changes, found before
            if top is None:
                room = [c for c in classes if c[1].bit_count() >= size]
                by_room = (size, frozenset(room))
                top = self._top_of_room(room, size)
                if by_room in self._static:
                    if len(self._fixed) > 50_000:
                        self._fixed.clear()
                    self._fixed[key] = top
            self._tops[key] = top
        if not top:
            return Failure(f"no node has {size} free GPUs")
        parts = self._parts
        if self._leaves.active and (len(top) > 1 or len(classes[top[0]]) > 1):
            return self._packed(state, top, size)
        if len(top) > 1:  # LeastAllocated decides among the classes at the top score
            totals = [(parts.get((c, size)) or self._part(c, size))[4][MAX_SCORE] for c in top]
            best = max(totals)
            top = tuple(c for c, t in zip(top, totals, strict=True) if t == best)
        if len(top) == 1:
            chosen = top[0]
        else:  # kubesched.select_host over the tied classes, in the state's order
            tied = [c for c in classes if c in top]
            pick = self.rng.randrange(sum(len(classes[c]) for c in tied))
            for chosen in tied:
                if pick < len(classes[chosen]):
                    break
                pick -= len(classes[chosen])
        members = classes[chosen]
        node = sorted(members)[self.rng.randrange(len(members))] if len(members) > 1 else min(members)
        return node, (parts.get((chosen, size)) or self._part(chosen, size))[3]  # may be bounded away

    def _declared_top(
        self,
        classes: dict[tuple[int, int], set[int]],
        room: list[tuple[int, int]],
        size: int,
        profile: Profile,
    ) -> tuple[tuple[int, int], ...]:
        """The classes of `room` at the extender's top score for a pod that declared `profile`:
        `placement.node_scores` with the objective for that profile over one node per class, as
        the sidecar's prioritize scores it (not kept: the class caches are the mix's)."""
        if not room:
            return ()
        reps = [self._view(min(classes[c]), c[1]) for c in room]
        scores = node_scores(size, reps, memo=self._memo, objective=self.objective.declared(profile))
        best = max(scores.values())
        return tuple(c for c, v in zip(room, reps, strict=True) if scores[v.name] == best) if best > 0 else ()

    def _packed(self, state: ClusterState, top: tuple[tuple[int, int], ...], size: int) -> Slot:
        """kube-scheduler's choice among the classes at the top score `top` once the extender
        has kept that score for the nodes under the fullest leaf (`Leaves.fullest`, the
        sidecar's `Leaves.pack_scores`): the best total over the kept nodes (LeastAllocated,
        per class), then `kubesched.select_host` over the classes in the state's order, each
        counted by its kept nodes, and one of those at random."""
        classes, parts, leaves = state.classes, self._parts, self._leaves
        rooms = state.group_free(leaves.leaf, len(leaves.members))
        kept = set(leaves.fullest_by_room([n for c in top for n in classes[c]], rooms.__getitem__))
        entries: list[tuple[tuple[int, int], list[int], int]] = []
        for c in classes:
            if c in top:
                sub = sorted([n for n in classes[c] if n in kept])
                if sub:
                    entries.append((c, sub, (parts.get((c, size)) or self._part(c, size))[4][MAX_SCORE]))
        k = kubesched.select_host([(t, len(sub)) for _, sub, t in entries], self.rng)
        chosen, sub, _ = entries[k]
        node = sub[self.rng.randrange(len(sub))] if len(sub) > 1 else sub[0]
        return node, (parts.get((chosen, size)) or self._part(chosen, size))[3]

    def _top_of_room(self, room: list[tuple[int, int]], size: int) -> tuple[tuple[int, int], ...]:
        """`_best_classes` of the classes with room, kept per (size, set with room): fewer sets
        than of every class present, so shared between them."""
        by_room = (size, frozenset(room))
        top = self._by_room.get(by_room) or self._static.get(by_room)
        if top is None:
            top, static = self._best_classes(room, size)
            if static and len(self._static) > 50_000:
                self._static.clear()
            (self._static if static else self._by_room)[by_room] = top
        return top

    def _ring_split(
        self, classes: dict[tuple[int, int], set[int]], key: tuple[int, frozenset[tuple[int, int]]]
    ) -> tuple[list[tuple[int, int]], bool]:
        """The classes with room for `key`'s size whose set is good enough for it (`ring_wait.good`),
        and whether some class with room is not: a function of the size and the set of classes
        present (a class is a topology and a free mask; the ring wait's answer is pure in them),
        so kept per key (`_rings`); the state's order of the classes present is read fresh only
        where it decides (`place_pod`'s ties), never here."""
        size, known = key[0], self._ring_ok
        room = [c for c in classes if c[1].bit_count() >= size]
        good = []
        for c in room:  # `_ring_good`, its memo read here
            fine = known.get((c, size))
            if fine or (fine is None and self._ring_good(classes, c, size)):
                good.append(c)
        if len(self._rings) > 50_000:
            self._rings.clear()
        hit = self._rings[key] = (good, len(good) < len(room))
        return hit

    def _ring_good(self, classes: dict[tuple[int, int], set[int]], c: tuple[int, int], size: int) -> bool:
        """`ring_wait.good` of class `c`: pure in its topology, free mask and the size, so kept
        per (class, size) in `_ring_ok`."""
        hit = self._ring_ok.get((c, size))
        if hit is None:
            if len(self._ring_ok) > 100_000:
                self._ring_ok.clear()
            v = self._view(min(classes[c]), c[1])
            hit = self._ring_ok[(c, size)] = self.ring_wait.good(v.allocator, v.free, size, self._memo)
        return hit

    def _renew(self) -> None:
        """A new demand mix version: every answer and good-enough key goes (an older mix is
        never asked for again); a newly learned server: the classes' parts too."""
        self._tops.clear()
        self._by_room.clear()
        self._good.clear()
        self._tops_version = self.objective.mix.version
        if self.objective.learned != self._parts_learned:
            self._parts.clear()
            self._static.clear()
            self._fixed.clear()
            self._frames.clear()
            self._parts_learned = self.objective.learned

    def _best_classes(
        self, room: list[tuple[int, int]], size: int
    ) -> tuple[tuple[tuple[int, int], ...], bool]:
        """The classes of `room` at the extender's top score (MAX_SCORE: among them
        LeastAllocated and the leaf packing decide, `place_pod`), in `room`'s order, and whether
        that holds for every mix version: when at most one class is good enough, no cost (the
        only part of a key that depends on the mix) decides a rank."""
        if not room:
            return (), True
        if len(room) <= _ALONE_AT_TOP:
            # Only the best distinct key scores MAX_SCORE, and it is a good-enough class's (their
            # keys lead with True). The keys are the ones `_class_totals` would ask for, which
            # decides otherwise.
            order, got, ok = self._frames.get((size, frozenset(room))) or self._frame(room, size)
            good = self._good
            keys = [good.get((order[i], size)) or self._good_key(order[i], size, got[i]) for i in ok]
            best_key = max(keys)
            tied = [i for i, k in zip(ok, keys, strict=True) if k == best_key]
            chosen = [order[i] for i in tied]  # in `room`'s order:
            return (chosen[0],) if len(chosen) == 1 else tuple(c for c in room if c in chosen), len(ok) <= 1
        totals, good_enough = self._class_totals(room, size)
        return tuple(c for c, t in zip(room, totals, strict=True) if t >= _TOP_TOTAL), good_enough <= 1

    def _frame(self, room: list[tuple[int, int]], size: int) -> _Frame:
        """What `_best_classes` reads of `room` that depends on no mix version: the classes (in
        the order first asked: the answer is read as a set), their parts and which of them are
        good enough (`ClusterObjective.floor`); kept per (size, room set) for rooms where the
        costs decide (two or more good enough) while the objective learns no new server."""
        parts = self._parts
        got = [parts.get((c, size)) or self._part(c, size) for c in room]
        floor = self.objective.floor(p[0] for p in got)
        ok = [i for i, p in enumerate(got) if p[0] >= floor]
        frame = (tuple(room), got, ok)
        if len(ok) > 1:
            if len(self._frames) > 50_000:
                self._frames.clear()
            self._frames[(size, frozenset(room))] = frame
        return frame

    def _class_totals(self, room: list[tuple[int, int]], size: int) -> tuple[list[int], int]:
        """kube-scheduler's total per class of `room` (non-empty classes with room for `size`):
        `placement.node_scores` with the objective over one node per class, through the same
        steps (`ClusterObjective.floor`, `key`, `placement.scores_in_order`), from each class's
        parts that do not depend on the other classes (`_part`, `_good_key`); and how many
        classes are good enough."""
        parts, good = self._parts, self._good
        got = [parts.get((c, size)) or self._part(c, size) for c in room]
        floor = self.objective.floor(p[0] for p in got)
        ok = [p[0] >= floor for p in got]
        keys = [
            (good.get((c, size)) or self._good_key(c, size, p)) if fine else p[2]
            for c, p, fine in zip(room, got, ok, strict=True)
        ]
        totals = [p[4][score] for score, p in zip(scores_in_order(keys), got, strict=True)]
        return totals, sum(ok)

    def _part(self, c: tuple[int, int], size: int) -> _Part:
        """What a class's score is made of that depends neither on the other classes nor on the
        mix: (efficiency, the allocator's choice, the objective's key when not good enough, the
        GPUs it gives sorted, kube-scheduler's total per extender score 0..10, the allocator,
        the free set); kept while the objective learns no new server (`_renew`)."""
        if len(self._parts) > 100_000:
            self._parts.clear()
        topology, mask = c
        allocator = self.allocators[topology]
        n = self.cluster.topologies[topology].n
        free = frozenset(i for i in range(n) if mask >> i & 1)
        choice = self._memo.choose(allocator, free, size)
        eff = self.objective.efficiency(allocator.exact, size, choice.ring_mbps)
        low = self.objective.key(size, allocator, free, choice, eff, False)
        totals = self._totals.get((len(free) - size, n))  # pure in the GPUs left and the node's
        if totals is None:
            totals = self._totals[(len(free) - size, n)] = tuple(
                kubesched.total_score(s, len(free) - size, n) for s in range(MAX_SCORE + 1)
            )
        hit = self._parts[(c, size)] = (
            eff,
            choice,
            low,
            tuple(sorted(choice.indices)),
            totals,
            allocator,
            free,
        )
        return hit

    def _good_key(self, c: tuple[int, int], size: int, part: _Part) -> tuple[object, ...]:
        """The objective's key of class `c` when good enough, for the mix version `_tops_version`
        (`_renew` empties them when it changes): `ClusterObjective.key`'s, with the first cut's
        part of it taken from the key when not good enough (`_part`: it depends on no mix)."""
        if len(self._good) > 100_000:
            self._good.clear()
        hit = self._good[(c, size)] = (True, self.objective.cost(part[5], part[6], part[1]), part[2][2])
        return hit
