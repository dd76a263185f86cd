"""The optional API kinds the sidecar reads beside Nodes and Pods, found through discovery.

Each kind belongs to an API group a cluster may or may not serve (Kubernetes' alpha Workload
API, Volcano, Kueue, KAI Scheduler's PodGroups and Topologies). At every (re)list the group's
served versions are looked up in the API server's discovery document (`GET /apis`, cached
briefly); a group that is not served is logged once (`kind_absent`) and retried quietly, never
an error. The parsed objects feed the snapshot: gang minimums and group-level topology keys
are resolved into the pods' `GangRef`s, Topology objects into the level list. Which kinds
there are, and their parsers, come from the core's table of gang sources
(gputopo/gang/sources.py `SOURCES`, `TOPOLOGY_APIS`).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from gputopo import jsonlog
from gputopo.gang import hypernodes
from gputopo.gang import sources as gangsources
from gputopo.gang.hypernodes import HyperNode
from gputopo.gang.planner import SubGroup
from gputopo.gang.sources import Api, Group, GroupParser
from gputopo_kube.rawapi import RawApi
from scheduler import sources
from scheduler.model import GangRef, PodInfo

log = logging.getLogger("gputopo.scheduler.kube")

#: How long one discovery answer is reused: relists of several kinds share it.
DISCOVERY_TTL_S = 10.0


@dataclass(frozen=True)
class Kind:
    """One optional kind: where it lives and how its objects are read."""

    name: str  # reflector name ("k8s-podgroups"), in logs and readiness
    group: str
    versions: tuple[str, ...]  # in order of preference; the first one served is used
    plural: str
    parse: GroupParser | None  # gang objects; None = a Topology (a level list) or HyperNodes
    hypernodes: bool = False  # Volcano's HyperNodes (tiers onto levels: gputopo/gang/hypernodes.py)


def _kind(api: Api, parse: GroupParser | None, hypernodes: bool = False) -> Kind:
    return Kind(api.reflector, api.group, api.versions, api.plural, parse, hypernodes)


#: Every discovered kind of the core's table: the gang sources' group objects in precedence
#: order, then the Topology kinds (scheduler-plugins' PodGroup has a watch of its own).
KINDS: tuple[Kind, ...] = (
    *(_kind(s.api, s.parse) for s in gangsources.SOURCES if s.api is not None and s.api.discovered),
    *(_kind(api, parse) for api, parse in gangsources.TREE_APIS),
    *(_kind(api, parse) for api, parse in gangsources.DOMAIN_APIS),
    *(_kind(api, None) for api in gangsources.TOPOLOGY_APIS),
    _kind(gangsources.HYPERNODE_API, None, hypernodes=True),
)


def absent(kind: Kind) -> ApiException:
    """What a list of a kind whose group the API server does not serve raises (a 404)."""
    e = ApiException(status=404, reason=f"{kind.group} {'/'.join(kind.versions)} is not served")
    return e


class Discovery:
    """Served versions per API group, from `GET /apis`, reused for DISCOVERY_TTL_S."""

    def __init__(
        self, api_client: client.ApiClient, timeout_s: float = 10.0, ttl_s: float = DISCOVERY_TTL_S
    ) -> None:
        self.apis = RawApi(api_client)  # not the typed ApisApi: its import costs ~0.5 s
        self.timeout_s = timeout_s
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._at = -math.inf
        self._served: dict[str, set[str]] = {}

    def version(self, kind: Kind) -> str:
        """The version of `kind` to use, or `absent(kind)` raised."""
        with self._lock:
            if time.monotonic() - self._at >= self.ttl_s:
                get: Any = self.apis.get_api_versions  # a raw response: _preload_content=False
                resp = get(_preload_content=False, _request_timeout=self.timeout_s)
                try:
                    doc = json.loads(resp.data)
                finally:
                    resp.release_conn()
                self._served = _served(doc)
                self._at = time.monotonic()
            served = self._served.get(kind.group, set())
        for v in kind.versions:
            if v in served:
                return v
        raise absent(kind)


def _served(doc: Any) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    groups = doc.get("groups") if isinstance(doc, Mapping) else None
    for g in groups if isinstance(groups, list) else []:
        if not isinstance(g, Mapping) or not isinstance(g.get("name"), str):
            continue
        raw = g.get("versions")
        versions: list[Any] = raw if isinstance(raw, list) else []
        out[g["name"]] = {
            v["version"] for v in versions if isinstance(v, Mapping) and isinstance(v.get("version"), str)
        }
    return out


class ExtraKinds:
    """The objects of every optional kind, and what the snapshot derives from them.

    Every mutating method is called with the owner's lock held (KubeState's), and calls
    `changed()` so the next snapshot is rebuilt."""

    def __init__(self, custom: RawApi, discovery: Discovery, changed: Callable[[], None]) -> None:
        self.custom = custom
        self.discovery = discovery
        self.changed = changed
        self.kinds = KINDS
        self._versions: dict[str, str] = {}
        self._groups: dict[str, dict[str, list[Group]]] = {k.name: {} for k in KINDS if k.parse}
        self._topologies: dict[str, dict[str, tuple[str, ...]]] = {
            k.name: {} for k in KINDS if not k.parse and not k.hypernodes
        }
        self._hypernodes: dict[str, HyperNode] = {}
        self._hyper_view: tuple[HyperNode, ...] | None = None  # None: rebuilt at next read
        self._legacy_refs: dict[str, dict[str, str]] = {}
        self._version = 0
        self._index: tuple[int, dict[str, Group]] | None = None
        self._resolved: tuple[object, int, dict[str, PodInfo]] | None = None

    @property
    def names(self) -> set[str]:
        return {k.name for k in self.kinds}

    def list_fn(self, kind: Kind) -> Callable[..., Any]:
        """The list/watch call of one kind, at the version discovery says is served now."""

        def call(**kw: Any) -> Any:
            version = self.discovery.version(kind)
            self._versions[kind.name] = version
            return self.custom.list_cluster_custom_object(kind.group, version, kind.plural, **kw)

        return call

    # -- store (caller holds the lock) --------------------------------------------------------

    def replace_all(self, kind: Kind, items: Iterable[dict[str, Any]]) -> None:
        if kind.hypernodes:
            self._hypernodes = dict(filter(None, (_parse_hypernode(o) for o in items)))
            self._hyper_view = None
        elif kind.parse is not None:
            self._groups[kind.name] = dict(filter(None, (self._parse_group(kind, o) for o in items)))
        else:
            self._topologies[kind.name] = dict(filter(None, (_parse_topology(o) for o in items)))
        self._bump()

    def apply(self, kind: Kind, event: str, obj: dict[str, Any]) -> None:
        name = _object_key(obj)
        if name is None:
            return
        parsed: tuple[str, Any] | None
        if kind.hypernodes:
            parsed = None if event == "DELETED" else _parse_hypernode(obj)
            store: dict[str, Any] = self._hypernodes
            self._hyper_view = None
        elif kind.parse is not None:
            parsed = None if event == "DELETED" else self._parse_group(kind, obj)
            store = self._groups[kind.name]
        else:
            parsed = None if event == "DELETED" else _parse_topology(obj)
            store = self._topologies[kind.name]
        if parsed is None:
            store.pop(name, None)
        else:
            store[parsed[0]] = parsed[1]
        self._bump()

    def replace_legacy(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A relist of scheduler-plugins PodGroups: forget the identities of the ones gone."""
        self._legacy_refs = {}
        for o in items:
            self.note_legacy("ADDED", o)

    def note_legacy(self, event: str, obj: Mapping[str, Any]) -> None:
        """Remember a scheduler-plugins PodGroup's identity, so Events can name it."""
        groups = gangsources.groups_scheduler_plugins(obj, gangsources.SCHEDULER_PLUGINS_API.api_version)
        key = _object_key(obj)
        if key is None:
            return
        if event == "DELETED" or not groups or groups[0].ref is None:
            self._legacy_refs.pop(key, None)
        else:
            self._legacy_refs[key] = dict(groups[0].ref)

    def _parse_group(self, kind: Kind, obj: Mapping[str, Any]) -> tuple[str, list[Group]] | None:
        key = _object_key(obj)
        if key is None:
            return None
        assert kind.parse is not None
        api_version = f"{kind.group}/{self._versions.get(kind.name, kind.versions[0])}"
        groups, refused = gangsources.with_profile(obj, kind.parse(obj, api_version))
        if refused:  # the object's declaration is ignored, its gangs are kept
            jsonlog.event(
                log, "group_profile_ignored", logging.WARNING, object=key, kind=kind.name, reason=refused
            )
        return key, groups

    def _bump(self) -> None:
        self._version += 1
        self.changed()

    # -- derived (caller holds the lock) -----------------------------------------------------

    def group_index(self) -> dict[str, Group]:
        """Gang key -> its Group, composite trees linked (`gangsources.link`)."""
        if self._index is None or self._index[0] != self._version:
            every = (
                g for name in sorted(self._groups) for _, gs in sorted(self._groups[name].items()) for g in gs
            )
            self._index = (self._version, gangsources.link(every))
        return self._index[1]

    def min_members(self) -> dict[str, int]:
        """The quorum of every gang a group object defines (a PodGroup inside a composite
        tree is no gang: its tree's root is)."""
        return {k: g.min_member for k, g in self.group_index().items() if not g.root and g.min_member >= 1}

    def hypernodes(self) -> tuple[HyperNode, ...]:
        """Every usable HyperNode, in name order: the same tuple while none changed (the
        extender rebuilds its tier map only when this object changes)."""
        if self._hyper_view is None:
            self._hyper_view = tuple(h for _, h in sorted(self._hypernodes.items()))
        return self._hyper_view

    def levels(self, defaults: tuple[str, ...]) -> tuple[str, ...]:
        """() when the cluster has no Topology object (the configured levels apply)."""
        lists = [lv for name in sorted(self._topologies) for _, lv in sorted(self._topologies[name].items())]
        return sources.merge_levels(lists, defaults) if lists else ()

    def resolve(self, pods: dict[str, PodInfo]) -> dict[str, PodInfo]:
        """The pods with what their group objects say filled in: the minimum (Workload replicas
        count by their Workload's pod group), the group's topology key as the required level
        unless gputopo's own annotations set the levels, Volcano's tier, and the group's tree
        (`with_group`); a pod that names no gang but claims a ComputeDomain's channel template
        is in that domain's gang (`with_compute_domain`). The same dict when nothing applies."""
        cached = self._resolved
        if cached is not None and cached[0] is pods and cached[1] == self._version:
            return cached[2]
        index = self.group_index()
        out = pods
        if index:
            domains = gangsources.compute_domain_gangs(
                ((k, p.namespace, p.claim_templates) for k, p in pods.items() if p.gang is None),
                index,
            )
            changed: dict[str, PodInfo] = {}
            for key, p in pods.items():
                found = domains.get(key)
                new = with_group(p, index) if found is None else with_compute_domain(p, *found)
                if new is not p:
                    changed[key] = new
            if changed:
                out = {**pods, **changed}
        self._resolved = (pods, self._version, out)
        return out

    def ref(self, gang_key: str) -> Mapping[str, str] | None:
        """The object (apiVersion, kind, namespace, name, uid) that defines a gang, if any."""
        group = gangsources.group_for(gang_key, self.group_index())
        if group is not None:
            return group.ref
        return self._legacy_refs.get(gang_key)


def with_group(p: PodInfo, index: Mapping[str, Group]) -> PodInfo:
    """One pod with its gang's group object applied (`ExtraKinds.resolve`); `p` itself when the
    object changes nothing.

    A PodGroup inside a CompositePodGroup tree puts its pods in the tree's gang (keyed by the
    root, `named` keeps the pod's own key) as members of the sub-group `podgroup:NAME`. The
    object's tree replaces the pod's declared sub-groups unless gputopo's own annotation
    declared them (precedence as for levels: gputopo > group object > Kueue); a pod naming a
    sub-group the tree lacks is a member of the root."""
    g = p.gang
    if g is None:
        return p
    group = gangsources.group_for(g.key, index)
    if group is None:
        return p
    new = g
    subgroup = g.subgroup
    if group.root:
        root = index.get(group.root)
        if root is None:
            return p
        subgroup = group.key.partition("/")[2]  # podgroup:NAME, its sub-group in the tree
        new = replace(new, key=root.key, named=g.key, min_member=None, subgroup_source="")
        group = root
    if new.min_member is None:
        new = replace(new, min_member=group.min_member)
    if group.profile is not None and p.profile is None:  # the pod's own one wins
        p = replace(p, profile=group.profile)
    if g.level_source != "gputopo" and (group.required_level or group.preferred_level or group.tier):
        new = replace(
            new,
            required_level=group.required_level,
            preferred_level=group.preferred_level,
            level_source="group",
            tier=group.tier,
        )
    if group.subgroups and new.subgroup_source != "gputopo":
        names = {s.name for s in group.subgroups}
        new = replace(
            new,
            subgroup=subgroup if subgroup in names else "",
            groups=group.subgroups,
            subgroup_source="group",
        )
    if group.partitions and new.subgroup_source != "gputopo":
        new = _with_partition(new, group.partitions)
    return p if new == g else replace(p, gang=new)


def _with_partition(g: GangRef, partitions: tuple[gangsources.Partition, ...]) -> GangRef:
    """A Volcano gang member in its partition's sub-group (`gangsources.partition_of`, read from
    the pod's labels), under the root, with the partition's tier to map when planned; a pod no
    policy takes is in the root (its declared sub-groups, if any, kept)."""
    found = gangsources.partition_of(partitions, dict(g.labels))
    if found is None:
        return g
    policy, name = found
    return replace(
        g,
        subgroup=name,
        groups=(SubGroup(name, "", None, None, policy.size),),
        subgroup_source="group",
        subgroup_tiers=((name, policy.tier),) if policy.tier is not None else (),
    )


def with_compute_domain(p: PodInfo, group: Group, quorum: int) -> PodInfo:
    """A pod that names no gang of its own in its ComputeDomain's gang: the domain's key, the
    quorum `compute_domain_gangs` gave, required in one domain of the domain's level (the NVLink
    clique), so every member lands where the domain's IMEX channel reaches."""
    gang = GangRef(
        group.key,
        quorum,
        group.required_level,
        None,
        gangsources.COMPUTE_DOMAIN_LABEL,
        "group",
    )
    if group.profile is not None and p.profile is None:
        p = replace(p, profile=group.profile)
    return replace(p, gang=gang)


def _object_key(obj: Mapping[str, Any]) -> str | None:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        return None
    ns = meta.get("namespace") or ""
    return f"{ns}/{meta['name']}" if isinstance(ns, str) and ns else meta["name"]


def _parse_hypernode(obj: Mapping[str, Any]) -> tuple[str, HyperNode] | None:
    """A HyperNode by name, or None (logged with the field at fault: it is skipped)."""
    key = _object_key(obj)
    parsed = hypernodes.parse_hypernode(obj)
    if isinstance(parsed, str):
        if key is not None:
            jsonlog.event(log, "hypernode_ignored", logging.WARNING, hypernode=key, reason=parsed)
        return None
    return (parsed.name, parsed)


def _parse_topology(obj: Mapping[str, Any]) -> tuple[str, tuple[str, ...]] | None:
    key = _object_key(obj)
    levels = sources.topology_levels(obj)
    if key is not None and levels is None:
        jsonlog.event(
            log,
            "topology_ignored",
            logging.WARNING,
            topology=key,
            reason="spec.levels must be 1..16 distinct node-label keys",
        )
    return (key, levels) if key is not None and levels is not None else None
