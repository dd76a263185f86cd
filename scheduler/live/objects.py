"""Raw Node, Pod and PodGroup JSON from the API server, read into the sidecar's model.

`KubeState` (scheduler/live/kube.py) keeps the store; these functions read one object each, and
each is total: whatever one object holds costs that object only (a node becomes "unknown
topology", a pod is ignored and logged, a group's minimum is dropped), never the watch or the
other objects. The same parsers read kube-scheduler's requests (scheduler/model.py).
"""

from __future__ import annotations

import gc
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from gputopo import jsonlog
from gputopo.gang import sources as gangsources
from gputopo.network.annotation import AnnotationError, NodeTopology, Shapes, decode
from gputopo.node.allocator import MAX_GPUS
from scheduler.model import BadInput, NodeInfo, PodInfo, node_gpu_capacity, parse_pod
from scheduler.nodeguard import NodeGuard, describe

log = logging.getLogger("gputopo.scheduler.kube")  # the store's logger: one name for its events


def node_info(
    obj: dict[str, Any],
    *,
    resource: str,
    annotation_key: str,
    clock: Callable[[], float],
    guard: NodeGuard,
    shapes: Shapes | None = None,
) -> NodeInfo:
    """The node as the sidecar sees it; never raises: whatever fails makes this one node
    "unknown topology" (counted and logged once by the guard), never the watch or others.
    `shapes`: the store's known server models, so a node of one shares its links (`Shapes`)."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    name = name if isinstance(name, str) else ""
    try:
        info = _node_info_unguarded(obj, resource, annotation_key, clock, shapes)
    except Exception as e:
        reason = f"node could not be read: {describe(e)}"
        guard.rejected(name, "node", reason, error=True)
        raw_labels = meta.get("labels") if isinstance(meta, dict) else None
        labels = raw_labels if isinstance(raw_labels, dict) else {}
        labels = {k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)}
        try:
            capacity = node_gpu_capacity(obj, resource)
        except Exception:
            capacity = 0
        return NodeInfo(name, labels, capacity, None, reason)
    if info.topology is None and info.topology_problem:
        stage = "allocatable" if "allocatable" in info.topology_problem else "annotation"
        guard.rejected(name, stage, info.topology_problem, quiet=True)  # extender logs it
    elif info.topology is not None:  # a refusal of an earlier annotation is over
        guard.accepted(name, "annotation")
        guard.accepted(name, "allocatable")
    return info


def listed_nodes(
    items: Iterable[dict[str, Any]], held: Mapping[str, NodeInfo], read: Callable[[dict[str, Any]], NodeInfo]
) -> list[NodeInfo]:
    """Every node of a list, read (`read`: `node_info` with the store's settings) and kept
    against what the store held (`same_topology`). The cycle collector is paused meanwhile:
    decoding creates millions of objects and no cycles, and with it on a 60,000-node list spent
    about as long in full collections of the growing heap as in the decoding itself (it is
    restored after, as it was)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return [same_topology(held.get(i.name), i) for i in map(read, items)]
    finally:
        if collecting:
            gc.enable()


def same_topology(prev: NodeInfo | None, info: NodeInfo) -> NodeInfo:
    """`info` holding `prev`'s Topology object when the annotation describes the same one.

    A plugin rewrites its node's annotation whenever a GPU is taken or freed, and decoding it
    makes a new, equal Topology each time. Everything derived from a topology is cached per
    object (its bandwidth matrix, the node's policy and its probe, the views' classes), so
    without this every rewrite would make the next filter redo that node's derivations (at
    5,000 nodes rewritten, ~30 ms of a filter's CPU); with it a rewrite costs the filter a
    class lookup. A topology that is new to the store gets its bandwidth matrix computed
    here, in the watch thread, rather than in the first filter after start (~70 % of that
    filter). Never raises: whatever fails keeps `info` as decoded."""
    old = prev.topology if prev is not None else None
    new = info.topology
    if new is None or (old is not None and old.topology is new.topology):
        return info
    try:
        if old is not None and old.topology == new.topology:
            return replace(info, topology=replace(new, topology=old.topology))
        new.topology.bandwidth_mbps  # noqa: B018 (a cached property: computed once, here)
    except Exception:
        pass
    return info


def _node_info_unguarded(
    obj: dict[str, Any],
    resource: str,
    annotation_key: str,
    clock: Callable[[], float],
    shapes: Shapes | None = None,
) -> NodeInfo:
    meta = obj.get("metadata") or {}
    name = meta.get("name", "")
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if isinstance(v, str)}
    text = (meta.get("annotations") or {}).get(annotation_key)
    capacity = node_gpu_capacity(obj, resource)
    try:
        topo = decode(text, now=clock(), max_age_s=math.inf, shapes=shapes)
        if topo.node != name:
            raise AnnotationError(f"annotation is for node {topo.node}")
        if topo.topology.n > MAX_GPUS:  # the node allocator refuses it: count, don't crash
            raise AnnotationError(f"{topo.topology.n} GPUs, more than the {MAX_GPUS} the allocator handles")
        healthy = topo.topology.n - len(topo.unhealthy)  # len(topo.healthy), without the sets
        if healthy > capacity:  # kubelet gives at most allocatable: trust it
            raise AnnotationError(
                f"annotation describes {healthy} healthy GPUs but the Node's allocatable {resource} is {capacity}"
            )
        return known_node(name, labels, capacity, topo)
    except AnnotationError as e:
        return NodeInfo(name, labels, capacity, None, str(e))


def known_node(name: str, labels: dict[str, str], capacity: int, topology: NodeTopology) -> NodeInfo:
    """`NodeInfo(name, labels, capacity, topology)`, ~3x faster than through the frozen
    dataclass's `__init__` (one per node of a list; tests/test_scheduler_kube.py compares)."""
    out = object.__new__(NodeInfo)
    out.__dict__.update(
        name=name,
        labels=labels,
        gpu_capacity=capacity,
        topology=topology,
        topology_problem="",
        pods_know_allocations=True,
    )
    return out


def relevant_pod(pod: PodInfo | None) -> PodInfo | None:
    """The pods the planner needs: active ones with GPUs, in a gang, or with ResourceClaims
    (their GPUs are known once the claims are: scheduler/live/dra.py) or claim templates (a
    ComputeDomain's channel: its gang)."""
    if pod is None:
        return None
    wanted = pod.gpus > 0 or pod.gang is not None or pod.claims or pod.claim_templates
    return pod if wanted and pod.active else None


def parsed_pod(obj: dict[str, Any], resource: str) -> PodInfo | None:
    """The pod, active or not (None when unreadable, logged)."""
    try:
        pod = parse_pod(obj, resource)
    except Exception as e:  # BadInput, or anything nobody foresaw: this pod only
        meta = obj.get("metadata") or {}
        jsonlog.event(
            log,
            "pod_ignored",
            logging.WARNING,
            pod=f"{meta.get('namespace')}/{meta.get('name')}",
            reason=str(e) if isinstance(e, BadInput) else describe(e),
        )
        return None
    return pod


def group_min(obj: dict[str, Any]) -> tuple[str, int | None]:
    """A scheduler-plugins PodGroup's key and its minMember, read by the core's parser of that
    gang source (None when unusable: one odd object costs that one only)."""
    meta = obj.get("metadata") or {}
    key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
    api = gangsources.SCHEDULER_PLUGINS_API
    groups = gangsources.groups_scheduler_plugins(obj, api.api_version)
    return key, groups[0].min_member if groups else None
