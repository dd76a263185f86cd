"""From cluster state to the planner's NodeViews: which GPUs of each node are really free.

A node's plugin annotation lags behind the scheduler (a pod bound a second ago is not in it
yet), so the free set is the annotation's, minus the GPUs of our own recent binds, minus what
bound pods hold beyond what the annotation shows (those GPUs are the ones the node allocator
would have handed out, so the same allocator picks them), minus reservations. A node whose
topology is unknown keeps a plain count and a neutral score.

"The node allocator" is the policy that node's plugin publishes in its annotation (`policy`,
gputopo's exact allocator when absent), so a node A/B-testing NVIDIA's or HAMi's choice is
predicted with that choice; one policy object per (policy, topology) serves every such node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gputopo.allocator import AllocationError
from gputopo.gang import NodeView
from gputopo.policy import GpuPolicy, PolicyPool
from gputopo.reservations import Assumed, Reservation
from scheduler.model import NodeInfo, Snapshot

__all__ = ["Assumed", "ViewBuilder", "node_view"]


def _take(alloc: GpuPolicy | None, free: set[int], count: int) -> set[int]:
    """The `count` GPUs the node allocator would hand out from `free` (or the lowest ones)."""
    count = min(count, len(free))
    if count <= 0:
        return set()
    if alloc is not None:
        try:
            return set(alloc.choose(sorted(free), count).indices)
        except AllocationError:
            pass
    return set(sorted(free)[:count])


def node_view(
    info: NodeInfo,
    alloc: GpuPolicy | None,
    pod_gpus: int,
    assumed: Iterable[Assumed],
    reserved: Iterable[Reservation],
    bound: frozenset[str] | set[str] = frozenset(),
) -> NodeView:
    """The free GPUs of one node; `pod_gpus` is what pods bound to it (per the watch) hold, and
    `bound` names those pods, so an assumed bind the watch already shows is not counted twice."""
    topo = info.topology
    assumed = list(assumed)
    unseen = sum(a.count for a in assumed if a.pod not in bound)
    if topo is None:
        used = pod_gpus + unseen + sum(r.count for r in reserved)
        free_count = max(0, info.gpu_capacity - used)
        return NodeView(info.name, info.labels, info.gpu_capacity, frozenset(range(free_count)), None)
    free = set(topo.free)
    if info.pods_know_allocations:
        lag = pod_gpus + unseen - len(topo.allocated)
        for a in assumed:
            if a.at >= topo.generated_at:
                hit = free.intersection(a.gpus)
                free -= hit
                lag -= len(hit)
        free -= _take(alloc, free, lag)
    for r in reserved:
        if r.gpus:
            free -= set(r.gpus)
        else:
            free -= _take(alloc, free, r.count)
    return NodeView(info.name, info.labels, topo.topology.n, frozenset(free), alloc)


class ViewBuilder:
    """Builds the NodeViews of a whole snapshot, recomputing only the nodes whose inputs changed.

    At 5,000 nodes a full rebuild costs more than a filter call may take, while a typical change
    (a pod asked about, a bind, one node's annotation) touches one node or none."""

    def __init__(self) -> None:
        self.policies = PolicyPool()
        self.allocators = self.policies.allocators
        self._whole: tuple | None = None
        self._views: dict[str, NodeView] = {}
        self._inputs: dict[str, tuple] = {}

    def build(
        self,
        snap: Snapshot,
        assumed: Mapping[str, Assumed],
        assumed_version: int,
        reservations_by_node: Mapping[str, list[Reservation]],
        reservations_version: int,
    ) -> dict[str, NodeView]:
        bound = frozenset(k for k in assumed if (p := snap.pods.get(k)) is not None and p.node)
        whole = (snap.nodes, snap.pod_gpus, assumed_version, reservations_version, bound)
        last = self._whole
        if last is not None and last[0] is whole[0] and last[1] is whole[1] and last[2:] == whole[2:]:
            return self._views
        assumed_by_node: dict[str, list[Assumed]] = {}
        for a in assumed.values():
            assumed_by_node.setdefault(a.node, []).append(a)
        views: dict[str, NodeView] = {}
        inputs: dict[str, tuple] = {}
        pod_gpus = snap.pod_gpus
        old_inputs, old_views = self._inputs, self._views
        for name, info in snap.nodes.items():
            mine = assumed_by_node.get(name)
            held = reservations_by_node.get(name)
            key = (
                info,
                pod_gpus.get(name, 0),
                tuple(mine) if mine else (),
                tuple(held) if held else (),
                bound if mine else frozenset(),
            )
            old = old_inputs.get(name)
            if old is not None and old[0] is info and old[1:] == key[1:]:
                views[name] = old_views[name]
            else:
                topo = info.topology
                alloc = self.policies.get(topo.policy, topo.topology) if topo is not None else None
                views[name] = node_view(info, alloc, key[1], key[2], key[3], bound)
            inputs[name] = key
        self._whole, self._views, self._inputs = whole, views, inputs
        return views
