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

from collections.abc import Callable, Iterable, Iterator, Mapping

from gputopo.gang.reservations import Reservation
from gputopo.network.nodeview import NodeView
from gputopo.node.allocator import AllocationError
from gputopo.node.policy import GpuPolicy
from scheduler.model import NodeInfo


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

    __slots__ = ("_classes", "_infos", "_made")

    def __init__(
        self, classes: dict[str, NodeClass], infos: Mapping[str, NodeInfo], made: dict[str, NodeView]
    ) -> None:
        self._classes = classes
        self._infos = infos
        self._made = made  # views already made: those of unchanged nodes carry over

    def __getitem__(self, name: str) -> NodeView:
        view = self._made.get(name)
        if view is None:
            c, info = self._classes[name], self._infos[name]
            view = self._made[name] = NodeView(info.name, info.labels, c.gpu_count, c.free, c.allocator)
        return view

    def __contains__(self, name: object) -> bool:
        return name in self._classes

    def __iter__(self) -> Iterator[str]:
        return iter(self._classes)

    def __len__(self) -> int:
        return len(self._classes)

    __hash__ = object.__hash__  # views objects are compared and cached by identity

    def __eq__(self, other: object) -> bool:
        return self is other

    def made_views(self) -> Mapping[str, NodeView]:
        """The views made so far (for the next build to carry over those of unchanged nodes)."""
        return self._made

    def node_class(self, name: str) -> NodeClass | None:
        return self._classes.get(name)

    def count(self, name: str) -> int | None:
        """How many GPUs of `name` are free (None: unknown to gputopo)."""
        c = self._classes.get(name)
        return None if c is None else c.count

    def split(
        self, names: Iterable[str], gpus: int, good: Callable[[NodeClass], bool] | None = None
    ) -> tuple[list[str], dict[str, str], set[str]]:
        """The filter's answer, in one pass over the candidates: those with at least `gpus`
        free, the reason for each other one, and those of them whose class `good` turns down
        (asked once per class; none without `good`), for the caller to drop or keep."""
        ok: list[str] = []
        failed: dict[str, str] = {}
        declined: set[str] = set()
        reasons: dict[int, str] = {}
        verdicts: dict[NodeClass, bool] = {}
        classes = self._classes
        for n in names:
            c = classes.get(n)
            if c is None:
                failed[n] = "node unknown to gputopo"
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
        classes = self._classes
        for n in names:
            c = classes.get(n)
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
