"""Where a pod's gang and its placement constraints come from: the APIs users already write.

A pod can name its gang through Kubernetes' own Workload API, scheduler-plugins, Volcano or
Kueue, and its topology level through gputopo's, Kueue's or KAI Scheduler's annotations. This
module reads all of them with one precedence order (docs/scheduler.md "Gang sources"), so a pod
spec is scheduled as its authors wrote it, with no gputopo-specific annotation.

It also parses the objects those APIs keep beside the pods (group objects with a member count
and maybe a topology key; Kueue / KAI `Topology` objects with a level list), the same way for
every kind: pure functions from API JSON to values, every field checked, garbage -> None.

Upstream facts used here (checked against upstream source, see docs/scheduler.md):
- `scheduling.k8s.io/v1alpha2` PodGroup: `spec.schedulingPolicy.gang.minCount`,
  `spec.schedulingConstraints.topologyConstraints[].topologyKey`; pods join with
  `spec.schedulingGroup.podGroupName` (kubernetes staging/src/k8s.io/api/scheduling/v1alpha2).
- `scheduling.k8s.io/v1alpha1` Workload (1.35): `spec.podGroups[] {name, policy.gang.minCount}`;
  pods join with `spec.workloadRef {name, podGroup, podGroupReplicaKey}`; the policy applies
  to each replica key separately.
- Volcano: pod annotation `scheduling.k8s.io/group-name`, `scheduling.volcano.sh/v1beta1`
  PodGroup `spec.minMember`.
- Kueue: pod label `kueue.x-k8s.io/pod-group-name` + annotation
  `kueue.x-k8s.io/pod-group-total-count`; annotations `kueue.x-k8s.io/podset-required-topology`
  / `…-preferred-topology`; `Topology` `spec.levels[].nodeLabel`, broadest level first.
- KAI Scheduler: `kai.scheduler/topology-required-placement` / `…-preferred-placement`
  (annotations the pod grouper reads from the top owner, which for a bare pod is the pod);
  `kai.scheduler/v1alpha1` Topology `spec.levels[].nodeLabel`, broadest first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gputopo.network.levels import HOSTNAME, is_label_key
from gputopo.numerals import duration_s

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

#: Level annotations, first source that sets either of its two keys wins (both values from it).
LEVEL_ANNOTATIONS: tuple[tuple[str, str, str], ...] = (
    ("gputopo", "gputopo.io/required-topology", "gputopo.io/preferred-topology"),
    ("kueue", "kueue.x-k8s.io/podset-required-topology", "kueue.x-k8s.io/podset-preferred-topology"),
    ("kai", "kai.scheduler/topology-required-placement", "kai.scheduler/topology-preferred-placement"),
)

#: How long this pod waits for its best topology before it takes what there is, overriding the
#: sidecar's --gang-spill-after: a gang for one domain of its own level (gputopo/gang/levelwait.py), a
#: multi-GPU pod for a node at its best ring (gputopo/pod/ringwait.py). A duration ("300s", "30m",
#: "1h30m") or seconds; Slurm's `--switches=count@max-time` is the same per-job bound.
LEVEL_WAIT_ANNOTATION = "gputopo.io/topology-wait"
#: The longest wait a pod may ask for (the sidecar's own flag has the same bound).
MAX_LEVEL_WAIT_S = 30 * 86_400.0

# --- gang key prefixes (one key space per API, so equal names never merge two gangs) --------
K8S_PODGROUP = "podgroup:"
K8S_WORKLOAD = "workload:"
VOLCANO = "volcano:"
KUEUE = "kueue:"
KAI = "kai:"


class SourceError(ValueError):
    """A pod whose gang fields are present but unusable; the message names the field."""


@dataclass(frozen=True)
class PodGang:
    """What a pod says about its gang: key, the member count if the pod carries it, levels."""

    key: str
    source: str  # which API named the gang, for logs and `why`
    min_member: int | None
    required_level: str | None
    preferred_level: str | None
    level_source: str  # "gputopo", "kueue", "kai" or "" (none: the group object may set one)


def level_wait(annotations: Mapping[str, str]) -> float | None:
    """The pod's LEVEL_WAIT_ANNOTATION in seconds, None when absent; SourceError when set to
    anything but a duration of at most MAX_LEVEL_WAIT_S (a typo must not mean "the default")."""
    raw = annotations.get(LEVEL_WAIT_ANNOTATION)
    if raw is None:
        return None
    value = duration_s(raw, max_s=MAX_LEVEL_WAIT_S) if isinstance(raw, str) else None
    if value is None:
        shown = raw[:40] if isinstance(raw, str) else raw
        raise SourceError(
            f"annotation {LEVEL_WAIT_ANNOTATION} must be a duration such as 300s, 30m or 1h30m "
            f"(at most {MAX_LEVEL_WAIT_S / 86_400:g} days), got {shown!r}"
        )
    return value


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


def pod_levels(annotations: Mapping[str, str]) -> tuple[str | None, str | None, str]:
    """(required, preferred, source) from the first annotation family that sets either."""
    for source, req_key, pref_key in LEVEL_ANNOTATIONS:
        required = annotations.get(req_key) or None
        preferred = annotations.get(pref_key) or None
        if required or preferred:
            return required, preferred, source
    return None, None, ""


def pod_gang(
    namespace: str, labels: Mapping[str, str], annotations: Mapping[str, str], spec: Mapping[str, Any]
) -> PodGang | None:
    """The pod's gang by the documented precedence, or None; SourceError when a source is
    named but malformed (a light label without a usable minimum, a Kueue group without count).

    Order: Kubernetes `spec.schedulingGroup` (1.36) > `spec.workloadRef` (1.35) >
    scheduler-plugins label > light labels > Volcano annotation > Kueue pod group > KAI
    Scheduler's `pod-group-name`."""
    required, preferred, level_source = pod_levels(annotations)

    def gang(key: str, source: str, minimum: int | None) -> PodGang:
        return PodGang(f"{namespace}/{key}", source, minimum, required, preferred, level_source)

    group = spec.get("schedulingGroup")
    if isinstance(group, Mapping) and group.get("podGroupName") is not None:
        name = _name(group.get("podGroupName"))
        if name is None:
            raise SourceError("Pod.spec.schedulingGroup.podGroupName must be an object name")
        return gang(K8S_PODGROUP + name, "scheduling.k8s.io/v1alpha2 PodGroup", None)
    ref = spec.get("workloadRef")
    if isinstance(ref, Mapping) and (ref.get("name") is not None or ref.get("podGroup") is not None):
        workload, pg = _name(ref.get("name")), _name(ref.get("podGroup"))
        replica = ref.get("podGroupReplicaKey")
        if workload is None or pg is None or (replica is not None and _name(replica) is None):
            raise SourceError("Pod.spec.workloadRef needs name and podGroup (object names)")
        key = f"{K8S_WORKLOAD}{workload}/{pg}" + (f"/{replica}" if replica else "")
        return gang(key, "scheduling.k8s.io/v1alpha1 Workload", None)
    name = labels.get(POD_GROUP_LABEL)
    if name:
        return gang(name, "scheduling.x-k8s.io PodGroup", None)
    name = labels.get(LIGHT_GROUP_LABEL)
    if name:
        minimum = _count(labels.get(LIGHT_MIN_LABEL, ""))
        if minimum is None:
            raw = labels.get(LIGHT_MIN_LABEL, "")
            raise SourceError(f"label {LIGHT_MIN_LABEL} must be a positive integer, got {raw!r}")
        return gang(name, "pod-group labels", minimum)
    for key in VOLCANO_GROUP_ANNOTATIONS:
        name = annotations.get(key)
        if name:
            return gang(VOLCANO + name, "scheduling.volcano.sh PodGroup", None)
    name = labels.get(KUEUE_GROUP_LABEL)
    if name:
        minimum = _count(annotations.get(KUEUE_TOTAL_ANNOTATION, ""))
        if minimum is None:
            raw = annotations.get(KUEUE_TOTAL_ANNOTATION, "")
            raise SourceError(f"annotation {KUEUE_TOTAL_ANNOTATION} must be a positive integer, got {raw!r}")
        return gang(KUEUE + name, "kueue pod group", minimum)
    name = annotations.get(KAI_GROUP_ANNOTATION)
    if name:
        if _name(name) is None:
            raise SourceError(f"annotation {KAI_GROUP_ANNOTATION} must be an object name, got {name[:64]!r}")
        return gang(KAI + name, "scheduling.run.ai PodGroup", None)
    return None


# --- group objects ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    """One gang as a group object defines it."""

    key: str  # the gang key pods compute (namespace/prefix+name)
    min_member: int
    required_level: str | None = None
    ref: Mapping[str, str] | None = None  # apiVersion, kind, namespace, name, uid: for Events
    preferred_level: str | None = None  # a level the group prefers (KAI's topologyConstraint)


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


def _ref(obj: Mapping[str, Any], kind: str, api_version: str, ns: str, name: str, uid: str) -> dict[str, str]:
    return {"apiVersion": api_version, "kind": kind, "namespace": ns, "name": name, "uid": uid}


def _dig(obj: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(p)
    return obj


def _topology_key(constraints: Any) -> str | None:
    items = _dig(constraints, "topologyConstraints")
    if isinstance(items, list) and items and isinstance(items[0], Mapping):
        key = items[0].get("topologyKey")
        return key if is_label_key(key) else None
    return None


def _min_member_group(obj: Mapping[str, Any], api_version: str, prefix: str) -> list[Group]:
    """A PodGroup whose gang size is `spec.minMember` (scheduler-plugins, Volcano); `prefix`
    keeps each API's names in a key space of their own."""
    m = _meta(obj)
    n = _count(_dig(obj, "spec", "minMember"))
    if m is None or n is None:
        return []
    return [Group(f"{m[0]}/{prefix}{m[1]}", n, None, _ref(obj, "PodGroup", api_version, *m))]


def groups_scheduler_plugins(obj: Mapping[str, Any], api_version: str) -> list[Group]:
    return _min_member_group(obj, api_version, "")


def groups_k8s_podgroup(obj: Mapping[str, Any], api_version: str) -> list[Group]:
    """A `basic` policy (no gang) yields nothing: such pods are placed one by one."""
    m = _meta(obj)
    n = _count(_dig(obj, "spec", "schedulingPolicy", "gang", "minCount"))
    if m is None or n is None:
        return []
    required = _topology_key(_dig(obj, "spec", "schedulingConstraints"))
    return [Group(f"{m[0]}/{K8S_PODGROUP}{m[1]}", n, required, _ref(obj, "PodGroup", api_version, *m))]


def groups_k8s_workload(obj: Mapping[str, Any], api_version: str) -> list[Group]:
    """One Group per gang pod group; replica keys are matched by prefix (see `min_for`)."""
    m = _meta(obj)
    pgs = _dig(obj, "spec", "podGroups")
    if m is None or not isinstance(pgs, list):
        return []
    out = []
    for pg in pgs[:64]:
        name = _name(_dig(pg, "name"))
        n = _count(_dig(pg, "policy", "gang", "minCount"))
        if name is not None and n is not None:
            key = f"{m[0]}/{K8S_WORKLOAD}{m[1]}/{name}"
            out.append(Group(key, n, None, _ref(obj, "Workload", api_version, *m)))
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
    constraint = _dig(obj, "spec", "topologyConstraint")
    required, preferred = (
        _dig(constraint, "requiredTopologyLevel"),
        _dig(constraint, "preferredTopologyLevel"),
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


# --- topology objects (level lists) --------------------------------------------------------


def topology_levels(obj: Mapping[str, Any]) -> tuple[str, ...] | None:
    """A Kueue / KAI Topology's levels, smallest domain first (they list broadest first);
    None when the object is unusable (no levels, a bad label key, a duplicate)."""
    levels = _dig(obj, "spec", "levels")
    if not isinstance(levels, list) or not 1 <= len(levels) <= 16:
        return None
    keys = [_dig(lv, "nodeLabel") for lv in levels]
    if not all(is_label_key(k) for k in keys) or len(set(keys)) != len(keys):
        return None
    return tuple(reversed(keys))


def merge_levels(lists: Iterable[Sequence[str]], defaults: Sequence[str]) -> tuple[str, ...]:
    """Hostname first, then each Topology's levels (in object-name order), then the default
    levels none of them names. A level another list already holds keeps its first place:
    nodes one Topology does not describe lack its labels, so its levels are one-node domains
    to them and cannot change where their gangs go."""
    out: list[str] = [HOSTNAME]
    for levels in (*lists, defaults):
        out.extend(lv for lv in levels if lv not in out)
    return tuple(out)


#: Parses one group object (and the apiVersion it was read at) into the gangs it defines.
GroupParser = Callable[[Mapping[str, Any], str], list[Group]]
