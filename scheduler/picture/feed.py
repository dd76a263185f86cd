"""Where the sidecar's picture of the cluster comes from: one Protocol, two sources.

The extender plans on a `Snapshot` and binds through `bind`, whether the cluster is a live API
server (scheduler/live/kube.py) or a snapshot file held in memory (FileState, for simulation and
tests). The planning code cannot tell them apart, which is the point.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Protocol

from gputopo.network.annotation import NodeTopology
from gputopo.network.cluster import ClusterSnapshot
from scheduler import defaults
from scheduler.model import NodeChanges, NodeInfo, PodInfo, Snapshot, parse_pod
from scheduler.picture.layered import FOLD_FRACTION, FOLD_MIN, Layered


class BindError(RuntimeError):
    """A bind the cluster refused; the message is returned to kube-scheduler."""


class ClusterState(Protocol):
    def snapshot(self) -> Snapshot:
        """The cluster now (cheap when nothing changed: the same object)."""
        ...

    def observe(self, pod: PodInfo) -> None:
        """kube-scheduler asked about this pod: it exists, even if no watch has shown it yet."""
        ...

    def bind(self, pod: PodInfo, node: str, gpus: tuple[int, ...]) -> None:
        """Bind the pod to the node (idempotent); raise BindError when refused."""
        ...

    def ready(self) -> bool:
        """True once the first full picture is loaded."""
        ...


class FileState:
    """A cluster held in memory, loaded from a snapshot file: binds allocate GPUs in place.

    The pods a gang has are the ones the file lists plus every one kube-scheduler asks about,
    since kube-scheduler keeps retrying pending pods until each member has shown up."""

    def __init__(
        self,
        nodes: Iterable[NodeInfo],
        pods: Iterable[PodInfo] = (),
        min_members: Mapping[str, int] | None = None,
        levels: Iterable[str] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._nodes = {n.name: replace(n, pods_know_allocations=False) for n in nodes}
        self._pods = {p.key: p for p in pods}
        self._min = dict(min_members or {})
        self._held: dict[str, tuple[int, ...]] = {}
        self.levels = tuple(levels) if levels is not None else None
        self._version = 1
        #: Snapshot.labels_version: bumped when a change adds, removes or relabels a node, or is
        #: not told node by node (`_changed`); `_labels` are the labels it was counted with
        self._labels_version = 1
        self._labels: dict[str, Mapping[str, str]] = {n: i.labels for n, i in self._nodes.items()}
        self._snap: Snapshot | None = None
        self._nodes_view: Layered[str, NodeInfo] | None = None
        self._last_nodes: Layered[str, NodeInfo] | None = None  # the last snapshot's
        #: nodes changed since the last snapshot's mapping (None: any, copy them all)
        self._touched: set[str] | None = None
        self._gpus_view: dict[str, int] | None = None
        #: node -> GPUs its bound, active pods hold, kept up to date by bind and delete_pod
        self._pod_gpus: dict[str, int] = {}
        for p in self._pods.values():
            if p.node and p.active:
                self._pod_gpus[p.node] = self._pod_gpus.get(p.node, 0) + p.gpus
        self.changes = NodeChanges()

    def _changed(self, nodes: bool = False, gpus: bool = False, names: Iterable[str] | None = None) -> None:
        """Something changed; `nodes`/`gpus`: node objects or bound pods' GPUs did, on the nodes
        `names` (None: on any node, so whatever was derived per node is redone for every one)."""
        self._version += 1
        self._snap = None
        names = None if names is None else list(names)
        if nodes:
            self._nodes_view = None
            self._relabelled(names)
        if gpus:
            self._gpus_view = None
        if nodes or gpus:
            if names is None:
                self.changes.reset()
                self._touched = None
            else:
                self.changes.mark(names)
                if self._touched is not None:
                    self._touched.update(names)

    def _relabelled(self, names: Iterable[str] | None) -> None:
        """Bump the labels version when one of the changed nodes `names` (None: any node) was
        added, removed or relabelled since it was last counted: the network index, built from
        the labels alone, is kept across every other change (a bind, an annotation rewrite)."""
        nodes, seen = self._nodes, self._labels
        if names is None:
            fresh = {n: i.labels for n, i in nodes.items()}
            if fresh != seen:
                self._labels, self._labels_version = fresh, self._labels_version + 1
            return
        changed = False
        for n in names:
            info = nodes.get(n)
            now = info.labels if info is not None else None
            if now != seen.get(n):
                changed = True
                if now is None:
                    seen.pop(n, None)
                else:
                    seen[n] = now
        if changed:
            self._labels_version += 1

    def snapshot(self) -> Snapshot:
        with self._lock:
            if self._snap is None:
                # Unchanged parts keep their identity, so the extender's views can skip them.
                if self._nodes_view is None:
                    self._nodes_view = self._layered_nodes()
                if self._gpus_view is None:
                    self._gpus_view = self._pod_gpus.copy()
                self._snap = Snapshot(
                    self._nodes_view,
                    dict(self._pods),
                    self._min,
                    self._version,
                    self._gpus_view,
                    labels_version=self._labels_version,
                    changes=self.changes,
                    changes_seq=self.changes.seq,
                )
            return self._snap

    def _layered_nodes(self) -> Layered[str, NodeInfo]:
        """The nodes as an immutable mapping: the last snapshot's with the nodes changed since
        replaced (a few entries), or a copy of them all (after a change not told node by node,
        or a node added or removed: the copy keeps the store's order)."""
        last, touched = self._last_nodes, self._touched
        nodes = self._nodes
        if (
            last is not None
            and touched is not None
            and len(touched) <= len(last) // FOLD_FRACTION + FOLD_MIN  # else a copy costs less
            and all(n in nodes and n in last for n in touched)
        ):
            out = last.replace({n: nodes[n] for n in touched})
        else:
            out = Layered.of(nodes)
        self._last_nodes, self._touched = out, set()
        return out

    def observe(self, pod: PodInfo) -> None:
        with self._lock:
            if pod.key not in self._pods:
                self._pods[pod.key] = replace(pod, node="")
                self._changed()

    def ready(self) -> bool:
        return True

    def bind(self, pod: PodInfo, node: str, gpus: tuple[int, ...]) -> None:
        with self._lock:
            info = self._nodes.get(node)
            if info is None:
                raise BindError(f"node {node} does not exist")
            known = self._pods.get(pod.key, pod)
            if known.node:
                if known.node == node:
                    return
                raise BindError(f"pod {pod.key} is already bound to {known.node}")
            topo = info.topology
            if topo is not None:
                taken = set(gpus) - topo.free
                if taken or len(gpus) != pod.gpus:
                    raise BindError(f"GPUs {sorted(gpus)} are not {pod.gpus} free GPUs of {node}")
                info = replace(info, topology=replace(topo, allocated=topo.allocated | set(gpus)))
            else:
                used = sum(p.gpus for p in self._pods.values() if p.node == node and p.active)
                if used + pod.gpus > info.gpu_capacity:
                    raise BindError(f"{node} has {info.gpu_capacity - used} free GPUs, pod needs {pod.gpus}")
            self._nodes[node] = info
            self._pods[pod.key] = replace(known, node=node)
            self._held[pod.key] = tuple(gpus)
            if known.active and known.gpus:
                self._pod_gpus[node] = self._pod_gpus.get(node, 0) + known.gpus
            self._changed(nodes=True, gpus=True, names=(node,))

    def held(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Pods bound through this state: pod -> (node, GPU indices it was given)."""
        with self._lock:
            return {k: (self._pods[k].node, g) for k, g in self._held.items() if k in self._pods}

    # Simulation hooks: the cluster changing under the scheduler.
    def remove_node(self, name: str) -> None:
        with self._lock:
            self._nodes.pop(name, None)
            self._changed(nodes=True, names=(name,))

    def delete_pod(self, key: str) -> None:
        """A pod ends: its GPUs go back to its node."""
        with self._lock:
            pod = self._pods.pop(key, None)
            self._changed(nodes=True, gpus=True, names=(pod.node,) if pod is not None and pod.node else ())
            if pod is None or not pod.node:
                return
            if pod.active and pod.gpus:
                left = self._pod_gpus.get(pod.node, 0) - pod.gpus
                if left:
                    self._pod_gpus[pod.node] = left
                else:
                    self._pod_gpus.pop(pod.node, None)
            info = self._nodes.get(pod.node)
            if info is not None and info.topology is not None:
                held = self._held.pop(key, ())
                topo = info.topology
                self._nodes[pod.node] = replace(
                    info, topology=replace(topo, allocated=topo.allocated - set(held))
                )


def from_cluster(snapshot: ClusterSnapshot, resource: str = defaults.RESOURCE_NAME) -> FileState:
    """A FileState holding a parsed cluster snapshot file (gputopo.network.cluster)."""
    nodes = []
    for n in snapshot.nodes:
        if n.topology is not None:
            topo = NodeTopology(n.name, n.topology, frozenset(), n.allocated, 0.0, "snapshot-file")
            nodes.append(NodeInfo(n.name, dict(n.labels), n.gpu_count, topo))
        else:
            nodes.append(
                NodeInfo(
                    n.name,
                    dict(n.labels),
                    n.gpu_count - len(n.allocated),
                    None,
                    "snapshot file gives only a GPU count",
                )
            )
    pods = [
        parse_pod(
            {
                "metadata": {
                    "namespace": p.namespace,
                    "name": p.name,
                    "uid": p.uid,
                    "labels": dict(p.labels),
                    "annotations": dict(p.annotations),
                },
                "spec": {"nodeName": p.node, "containers": [{"resources": {"limits": {resource: p.gpus}}}]},
            },
            resource,
        )
        for p in snapshot.pods
    ]
    return FileState(nodes, pods, {g.key: g.min_member for g in snapshot.podgroups}, levels=snapshot.levels)
