"""The views of one snapshot as node classes: nodes that answer every question alike share one.

Two nodes with the same allocator and the same free GPUs get the same answer from every
decision the core makes for a single pod (room for k GPUs, the best set, its score), which is
why the simulator keeps its nodes in (topology, free mask) classes (gputopo/sim/state.py). The
sidecar does the same: a node whose annotation changed costs one class lookup, a filter one
count comparison, and prioritize scores one node per class (`NodeViews.classes`). The per-node
`NodeView` the planners read (its name and labels with the class's free set and allocator) is
made on first read and carried over to the next build while the node stays unchanged, so views
keep their identity from one build to the next, which the gang planner's memo relies on.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, ItemsView, Iterable, Iterator, Mapping, Sequence, ValuesView
from itertools import compress

from gputopo.gang.reservations import Reservation
from gputopo.network.nodeview import NodeView
from gputopo.node.allocator import AllocationError
from gputopo.node.policy import GpuPolicy
from scheduler.model import NodeInfo
from scheduler.picture.layered import Layered


class NodeClass:
    """What every node of one class shares: allocator (None = unknown topology), GPU count,
    free GPUs (net of own binds and reservations), the GPUs kubelet would offer the node's
    plugin now (`scheduler.picture.views.offered`; reservations included, empty for unknown topology),
    and the reservations held on the node (`held`: only a node with reservations has any, and
    such a node has a class of its own).

    The reservation rule lives here, so that filter, prioritize and bind cannot disagree on it
    (issue 30): kubelet offers the plugin reserved GPUs too, and the plugin's pick from that offer
    (`gives`) is what a pod bound now really gets, so a pod outside a gang plan may use a node
    only when that pick avoids every reservation (`takes_reserved`). Judging by the free count
    alone let a single pod bound beside a member's reservation land inside it."""

    __slots__ = ("_gives", "allocator", "count", "free", "gpu_count", "held", "offer")

    def __init__(
        self,
        allocator: GpuPolicy | None,
        gpu_count: int,
        free: frozenset[int],
        offer: frozenset[int],
        held: tuple[Reservation, ...] = (),
    ) -> None:
        self.allocator = allocator
        self.gpu_count = gpu_count
        self.free = free
        self.count = len(free)
        self.offer = offer
        self.held = held
        self._gives: dict[int, tuple[int, ...] | None] = {}  # size -> `gives` (pure per class)

    def gives(self, size: int) -> tuple[int, ...] | None:
        """The GPUs the node's plugin gives a pod of `size` bound now: its allocator's choice
        from what kubelet offers it, reservations included. None when that cannot be told
        (unknown topology, too few offered, the allocator refuses)."""
        if size in self._gives:
            return self._gives[size]
        out: tuple[int, ...] | None = None
        if self.allocator is not None and 0 < size <= len(self.offer):
            try:
                out = tuple(self.allocator.choose(sorted(self.offer), size).indices)
            except AllocationError:
                out = None
        if len(self._gives) < 64:
            self._gives[size] = out
        return out

    def takes_reserved(self, size: int, *, excluding: str = "") -> tuple[Reservation, ...]:
        """The reservations (other than `excluding`'s, a member's own) that a pod of `size`
        bound here now would take GPUs of: those the plugin's pick (`gives`) overlaps. Empty
        when the node holds none, or its topology is unknown (reservations are then a count,
        already out of `free`)."""
        if not self.held or size <= 0:
            return ()
        pick = self.gives(size)
        if not pick:
            return ()
        mine = set(pick)
        return tuple(r for r in self.held if r.pod != excluding and mine.intersection(r.gpus))


class NodeViews(Mapping[str, NodeView]):
    """Node name -> NodeView of one build (read-only); `count` and `classes` answer without
    making views. Holds per node only its class: a build after every annotation changed
    allocates nothing per node (no work for the cycle collector in the middle of a filter)."""

    __slots__ = ("_answers", "_base", "_classes", "_generation", "_gone", "_infos", "_made")

    def __init__(
        self,
        classes: Layered[str, NodeClass],
        infos: Mapping[str, NodeInfo],
        made: dict[str, NodeView],
        answers: Answers | None = None,
        base: Mapping[str, NodeView] | None = None,
        gone: frozenset[str] = frozenset(),
    ) -> None:
        self._classes = classes
        self._infos = infos
        # Views already made, in two layers: `_base` (shared with earlier builds, never
        # changed: unchanged nodes' views carry over without a copy of every entry) less the
        # nodes in `_gone` (changed since it was made), under `_made`, this build's own.
        self._made = made
        self._base: Mapping[str, NodeView] = base if base is not None else {}
        self._gone = gone
        self._answers = answers  # the builder's, current while its generation is this one's
        self._generation = answers.generation if answers is not None else -1

    def __getitem__(self, name: str) -> NodeView:
        view = self._made.get(name)
        if view is None:
            if name not in self._gone:
                view = self._base.get(name)
                if view is not None:
                    return view
            c, info = self._classes[name], self._infos[name]
            view = self._made[name] = NodeView(info.name, info.labels, c.gpu_count, c.free, c.allocator)
        return view

    def __contains__(self, name: object) -> bool:
        return name in self._classes

    def values(self) -> ValuesView[NodeView]:
        return _Values(self)

    def items(self) -> ItemsView[str, NodeView]:
        return _Items(self)

    def every_view(self) -> list[NodeView]:
        """Every node's view in the snapshot's order, made where not made yet: one loop with
        the lookups inlined (the Mapping mixins' `values()` calls `__getitem__` per node
        through a generator: ~0.1 s per pass at 20,000 nodes, and a gang plan made two)."""
        made, base, gone, classes, infos = self._made, self._base, self._gone, self._classes, self._infos
        out: list[NodeView] = []
        append = out.append
        for name in infos:
            view = made.get(name)
            if view is None:
                view = None if name in gone else base.get(name)
                if view is None:
                    c, info = classes[name], infos[name]
                    view = made[name] = NodeView(info.name, info.labels, c.gpu_count, c.free, c.allocator)
            append(view)
        return out

    def __iter__(self) -> Iterator[str]:
        # the snapshot's order (a build that redid a few nodes may hold its classes in another)
        return iter(self._infos)

    def __len__(self) -> int:
        return len(self._classes)

    __hash__ = object.__hash__  # views objects are compared and cached by identity

    def __eq__(self, other: object) -> bool:
        return self is other

    def current(self) -> bool:
        """Whether these are the builder's latest views (what it keeps answers for: `Answers`,
        `scheduler.picture.ranks.Ranks`)."""
        return self._answers is not None and self._answers.generation == self._generation

    def class_map(self) -> Mapping[str, NodeClass]:
        """Node -> its class (read-only)."""
        return self._classes

    def made_view(self, name: str) -> NodeView | None:
        """The view of `name` if one was made (by this build or carried over), else None."""
        view = self._made.get(name)
        if view is None and name not in self._gone:
            view = self._base.get(name)
        return view

    def made_layers(self) -> tuple[Mapping[str, NodeView], frozenset[str], dict[str, NodeView]]:
        """(base, gone, own): the views made so far as `__init__` layers them, for the next
        build to carry over those of unchanged nodes (read-only)."""
        return self._base, self._gone, self._made

    def node_class(self, name: str) -> NodeClass | None:
        return self._classes.get(name)

    def count(self, name: str) -> int | None:
        """How many GPUs of `name` are free (None: unknown to gputopo)."""
        c = self._classes.get(name)
        return None if c is None else c.count

    def split(
        self, names: Sequence[str], gpus: int, good: Callable[[NodeClass], bool] | None = None
    ) -> tuple[list[str], dict[str, str], set[str]]:
        """The filter's answer: the candidates with at least `gpus` free (and whose plugin would
        not give the pod reserved GPUs), the reason for each other one, and those of them whose
        class `good` turns down (asked once per class; none without `good`), for the caller to
        drop or keep. Asked again with the same candidates on these views or a later build of
        the same builder, the answer kept for them (`Answers`) is patched for the nodes changed
        since, rather than redone over every candidate."""
        answers = self._answers
        if good is None and answers is not None and answers.generation == self._generation and names:
            hit = answers.get(names, gpus, self._classes)
            if hit is not None:
                return hit[0], hit[1], set()
            ok, failed, _ = self._split(names, gpus, None)
            answers.put(names, gpus, ok, failed)
            return ok, failed, set()
        return self._split(names, gpus, good)

    def _split(
        self, names: Iterable[str], gpus: int, good: Callable[[NodeClass], bool] | None
    ) -> tuple[list[str], dict[str, str], set[str]]:
        """`split` in one pass over the candidates."""
        ok: list[str] = []
        failed: dict[str, str] = {}
        declined: set[str] = set()
        reasons: dict[int, str] = {}
        verdicts: dict[NodeClass, bool] = {}
        base, delta = self._classes.parts()
        get, replaced = base.get, delta.get
        for n in names:
            c = (replaced(n) or get(n)) if delta else get(n)
            if c is None:
                failed[n] = UNKNOWN
            elif c.count >= gpus and c.held and (taken := c.takes_reserved(gpus)):
                failed[n] = reserved_reason(c, gpus, taken)
            elif c.count >= gpus:
                ok.append(n)
                if good is not None:
                    fine = verdicts.get(c)
                    if fine is None:
                        fine = verdicts[c] = good(c)
                    if not fine:
                        declined.add(n)
            else:
                why = reasons.get(c.count)
                if why is None:
                    why = reasons[c.count] = f"needs {gpus} GPUs, {c.count} free"
                failed[n] = why
        return ok, failed, declined

    def classes(self, names: Iterable[str]) -> dict[NodeClass, list[str]]:
        """The known nodes among `names`, grouped by class (in first-seen order)."""
        out: dict[NodeClass, list[str]] = {}
        base, delta = self._classes.parts()
        get, replaced = base.get, delta.get
        for n in names:
            c = (replaced(n) or get(n)) if delta else get(n)
            if c is not None:
                members = out.get(c)
                if members is None:
                    out[c] = [n]
                else:
                    members.append(n)
        return out

    def offer(self, name: str) -> frozenset[int] | None:
        c = self._classes.get(name)
        return None if c is None else c.offer

    def takes_reserved(self, name: str, size: int, *, excluding: str = "") -> tuple[Reservation, ...]:
        """`NodeClass.takes_reserved` of node `name` (nothing for a node unknown to gputopo)."""
        c = self._classes.get(name)
        return () if c is None or not c.held else c.takes_reserved(size, excluding=excluding)


class _Values(ValuesView[NodeView]):
    """`NodeViews.values()`: iterates `every_view` (one pass, lookups inlined)."""

    _mapping: NodeViews

    def __iter__(self) -> Iterator[NodeView]:
        return iter(self._mapping.every_view())


class _Items(ItemsView[str, NodeView]):
    """`NodeViews.items()`: the names with `every_view`, in the snapshot's order."""

    _mapping: NodeViews

    def __iter__(self) -> Iterator[tuple[str, NodeView]]:
        views = self._mapping
        return zip(list(views._infos), views.every_view(), strict=True)


UNKNOWN = "node unknown to gputopo"


def verdict(c: NodeClass | None, gpus: int) -> str | None:
    """Why a node of class `c` (None: unknown to gputopo) fails a pod of `gpus` GPUs, or None
    when it passes: `NodeViews._split`'s rule for one node, as `Answers` patches it."""
    if c is None:
        return UNKNOWN
    if c.count >= gpus:
        if c.held and (taken := c.takes_reserved(gpus)):
            return reserved_reason(c, gpus, taken)
        return None
    return f"needs {gpus} GPUs, {c.count} free"


def _same(names: Sequence[str], kept: list[str]) -> bool:
    """`names` holds the kept candidates in the same order (a C-level compare of two lists,
    string by string: identical objects compare by address)."""
    if len(names) != len(kept):
        return False
    return (names if isinstance(names, list) else list(names)) == kept


class _Answer:
    """The filter's answer for one pod size over the kept candidates: the passing ones with
    their places among the candidates (ascending), whether each candidate passes (`passes`,
    by place), the reason of each failing one, and the nodes changed since it was last right
    (`pending`)."""

    __slots__ = ("failed", "ok", "passes", "pending", "places")

    def __init__(self, ok: list[str], places: list[int], passes: list[bool], failed: dict[str, str]) -> None:
        self.ok = ok
        self.places = places
        self.passes = passes
        self.failed = failed
        self.pending: set[str] = set()


#: pending nodes beyond which the passing list is redone from `_Answer.passes` in one C-level
#: pass rather than by an insert or delete each (each moves the list's tail: O(candidates))
REDO_AFTER = 16


class Answers:
    """The filter's answers for the last candidate list, per pod size, kept across builds.

    kube-scheduler offers an extender the same feasible nodes call after call while the cluster
    changes a node at a time. A pass over 60,000 candidates costs ~25 ms of CPU in Python (three
    cache misses a candidate: its name, the class table, the output) however cheap each test
    is, so the answer for those candidates is kept per size and, when a build changed some
    nodes (`changed`), patched for those nodes only at the next question: a place found by
    bisection, a list insert or delete, a dict entry. What a caller gets is a copy (two C-level
    copies). Owned by one ViewBuilder: `generation` tells which build's views it answers for
    (an older views object answers with a pass of its own). Not thread-safe: the extender's
    lock guards it, as it guards the builder."""

    #: pod sizes kept at most (each a list and a dict over the candidates)
    MAX_SIZES = 8

    def __init__(self) -> None:
        self.generation = 0
        self._names: list[str] = []  # the kept candidates (a copy of the caller's list)
        self._place: dict[str, int] = {}  # candidate -> its place among them
        self._by_size: dict[int, _Answer] = {}

    def reset(self) -> None:
        """Every node may have changed: nothing kept is right any more."""
        self.generation += 1
        self._by_size.clear()

    def changed(self, names: Iterable[str]) -> None:
        """These nodes' classes may have changed since the last build (a new generation)."""
        self.generation += 1
        if not self._by_size:
            return
        names = [n for n in names if n in self._place]
        for size, kept in list(self._by_size.items()):
            kept.pending.update(names)
            if len(kept.pending) > len(self._names) // 8 + 64:  # a fresh pass costs less
                del self._by_size[size]

    def get(
        self, names: Sequence[str], gpus: int, classes: Mapping[str, NodeClass]
    ) -> tuple[list[str], dict[str, str]] | None:
        """The answer for `names` (the kept candidates, in the same order) and `gpus`, patched
        for the nodes changed since it was kept, as copies; None when none is kept."""
        kept = self._by_size.get(gpus)
        if kept is None or not _same(names, self._names):
            return None
        if kept.pending:
            ok, places, passes, failed, place = kept.ok, kept.places, kept.passes, kept.failed, self._place
            redo = len(kept.pending) > REDO_AFTER
            for name in kept.pending:
                at = place[name]
                why = verdict(classes.get(name), gpus)
                if why is None:
                    failed.pop(name, None)
                else:
                    failed[name] = why
                if passes[at] == (why is None):
                    continue
                passes[at] = why is None
                if redo:
                    continue
                i = bisect_left(places, at)
                if why is None:
                    places.insert(i, at)
                    ok.insert(i, name)
                else:
                    del places[i]
                    del ok[i]
            if redo:
                kept.ok = list(compress(self._names, passes))
                kept.places = list(compress(range(len(passes)), passes))
            kept.pending.clear()
        return kept.ok.copy(), kept.failed.copy()

    def put(self, names: Sequence[str], gpus: int, ok: list[str], failed: dict[str, str]) -> None:
        """Keep the answer a pass over `names` gave for `gpus` (on the current build). A new
        candidate list replaces the kept one (and every size's answer); a list with repeats is
        not kept."""
        if not _same(names, self._names):
            place = {n: i for i, n in enumerate(names)}
            if len(place) != len(names):
                return
            self._names, self._place = list(names), place
            self._by_size.clear()
        if len(self._by_size) >= self.MAX_SIZES:
            del self._by_size[next(iter(self._by_size))]
        place = self._place
        places = [place[n] for n in ok]
        passes = [False] * len(names)
        for at in places:
            passes[at] = True
        self._by_size[gpus] = _Answer(ok.copy(), places, passes, failed.copy())


def reserved_reason(c: NodeClass, size: int, taken: Iterable[Reservation]) -> str:
    """Why a pod of `size` may not use a node of class `c` now: which reserved GPUs its plugin
    would give it, and for whom (the member and its gang), as filter and bind report it."""
    pick = set(c.gives(size) or ())
    whose = "; ".join(
        f"GPUs {sorted(pick.intersection(r.gpus))} reserved for {r.pod} of gang {r.gang}"
        for r in taken
        if pick.intersection(r.gpus)
    )
    return f"needs {size} GPUs: the node's plugin would give it {whose} (reservations counted as taken)"


class Offers(Mapping[str, frozenset[int]]):
    """Node -> the GPUs kubelet would offer its plugin now, for nodes with any (read-only)."""

    __slots__ = ("_classes",)

    def __init__(self, classes: Mapping[str, NodeClass]) -> None:
        self._classes = classes

    def __getitem__(self, name: str) -> frozenset[int]:
        offer = self._classes[name].offer
        if not offer:
            raise KeyError(name)
        return offer

    def __iter__(self) -> Iterator[str]:
        return (n for n, c in self._classes.items() if c.offer)

    def __len__(self) -> int:
        return sum(1 for c in self._classes.values() if c.offer)
