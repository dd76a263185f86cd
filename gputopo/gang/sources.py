"""The gang sources: every API a pod can name its gang through, in one table, and the pure
functions that read them.

A pod names its gang through Kubernetes' own Workload API, scheduler-plugins, the pod-group
labels, Volcano, Kueue or KAI Scheduler. `SOURCES` lists them in precedence order (the first one
a pod carries decides; docs/scheduler.md "Gang sources and levels"): for each, where the pod
names it, the key space of its gangs, where its group object lives (API group, versions, plural,
kind) and how that object gives the quorum. The sidecar (scheduler/sources.py, apikinds.py) and
`kubectl gputopo why` both decide with `pod_gang` and the parsers here, and the RBAC rules of
charts/ and deploy/ are tested against `APIS`, so a new gang source is one entry here (a reader
and a parser) and its test.

Everything is a pure function of API JSON: every field checked, garbage -> None (or
`SourceError` when a pod names a source but its fields are unusable: the message names the
field). Upstream facts used here (checked against upstream source, see docs/scheduler.md):
- `scheduling.k8s.io/v1beta1` PodGroup (1.37, beta behind the GenericWorkload gate) and
  `v1alpha2` (1.36): `spec.schedulingPolicy.gang.minCount`,
  `spec.schedulingConstraints.topology[].key`; pods join with
  `spec.schedulingGroup.podGroupName` (kubernetes staging/src/k8s.io/api/scheduling/v1beta1 and
  v1alpha2 types.go, and core/v1 `PodSchedulingGroup`: the same fields in both versions).
- `scheduling.k8s.io/v1alpha1` Workload (1.35): `spec.podGroups[] {name, policy.gang.minCount}`;
  pods join with `spec.workloadRef {name, podGroup, podGroupReplicaKey}`; the policy applies
  to each replica key separately.
- scheduler-plugins: pod label `scheduling.x-k8s.io/pod-group`, `scheduling.x-k8s.io/v1alpha1`
  PodGroup `spec.minMember` (design.md §5).
- Volcano: pod annotation `scheduling.k8s.io/group-name`, `scheduling.volcano.sh/v1beta1`
  PodGroup `spec.minMember`.
- Kueue: pod label `kueue.x-k8s.io/pod-group-name` + annotation
  `kueue.x-k8s.io/pod-group-total-count`; annotations `kueue.x-k8s.io/podset-required-topology`
  / `…-preferred-topology`; `Topology` `spec.levels[].nodeLabel`, broadest level first.
- KAI Scheduler: the pod grouper writes annotation `pod-group-name`; `scheduling.run.ai/v2alpha2`
  PodGroup `spec.minMember`, `spec.topologyConstraint`; `kai.scheduler/topology-required-placement`
  / `…-preferred-placement` (annotations the pod grouper reads from the top owner, which for a
  bare pod is the pod); `kai.scheduler/v1alpha1` Topology `spec.levels[].nodeLabel`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gputopo.jobtime.profiles import Profile, ProfileError, declared_profile
from gputopo.network.levels import is_label_key

MAX_MEMBERS = 100_000

# --- pod-side keys ------------------------------------------------------------------------
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"  # scheduler-plugins (design.md §5)
LIGHT_GROUP_LABEL = "pod-group.scheduling.sigs.k8s.io/name"
LIGHT_MIN_LABEL = "pod-group.scheduling.sigs.k8s.io/min-available"
VOLCANO_GROUP_ANNOTATIONS = ("scheduling.k8s.io/group-name", "scheduling.volcano.sh/group-name")
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
#: KAI Scheduler's pod grouper writes its PodGroup's name on every pod it groups.
KAI_GROUP_ANNOTATION = "pod-group-name"

#: Level annotations (family, required key, preferred key), in precedence order: gputopo's own,
#: Kueue's, KAI Scheduler's. The sidecar reads them (scheduler/sources.py `pod_levels`) and
#: `kubectl gputopo why` shows them.
LEVEL_ANNOTATIONS: tuple[tuple[str, str, str], ...] = (
    ("gputopo", "gputopo.io/required-topology", "gputopo.io/preferred-topology"),
    ("kueue", "kueue.x-k8s.io/podset-required-topology", "kueue.x-k8s.io/podset-preferred-topology"),
    ("kai", "kai.scheduler/topology-required-placement", "kai.scheduler/topology-preferred-placement"),
)

# --- gang key prefixes (one key space per API, so equal names never merge two gangs) --------
K8S_PODGROUP = "podgroup:"
K8S_WORKLOAD = "workload:"
VOLCANO = "volcano:"
KUEUE = "kueue:"
KAI = "kai:"


class SourceError(ValueError):
    """A pod whose gang fields are present but unusable; the message names the field."""


# --- the objects beside the pods -------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    """One gang as a group object defines it."""

    key: str  # the gang key pods compute (namespace/prefix+name)
    min_member: int
    required_level: str | None = None
    ref: Mapping[str, str] | None = None  # apiVersion, kind, namespace, name, uid: for Events
    preferred_level: str | None = None  # a level the group prefers (KAI's topologyConstraint)
    #: what the gang trains, from the object's own gputopo.io/profile annotations (its pods'
    #: annotations win); set by `with_profile` for every group object kind alike
    profile: Profile | None = None


#: Parses one group object (and the apiVersion it was read at) into the gangs it defines.
GroupParser = Callable[[Mapping[str, Any], str], list[Group]]


@dataclass(frozen=True)
class Api:
    """Where a kind of object beside the pods lives, as RBAC and the client name it.

    `reflector` is the sidecar's name for its watch (logs, readiness); `discovered`: the group is
    optional and looked up in the API server's discovery (scheduler/apikinds.py) — the one that
    is not (scheduler-plugins' PodGroup, design.md §5) has a watch of its own."""

    reflector: str
    group: str
    versions: tuple[str, ...]  # in order of preference; the first one served is used
    plural: str
    kind: str
    discovered: bool = True

    @property
    def api_version(self) -> str:
        """The preferred group/version (what a client asks for without discovery)."""
        return f"{self.group}/{self.versions[0]}"


@dataclass(frozen=True)
class Named:
    """A pod's gang as the pod names it: the source, the key (without the namespace), the
    quorum when the pod carries it, and the group object to read for the rest."""

    source: GangSource
    key: str
    field: str  # where the pod names it, as `kubectl gputopo why` shows it
    name: str  # the group's name as the pod gives it (the group object's, when the source has one)
    min_member: int | None = None
    pod_group: str | None = None  # the Workload's pod group the pod belongs to


#: Reads one source from a pod's labels, annotations and spec: None when the pod does not name
#: that source, SourceError when it names it with unusable fields.
PodReader = Callable[["GangSource", Mapping[str, str], Mapping[str, str], Mapping[str, Any]], "Named | None"]


@dataclass(frozen=True)
class GangSource:
    """One API a pod can name its gang through (a row of docs/scheduler.md's table)."""

    name: str  # short id
    label: str  # the sidecar's name for it (logs, `source` of a gang)
    read: PodReader
    quorum: str  # how the quorum is read, for docs and `why`
    api: Api | None = None  # its group object, if the source has one
    parse: GroupParser | None = None  # that object -> the gangs it defines


# --- helpers ----------------------------------------------------------------------------------


def _count(raw: object) -> int | None:
    """A positive member count from a label/annotation string or a JSON int; else None."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, str):
        text = raw.strip()
        if not (0 < len(text) <= 6 and text.isascii() and text.isdigit()):
            return None
        raw = int(text)
    if isinstance(raw, int) and 1 <= raw <= MAX_MEMBERS:
        return raw
    return None


def _name(raw: object) -> str | None:
    """An object name as the API allows it (non-empty, no '/', bounded); else None."""
    if isinstance(raw, str) and 0 < len(raw) <= 253 and "/" not in raw and raw.strip() == raw:
        return raw
    return None


def _meta(obj: Mapping[str, Any]) -> tuple[str, str, str] | None:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    ns = meta.get("namespace") or "default"
    name = _name(meta.get("name"))
    uid = meta.get("uid") or ""
    if name is None or not isinstance(ns, str) or not isinstance(uid, str):
        return None
    return ns, name, uid


def _ref(kind: str, api_version: str, ns: str, name: str, uid: str) -> dict[str, str]:
    return {"apiVersion": api_version, "kind": kind, "namespace": ns, "name": name, "uid": uid}


def dig(obj: Any, *path: str) -> Any:
    """`obj[path[0]][path[1]]…`, None as soon as a step is not a mapping."""
    for p in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(p)
    return obj


def _topology_key(constraints: Any) -> str | None:
    items = dig(constraints, "topology")
    if isinstance(items, list) and items and isinstance(items[0], Mapping):
        key = items[0].get("key")
        return key if is_label_key(key) else None
    return None


# --- group object parsers ---------------------------------------------------------------------


def _min_member_group(obj: Mapping[str, Any], api_version: str, prefix: str) -> list[Group]:
    """A PodGroup whose gang size is `spec.minMember` (scheduler-plugins, Volcano, KAI); `prefix`
    keeps each API's names in a key space of their own."""
    m = _meta(obj)
    n = _count(dig(obj, "spec", "minMember"))
    if m is None or n is None:
        return []
    return [Group(f"{m[0]}/{prefix}{m[1]}", n, None, _ref("PodGroup", api_version, *m))]


def groups_scheduler_plugins(obj: Mapping[str, Any], api_version: str) -> list[Group]:
    return _min_member_group(obj, api_version, "")


def groups_k8s_podgroup(obj: Mapping[str, Any], api_version: str) -> list[Group]:
    """A `basic` policy (no gang) yields nothing: such pods are placed one by one."""
    m = _meta(obj)
    n = _count(dig(obj, "spec", "schedulingPolicy", "gang", "minCount"))
    if m is None or n is None:
        return []
    required = _topology_key(dig(obj, "spec", "schedulingConstraints"))
    return [Group(f"{m[0]}/{K8S_PODGROUP}{m[1]}", n, required, _ref("PodGroup", api_version, *m))]


def groups_k8s_workload(obj: Mapping[str, Any], api_version: str) -> list[Group]:
    """One Group per gang pod group; replica keys are matched by prefix (see `group_for`)."""
    m = _meta(obj)
    pgs = dig(obj, "spec", "podGroups")
    if m is None or not isinstance(pgs, list):
        return []
    out = []
    for pg in pgs[:64]:
        name = _name(dig(pg, "name"))
        n = _count(dig(pg, "policy", "gang", "minCount"))
        if name is not None and n is not None:
            key = f"{m[0]}/{K8S_WORKLOAD}{m[1]}/{name}"
            out.append(Group(key, n, None, _ref("Workload", api_version, *m)))
    return out


def groups_volcano(obj: Mapping[str, Any], api_version: str) -> list[Group]:
    return _min_member_group(obj, api_version, VOLCANO)


def groups_kai(obj: Mapping[str, Any], api_version: str) -> list[Group]:
    """KAI Scheduler's PodGroup: `spec.minMember`, and `spec.topologyConstraint`'s
    `requiredTopologyLevel` / `preferredTopologyLevel` (node-label keys of its Topology's
    levels). A PodGroup counted by `minSubGroup` instead of members yields nothing: its pods
    are placed one by one (sub-groups are not modelled)."""
    found = _min_member_group(obj, api_version, KAI)
    if not found:
        return []
    constraint = dig(obj, "spec", "topologyConstraint")
    required, preferred = (
        dig(constraint, "requiredTopologyLevel"),
        dig(constraint, "preferredTopologyLevel"),
    )
    return [
        replace(
            found[0],
            required_level=required if is_label_key(required) else None,
            preferred_level=preferred if is_label_key(preferred) else None,
        )
    ]


def workload_key(gang_key: str) -> str:
    """A Workload member's key without its replica key: the Workload's pod group it counts by."""
    ns, _, rest = gang_key.partition("/")
    if not rest.startswith(K8S_WORKLOAD):
        return gang_key
    parts = rest[len(K8S_WORKLOAD) :].split("/")
    return f"{ns}/{K8S_WORKLOAD}{'/'.join(parts[:2])}" if len(parts) == 3 else gang_key


def group_for(gang_key: str, index: Mapping[str, Group]) -> Group | None:
    """The group object's gang a pod's gang key (namespace/key) counts by, if any: its own, or
    for a Workload replica its Workload's pod group."""
    return index.get(gang_key) or index.get(workload_key(gang_key))


# --- pod-side readers -------------------------------------------------------------------------


def _read_k8s_podgroup(
    source: GangSource, labels: Mapping[str, str], annotations: Mapping[str, str], spec: Mapping[str, Any]
) -> Named | None:
    group = spec.get("schedulingGroup")
    if not isinstance(group, Mapping) or group.get("podGroupName") is None:
        return None
    name = _name(group.get("podGroupName"))
    if name is None:
        raise SourceError("Pod.spec.schedulingGroup.podGroupName must be an object name")
    return Named(source, K8S_PODGROUP + name, "spec.schedulingGroup.podGroupName", name)


def _read_k8s_workload(
    source: GangSource, labels: Mapping[str, str], annotations: Mapping[str, str], spec: Mapping[str, Any]
) -> Named | None:
    ref = spec.get("workloadRef")
    if not isinstance(ref, Mapping) or (ref.get("name") is None and ref.get("podGroup") is None):
        return None
    workload, pg = _name(ref.get("name")), _name(ref.get("podGroup"))
    replica = ref.get("podGroupReplicaKey")
    if workload is None or pg is None or (replica is not None and _name(replica) is None):
        raise SourceError("Pod.spec.workloadRef needs name and podGroup (object names)")
    key = f"{K8S_WORKLOAD}{workload}/{pg}" + (f"/{replica}" if replica else "")
    return Named(source, key, "spec.workloadRef", workload, pod_group=pg)


def _read_scheduler_plugins(
    source: GangSource, labels: Mapping[str, str], annotations: Mapping[str, str], spec: Mapping[str, Any]
) -> Named | None:
    name = labels.get(POD_GROUP_LABEL)
    if not name:
        return None
    return Named(source, name, f"label {POD_GROUP_LABEL}", name)


def _read_light(
    source: GangSource, labels: Mapping[str, str], annotations: Mapping[str, str], spec: Mapping[str, Any]
) -> Named | None:
    name = labels.get(LIGHT_GROUP_LABEL)
    if not name:
        return None
    minimum = _count(labels.get(LIGHT_MIN_LABEL, ""))
    if minimum is None:
        raw = labels.get(LIGHT_MIN_LABEL, "")
        raise SourceError(f"label {LIGHT_MIN_LABEL} must be a positive integer, got {raw!r}")
    return Named(source, name, f"label {LIGHT_GROUP_LABEL}", name, min_member=minimum)


def _read_volcano(
    source: GangSource, labels: Mapping[str, str], annotations: Mapping[str, str], spec: Mapping[str, Any]
) -> Named | None:
    for key in VOLCANO_GROUP_ANNOTATIONS:
        name = annotations.get(key)
        if name:
            return Named(source, VOLCANO + name, f"annotation {key}", name)
    return None


def _read_kueue(
    source: GangSource, labels: Mapping[str, str], annotations: Mapping[str, str], spec: Mapping[str, Any]
) -> Named | None:
    name = labels.get(KUEUE_GROUP_LABEL)
    if not name:
        return None
    minimum = _count(annotations.get(KUEUE_TOTAL_ANNOTATION, ""))
    if minimum is None:
        raw = annotations.get(KUEUE_TOTAL_ANNOTATION, "")
        raise SourceError(f"annotation {KUEUE_TOTAL_ANNOTATION} must be a positive integer, got {raw!r}")
    return Named(source, KUEUE + name, f"label {KUEUE_GROUP_LABEL}", name, min_member=minimum)


def _read_kai(
    source: GangSource, labels: Mapping[str, str], annotations: Mapping[str, str], spec: Mapping[str, Any]
) -> Named | None:
    name = annotations.get(KAI_GROUP_ANNOTATION)
    if not name:
        return None
    if _name(name) is None:
        raise SourceError(f"annotation {KAI_GROUP_ANNOTATION} must be an object name, got {name[:64]!r}")
    return Named(source, KAI + name, f"annotation {KAI_GROUP_ANNOTATION}", name)


# --- the table ----------------------------------------------------------------------------------

#: scheduler-plugins' PodGroup (design.md §5): always watched, by a watch of the sidecar's own.
SCHEDULER_PLUGINS_API = Api(
    "podgroups", "scheduling.x-k8s.io", ("v1alpha1",), "podgroups", "PodGroup", discovered=False
)

#: Every gang source, in precedence order: the first one a pod carries decides.
SOURCES: tuple[GangSource, ...] = (
    GangSource(
        "k8s-podgroup",
        "scheduling.k8s.io PodGroup",
        _read_k8s_podgroup,
        "PodGroup spec.schedulingPolicy.gang.minCount",
        # 1.37 serves v1beta1 (and no longer v1alpha2); 1.36 serves v1alpha2.
        Api("k8s-podgroups", "scheduling.k8s.io", ("v1beta1", "v1alpha2"), "podgroups", "PodGroup"),
        groups_k8s_podgroup,
    ),
    GangSource(
        "k8s-workload",
        "scheduling.k8s.io/v1alpha1 Workload",
        _read_k8s_workload,
        "Workload spec.podGroups[].policy.gang.minCount",
        Api("k8s-workloads", "scheduling.k8s.io", ("v1alpha1",), "workloads", "Workload"),
        groups_k8s_workload,
    ),
    GangSource(
        "scheduler-plugins",
        "scheduling.x-k8s.io PodGroup",
        _read_scheduler_plugins,
        "PodGroup spec.minMember",
        SCHEDULER_PLUGINS_API,
        groups_scheduler_plugins,
    ),
    GangSource("pod-group-labels", "pod-group labels", _read_light, f"label {LIGHT_MIN_LABEL}"),
    GangSource(
        "volcano",
        "scheduling.volcano.sh PodGroup",
        _read_volcano,
        "PodGroup spec.minMember",
        Api("volcano-podgroups", "scheduling.volcano.sh", ("v1beta1",), "podgroups", "PodGroup"),
        groups_volcano,
    ),
    GangSource("kueue", "kueue pod group", _read_kueue, f"annotation {KUEUE_TOTAL_ANNOTATION}"),
    GangSource(
        "kai",
        "scheduling.run.ai PodGroup",
        _read_kai,
        "PodGroup spec.minMember",
        Api("kai-podgroups", "scheduling.run.ai", ("v2alpha2",), "podgroups", "PodGroup"),
        groups_kai,
    ),
)

#: The `Topology` kinds whose level lists come first among the network levels (Kueue, KAI).
TOPOLOGY_APIS: tuple[Api, ...] = (
    Api("kueue-topologies", "kueue.x-k8s.io", ("v1beta2", "v1beta1", "v1alpha1"), "topologies", "Topology"),
    Api("kai-topologies", "kai.scheduler", ("v1alpha1",), "topologies", "Topology"),
)

#: Every API the sidecar reads beside Nodes and Pods (its RBAC must allow get/list/watch on each).
APIS: tuple[Api, ...] = (*(s.api for s in SOURCES if s.api is not None), *TOPOLOGY_APIS)


def pod_gang(
    labels: Mapping[str, str], annotations: Mapping[str, str], spec: Mapping[str, Any]
) -> Named | None:
    """The pod's gang by the precedence of `SOURCES`, or None; SourceError when the deciding
    source is named but malformed (a light label without a usable minimum, a Kueue group
    without count). The key has no namespace: the caller's pod namespace comes first."""
    for source in SOURCES:
        found = source.read(source, labels, annotations, spec)
        if found is not None:
            return found
    return None


def with_profile(obj: Mapping[str, Any], groups: list[Group]) -> tuple[list[Group], str]:
    """`groups` with the profile their object declares in its annotations, and "" — or the
    groups unchanged and why the declaration was refused (an unusable one costs that object
    its declaration, never its gangs)."""
    meta = obj.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    if not isinstance(annotations, Mapping) or not groups:
        return groups, ""
    try:
        profile = declared_profile({k: v for k, v in annotations.items() if isinstance(k, str)})
    except ProfileError as e:
        return groups, str(e)
    if profile is None:
        return groups, ""
    return [replace(g, profile=profile) for g in groups], ""


def object_groups(named: Named, obj: Mapping[str, Any]) -> list[Group]:
    """The gangs the pod's group object defines (read at its own apiVersion when it says one)."""
    source = named.source
    if source.api is None or source.parse is None:
        return []
    api_version = obj.get("apiVersion")
    groups = source.parse(obj, api_version if isinstance(api_version, str) else source.api.api_version)
    return with_profile(obj, groups)[0]


def object_group(named: Named, namespace: str, obj: Mapping[str, Any] | None) -> Group | None:
    """The gang of the pod's group object that the pod counts by (a Workload replica by its
    Workload's pod group), or None (no object, or one that defines no such gang)."""
    if obj is None:
        return None
    index: dict[str, Group] = {}
    for g in object_groups(named, obj):
        index.setdefault(g.key, g)
    return group_for(f"{namespace}/{named.key}", index)


def quorum(named: Named, namespace: str, obj: Mapping[str, Any] | None) -> int | None:
    """The gang's quorum as the sidecar counts it: the pod's own count when it carries one,
    else its group object's."""
    if named.min_member is not None:
        return named.min_member
    group = object_group(named, namespace, obj)
    return None if group is None else group.min_member
