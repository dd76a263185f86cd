"""The sidecar on DRA clusters: ResourceSlices and ResourceClaims (`resource.k8s.io/v1`) as the
topology, free GPUs and pod sizes the planner needs where no node annotation exists.

`DraStore` keeps the raw slices and what each claim says (the devices its allocation holds, the
GPUs it asks for), fed by two reflectors in scheduler/live/kube.py, and overlays the snapshot: a node
whose `gputopo.io/topology` annotation is absent gets a NodeTopology rebuilt from its pool
(gputopo/network/draview.py: gputopo's slices exactly, NVIDIA's conservatively), GPUs in use from the
claims allocated in that pool, so filter, score and gang planning treat it like an annotated
node. Pods that ask for GPUs through claims get their size from those claims.

Everything here is untrusted: a slice or claim that cannot be read costs its node (left of
unknown topology, with the reason) or its pod (size 0), never the watch or other nodes. Only
the pools of a node whose objects changed are re-read.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gputopo import jsonlog
from gputopo.network.annotation import NodeTopology
from gputopo.network.draview import (
    DRIVERS,
    GPUTOPO_DRIVER,
    NVIDIA_DRIVER,
    DraNode,
    DraViewError,
    allocated_devices,
    gpus_in_use,
    read_pool,
)
from gputopo.node.draslices import class_gpus
from scheduler.model import NodeInfo, PodInfo
from scheduler.nodeguard import describe

log = logging.getLogger("gputopo.scheduler.dra")

GROUP = "resource.k8s.io"
VERSION = "v1"
#: DeviceClass name -> GPUs one device of it is: gputopo's classes (one per device layout and
#: size, gputopo.node.draslices.class_gpus: deploy/components/dra, and a Helm release's own
#: under a subdomain, nvlink-4.research-gputopo.gputopo.io: the chart's gputopo.draClassDomain)
#: and NVIDIA's GPU class. Other classes count 0 (not a GPU the planner sizes).
_GPU_CLASSES = {"gpu.nvidia.com": 1}
MAX_COUNT = 64
PUBLISHING = " (still being published)"


@dataclass(frozen=True)
class Claim:
    """What one ResourceClaim says: devices its allocation holds, and GPUs it asks for."""

    held: tuple[tuple[str, str, str], ...]  # (driver, pool, device)
    gpus: int  # GPUs asked (the allocation's GPUs once known); 0 when not a GPU claim
    problem: str = ""


def requested_gpus(claim: Mapping[str, Any]) -> int:
    """GPUs a claim's requests ask for, by their DeviceClass (`exactly` requests with
    allocationMode ExactCount); 0 when none is a known GPU class."""
    spec = claim.get("spec")
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    total = 0
    for r in requests if isinstance(requests, list) else []:
        exact = r.get("exactly") if isinstance(r, Mapping) else None
        if not isinstance(exact, Mapping):
            continue
        cls = exact.get("deviceClassName")
        count = exact.get("count", 1)
        if exact.get("allocationMode", "ExactCount") != "ExactCount" or not isinstance(cls, str):
            continue
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_COUNT:
            continue
        each = class_gpus(cls) or _GPU_CLASSES.get(cls, 0)
        total += each * count
    return min(total, MAX_COUNT)


def read_claim(obj: Mapping[str, Any]) -> Claim:
    """Never raises: a malformed claim holds nothing the store trusts and says why."""
    try:
        held = tuple(allocated_devices(obj))
    except DraViewError as e:
        return Claim((), 0, f"claim unreadable: {e}")
    return Claim(held, requested_gpus(obj))


def _key(obj: Mapping[str, Any]) -> str | None:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        return None
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if isinstance(ns, str) and ns else str(meta["name"])


class DraStore:
    """ResourceSlices and ResourceClaims, and the per-node views derived from them.

    Not thread-safe by itself: the owner (KubeState) calls every method with its lock held."""

    def __init__(self) -> None:
        self._slices: dict[str, Mapping[str, Any]] = {}  # slice name -> object (gputopo/NVIDIA only)
        self._claims: dict[str, Claim] = {}
        self._nodes: dict[str, DraNode | str] = {}  # node -> its pool read, or why it could not be
        self._dirty: set[str] | None = None  # nodes whose slices changed; None = all
        self._held: dict[tuple[str, str], set[str]] | None = None
        self.version = 0
        self._overlay: dict[str, tuple[NodeInfo, tuple[int, object], NodeInfo]] = {}
        self._node_version: dict[str, int] = {}
        self._in_use: dict[str, frozenset[int] | str] = {}

    # -- store ---------------------------------------------------------------------------

    def replace_slices(self, items: Iterable[Mapping[str, Any]]) -> None:
        self._slices = {}
        for o in items:
            self._put_slice(o)
        self._dirty = None
        self.version += 1

    def apply_slice(self, event: str, obj: Mapping[str, Any]) -> None:
        name = _key(obj)
        if name is None:
            return
        old = self._slices.pop(name, None)
        if event != "DELETED":
            self._put_slice(obj)
        touched = {_node_of(x) for x in (old, self._slices.get(name)) if x is not None}
        if self._dirty is not None:
            self._dirty |= {n for n in touched if n}
        self.version += 1

    def _put_slice(self, obj: Mapping[str, Any]) -> None:
        name = _key(obj)
        spec = obj.get("spec")
        if name is None or not isinstance(spec, Mapping) or spec.get("driver") not in DRIVERS:
            return
        self._slices[name] = obj

    def replace_claims(self, items: Iterable[Mapping[str, Any]]) -> None:
        self._claims = {}
        for o in items:
            key = _key(o)
            if key is not None:
                self._claims[key] = read_claim(o)
        self._held = None
        self.version += 1

    def apply_claim(self, event: str, obj: Mapping[str, Any]) -> None:
        key = _key(obj)
        if key is None:
            return
        if event == "DELETED":
            self._claims.pop(key, None)
        else:
            self._claims[key] = read_claim(obj)
        self._held = None
        self.version += 1

    # -- derived -------------------------------------------------------------------------

    def pool(self, node: str) -> DraNode | str | None:
        """The node's pool as last read (for tests and debugging): its view, why it could not
        be read, or None."""
        return self._nodes.get(node)

    @property
    def has_claims(self) -> bool:
        return bool(self._claims)

    def pod_gpus(self, namespace: str, claims: Iterable[str]) -> int:
        """GPUs a pod's claims ask for (claims not seen yet count 0)."""
        return sum(c.gpus for name in claims if (c := self._claims.get(f"{namespace}/{name}")) is not None)

    def _read_nodes(self) -> None:
        """Re-read the pools of the nodes whose slices changed (all after a relist). A node's
        daemon republishes on every prepare and unprepare (the set order follows use), so a
        re-read that finds the same Topology keeps the old object, and the node's version (what
        its overlaid NodeInfo is kept by) moves only when its topology, health or problem did."""
        by_node: dict[str, list[Mapping[str, Any]]] = {}
        for s in self._slices.values():
            node = _node_of(s)
            if node and (self._dirty is None or node in self._dirty):
                by_node.setdefault(node, []).append(s)
        old_nodes = self._nodes
        if self._dirty is None:
            self._nodes = {}
            todo: Iterable[str] = set(by_node) | set(old_nodes)
        else:
            todo = self._dirty
        for node in todo:
            old = old_nodes.get(node)
            self._nodes.pop(node, None)
            if node not in by_node:
                self._node_version.pop(node, None)
                self._overlay.pop(node, None)
                continue
            new = _read_node(node, by_node[node])
            if isinstance(new, str) and isinstance(old, DraNode) and new.endswith(PUBLISHING):
                new = old  # a republication under way: the last complete one stands until it ends
            if isinstance(old, DraNode) and isinstance(new, DraNode) and old.topology == new.topology:
                new = replace(new, topology=old.topology)
                if old.unhealthy == new.unhealthy:
                    self._nodes[node] = new
                    continue
            if new != old:
                self._node_version[node] = self._node_version.get(node, 0) + 1
            self._nodes[node] = new
        self._dirty = set()

    def _read_use(self, nodes_changed: bool) -> None:
        """GPUs in use per node: the devices allocated claims hold in its pool."""
        if self._held is not None and not nodes_changed:
            return
        held: dict[tuple[str, str], set[str]] = {}
        for c in self._claims.values():
            for driver, pool, device in c.held:
                held.setdefault((driver, pool), set()).add(device)
        self._held = held
        self._in_use = {}
        for node, view in self._nodes.items():
            if isinstance(view, DraNode):
                try:
                    self._in_use[node] = gpus_in_use(view, held.get((view.driver, view.pool), ()))
                except DraViewError as e:
                    self._in_use[node] = str(e)

    def overlay(self, nodes: Mapping[str, NodeInfo], now: float) -> Mapping[str, NodeInfo]:
        """`nodes` with every node that has no topology of its own (no annotation) and a DRA pool
        given the pool's view; the same mapping when nothing applies. A node's NodeInfo object
        stays the same while its inputs do (the views' caches key on it)."""
        nodes_changed = self._dirty is None or bool(self._dirty)
        if nodes_changed:
            self._read_nodes()
        self._read_use(nodes_changed)
        if not self._nodes:
            return nodes
        out: dict[str, NodeInfo] | None = None
        for name, view in self._nodes.items():
            info = nodes.get(name)
            if info is None or info.topology is not None:
                continue
            stamp = (self._node_version.get(name, 0), self._in_use.get(name))
            kept = self._overlay.get(name)
            if kept is not None and kept[0] is info and kept[1] == stamp:
                new = kept[2]
            else:
                new = self._node_info(info, view, now)
                self._overlay[name] = (info, stamp, new)
            if out is None:
                out = dict(nodes)
            out[name] = new
        return nodes if out is None else out

    def _node_info(self, info: NodeInfo, view: DraNode | str, now: float) -> NodeInfo:
        if isinstance(view, str):
            return replace(info, topology_problem=f"{info.topology_problem}; DRA slices: {view}")
        use = self._in_use.get(info.name, frozenset())
        if isinstance(use, str):
            return replace(info, topology_problem=f"{info.topology_problem}; DRA claims: {use}")
        topo = NodeTopology(
            node=info.name,
            topology=view.topology,
            unhealthy=view.unhealthy,
            allocated=use & (frozenset(range(view.topology.n)) - view.unhealthy),
            generated_at=now,
            plugin_version=f"dra:{view.driver}",
        )
        # The claims are the whole truth of use (kube-scheduler writes the allocation before
        # the bind), so the pods' counts are not compared with it (as in file mode).
        healthy = view.topology.n - len(view.unhealthy)
        return replace(
            info, gpu_capacity=healthy, topology=topo, topology_problem="", pods_know_allocations=False
        )

    def problems(self) -> dict[str, str]:
        """Node -> why its DRA pool could not be read (for logs and tests)."""
        return {n: v for n, v in self._nodes.items() if isinstance(v, str)}


def _node_of(obj: Mapping[str, Any] | None) -> str:
    spec = obj.get("spec") if obj is not None else None
    node = spec.get("nodeName") if isinstance(spec, Mapping) else None
    return node if isinstance(node, str) else ""


def _read_node(node: str, slices: list[Mapping[str, Any]]) -> DraNode | str:
    """The node's pool, gputopo's before NVIDIA's; or why none could be read. Never raises."""
    why = ""
    for driver in (GPUTOPO_DRIVER, NVIDIA_DRIVER):
        mine = [s for s in slices if s.get("spec", {}).get("driver") == driver]
        if not mine:
            continue
        try:
            pools = {str(s["spec"].get("pool", {}).get("name")) for s in mine}
            if len(pools) != 1:
                raise DraViewError(f"{len(pools)} pools of driver {driver} on one node")
            newest = max(int(s["spec"]["pool"]["generation"]) for s in mine)
            current = [s for s in mine if int(s["spec"]["pool"]["generation"]) == newest]
            count = current[0]["spec"]["pool"].get("resourceSliceCount")
            if count != len(current):
                raise DraViewError(f"pool has {len(current)} of its {count} slices{PUBLISHING}")
            current.sort(key=lambda s: str(s.get("metadata", {}).get("name")))
            return read_pool(node, driver, current)
        except Exception as e:  # DraViewError, or any shape nobody foresaw: this node only
            why = str(e) if isinstance(e, DraViewError) else describe(e)
            jsonlog.event(log, "dra_node_unreadable", logging.WARNING, node=node, driver=driver, reason=why)
    return why or "no GPU pool"


def with_claim_gpus(pods: Mapping[str, PodInfo], store: DraStore) -> Mapping[str, PodInfo]:
    """Pods that ask for GPUs only through claims, with their size from those claims."""
    if not store.has_claims:  # not a DRA cluster (or no claims yet): nothing to size, no pass
        return pods
    changed = {
        k: replace(p, gpus=g)
        for k, p in pods.items()
        if p.claims and p.gpus == 0 and (g := store.pod_gpus(p.namespace, p.claims)) > 0
    }
    return {**pods, **changed} if changed else pods
