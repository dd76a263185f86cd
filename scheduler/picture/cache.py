"""The sidecar's picture of the cluster between two calls: snapshot, NodeViews and own binds.

kube-scheduler calls filter, prioritize and bind thousands of times against a cluster that
changes far less often, so everything derived from a snapshot is kept per snapshot (or per
views object) and swapped whole when it changes: the views (as node classes, see
scheduler/picture/classes.py), the network index, the gang membership index. Binds this sidecar made are remembered (as
`Assumed`) until the node's annotation shows them, since until then the annotation still
calls those GPUs free. No decisions are made here; they are the core's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from gputopo import jsonlog
from gputopo.gang.reservations import Assumed, Reservation
from gputopo.network.levels import NetworkIndex
from gputopo.network.nodeview import NodeView
from gputopo.node.policy import GpuPolicy
from scheduler.model import PodInfo, Snapshot
from scheduler.nodeguard import NodeGuard
from scheduler.picture.ranks import Ranks
from scheduler.picture.views import NodeViews, ViewBuilder, in_use

log = logging.getLogger("gputopo.scheduler")

#: Our own binds are remembered this long at most while the node's annotation catches up.
ASSUMED_TTL_S = 600.0


class ClusterCache:
    """Derived state of the current snapshot. Not thread-safe: the extender's lock guards it."""

    def __init__(self, levels: Sequence[str], guard: NodeGuard | None = None) -> None:
        self.levels = tuple(levels)
        self.assumed: dict[str, Assumed] = {}
        self.assumed_version = 0
        self._views = ViewBuilder(guard)
        self._warned: dict[str, str] = {}
        self._warned_for: object = None  # the views object whose nodes were checked
        self._gang_index: tuple[object, dict[str, list[PodInfo]]] | None = None
        # the index is built from node names and labels only: keyed on the snapshot's labels
        # version (or, where a feed does not track it, the nodes mapping) and the levels, not on
        # the snapshot version, which every new pod and annotation rewrite bumps
        self._index_key: tuple[object, tuple[str, ...]] | None = None
        self._index: NetworkIndex | None = None

    # ------------------------------------------------------------------ own binds

    def assume(self, a: Assumed) -> None:
        self.assumed[a.pod] = a
        self.assumed_version += 1

    def unassume(self, pod: str) -> None:
        if self.assumed.pop(pod, None) is not None:
            self.assumed_version += 1

    def forget_caught_up(self, snap: Snapshot, now: float) -> None:
        """Drop assumed binds the watch and the annotation now show (or that are too old)."""
        stale = [k for k, a in self.assumed.items() if now - a.at > ASSUMED_TTL_S or _caught_up(snap, a)]
        for k in stale:
            del self.assumed[k]
        if stale:
            self.assumed_version += 1

    def bound_node(self, pod: PodInfo) -> str:
        """Where the pod is bound: per the watch, or by a bind of ours the watch lags behind."""
        a = self.assumed.get(pod.key)
        return pod.node or (a.node if a is not None else "")

    def placed_node(self, pod: PodInfo, snap: Snapshot) -> str:
        """Where gang planning counts the pod as placed: its bound node, or the node of a bind
        of ours still in flight while that node exists. A bind in flight to a node deleted since
        fails, or leaves a pod the pod garbage collector deletes: either way the gang needs a
        place for that member, and planning the rest around it would put them in a domain the
        gang can no longer complete there (a split gang)."""
        if pod.node:
            return pod.node
        a = self.assumed.get(pod.key)
        return a.node if a is not None and a.node in snap.nodes else ""

    def in_use(self, snap: Snapshot, node: str) -> set[int]:
        """GPUs of `node` that a pod holds: the published in-use set (less the GPUs of pods the
        watch saw end since, `views.in_use`) and our assumed binds."""
        info = snap.nodes.get(node)
        used = set(in_use(info, snap.ended.get(node, frozenset()))) if info is not None else set()
        for a in self.assumed.values():
            if a.node == node:
                used.update(a.gpus)
        return used

    # ------------------------------------------------------------------ derived views

    def views(self, snap: Snapshot, reservations: Mapping[str, list[Reservation]], version: int) -> NodeViews:
        """NodeViews of every node: free GPUs net of own binds and reservations."""
        views = self._views.build(snap, self.assumed, self.assumed_version, reservations, version)
        if views is not self._warned_for:  # rebuilt: warn about the nodes whose inputs changed
            self._warned_for = views
            self._warn_unknown(snap, self._views.unknown)
        return views

    @property
    def ranks(self) -> Ranks:
        """Prioritize's kept picture of every node (`scheduler.picture.ranks`), for the latest
        views only (`NodeViews.current`)."""
        return self._views.ranks

    def policies(self) -> list[GpuPolicy]:
        """Every policy object a node's view was made with (one per server model and policy)."""
        return list(self._views.used_policies.values())

    def predict(self, node: str, size: int, view: NodeView | None) -> tuple[int, ...] | None:
        """The GPUs the node's plugin will give a pod of `size` bound now (`ViewBuilder.predict`)."""
        return self._views.predict(node, size, view)

    def network(self, snap: Snapshot) -> NetworkIndex:
        """Which nodes share each domain. Rebuilt only when a node was added, removed or
        relabelled (`Snapshot.labels_version`), or the levels changed: a plugin rewrites its
        node's annotation at every allocation, which gives a new nodes mapping but the same
        domains, and a rebuild at 20,000 nodes costs about 100 ms (the index, then the leaves
        the prioritize step packs by, which follow its identity)."""
        # the cluster's own levels (its Kueue/KAI Topology objects) when it defines any, else ours
        levels = tuple(snap.levels or self.levels)
        # a feed that does not track labels (0) is keyed by the identity of its nodes mapping
        nodes: object = snap.labels_version or snap.nodes
        key = self._index_key
        if self._index is None or key is None or not _same(key[0], nodes) or key[1] != levels:
            self._index = NetworkIndex.build(((n.name, n.labels) for n in snap.nodes.values()), levels)
            self._index_key = (nodes, levels)
        return self._index

    def members(self, gang: str, snap: Snapshot) -> list[PodInfo]:
        """Active pods of a gang; the index is rebuilt once per pods mapping, not per call."""
        cached = self._gang_index
        if cached is None or cached[0] is not snap.pods:
            index: dict[str, list[PodInfo]] = {}
            for p in snap.pods.values():
                if p.gang is not None and p.active:
                    index.setdefault(p.gang.key, []).append(p)
            cached = self._gang_index = (snap.pods, index)
        return sorted(cached[1].get(gang, ()), key=lambda p: p.key)

    def _warn_unknown(self, snap: Snapshot, unknown: list[str]) -> None:
        """Log each node's unknown-topology reason once. A node's reason changes only with its
        inputs: the nodes of unknown topology the last build found changed are looked at, and
        the ones warned about before (few), in case they have a topology again."""
        if len(self._warned) > 100_000:
            self._warned.clear()
        nodes = snap.nodes
        for name in unknown:
            info = nodes.get(name)
            problem = info.topology_problem if info is not None and info.topology is None else ""
            if problem and self._warned.get(name) != problem:
                self._warned[name] = problem
                jsonlog.event(
                    log,
                    "unknown_topology",
                    logging.WARNING,
                    node=name,
                    reason=problem,
                    effect="GPUs counted only, neutral score",
                )
        for name in list(self._warned):
            info = nodes.get(name)
            if info is not None and not (info.topology is None and info.topology_problem):
                del self._warned[name]


def _caught_up(snap: Snapshot, a: Assumed) -> bool:
    """An assumed bind is no longer needed once the watch shows the pod bound and the node's
    annotation was written after the bind (or the node has no annotation to wait for)."""
    pod = snap.pods.get(a.pod)
    if pod is not None and a.uid and pod.uid and pod.uid != a.uid:
        return True  # deleted and recreated under the same name: the old bind is history
    if pod is None or not pod.node:
        return pod is None
    info = snap.nodes.get(a.node)
    return info is None or info.topology is None or info.topology.generated_at > a.at


def _same(a: object, b: object) -> bool:
    """Equal labels versions (ints), or the very same nodes mapping."""
    return a == b if isinstance(a, int) and isinstance(b, int) else a is b
