"""Cluster snapshot files (design.md §4) and synthetic clusters of leaves and spines.

A snapshot is the whole cluster as the planner sees it without an API server: network levels,
nodes with their labels, GPU topology and GPUs in use, PodGroups and (optionally) pods. The
scheduler's file mode, the simulator, the tests and the benchmarks all start from one, so it is
validated here, once, with errors that name the place ("nodes[3].gpus: unknown preset …").

Building an `Allocator` costs O(2^n) work, so nodes whose bandwidth matrices are identical share
one: a 5,000-node cluster of three server types builds three.

File shape (YAML or JSON), beyond design.md §4's example:
  nodes[].gpus        preset name | topology file path (with a `/` or an extension; relative
                      to the snapshot file) |
                      inline topology object | integer GPU count (topology unknown)
  nodes[].allocated   GPU indices or UUIDs in use (UUIDs only when the topology is known)
  podgroups[]         {namespace (default "default"), name, minMember}
  pods[]              {namespace (default "default"), name, gpus (default 0), labels,
                       annotations, node (bound node; absent = pending)}
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any

import orjson
import yaml

from gputopo.network.levels import (
    DEFAULT_LEVELS,
    HOSTNAME,
    LEAF,
    SPINE,
    LevelError,
    NetworkIndex,
    is_label_key,
    validate_levels,
)
from gputopo.network.nodeview import NodeView
from gputopo.node.allocator import MAX_GPUS, AllocationError, Allocator, AllocatorPool
from gputopo.node.topofile import list_presets, load_topology
from gputopo.node.topology import Topology, TopologyError
from gputopo.userfile import MAX_CLUSTER_BYTES, UserFileError, read_text

_TOP_KEYS = ("levels", "nodes", "podgroups", "pods")
_NODE_KEYS = ("name", "labels", "gpus", "allocated")
_GROUP_KEYS = ("namespace", "name", "minMember")
_POD_KEYS = ("namespace", "name", "gpus", "labels", "annotations", "node", "uid")
_DNS_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class ClusterError(ValueError):
    """A snapshot that cannot be used; the message says where (`nodes[3].gpus: …`)."""


@dataclass(frozen=True)
class ClusterNode:
    name: str
    labels: Mapping[str, str]
    gpu_count: int
    topology: Topology | None  # None: only the GPU count is known
    allocated: frozenset[int]  # GPU indices in use
    gpus_source: Any = field(default=None, compare=False, repr=False)  # what the file said


@dataclass(frozen=True)
class PodGroupSpec:
    namespace: str
    name: str
    min_member: int

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class PodRecord:
    namespace: str
    name: str
    gpus: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    node: str = ""  # bound node; "" = pending
    uid: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class ClusterSnapshot:
    """A validated cluster: the planner's NodeViews and network index are derived from it."""

    levels: tuple[str, ...]
    nodes: tuple[ClusterNode, ...]
    podgroups: tuple[PodGroupSpec, ...] = ()
    pods: tuple[PodRecord, ...] = ()
    allocators: Mapping[str, Allocator | None] = field(default_factory=dict, compare=False, repr=False)

    @cached_property
    def by_name(self) -> Mapping[str, ClusterNode]:
        return MappingProxyType({n.name: n for n in self.nodes})

    @cached_property
    def index(self) -> NetworkIndex:
        """Domains per level: depends on labels only, so it is built once per snapshot."""
        return NetworkIndex.build(((n.name, n.labels) for n in self.nodes), self.levels)

    def node_views(self, used: Mapping[str, Iterable[int]] | None = None) -> tuple[NodeView, ...]:
        """What the planner sees: each node's GPUs minus `allocated` minus `used` (e.g. the
        GPUs a simulator or the file-mode scheduler has handed out since)."""
        used = used or {}
        out = []
        for n in self.nodes:
            busy = n.allocated.union(used.get(n.name, ()))
            free = frozenset(i for i in range(n.gpu_count) if i not in busy)
            out.append(NodeView(n.name, n.labels, n.gpu_count, free, self.allocators.get(n.name)))
        return tuple(out)

    def to_dict(self) -> dict[str, Any]:
        """The file form again (inline topologies stay inline), e.g. to save a generated cluster."""
        return {
            "levels": list(self.levels),
            "nodes": [
                {
                    "name": n.name,
                    "labels": dict(n.labels),
                    "gpus": n.gpus_source if n.gpus_source is not None else n.gpu_count,
                    "allocated": sorted(n.allocated),
                }
                for n in self.nodes
            ],
            "podgroups": [
                {"namespace": g.namespace, "name": g.name, "minMember": g.min_member} for g in self.podgroups
            ],
            "pods": [_pod_dict(p) for p in self.pods],
        }


def _pod_dict(p: PodRecord) -> dict[str, Any]:
    out: dict[str, Any] = {"namespace": p.namespace, "name": p.name, "gpus": p.gpus}
    if p.labels:
        out["labels"] = dict(p.labels)
    if p.annotations:
        out["annotations"] = dict(p.annotations)
    if p.node:
        out["node"] = p.node
    if p.uid:
        out["uid"] = p.uid
    return out


# --------------------------------------------------------------------------- parsing


TopologyLoader = Callable[[str], Topology]


def load_cluster(
    path: str, *, load: TopologyLoader = load_topology, pool: AllocatorPool | None = None
) -> ClusterSnapshot:
    """Read a YAML or JSON snapshot file; topology paths in it are relative to its folder."""
    try:  # a FIFO, a device or a huge file is refused here, never read (gputopo.userfile)
        text = read_text(path, MAX_CLUSTER_BYTES)
    except UserFileError as e:
        raise ClusterError(f"cannot read cluster snapshot {e}") from None
    data = decode_document(text, path)
    return parse_cluster(data, base_dir=os.path.dirname(os.path.abspath(path)), load=load, pool=pool)


def decode_document(text: str, path: str) -> Any:
    """JSON as JSON, everything else as YAML with libyaml's C loader where it is installed.

    A 10 MB snapshot of 5,000 nodes took PyYAML's pure-Python parser over a minute; a JSON
    parser reads it in a fraction of a second. A text that looks like JSON but is not valid JSON
    (comments, trailing commas) still gets its chance as YAML, which is a superset."""
    body = text.lstrip("\ufeff \t\r\n")
    if body[:1] in ("{", "["):
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
    try:
        return yaml.load(text, Loader=_YAML_LOADER)
    except yaml.YAMLError as e:
        raise ClusterError(f"{path}: not valid YAML or JSON: {_one_line(str(e))}") from None


#: libyaml's safe loader when PyYAML was built with it, else the pure-Python one.
_YAML_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_cluster(
    data: Any,
    *,
    base_dir: str | None = None,
    load: TopologyLoader = load_topology,
    pool: AllocatorPool | None = None,
) -> ClusterSnapshot:
    """Validate a decoded snapshot; `load` resolves preset names and topology file paths, and
    `pool` (one per snapshot unless given) shares allocators between nodes and snapshots."""
    if not isinstance(data, Mapping):
        raise ClusterError("a cluster snapshot must be a mapping with 'nodes'")
    _no_unknown_keys(data, _TOP_KEYS, "snapshot")
    try:
        levels = validate_levels(data.get("levels", DEFAULT_LEVELS))
    except LevelError as e:
        raise ClusterError(str(e)) from None
    raw_nodes = _list(data.get("nodes"), "nodes", required=True)
    topologies = _TopologyCache(load, base_dir)
    nodes: list[ClusterNode] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_nodes):
        node = _node(raw, f"nodes[{i}]", topologies)
        if node.name in seen:
            raise ClusterError(f"nodes[{i}].name: node {node.name!r} is listed twice")
        seen.add(node.name)
        nodes.append(node)
    groups = _podgroups(_list(data.get("podgroups"), "podgroups"))
    pods = _pods(_list(data.get("pods"), "pods"), seen)
    allocators = _share_allocators(nodes, pool if pool is not None else AllocatorPool())
    return ClusterSnapshot(levels, tuple(nodes), groups, pods, MappingProxyType(allocators))


class _TopologyCache:
    """Loads each distinct source once: 5,000 nodes usually name a handful of presets."""

    def __init__(self, load: TopologyLoader, base_dir: str | None) -> None:
        self._load = load
        self._base = base_dir
        self._presets = set(list_presets())
        self._done: dict[str, Topology] = {}

    def get(self, source: str) -> Topology:
        """A bare word is a preset name; anything with a `/` or an extension is a file path."""
        path = source
        looks_like_path = os.sep in source or "." in source
        if looks_like_path and source not in self._presets and self._base and not os.path.isabs(source):
            path = os.path.join(self._base, source)
        hit = self._done.get(path)
        if hit is None:
            hit = self._done[path] = self._load(path)
        return hit


def _node(raw: Any, where: str, topologies: _TopologyCache) -> ClusterNode:
    if not isinstance(raw, Mapping):
        raise ClusterError(f"{where}: must be a mapping with name, labels, gpus")
    _no_unknown_keys(raw, _NODE_KEYS, where)
    name = raw.get("name")
    if not isinstance(name, str) or len(name) > 253 or not _DNS_RE.match(name):
        raise ClusterError(f"{where}.name: {name!r} is not a valid node name (lowercase DNS name)")
    labels = _labels(raw.get("labels"), f"{where}.labels")
    gpus = raw.get("gpus")
    topology: Topology | None = None
    if isinstance(gpus, bool) or gpus is None:
        raise ClusterError(
            f"{where}.gpus: give a preset name, a topology file, an inline topology or a count"
        )
    if isinstance(gpus, int):
        if not 0 <= gpus <= 1024:
            raise ClusterError(f"{where}.gpus: a GPU count must be 0..1024, got {gpus}")
        count = gpus
    elif isinstance(gpus, str):
        try:
            topology = topologies.get(gpus)
        except TopologyError as e:
            raise ClusterError(f"{where}.gpus: {_one_line(str(e))}") from None
        count = topology.n
    elif isinstance(gpus, Mapping):
        try:
            topology = Topology.from_dict(gpus, default_name=name)
        except TopologyError as e:
            raise ClusterError(f"{where}.gpus: {e}") from None
        count = topology.n
    else:
        raise ClusterError(f"{where}.gpus: must be a preset name, a file path, a topology object or a count")
    if topology is not None and topology.n > MAX_GPUS:
        raise ClusterError(f"{where}.gpus: nodes of more than {MAX_GPUS} GPUs are not supported")
    allocated = _allocated(raw.get("allocated"), f"{where}.allocated", count, topology)
    return ClusterNode(name, labels, count, topology, allocated, gpus)


def _allocated(raw: Any, where: str, count: int, topology: Topology | None) -> frozenset[int]:
    out: set[int] = set()
    for j, item in enumerate(_list(raw, where)):
        if isinstance(item, int) and not isinstance(item, bool):
            if not 0 <= item < count:
                raise ClusterError(f"{where}[{j}]: GPU index {item} is not in 0..{count - 1}")
            out.add(item)
        elif isinstance(item, str) and topology is not None:
            index = topology.index_by_uuid.get(item)
            if index is None:
                raise ClusterError(f"{where}[{j}]: no GPU with UUID {item!r} on this node")
            out.add(index)
        else:
            kind = "GPU index or UUID" if topology is not None else "GPU index (topology unknown: no UUIDs)"
            raise ClusterError(f"{where}[{j}]: {item!r} is not a {kind}")
    return frozenset(out)


def _podgroups(raw: list[Any]) -> tuple[PodGroupSpec, ...]:
    out: list[PodGroupSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        where = f"podgroups[{i}]"
        if not isinstance(item, Mapping):
            raise ClusterError(f"{where}: must be a mapping with namespace, name, minMember")
        _no_unknown_keys(item, _GROUP_KEYS, where)
        ns = _name(item.get("namespace", "default"), f"{where}.namespace")
        name = _name(item.get("name"), f"{where}.name")
        mm = item.get("minMember")
        if not isinstance(mm, int) or isinstance(mm, bool) or not 1 <= mm <= 100_000:
            raise ClusterError(f"{where}.minMember: must be an integer from 1 to 100000, got {mm!r}")
        group = PodGroupSpec(ns, name, mm)
        if group.key in seen:
            raise ClusterError(f"{where}: podgroup {group.key} is listed twice")
        seen.add(group.key)
        out.append(group)
    return tuple(out)


def _pods(raw: list[Any], node_names: set[str]) -> tuple[PodRecord, ...]:
    out: list[PodRecord] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        where = f"pods[{i}]"
        if not isinstance(item, Mapping):
            raise ClusterError(f"{where}: must be a mapping with namespace, name, gpus")
        _no_unknown_keys(item, _POD_KEYS, where)
        ns = _name(item.get("namespace", "default"), f"{where}.namespace")
        name = _name(item.get("name"), f"{where}.name")
        gpus = item.get("gpus", 0)
        if not isinstance(gpus, int) or isinstance(gpus, bool) or not 0 <= gpus <= 1024:
            raise ClusterError(f"{where}.gpus: must be an integer from 0 to 1024, got {gpus!r}")
        node = item.get("node") or ""
        if not isinstance(node, str) or (node and node not in node_names):
            raise ClusterError(f"{where}.node: {node!r} is not a node of this snapshot")
        uid = item.get("uid") or ""
        if not isinstance(uid, str):
            raise ClusterError(f"{where}.uid: must be a string")
        pod = PodRecord(
            ns,
            name,
            gpus,
            _labels(item.get("labels"), f"{where}.labels"),
            _annotations(item.get("annotations"), f"{where}.annotations"),
            node,
            uid,
        )
        if pod.key in seen:
            raise ClusterError(f"{where}: pod {pod.key} is listed twice")
        seen.add(pod.key)
        out.append(pod)
    return tuple(out)


def _share_allocators(nodes: Sequence[ClusterNode], pool: AllocatorPool) -> dict[str, Allocator | None]:
    """One Allocator per distinct bandwidth matrix (the only input of the objective)."""
    out: dict[str, Allocator | None] = {}
    for n in nodes:
        try:
            out[n.name] = pool.get(n.topology) if n.topology is not None else None
        except AllocationError as e:
            raise ClusterError(f"node {n.name}: {e}") from None
    return out


def _list(raw: Any, where: str, *, required: bool = False) -> list[Any]:
    if raw is None and not required:
        return []
    if not isinstance(raw, list) or (required and not raw):
        raise ClusterError(f"{where}: must be a {'non-empty ' if required else ''}list")
    return raw


def _no_unknown_keys(raw: Mapping[Any, Any], allowed: Sequence[str], where: str) -> None:
    for key in raw:
        if key not in allowed:
            raise ClusterError(f"{where}: unknown key {key!r} (expected {', '.join(allowed)})")


def _name(raw: Any, where: str) -> str:
    if not isinstance(raw, str) or len(raw) > 253 or not _DNS_RE.match(raw):
        raise ClusterError(f"{where}: {raw!r} is not a valid name (lowercase DNS name)")
    return raw


def _labels(raw: Any, where: str) -> Mapping[str, str]:
    if raw is None:
        return MappingProxyType({})
    if not isinstance(raw, Mapping):
        raise ClusterError(f"{where}: must be a mapping of label keys to string values")
    for key, value in raw.items():
        if not is_label_key(key):
            raise ClusterError(f"{where}: {key!r} is not a valid label key")
        if not isinstance(value, str) or len(value) > 63 or not _VALUE_RE.match(value):
            raise ClusterError(f"{where}.{key}: {value!r} is not a valid label value (quote numbers in YAML)")
    return MappingProxyType(dict(raw))


def _annotations(raw: Any, where: str) -> Mapping[str, str]:
    if raw is None:
        return MappingProxyType({})
    if not isinstance(raw, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        raise ClusterError(f"{where}: must be a mapping of strings to strings")
    return MappingProxyType(dict(raw))


def _one_line(text: str) -> str:
    return " ".join(text.split())


# --------------------------------------------------------------------------- synthetic clusters


def generate_cluster(
    spines: int,
    leaves_per_spine: int,
    nodes_per_leaf: int,
    presets: Mapping[str, float] | Sequence[str] = ("dgx-a100",),
    seed: int = 0,
    *,
    busy_fraction: float = 0.0,
    levels: Sequence[str] = DEFAULT_LEVELS,
    load: TopologyLoader = load_topology,
    pool: AllocatorPool | None = None,
) -> ClusterSnapshot:
    """A fat tree of spines > leaves > nodes, labelled with the NVIDIA topology keys.

    `presets` is a weighted mix ({"dgx-a100": 3, "hgx-h100": 1}) or a list (equal weights); each
    node draws its server type. A `busy_fraction` of the nodes, drawn at random, has between 1
    and all of its GPUs in use, also drawn at random. Same arguments, same cluster (`seed`)."""
    for what, v in (
        ("spines", spines),
        ("leaves_per_spine", leaves_per_spine),
        ("nodes_per_leaf", nodes_per_leaf),
    ):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{what} must be a positive integer, got {v!r}")
    if not 0.0 <= busy_fraction <= 1.0:
        raise ValueError(f"busy_fraction must be within 0..1, got {busy_fraction!r}")
    weights = dict(presets) if isinstance(presets, Mapping) else {p: 1.0 for p in presets}
    if not weights or any(not (w > 0) for w in weights.values()):
        raise ValueError("presets must name at least one preset, each with a positive weight")
    rng = random.Random(seed)
    names, probs = list(weights), list(weights.values())
    sizes = {p: load(p).n for p in names}
    nodes = []
    for s in range(spines):
        for lf in range(leaves_per_spine):
            for k in range(nodes_per_leaf):
                preset = rng.choices(names, probs)[0]
                n = sizes[preset]
                allocated: list[int] = []
                if rng.random() < busy_fraction:
                    allocated = sorted(rng.sample(range(n), rng.randint(1, n)))
                name = f"s{s}-l{lf}-n{k}"
                nodes.append(
                    {
                        "name": name,
                        "labels": {HOSTNAME: name, LEAF: f"leaf-{s}-{lf}", SPINE: f"spine-{s}"},
                        "gpus": preset,
                        "allocated": allocated,
                    }
                )
    return parse_cluster({"levels": list(levels), "nodes": nodes}, load=load, pool=pool)
