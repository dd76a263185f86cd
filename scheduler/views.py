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

import gc
from collections.abc import Iterable, Mapping
from dataclasses import replace

from gputopo.allocator import AllocationError
from gputopo.gang import NodeView
from gputopo.policy import GpuPolicy, PolicyPool
from gputopo.reservations import Assumed, Reservation
from scheduler.model import NodeInfo, Snapshot
from scheduler.nodeguard import NodeGuard, describe

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
    ended: frozenset[str] = frozenset(),
) -> NodeView:
    """The free GPUs of one node; `pod_gpus` is what pods bound to it (per the watch) hold, and
    `bound` names those pods, so an assumed bind the watch already shows is not counted twice;
    `ended` names pods the watch saw end here, whose GPUs the annotation's pod map still lists."""
    topo = info.topology
    assumed = list(assumed)
    if topo is None:
        unseen = sum(a.count for a in assumed if a.pod not in bound)
        used = pod_gpus + unseen + sum(r.count for r in reserved)
        free_count = max(0, info.gpu_capacity - used)
        return NodeView(info.name, info.labels, info.gpu_capacity, frozenset(range(free_count)), None)
    free = _unreserved(alloc, offered(info, alloc, pod_gpus, assumed, bound, ended), reserved)
    return NodeView(info.name, info.labels, topo.topology.n, frozenset(free), alloc)


def _unreserved(alloc: GpuPolicy | None, offer: set[int], reserved: Iterable[Reservation]) -> set[int]:
    """What stays free of `offer` once reservations hold theirs."""
    free = set(offer)
    for r in reserved:
        if r.gpus:
            free -= set(r.gpus)
        else:
            free -= _take(alloc, free, r.count)
    return free


def offered(
    info: NodeInfo,
    alloc: GpuPolicy | None,
    pod_gpus: int,
    assumed: Iterable[Assumed],
    bound: frozenset[str] | set[str] = frozenset(),
    ended: frozenset[str] = frozenset(),
) -> set[int]:
    """The GPUs kubelet would offer the node's plugin now: healthy and not in use (per the
    annotation, less pods seen ending, plus our binds it does not show yet and what bound pods
    hold beyond it). Reserved GPUs are in it: kubelet knows nothing of reservations, so this is
    the set the plugin's GetPreferredAllocation picks from. Empty for unknown topology."""
    topo = info.topology
    if topo is None:
        return set()
    assumed = list(assumed)
    unseen = sum(a.count for a in assumed if a.pod not in bound)
    allocated = in_use(info, ended)
    free = set(topo.healthy - allocated)
    if info.pods_know_allocations:
        lag = pod_gpus + unseen - len(allocated)
        for a in assumed:
            if a.at >= topo.generated_at:
                hit = free.intersection(a.gpus)
                free -= hit
                lag -= len(hit)
        free -= _take(alloc, free, lag)
    return free


def in_use(info: NodeInfo, ended: frozenset[str] = frozenset()) -> frozenset[int]:
    """The GPUs the node's annotation reports in use, less those of pods seen ending since."""
    topo = info.topology
    if topo is None:
        return frozenset()
    if not ended or topo.pods is None:
        return topo.allocated
    freed = set().union(*(topo.pods[p] for p in ended if p in topo.pods))
    if freed:  # a GPU another listed pod still holds (shared, or a corrupt map) stays in use
        freed -= set().union(*(g for p, g in topo.pods.items() if p not in ended))
    return topo.allocated - freed


def broken_reservations(info: NodeInfo, reserved: Iterable[Reservation], free: set[int]) -> dict[str, str]:
    """Reservations of this node whose GPUs are no longer among those kubelet would offer
    (`offered`): a pod got them — kubelet offers the plugin reserved GPUs too — or they turned
    unhealthy. Reservation's pod -> reason; the gang holding one must re-plan its unbound members."""
    out = {}
    for r in reserved:
        lost = set(r.gpus) - free
        if lost:
            out[r.pod] = f"reserved GPUs {sorted(lost)} of {info.name} are no longer free"
    return out


class ViewBuilder:
    """Builds the NodeViews of a whole snapshot, recomputing only the nodes whose inputs changed.

    At 5,000 nodes a full rebuild costs more than a filter call may take, while a typical change
    (a pod asked about, a bind, one node's annotation) touches one node or none."""

    def __init__(self, guard: NodeGuard | None = None) -> None:
        self.policies = PolicyPool()  # each node's chooser: the policy its plugin publishes
        self.allocators = self.policies.allocators
        self.guard = guard or NodeGuard()
        self._whole: tuple | None = None
        self._views: dict[str, NodeView] = {}
        self._inputs: dict[str, tuple] = {}
        self._broken: dict[str, dict[str, str]] = {}
        #: node -> the GPUs kubelet would offer its plugin now (see `offered`), for prediction
        self.offered: dict[str, frozenset[int]] = {}
        #: reservation pod -> reason, for reservations whose GPUs are no longer free (see
        #: broken_reservations); recomputed with the views
        self.conflicts: dict[str, str] = {}
        #: (policy, id(topology)) -> (that topology, kept alive so the id stays its own; its
        #: policy object, already probed): a rebuilt node skips the pool's key and the probe
        self._policy_of: dict[tuple[str, int], tuple[object, GpuPolicy]] = {}
        #: (GPU count, unhealthy, in use) -> healthy GPUs not in use, shared by the nodes that match
        self._free_of: dict[tuple[int, frozenset[int], frozenset[int]], frozenset[int]] = {}

    def build(
        self,
        snap: Snapshot,
        assumed: Mapping[str, Assumed],
        assumed_version: int,
        reservations_by_node: Mapping[str, list[Reservation]],
        reservations_version: int,
    ) -> dict[str, NodeView]:
        bound = frozenset(k for k in assumed if (p := snap.pods.get(k)) is not None and p.node)
        whole = (snap.nodes, snap.pod_gpus, assumed_version, reservations_version, bound, snap.ended)
        last = self._whole
        if last is not None and last[0] is whole[0] and last[1] is whole[1] and last[2:] == whole[2:]:
            return self._views
        # A rebuild allocates a few objects per changed node and none that form cycles; left on,
        # the cycle collector would run a young collection every 700 of them and, at 20,000
        # nodes, full collections over the whole heap in the middle of the filter.
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._rebuild(snap, assumed, reservations_by_node, bound, whole)
        finally:
            if collecting:
                gc.enable()

    def _rebuild(
        self,
        snap: Snapshot,
        assumed: Mapping[str, Assumed],
        reservations_by_node: Mapping[str, list[Reservation]],
        bound: frozenset[str],
        whole: tuple,
    ) -> dict[str, NodeView]:
        assumed_by_node: dict[str, list[Assumed]] = {}
        for a in assumed.values():
            assumed_by_node.setdefault(a.node, []).append(a)
        views: dict[str, NodeView] = {}
        inputs: dict[str, tuple] = {}
        pod_gpus = snap.pod_gpus
        broken: dict[str, dict[str, str]] = {}
        offers: dict[str, frozenset[int]] = {}
        old_inputs, old_views, old_broken, old_offers = self._inputs, self._views, self._broken, self.offered
        ended = snap.ended
        for name, info in snap.nodes.items():
            mine = assumed_by_node.get(name) if assumed_by_node else None
            held = reservations_by_node.get(name) if reservations_by_node else None
            gone = ended.get(name) if ended else None
            old = old_inputs.get(name)
            if not (mine or held or gone):  # the common case: the annotation and bound pods only
                key: tuple = (info, pod_gpus.get(name, 0))
                if old is not None and old[0] is info and old[1:] == key[1:]:
                    views[name] = old_views[name]
                    if name in old_offers:
                        offers[name] = old_offers[name]
                else:
                    plain = self._plain(info, key[1])
                    if plain is None:  # something failed: the guarded path logs and degrades
                        views[name], conflicts, offer = self._node(info, self._full(key), bound)
                    else:
                        (views[name], offer), conflicts = plain, {}
                    if conflicts:
                        broken[name] = conflicts
                    if offer:
                        offers[name] = offer
                inputs[name] = key
                continue
            key = (
                info,
                pod_gpus.get(name, 0),
                tuple(mine) if mine else (),
                tuple(held) if held else (),
                bound if mine else frozenset(),
                gone or frozenset(),
            )
            if old is not None and old[0] is info and old[1:] == key[1:]:
                views[name] = old_views[name]
                if name in old_broken:
                    broken[name] = old_broken[name]
                if name in old_offers:
                    offers[name] = old_offers[name]
            else:
                views[name], conflicts, offer = self._node(info, key, bound)
                if conflicts:
                    broken[name] = conflicts
                if offer:
                    offers[name] = offer
            inputs[name] = key
        self._whole, self._views, self._inputs, self._broken = whole, views, inputs, broken
        self.offered = offers
        self.conflicts = {pod: why for per_node in broken.values() for pod, why in per_node.items()}
        return views

    @staticmethod
    def _full(key: tuple) -> tuple:
        """A common-case key in `_node`'s long form (no own binds, reservations or ended pods)."""
        return (*key, (), (), frozenset(), frozenset())

    def _plain(self, info: NodeInfo, pod_gpus: int) -> tuple[NodeView, frozenset[int]] | None:
        """`_node` for a node without own binds, reservations or ended pods, minus its generality:
        the same view and offer (this is `offered` with nothing assumed, and `_unreserved` with
        nothing held), about five times cheaper, which is what a filter after every node's
        annotation changed is made of. None when anything fails, for `_node` to handle."""
        topo = info.topology
        try:
            if topo is None:
                free_count = max(0, info.gpu_capacity - pod_gpus)
                view = NodeView(info.name, info.labels, info.gpu_capacity, frozenset(range(free_count)), None)
                self.guard.accepted(info.name, "view")
                return view, frozenset()
            hit = self._policy_of.get((topo.policy, id(topo.topology)))
            if hit is None or hit[0] is not topo.topology:
                alloc = self.policies.get(topo.policy, topo.topology)
                alloc.choose(range(topo.topology.n), 1)  # cached: proves the tables work
                if len(self._policy_of) > 100_000:
                    self._policy_of.clear()
                self._policy_of[(topo.policy, id(topo.topology))] = (topo.topology, alloc)
            else:
                alloc = hit[1]
            n = topo.topology.n
            allocated = topo.allocated
            shape = (n, topo.unhealthy, allocated)  # few distinct ones: nodes share the set
            offer = self._free_of.get(shape)
            if offer is None:
                if len(self._free_of) > 100_000:
                    self._free_of.clear()
                offer = self._free_of[shape] = frozenset(range(n)) - topo.unhealthy - allocated
            if info.pods_know_allocations:
                lag = pod_gpus - len(allocated)
                if lag > 0:
                    offer = offer - _take(alloc, set(offer), lag)
            self.guard.accepted(info.name, "view")
            return NodeView(info.name, info.labels, n, offer, alloc), offer
        except Exception:
            return None

    def _node(
        self, info: NodeInfo, key: tuple, bound: frozenset[str]
    ) -> tuple[NodeView, dict[str, str], frozenset[int]]:
        """One node's view, guarded: whatever fails here (the allocator build, a probe of it,
        the free-set arithmetic) makes this node "unknown topology", logged once and counted."""
        _, pod_gpus, mine, held, _, ended = key
        try:
            alloc = None
            if info.topology is not None:
                alloc = self.policies.get(info.topology.policy, info.topology.topology)
                alloc.choose(range(info.topology.topology.n), 1)  # cached: proves the tables work
            if info.topology is None:
                view, offer = node_view(info, None, pod_gpus, mine, held, bound), set()
            else:
                offer = offered(info, alloc, pod_gpus, mine, bound, ended)
                free = frozenset(_unreserved(alloc, offer, held))
                view = NodeView(info.name, info.labels, info.topology.topology.n, free, alloc)
            conflicts = broken_reservations(info, held, offer) if info.topology is not None else {}
            self.guard.accepted(info.name, "view")
            return view, conflicts, frozenset(offer)
        except Exception as e:
            reason = f"topology unusable: {describe(e)}"
            self.guard.rejected(info.name, "view", reason, error=True)
            unknown = replace(info, topology=None, topology_problem=reason)
            return node_view(unknown, None, pod_gpus, mine, held, bound), {}, frozenset()

    def predict(self, node: str, size: int, view: NodeView | None) -> tuple[int, ...] | None:
        """The GPUs the node's plugin will give a pod of `size` bound now: its allocator's choice
        from what kubelet offers it (reservations included). None when that cannot be told
        (unknown topology, too few offered)."""
        offer = self.offered.get(node)
        if view is None or view.allocator is None or offer is None or len(offer) < size or size <= 0:
            return None
        try:
            return view.allocator.choose(sorted(offer), size).indices
        except AllocationError:
            return None
