"""The views of one snapshot as node classes: nodes that answer every question alike share one.

Two nodes with the same allocator and the same free GPUs get the same answer from every
decision the core makes for a single pod (room for k GPUs, the best set, its score), which is
why the simulator keeps its nodes in (topology, free mask) classes (gputopo/sim/state.py). The
sidecar does the same: a node whose annotation changed costs one class lookup, a filter one
count comparison, and prioritize scores one node per class (`NodeViews.classes`). The per-node
`NodeView` the planners read (its name and labels with the class's free set and allocator) is
made on first read and kept with the node's entry, so views of nodes that did not change keep
their identity from one build to the next, which the gang planner's memo relies on.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from gputopo.gang import NodeView
from gputopo.policy import GpuPolicy
from scheduler.model import NodeInfo


class NodeClass:
    """What every node of one class shares: allocator (None = unknown topology), GPU count,
    free GPUs (net of own binds and reservations), and the GPUs kubelet would offer the node's
    plugin now (`scheduler.views.offered`; reservations included, empty for unknown topology)."""

    __slots__ = ("allocator", "count", "free", "gpu_count", "offer", "topology")

    def __init__(
        self,
        allocator: GpuPolicy | None,
        gpu_count: int,
        free: frozenset[int],
        offer: frozenset[int],
        topology: object = None,
    ) -> None:
        self.allocator = allocator
        self.gpu_count = gpu_count
        self.free = free
        self.count = len(free)
        self.offer = offer
        self.topology = topology  # kept alive: class keys hold its id()


class Entry:
    """One node in one or more builds: its inputs, class and (once read) its NodeView. Shared
    by consecutive builds while the node's inputs stay the same."""

    __slots__ = ("cls", "conflicts", "info", "key", "pod_gpus", "view")

    def __init__(
        self,
        info: NodeInfo,
        pod_gpus: int,
        cls: NodeClass,
        view: NodeView | None = None,
        key: tuple | None = None,
        conflicts: Mapping[str, str] | None = None,
    ) -> None:
        self.info = info
        self.pod_gpus = pod_gpus
        self.cls = cls
        self.view = view
        self.key = key  # the general path's inputs; None for a node with no own binds etc.
        self.conflicts = conflicts


class NodeViews(Mapping[str, NodeView]):
    """Node name -> NodeView of one build (read-only); `count` and `classes` answer without
    making views."""

    __slots__ = ("_entries",)

    def __init__(self, entries: dict[str, Entry]) -> None:
        self._entries = entries

    def __getitem__(self, name: str) -> NodeView:
        e = self._entries[name]
        view = e.view
        if view is None:
            c, info = e.cls, e.info
            view = e.view = NodeView(info.name, info.labels, c.gpu_count, c.free, c.allocator)
        return view

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    __hash__ = object.__hash__  # views objects are compared and cached by identity

    def __eq__(self, other: object) -> bool:
        return self is other

    def count(self, name: str) -> int | None:
        """How many GPUs of `name` are free (None: unknown to gputopo)."""
        e = self._entries.get(name)
        return None if e is None else e.cls.count

    def fitting(self, gpus: int) -> frozenset[str]:
        """Nodes with at least `gpus` free."""
        return frozenset(n for n, e in self._entries.items() if e.cls.count >= gpus)

    def classes(self, names: Iterable[str]) -> dict[NodeClass, list[str]]:
        """The known nodes among `names`, grouped by class (in first-seen order)."""
        out: dict[NodeClass, list[str]] = {}
        entries = self._entries
        for n in names:
            e = entries.get(n)
            if e is not None:
                members = out.get(e.cls)
                if members is None:
                    out[e.cls] = [n]
                else:
                    members.append(n)
        return out

    def offer(self, name: str) -> frozenset[int] | None:
        e = self._entries.get(name)
        return None if e is None else e.cls.offer


class Offers(Mapping[str, frozenset[int]]):
    """Node -> the GPUs kubelet would offer its plugin now, for nodes with any (read-only)."""

    __slots__ = ("_entries",)

    def __init__(self, entries: Mapping[str, Entry]) -> None:
        self._entries = entries

    def __getitem__(self, name: str) -> frozenset[int]:
        offer = self._entries[name].cls.offer
        if not offer:
            raise KeyError(name)
        return offer

    def __iter__(self) -> Iterator[str]:
        return (n for n, e in self._entries.items() if e.cls.offer)

    def __len__(self) -> int:
        return sum(1 for e in self._entries.values() if e.cls.offer)
