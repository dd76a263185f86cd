"""The gang planner's memo (`PlanMemo`): what planning calls work out that is a function of the
node views and the network index alone, kept across calls by the caller.

A `ChoiceMemo` (the allocator answers, which single-pod placement shares) with one typed entry
per thing the planner keeps. Owned by the caller, never global: the `GangTracker` keeps one
(the sidecar's and the simulator's gangs, and the sidecar's single pods through
`GangTracker.memo`); `plan_gang` and `plan_tree` make one per call when given none.

Every entry is for one network index (`index`): they are keyed on its positions and levels.
An entry made from node views holds those views, so that an id in its key stays theirs while
it is kept; `own` empties every entry for another index, or once they hold more than
`VIEWS_HELD` views (`held`, counted as entries are added). Pure: no I/O, no clock, no globals.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gputopo.gang.candidate import Candidate
from gputopo.network.levels import LevelIndex, NetworkIndex
from gputopo.network.nodeview import ChoiceMemo, NodeView, Quality
from gputopo.node.allocator import Choice
from gputopo.node.policy import GpuPolicy
from gputopo.pod.objective import ClusterObjective

#: Node views the entries of one memo may hold before they are all dropped.
VIEWS_HELD = 200_000

#: A node's allocator and free set: nodes of one kind answer alike.
Kind = tuple[GpuPolicy | None, frozenset[int]]
#: Per kind of node in a domain: the running worst of its members' sets (`floor`), their
#: choices one after the other, and the node positions of that kind, in name order.
Kinds = dict[Kind, tuple[list[Quality], list[Choice | None], list[int]]]
#: A domain's kinds with, per kind, its first member's quality and its node count, best first
#: (what `domain.worst_cap` reads; the first member's set does not depend on the member count).
Firsts = list[tuple[Quality, int]]
#: `domain._domain_kinds`' answer: the member count it was worked out for, the most members
#: one node got, its `Kinds` and its `Firsts`.
DomainKinds = tuple[int, int, Kinds, Firsts]
#: One node's only offer (`singleoffer`): its member's quality, set, and kind.
Offer = tuple[Quality, Choice | None, Kind]
#: Per domain (`singleoffer._rooms`): its nodes with an offer (name order), their offers'
#: qualities best first, its free GPUs, and `singleoffer._pick`'s answers on those views
#: (keyed on what else they depend on).
Room = tuple[
    list[int], list[Quality], int, dict[tuple[object, ...], tuple[list[int], float | None, tuple[int, ...]]]
]
#: Picks a domain's entries out of a per-position list (`domain.level_bounds`).
CountGetter = Callable[[list[int]], tuple[int, ...]]
#: A domain's node views, in position order (None where the caller gave none).
Views = tuple[NodeView | None, ...]
#: A planning call's views list, per index position (`domain.Problem.views`).
ViewList = list[NodeView | None]


@dataclass(slots=True)
class Layout:
    """`planner._layout`'s answer for the nodes list `nodes`: per index position its view and
    free GPUs, each node's GPU count (in `nodes` order), the largest of those, and the objective
    that learned the nodes' allocators (None: none did). Made once per call, its `learner` set
    before it is kept; a kept one is never changed (the next call copies its lists)."""

    nodes: tuple[NodeView, ...]
    views: ViewList
    counts: list[int]
    gpus: list[int]
    largest: int
    learner: ClusterObjective | None = None


class PlanMemo(ChoiceMemo):
    """Allocator answers (`ChoiceMemo`), and the gang planner's answers for one network index."""

    def __init__(self) -> None:
        super().__init__()
        #: the index every entry is for (None: none yet), and the node views they hold
        self.index: NetworkIndex | None = None
        self.held = 0
        #: `planner._layout`'s last answer
        self.layout: Layout | None = None
        #: per level: `spread.lower_levels` (with the index it is of)
        self.lower: dict[str, tuple[NetworkIndex, list[LevelIndex]]] = {}
        #: per level: `lx.members` as lists, a `CountGetter` per domain, `lx.domain_id` as a
        #: list (each with the `LevelIndex` it was made from)
        self.members: dict[str, tuple[LevelIndex, list[list[int]]]] = {}
        self.getters: dict[str, tuple[LevelIndex, list[CountGetter]]] = {}
        self.domain_ids: dict[str, tuple[LevelIndex, list[int]]] = {}
        #: `domain.level_bounds`' (free GPUs, fewest nodes) of a domain, per (member size,
        #: member count, its nodes' free GPU counts)
        self.bounds: dict[tuple[int, int, tuple[int, ...]], tuple[int, int]] = {}
        #: `domain._domain_kinds` per (member size, *ids of the domain's views), with the views
        self.kinds: dict[tuple[int, ...], tuple[Views, DomainKinds]] = {}
        #: `domain.evaluate`'s candidate per (level, domain, member size, member count, nodes,
        #: *`domain.cost_key`, *ids of the domain's views), with the views
        self.candidates: dict[tuple[object, ...], tuple[Views, Candidate]] = {}
        #: `singleoffer`'s last offers per member size, and its last rooms per (member size,
        #: level), with the views list they were made from
        self.offers: dict[int, tuple[ViewList, list[Offer | None]]] = {}
        self.rooms: dict[tuple[int, str], tuple[ViewList, list[Room]]] = {}
        #: `predict.predict_kept`'s bus bandwidths per (objective, a plan's nodes and sets), each
        #: with the table and the nodes' servers, labels and GPU counts it was read with
        self.busbw: dict[tuple[object, ...], tuple[object, tuple[object, ...], float]] = {}

    def own(self, index: NetworkIndex) -> None:
        """Empty every entry when they were made for another index or hold too many views."""
        if self.index is not index or self.held > VIEWS_HELD:
            self.layout = None
            for table in self._tables():
                table.clear()
            self.index, self.held = index, 0

    def _tables(self) -> tuple[dict[Any, Any], ...]:
        return (
            self.lower,
            self.members,
            self.getters,
            self.domain_ids,
            self.bounds,
            self.kinds,
            self.candidates,
            self.offers,
            self.rooms,
            self.busbw,
        )

    def __len__(self) -> int:
        """Allocator answers and planner entries (what an owner bounds the memo by)."""
        return super().__len__() + (self.layout is not None) + sum(map(len, self._tables()))
