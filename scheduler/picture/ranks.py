"""Prioritize's picture of every node, kept across builds and patched per change.

kube-scheduler (with `percentageOfNodesToScore: 100`, as deploy/ sets it) asks prioritize about
every node the filter passed, one call per pod, while the cluster changes a node or two between
calls (the last pod's bind). Scoring is per node class (`NodeViews.classes`: nodes with the same
allocator and free set score alike), but grouping 20,000 names into their classes, spreading the
class scores back over them, applying the leaf packing (`gputopo.pod.leafpack`) and writing the
reply were each a pass over every candidate in Python: 60-70 ms of a filter + prioritize + bind
cycle at 20,000 nodes, against ~2 ms for everything else the cycle decides.

`Ranks` keeps, per node of the network index (its positions, stable until a node is added,
removed or relabelled), the node's class as a small integer in a numpy array, its free GPUs,
its leaf and its reply fragment already encoded, and each leaf's sum of free GPUs. A build
tells it which nodes changed (as it tells `Answers`); the next question patches those entries
only. The asked candidates are mapped to positions (a dict lookup each, ~2 ms at 20,000):
kube-scheduler offers the nodes its own filters passed, which change with the pod's size and
after every bind, so nothing is keyed on the list itself. Every per-candidate step is then a numpy operation or a C-level join:

  * which classes the asked candidates hold, and a representative of each (`np.unique`);
  * the caller scores the representatives (`node_scores`, the reservation rule) as before;
  * the class scores spread over the candidates by one fancy index;
  * the leaf packing: among the top-score candidates, those outside the fullest leaf (its free
    GPUs summed over every node of the leaf, the sum kept here) get one point less;
  * the reply is the kept fragments joined with each score's digits.

The answer is the same as the per-node path's (`scheduler.extender._per_node_scores`);
tests/test_scheduler_ranks.py checks it against that path after random rewrites, binds and
reservations. A question this cannot answer (a candidate the network index does not hold, a
views object of an earlier build) gets None and the caller takes the per-node path.

Not thread-safe: the extender's lock guards it, as it guards the builder and `Answers`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import orjson

from gputopo.network.levels import NetworkIndex
from gputopo.pod.leafpack import Leaves
from gputopo.pod.placement import MAX_SCORE
from scheduler.picture.classes import NodeClass

#: the encoded end of a reply entry per score (scores are 0..MAX_SCORE)
_TAILS = tuple(b"%d}" % s for s in range(MAX_SCORE + 1))
_TAILS_SEP = np.array([t + b"," for t in _TAILS], object)

#: A caller's scores for the classes the asked candidates hold: given each class and one node
#: of it (in first-seen order), a score per class in the same order.
ClassScorer = Callable[[list[NodeClass], list[str]], Sequence[int]]


class Ranked:
    """Prioritize's answer: `names` (the asked candidates, in order) and their scores; with the
    kept fragments (`_frags`, `_places`) the reply encodes by a join instead of per entry."""

    __slots__ = ("_frags", "_places", "names", "scores")

    def __init__(
        self,
        names: Sequence[str],
        scores: Sequence[int] | np.ndarray,
        frags: np.ndarray | None = None,
        places: np.ndarray | None = None,
    ) -> None:
        self.names = names
        self.scores = scores
        self._frags = frags
        self._places = places

    def pairs(self) -> list[tuple[str, int]]:
        """(node, score) in the candidates' order."""
        scores = self.scores.tolist() if isinstance(self.scores, np.ndarray) else self.scores
        return list(zip(self.names, map(int, scores), strict=True))

    def encode(self) -> bytes:
        """The HostPriorityList as JSON: `[{"Host": name, "Score": s}, ...]` in order: the kept
        fragments and each score's ending gathered by numpy (object arrays) and joined once.
        Per entry in Python (`bytes +` through `map`, or a list lookup each) it cost 5-13 ms at
        20,000 candidates; this is ~1.5 ms."""
        n = len(self.names)
        if n == 0:
            return b"[]"
        scores = np.asarray(self.scores, np.int64)
        parts = np.empty(2 * n, object)
        if self._frags is not None and self._places is not None:
            parts[0::2] = self._frags[self._places]
        else:
            parts[0::2] = [_frag(name) for name in self.names]
        parts[1::2] = _TAILS_SEP[scores]
        parts[-1] = _TAILS[int(scores[-1])]
        return b"[" + b"".join(parts.tolist()) + b"]"


def _frag(name: str) -> bytes:
    return b'{"Host":' + orjson.dumps(name) + b',"Score":'


class Ranks:
    """Per node of the network index (its positions): its class id (`_ids`), its free GPUs,
    its leaf and its reply fragment; per leaf the free GPUs of its nodes; all patched for the
    nodes each build changed (`changed`) and rebuilt whole after `reset` or for a new index
    (a node added, removed or relabelled). Owned by one ViewBuilder, beside its `Answers`."""

    #: class ids handed out before the table is rebuilt from the live classes (a node on the
    #: general path gets a new class object at each change)
    MAX_TABLE = 4096

    def __init__(self) -> None:
        self._net: NetworkIndex | None = None  # the index every array is for
        self._ids = np.empty(0, np.int64)  # class id per position (-1: unknown to gputopo)
        self._table: list[NodeClass] = []
        self._id_of: dict[NodeClass, int] = {}
        self._frags = np.empty(0, object)  # encoded `{"Host":NAME,"Score":` per position
        self._pending: set[str] = set()  # nodes changed since the arrays were last right
        self._leaf_of_pos = np.empty(0, np.int64)  # leaf id per position (-1: none)
        self._pos_count = np.empty(0, np.int64)  # free GPUs per position
        self._leaf_room = np.empty(0, np.int64)  # free GPUs per leaf, over every node of it

    def reset(self) -> None:
        """Every node may have changed: rebuild at the next question."""
        self._net = None
        self._pending.clear()

    def changed(self, names: Sequence[str] | set[str]) -> None:
        """These nodes' classes may have changed (the builder's new generation)."""
        if self._net is None:
            return
        self._pending.update(names)
        if len(self._pending) > len(self._ids) // 8 + 64:  # a fresh pass costs less
            self.reset()

    def _id(self, c: NodeClass | None) -> int:
        if c is None:
            return -1
        got = self._id_of.get(c)
        if got is None:
            got = self._id_of[c] = len(self._table)
            self._table.append(c)
        return got

    def _sync(self, classes: Mapping[str, NodeClass], net: NetworkIndex, leaves: Leaves) -> None:
        """Bring every array up to date with `classes` (the current build's)."""
        if self._net is not net or len(self._table) > self.MAX_TABLE:
            nodes = net.nodes
            if self._net is not net:
                frags = np.empty(len(nodes), object)
                frags[:] = [_frag(n) for n in nodes]
                self._frags = frags
                self._leaf_of_pos = (
                    np.asarray(leaves.leaf, np.int64) if leaves.leaf else np.full(len(nodes), -1, np.int64)
                )
            self._table, self._id_of = [], {}
            get, ident = classes.get, self._id
            self._ids = np.fromiter((ident(get(n)) for n in nodes), np.int64, len(nodes))
            table = self._table
            self._pos_count = np.fromiter(
                ((table[i].count if i >= 0 else 0) for i in self._ids.tolist()), np.int64, len(nodes)
            )
            leaf = self._leaf_of_pos
            has = leaf >= 0
            self._leaf_room = np.bincount(
                leaf[has], weights=self._pos_count[has], minlength=len(leaves.members)
            ).astype(np.int64)
            self._net = net
            self._pending.clear()
            return
        if self._pending:
            position = net.position
            for name in self._pending:
                p = position.get(name)
                if p is None:
                    continue
                c = classes.get(name)
                self._ids[p] = self._id(c)
                new = c.count if c is not None else 0
                leaf = self._leaf_of_pos[p]
                if leaf >= 0:
                    self._leaf_room[leaf] += new - self._pos_count[p]
                self._pos_count[p] = new
            self._pending.clear()

    def _places(self, names: Sequence[str]) -> np.ndarray | None:
        """Each asked candidate's network position (the index `_sync` made the arrays for);
        None when one is not in the index."""
        assert self._net is not None
        position = self._net.position
        try:  # a miss raises; hashing the freshly decoded names is most of the ~2 ms at 20,000
            places = np.asarray([position[n] for n in names], np.int64)
        except (KeyError, TypeError):
            return None
        return places

    def rank(
        self,
        names: Sequence[str],
        gpus: int,
        classes: Mapping[str, NodeClass],
        net: NetworkIndex,
        leaves: Leaves,
        score: ClassScorer,
    ) -> Ranked | None:
        """The scores of `names` for a pod of `gpus` (module docstring), or None when the kept
        picture cannot answer (a name the network index does not hold: the caller's per-node
        path answers)."""
        self._sync(classes, net, leaves)
        places = self._places(names)
        if places is None:
            return None
        ids = self._ids[places]
        present, first = np.unique(ids, return_index=True)
        order = np.argsort(first, kind="stable")
        present, first = present[order], first[order]
        known = present >= 0
        table = self._table
        reps = [table[i] for i in present[known].tolist()]
        rep_names = [names[i] for i in first[known].tolist()]
        by_class = np.zeros(len(table) + 1, np.int64)  # the last slot: unknown (-1) scores 0
        if reps:
            by_class[present[known]] = np.asarray(score(reps, rep_names), np.int64)
        scores = by_class[ids]
        self._pack(scores, places)
        return Ranked(names, scores, self._frags, places)

    def _pack(self, scores: np.ndarray, places: np.ndarray) -> None:
        """`Leaves.pack_scores` on the arrays: the top-score candidates outside the leaf with
        the fewest free GPUs (among the top candidates' leaves) get one point less. A name
        asked twice counts once, as in the per-node path (a leaf is touched or not)."""
        at_top = scores == MAX_SCORE
        if int(np.count_nonzero(at_top)) < 2:
            return
        leaf = self._leaf_of_pos[places]
        top_leaves = leaf[at_top]
        touched = np.unique(top_leaves[top_leaves >= 0])
        if len(touched) < 2:
            return
        room = self._leaf_room
        least = room[touched].min()
        demote = at_top & (leaf >= 0) & (room[np.maximum(leaf, 0)] != least)
        scores[demote] = MAX_SCORE - 1
