"""The gang sources: every API a pod can name its gang through, in one table, and the pure
functions that read them.

A pod names its gang through Kubernetes' own Workload API, scheduler-plugins, the pod-group
labels, Volcano, Kueue or KAI Scheduler. `SOURCES` lists them in precedence order (the first one
a pod carries decides; docs/scheduler.md "Gang sources and levels"): for each, where the pod
names it, the key space of its gangs, where its group object lives (API group, versions, plural,
kind) and how that object gives the quorum. The sidecar (scheduler/sources.py, scheduler/live/kinds.py) and
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
- NVIDIA's ComputeDomain (`resource.nvidia.com/v1beta1`, kubernetes-sigs/dra-driver-nvidia-gpu):
  `spec.numNodes`, `spec.channel.resourceClaimTemplate.name`; the last source, read by the
  sidecar only (a pod joins by claiming the channel template: `compute_domain_gangs`).

Gangs as trees (docs/scheduler.md "Gangs as trees: what each API says"): a CompositePodGroup
(`scheduling.k8s.io/v1alpha3`) joins the PodGroups under it into one gang (`link`); KAI's
`spec.subGroups[]` and label `kai.scheduler/subgroup-name` (`kai_tree`); Kueue's PodSet slices
and PodSet group, gputopo's `gputopo.io/subgroup` (`pod_subgroup`); Volcano's
`spec.networkTopology` tier (`Tier`, `tier_level`, with the HyperNodes of
gputopo/gang/hypernodes.py) and `spec.subGroupPolicy[]` partitions (`Partition`, `partition_of`).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gputopo.gang.hypernodes import HyperTiers, Selector, label_selector
from gputopo.gang.planner import SubGroup
from gputopo.jobtime.profiles import Profile, ProfileError, declared_profile
from gputopo.network.levels import GPU_CLIQUE, HOSTNAME, is_label_key

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
#: ... and the pod's leaf sub-group of that PodGroup's `spec.subGroups[]` (docs/topology/multilevel.md)
KAI_SUBGROUP_LABEL = "kai.scheduler/subgroup-name"

# --- sub-groups a pod declares itself (docs/scheduler.md "Gangs as trees: sources") ----------
#: gputopo's own: the pod's sub-group of its gang, and that sub-group's level(s).
SUBGROUP_ANNOTATION = "gputopo.io/subgroup"
SUBGROUP_REQUIRED_ANNOTATION = "gputopo.io/subgroup-required-topology"
SUBGROUP_PREFERRED_ANNOTATION = "gputopo.io/subgroup-preferred-topology"
#: Kueue's PodSet slices (apis/kueue/v1beta2/topology_types.go, tas_validation.go): slices of
#: `size` pods each inside one domain of the slice topology; or up to three layers as a JSON
#: list [{"topology": KEY, "size": N}, ...], outermost first.
KUEUE_SLICE_TOPOLOGY = "kueue.x-k8s.io/podset-slice-required-topology"
KUEUE_SLICE_SIZE = "kueue.x-k8s.io/podset-slice-size"
KUEUE_SLICE_CONSTRAINTS = "kueue.x-k8s.io/podset-slice-required-topology-constraints"
KUEUE_UNCONSTRAINED = "kueue.x-k8s.io/podset-unconstrained-topology"
KUEUE_PODSET_GROUP = "kueue.x-k8s.io/podset-group-name"
#: Where a pod's index (its rank in the PodSet) is read, first found wins: the label Kueue's
#: plain-pod groups name in `…/pod-group-pod-index-label`, Kueue's own pod-group index label,
#: the Job completion index (label, or annotation before Kubernetes 1.28), a StatefulSet's (and
#: LeaderWorkerSet's) pod index, a Kubeflow replica index: the PodIndexLabel of each Kueue
#: integration (kueue pkg/controller/jobs/*, apis/kueue/v1beta2 constants).
KUEUE_INDEX_LABEL_ANNOTATION = "kueue.x-k8s.io/pod-group-pod-index-label"
POD_INDEX_KEYS = (
    "kueue.x-k8s.io/pod-group-pod-index",
    "batch.kubernetes.io/job-completion-index",
    "apps.kubernetes.io/pod-index",
    "training.kubeflow.org/replica-index",
)
#: A JobSet's child Job index: pods of two child Jobs never share a slice.
JOBSET_JOB_INDEX = "jobset.sigs.k8s.io/job-index"
MAX_SLICE_LAYERS = 3
#: The deepest tree read from any API (Kubernetes allows 4 levels of (composite) pod groups,
#: KAI does not bound it); deeper ones are not modelled (the gang stays flat or is ignored).
MAX_TREE_DEPTH = 8
MAX_SUBGROUPS = 256

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
K8S_COMPOSITE = "composite:"
COMPUTE_DOMAIN = "computedomain:"


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
    #: the gang's tree as its object describes it (KAI `spec.subGroups[]`, a CompositePodGroup's
    #: PodGroups and composites once `link`ed): () a flat gang
    subgroups: tuple[SubGroup, ...] = ()
    #: a Kubernetes PodGroup or CompositePodGroup under a CompositePodGroup: its parent's key
    parent: str = ""
    #: set by `link` on a PodGroup inside a composite tree: the key of the tree's root, the gang
    root: str = ""
    #: a CompositePodGroup's `gang.minGroupCount` (None: `basic`, or not a composite)
    min_groups: int | None = None
    #: Volcano's `networkTopology`: a tier, mapped onto the levels when planning (`tier_level`)
    tier: Tier | None = None
    #: Volcano's `spec.subGroupPolicy[]` (its Jobs' partitionPolicy): pods' sub-groups by label
    partitions: tuple[Partition, ...] = ()
    #: a ComputeDomain's channel ResourceClaimTemplate (in its namespace): its pods name this
    #: template in `spec.resourceClaims[].resourceClaimTemplateName` (`compute_domain_gangs`)
    claim_template: str = ""


@dataclass(frozen=True)
class Tier:
    """Volcano's `networkTopology {mode, highestTierAllowed | highestTierName}`: the highest
    tier a gang may span; `hard` (mode hard, the default) makes it a required level, soft a
    preferred one. Tier N is the N-th level counting up from the node (`tier_level`)."""

    hard: bool
    number: int | None = None
    name: str | None = None


#: Parses one group object (and the apiVersion it was read at) into the gangs it defines.
GroupParser = Callable[[Mapping[str, Any], str], list[Group]]


@dataclass(frozen=True)
class Api:
    """Where a kind of object beside the pods lives, as RBAC and the client name it.

    `reflector` is the sidecar's name for its watch (logs, readiness); `discovered`: the group is
    optional and looked up in the API server's discovery (scheduler/live/kinds.py) — the one that
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
    #: the pod's leaf sub-group ("" none) and the sub-groups the pod itself declares (its path
    #: from the root, gputopo's or Kueue's annotations; a KAI pod names only its leaf, its
    #: PodGroup has the tree); `subgroup_source` says which family: gputopo, kai, kueue or ""
    subgroup: str = ""
    subgroups: tuple[SubGroup, ...] = ()
    subgroup_source: str = ""


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


def _json_count(raw: object) -> int | None:
    """A positive count from a JSON integer field (a string there is not the API's type)."""
    return None if isinstance(raw, str) else _count(raw)


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


def _parent(obj: Mapping[str, Any], ns: str) -> str | None:
    """A Kubernetes (composite) pod group's parent key, "" for none, None when unusable."""
    raw = dig(obj, "spec", "parentCompositePodGroupName")
    if raw is None:
        return ""
    name = _name(raw)
    return None if name is None else f"{ns}/{K8S_COMPOSITE}{name}"


def groups_k8s_podgroup(obj: Mapping[str, Any], api_version: str) -> list[Group]:
    """A `basic` policy (no gang) yields nothing: such pods are placed one by one — unless the
    PodGroup sits under a CompositePodGroup (`spec.parentCompositePodGroupName`, 1.37): then it
    is a sub-group counting no members towards the tree's quorum (`link`)."""
    m = _meta(obj)
    if m is None:
        return []
    parent = _parent(obj, m[0])
    n = _count(dig(obj, "spec", "schedulingPolicy", "gang", "minCount"))
    if parent is None or (n is None and not parent):
        return []
    if n is None and not isinstance(dig(obj, "spec", "schedulingPolicy", "basic"), Mapping):
        return []
    required = _topology_key(dig(obj, "spec", "schedulingConstraints"))
    ref = _ref("PodGroup", api_version, *m)
    return [Group(f"{m[0]}/{K8S_PODGROUP}{m[1]}", n or 0, required, ref, parent=parent)]


def groups_k8s_composite(obj: Mapping[str, Any], api_version: str) -> list[Group]:
    """A CompositePodGroup (`scheduling.k8s.io/v1alpha3`, kubernetes/api
    scheduling/v1alpha3/types.go): `spec.schedulingPolicy.gang.minGroupCount` (or `basic`),
    `spec.parentCompositePodGroupName` (absent on the root), `spec.schedulingConstraints
    .topology[0].key`. Not a gang by itself: `link` makes its tree one."""
    m = _meta(obj)
    if m is None:
        return []
    parent = _parent(obj, m[0])
    policy = dig(obj, "spec", "schedulingPolicy")
    groups = _json_count(dig(policy, "gang", "minGroupCount"))
    if parent is None or (groups is None and not isinstance(dig(policy, "basic"), Mapping)):
        return []
    required = _topology_key(dig(obj, "spec", "schedulingConstraints"))
    ref = _ref("CompositePodGroup", api_version, *m)
    return [Group(f"{m[0]}/{K8S_COMPOSITE}{m[1]}", 0, required, ref, parent=parent, min_groups=groups)]


def _sum_smallest(counts: Sequence[int | None], k: int | None) -> int:
    """The quorum of a node whose children have `counts` (None: not derivable, skipped): the
    sum of its `k` smallest (all when k is None) — the fewest pods with which it can start."""
    known = sorted(c for c in counts if c is not None)
    return sum(known if k is None else known[:k])


def link(groups: Iterable[Group]) -> dict[str, Group]:
    """The gang index (gang key -> Group) from every group object's Groups: a flat group is
    itself; Kubernetes' PodGroups and CompositePodGroups under a root CompositePodGroup become
    one gang keyed by the root (`ns/composite:NAME`) whose `subgroups` are every PodGroup
    (`podgroup:NAME`) and non-root composite (`composite:NAME`) below it, each required in one
    domain of its `topology[0].key`; each such PodGroup maps to a Group with `root` set.

    The tree's quorum: a PodGroup counts its `gang.minCount` (a `basic` one 0); a composite the
    sum of its `minGroupCount` smallest children (a `basic` one 0). A root whose quorum is 0,
    a `basic` root (its gang PodGroups stay gangs of their own), a chain that does not reach a
    root (a parent not seen yet, a cycle) or a tree deeper than MAX_TREE_DEPTH yields no tree
    gang: its pods wait for the missing object rather than start as the wrong gang."""
    index: dict[str, Group] = {}
    children: dict[str, list[Group]] = {}
    roots: list[Group] = []
    for g in groups:
        if g.parent:
            children.setdefault(g.parent, []).append(g)
        elif g.key.partition("/")[2].startswith(K8S_COMPOSITE):
            roots.append(g)
        else:
            index.setdefault(g.key, g)
    for root in roots:
        if root.key in index:
            continue
        tree = _composite_tree(root, children)
        if tree is None:
            continue
        subgroups, members, quorum = tree
        if root.min_groups is None:  # basic root: its gang PodGroups are gangs of their own
            for pg in members:
                if pg.min_member >= 1:
                    index.setdefault(pg.key, replace(pg, parent=""))
            continue
        if quorum < 1:
            continue
        index[root.key] = replace(root, min_member=min(quorum, MAX_MEMBERS), subgroups=subgroups)
        for pg in members:
            index.setdefault(pg.key, replace(pg, root=root.key))
    return index


def _composite_tree(
    root: Group, children: Mapping[str, list[Group]]
) -> tuple[tuple[SubGroup, ...], list[Group], int] | None:
    """(sub-groups, PodGroups, quorum) below a root composite, or None (too deep, too big)."""
    subgroups: list[SubGroup] = []
    members: list[Group] = []
    seen = {root.key}

    def quorum(node: Group, name: str, depth: int) -> int | None:
        if depth > MAX_TREE_DEPTH:
            return None
        counts: list[int | None] = []
        for child in sorted(children.get(node.key, ()), key=lambda c: c.key):
            if child.key in seen:
                continue
            seen.add(child.key)
            child_name = child.key.partition("/")[2]  # podgroup:NAME / composite:NAME
            at = len(subgroups)
            subgroups.append(SubGroup(child_name, name))
            q: int | None
            if child_name.startswith(K8S_COMPOSITE):
                q = quorum(child, child_name, depth + 1)
                if q is None:
                    return None
                q = q if child.min_groups is not None else None  # basic: counts nothing
            else:
                members.append(child)
                q = child.min_member or None  # basic: counts nothing
            subgroups[at] = SubGroup(child_name, name, child.required_level, None, q)
            counts.append(q)
            if len(subgroups) > MAX_SUBGROUPS:
                return None
        return _sum_smallest(counts, node.min_groups)

    q = quorum(root, "", 1)
    return None if q is None else (tuple(subgroups), members, q)


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


def _tier(raw: Any) -> Tier | None:
    """Volcano's `networkTopology` (volcano-sh/apis pkg/apis/scheduling/v1beta1/types.go
    NetworkTopologySpec): mode hard|soft (default hard), highestTierAllowed xor highestTierName."""
    if not isinstance(raw, Mapping):
        return None
    mode = raw.get("mode", "hard")
    number, name = raw.get("highestTierAllowed"), raw.get("highestTierName")
    if mode not in ("hard", "soft") or (number is not None and name):
        return None
    if number is not None:
        n = _json_count(number)
        return None if n is None or n > 16 else Tier(mode == "hard", number=n)
    if isinstance(name, str) and 0 < len(name) <= 253:
        return Tier(mode == "hard", name=name)
    return None


def tier_level(
    tier: Tier, levels: Sequence[str], labelled: Iterable[str], hyper: HyperTiers | None = None
) -> str | None:
    """The level a Volcano tier means. Where the cluster's HyperNodes describe the tier
    (`hyper`, gputopo/gang/hypernodes.py), the level they map it to: a `highestTierName` is the
    tier of the HyperNodes with that `spec.tierName`, tier N the smallest level one of whose
    domains holds each tier-N HyperNode's nodes. Otherwise by the labels: tier N is the N-th level
    counting up from the node among the levels some node is labelled with (HyperNode label
    discovery converts levels "from bottom to top, starting at tier 1", volcano
    docs/user-guide/how_to_use_hypernode_auto_discovery.md); a tier name is a level when it is
    one of the levels' label keys. None: no such level (a tier above every level spans the
    cluster: no constraint)."""
    number = tier.number
    if tier.name is not None:
        if tier.name in levels:
            return tier.name
        number = hyper.names.get(tier.name) if hyper is not None else None
        if number is None:
            return None
    if hyper is not None and number is not None and number in hyper.levels:
        return hyper.levels[number]
    present = set(labelled)
    ordered = [lv for lv in levels if lv != HOSTNAME and lv in present]
    n = number or 0
    return ordered[n - 1] if 1 <= n <= len(ordered) else None


@dataclass(frozen=True)
class Partition:
    """One entry of a Volcano PodGroup's `spec.subGroupPolicy[]` (volcano-sh/apis
    pkg/apis/scheduling/v1beta1/types.go `SubGroupPolicySpec`), which Volcano's job controller
    writes for every Job task with a `partitionPolicy` (volcano-sh/volcano
    pkg/controllers/job/job_controller_actions.go `getSubGroupPolicy`: name = the task,
    subGroupSize = partitionSize, labelSelector `volcano.sh/task-spec: <task>`, matchLabelKeys
    [`volcano.sh/partition-id`], networkTopology = the partition's). The pods it selects with
    equal values of `keys` are one sub-group, kept within the tier."""

    name: str
    selector: Selector | None  # None: every pod of the gang (a nil labelSelector)
    keys: tuple[str, ...]
    size: int | None
    tier: Tier | None


#: Volcano Job pods' labels (volcano-sh/apis pkg/apis/batch/v1alpha1/labels.go)
VOLCANO_TASK_LABEL = "volcano.sh/task-spec"
VOLCANO_PARTITION_LABEL = "volcano.sh/partition-id"
MAX_PARTITION_POLICIES = 64


def _partitions(raw: Any) -> tuple[Partition, ...] | None:
    """`spec.subGroupPolicy[]` as partitions; None when the list is unusable (a missing or
    repeated name, a bad selector or size): the gang is then flat, never lost."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_PARTITION_POLICIES:
        return None
    out: list[Partition] = []
    for item in raw:
        name = dig(item, "name")
        if not isinstance(name, str) or not 0 < len(name) <= 253 or any(p.name == name for p in out):
            return None
        selector: Selector | None = None
        raw_sel = dig(item, "labelSelector")
        if raw_sel is not None:
            if not isinstance(raw_sel, Mapping):
                return None
            parsed = label_selector(raw_sel)
            if isinstance(parsed, str):
                return None
            selector = parsed if parsed.labels or parsed.expressions else None
        keys = dig(item, "matchLabelKeys") or []
        if not isinstance(keys, list) or len(keys) > 8 or not all(is_label_key(k) for k in keys):
            return None
        size_raw = dig(item, "subGroupSize")
        size = None if size_raw is None else _json_count(size_raw)
        if size_raw is not None and size is None:
            return None
        out.append(Partition(name, selector, tuple(keys), size, _tier(dig(item, "networkTopology"))))
    return tuple(out)


def partition_of(partitions: Sequence[Partition], labels: Mapping[str, str]) -> tuple[Partition, str] | None:
    """The first partition policy that takes a pod with these labels, and the pod's sub-group
    in it (`<policy>-<value>-<value>…`, the sub-job id of Volcano's scheduler,
    pkg/scheduler/api/sub_job_info.go); None when none does (the pod is in the gang's root).
    As Volcano (pkg/scheduler/api/job_info.go `getOrCreateSubJob`): the selector must match,
    and the policy must have match keys, each a non-empty label of the pod (a policy without
    keys takes no pod: Volcano's default sub-job)."""
    for p in partitions:
        if p.selector is not None and not p.selector.matches("", labels):
            continue
        values = [labels.get(k, "") for k in p.keys]
        if values and all(values):
            return p, f"{p.name}-{'-'.join(values)}"
    return None


def groups_volcano(obj: Mapping[str, Any], api_version: str) -> list[Group]:
    """Volcano's PodGroup: `spec.minMember`, `spec.networkTopology` as a tier (`Tier`), and
    `spec.subGroupPolicy[]` as partitions (`Partition`, sub-groups of the gang each kept within
    its own tier). An unusable networkTopology costs the gang its tier, an unusable
    subGroupPolicy its partitions, never the gang."""
    found = _min_member_group(obj, api_version, VOLCANO)
    if not found:
        return []
    partitions = _partitions(dig(obj, "spec", "subGroupPolicy"))
    return [
        replace(
            found[0],
            tier=_tier(dig(obj, "spec", "networkTopology")),
            partitions=partitions or (),
        )
    ]


def _kai_levels(constraint: Any) -> tuple[str | None, str | None]:
    required, preferred = dig(constraint, "requiredTopologyLevel"), dig(constraint, "preferredTopologyLevel")
    return (required if is_label_key(required) else None, preferred if is_label_key(preferred) else None)


def _dns_label(raw: object) -> str | None:
    if isinstance(raw, str) and 0 < len(raw) <= 63 and raw.isascii() and raw.replace("-", "").isalnum():
        return raw if raw == raw.lower() and raw[0] != "-" and raw[-1] != "-" else None
    return None


def _count0(raw: object) -> int | None:
    """A count that may be 0 (a KAI sub-group's minMember / minSubGroup)."""
    return 0 if raw == 0 and not isinstance(raw, bool) else _count(raw)


def kai_tree(spec: Any) -> tuple[tuple[SubGroup, ...], int | None] | None:
    """KAI's `spec.subGroups[] {name, minMember, minSubGroup, parent, topologyConstraint}`
    (kai-scheduler/KAI-Scheduler pkg/apis/scheduling/v2alpha2/podgroup_types.go) as sub-groups,
    and the quorum they give the PodGroup: (tree, quorum), or None when the list is unusable (a
    bad or repeated name, an unknown parent, a cycle, deeper than MAX_TREE_DEPTH).

    The quorum rule (KAI: minMember counts descendant pods, minSubGroup direct child sub-groups,
    "when unset, all direct children are required"): a node with minMember needs that many pods;
    one with minSubGroup k the sum of its k smallest children's quorums; one with neither the sum
    of all its children's; a leaf with neither is not derivable and counts nothing. The root's
    is the same rule over `spec.minMember` / `spec.minSubGroup` and its top-level sub-groups."""
    raw = dig(spec, "subGroups")
    if raw is None:
        raw = []
    if not isinstance(raw, list) or len(raw) > MAX_SUBGROUPS:
        return None
    nodes: dict[str, tuple[str, int | None, int | None, str | None, str | None]] = {}
    for item in raw:
        if not isinstance(item, Mapping):
            return None
        name, parent = _dns_label(item.get("name")), item.get("parent")
        mm, ms = item.get("minMember"), item.get("minSubGroup")
        members, subs = _count0(mm), _count0(ms)
        if (
            name is None
            or name in nodes
            or (mm is not None and members is None)
            or (ms is not None and subs is None)
        ):
            return None
        if parent is not None and _dns_label(parent) is None:
            return None
        constraint = item.get("topologyConstraint")
        if constraint is not None and not isinstance(constraint, Mapping):
            return None
        nodes[name] = (parent or "", members, subs, *_kai_levels(constraint))
    kids: dict[str, list[str]] = {}
    for name, (parent, *_) in nodes.items():
        if parent and parent not in nodes:
            return None
        kids.setdefault(parent, []).append(name)
    quorum: dict[str, int | None] = {}

    def q(name: str, members: int | None, subs: int | None, depth: int) -> int | None:
        if depth > MAX_TREE_DEPTH:
            raise ValueError
        counts = [q(c, nodes[c][1], nodes[c][2], depth + 1) for c in kids.get(name, ())]
        if name:
            quorum[name] = None
        if members is not None:
            value: int | None = members
        elif counts:
            value = _sum_smallest(counts, subs)
        else:
            value = None
        if name:
            quorum[name] = value
        return value

    root_members, root_subs = _count(dig(spec, "minMember")), _count(dig(spec, "minSubGroup"))
    try:
        total = q("", root_members, root_subs, 0)
    except (ValueError, RecursionError):
        return None
    if len(quorum) != len(nodes):  # a cycle: never reached from the root
        return None
    tree = tuple(SubGroup(n, p, r, pr, quorum[n]) for n, (p, _, _, r, pr) in nodes.items())
    return tree, total


def groups_kai(obj: Mapping[str, Any], api_version: str) -> list[Group]:
    """KAI Scheduler's PodGroup (`scheduling.run.ai/v2alpha2`): `spec.minMember` xor
    `spec.minSubGroup`, `spec.topologyConstraint`'s `requiredTopologyLevel` /
    `preferredTopologyLevel` (node-label keys of its Topology's levels) and `spec.subGroups[]`
    (`kai_tree`): a PodGroup counted by `minSubGroup` has the quorum its sub-groups give. An
    unusable sub-group list leaves a gang with `minMember` flat, and one without no gang."""
    m = _meta(obj)
    spec = dig(obj, "spec")
    if m is None or not isinstance(spec, Mapping):
        return []
    tree = kai_tree(spec)
    minimum = _count(spec.get("minMember"))
    if minimum is None and tree is not None:
        minimum = tree[1]
    if minimum is None or minimum < 1:
        return []
    required, preferred = _kai_levels(spec.get("topologyConstraint"))
    return [
        Group(
            f"{m[0]}/{KAI}{m[1]}",
            min(minimum, MAX_MEMBERS),
            required,
            _ref("PodGroup", api_version, *m),
            preferred,
            subgroups=() if tree is None else tree[0],
        )
    ]


def groups_compute_domain(obj: Mapping[str, Any], api_version: str) -> list[Group]:
    """NVIDIA's ComputeDomain (`resource.nvidia.com/v1beta1`, kubernetes-sigs/dra-driver-nvidia-gpu
    api/nvidia.com/resource/v1beta1/computedomain.go): the driver's controller creates the
    ResourceClaimTemplate `spec.channel.resourceClaimTemplate.name` in the ComputeDomain's
    namespace (cmd/compute-domain-controller/computedomain.go), and the pods that name it in
    `spec.resourceClaims[]` share the domain's IMEX channel, which works across GPUs of one
    NVLink partition only: they are one gang required in one clique (`nvidia.com/gpu.clique`).

    The quorum is `spec.numNodes` when set (nodes, so at most the pods: a node holds one pod of
    the domain or more); upstream defaults it to 0 and deprecates it, and then the gang is the
    pods seen (`compute_domain_gangs`, min_member 0 here). A ComputeDomain without a usable
    channel template name or with a bad numNodes defines no gang (its pods are placed one by
    one, as before)."""
    m = _meta(obj)
    spec = dig(obj, "spec")
    if m is None or not isinstance(spec, Mapping):
        return []
    template = _name(dig(spec, "channel", "resourceClaimTemplate", "name"))
    raw = spec.get("numNodes", 0)
    nodes = 0 if raw == 0 and not isinstance(raw, bool) else _json_count(raw)
    if template is None or nodes is None:
        return []
    ref = _ref("ComputeDomain", api_version, *m)
    return [Group(f"{m[0]}/{COMPUTE_DOMAIN}{m[1]}", nodes, GPU_CLIQUE, ref, claim_template=template)]


def compute_domain_gangs(
    pods: Iterable[tuple[str, str, Sequence[str]]], index: Mapping[str, Group]
) -> dict[str, tuple[Group, int]]:
    """The ComputeDomain gang of each pod that names one's channel template: pod key ->
    (its ComputeDomain's Group, the quorum). `pods` are (pod key, namespace, the pod's
    `resourceClaimTemplateName`s in spec order); the first template that is a ComputeDomain's
    decides. The quorum is the domain's `numNodes`, or with numNodes 0 (upstream's default) the
    number of its pods seen now, so the gang is planned as a whole once they all exist and a
    pod created later joins its mates' clique (the bound members pin the domain)."""
    by_template = {
        f"{key.partition('/')[0]}/{g.claim_template}": g for key, g in index.items() if g.claim_template
    }
    if not by_template:
        return {}
    found: dict[str, Group] = {}
    for pod, namespace, templates in pods:
        for t in templates:
            g = by_template.get(f"{namespace}/{t}")
            if g is not None:
                found[pod] = g
                break
    seen: dict[str, int] = {}
    for g in found.values():
        seen[g.key] = seen.get(g.key, 0) + 1
    return {pod: (g, g.min_member or seen[g.key]) for pod, g in found.items()}


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
    sub = labels.get(KAI_SUBGROUP_LABEL)
    if sub is None:
        return Named(source, KAI + name, f"annotation {KAI_GROUP_ANNOTATION}", name)
    if _dns_label(sub) is None:
        raise SourceError(f"label {KAI_SUBGROUP_LABEL} must be a DNS label, got {sub[:64]!r}")
    return Named(
        source, KAI + name, f"annotation {KAI_GROUP_ANNOTATION}", name, subgroup=sub, subgroup_source="kai"
    )


# --- sub-groups a pod declares -----------------------------------------------------------------


def _level(annotations: Mapping[str, str], key: str) -> str | None:
    raw = annotations.get(key)
    if raw is None or raw == "":
        return None
    if not is_label_key(raw):
        raise SourceError(f"annotation {key} must be a node-label key, got {raw[:64]!r}")
    return raw


def _gputopo_subgroup(annotations: Mapping[str, str]) -> tuple[str, tuple[SubGroup, ...]] | None:
    """gputopo's own: `gputopo.io/subgroup: NAME` puts the pod in sub-group NAME of its gang
    (directly under the root), which `gputopo.io/subgroup-required-topology` /
    `…-preferred-topology` place in one domain of a level (the first member seen decides)."""
    name = annotations.get(SUBGROUP_ANNOTATION)
    if name is None:
        return None
    if _dns_label(name) is None:
        raise SourceError(
            f"annotation {SUBGROUP_ANNOTATION} must be a DNS label (a-z, 0-9, -), got {name[:64]!r}"
        )
    required = _level(annotations, SUBGROUP_REQUIRED_ANNOTATION)
    preferred = _level(annotations, SUBGROUP_PREFERRED_ANNOTATION)
    return name, (SubGroup(name, "", required, preferred),)


def pod_index(labels: Mapping[str, str], annotations: Mapping[str, str]) -> int | None:
    """The pod's index in its PodSet, as Kueue reads it (POD_INDEX_KEYS), or None."""
    keys: list[str] = []
    named = annotations.get(KUEUE_INDEX_LABEL_ANNOTATION)
    if named:
        keys.append(named)
    keys.extend(POD_INDEX_KEYS)
    for key in keys:
        raw = labels.get(key, annotations.get(key))
        if raw is not None:
            return 0 if raw.strip() == "0" else _count(raw)
    return None


def _slice_layers(annotations: Mapping[str, str]) -> list[tuple[str, int]]:
    """Kueue's slice layers [(level, size)], outermost first; [] when the pod has none."""
    where = KUEUE_SLICE_CONSTRAINTS
    raw = annotations.get(KUEUE_SLICE_CONSTRAINTS)
    if raw is not None:
        try:
            items = json.loads(raw) if len(raw) <= 4096 else None
        except ValueError:
            items = None
        if not isinstance(items, list) or not 1 <= len(items) <= MAX_SLICE_LAYERS:
            raise SourceError(
                f'annotation {where} must be a JSON list of 1..3 {{"topology": KEY, "size": N}}'
            )
        layers = []
        for item in items:
            topology, size = dig(item, "topology"), dig(item, "size")
            n = _json_count(size)
            if not is_label_key(topology) or n is None:
                raise SourceError(
                    f'annotation {where}: each entry needs "topology" (a label key) and "size" (an integer)'
                )
            layers.append((topology, n))
    else:
        topology = annotations.get(KUEUE_SLICE_TOPOLOGY)
        if topology is None:
            return []
        size = _count(annotations.get(KUEUE_SLICE_SIZE, ""))
        if not is_label_key(topology) or size is None:
            raise SourceError(
                f"annotations {KUEUE_SLICE_TOPOLOGY} (a label key) and {KUEUE_SLICE_SIZE} "
                "(a positive integer) go together"
            )
        layers = [(topology, size)]
    for (_, outer), (_, inner) in itertools.pairwise(layers):
        if outer % inner:
            raise SourceError(f"annotation {where}: each slice size must be a multiple of the next one")
    return layers


def _kueue_subgroups(
    labels: Mapping[str, str], annotations: Mapping[str, str]
) -> tuple[str, tuple[SubGroup, ...]] | None:
    """Kueue's PodSet slices as sub-groups: with slice layers [(level, N)...], the pod of index i
    is in slice i // N of each layer (`slice<layer>-<k>`, nested in the layer above), each slice
    required in one domain of its level; a PodSet group (`podset-group-name: G`) is the sub-group
    `podset-G` above them. Pods of two JobSet child Jobs (`jobset.sigs.k8s.io/job-index`) never
    share a slice (`job<j>-slice…`). `podset-unconstrained-topology` declares no sub-group."""
    layers = _slice_layers(annotations)
    group = annotations.get(KUEUE_PODSET_GROUP)
    if not layers and group is None:
        return None
    path: list[SubGroup] = []
    parent = ""
    if group is not None:
        if _dns_label(group) is None:
            raise SourceError(f"annotation {KUEUE_PODSET_GROUP} must be a DNS label, got {group[:64]!r}")
        parent = f"podset-{group}"
        path.append(SubGroup(parent))
    if layers:
        index = pod_index(labels, annotations)
        if index is None:
            raise SourceError(
                "Kueue slices need the pod's index: label batch.kubernetes.io/job-completion-index, "
                "apps.kubernetes.io/pod-index, kueue.x-k8s.io/pod-group-pod-index or the one "
                f"{KUEUE_INDEX_LABEL_ANNOTATION} names"
            )
        job = labels.get(JOBSET_JOB_INDEX)
        stem = f"{parent}-" if parent else ""
        if job is not None:
            j = 0 if job.strip() == "0" else _count(job)
            if j is None:
                raise SourceError(f"label {JOBSET_JOB_INDEX} must be an integer, got {job[:32]!r}")
            stem += f"job{j}-"
        for layer, (level, size) in enumerate(layers):
            name = f"{stem}slice{layer}-{index // size}"
            path.append(SubGroup(name, parent, level))
            parent = name
    return parent, tuple(path)


def pod_subgroup(
    labels: Mapping[str, str], annotations: Mapping[str, str]
) -> tuple[str, tuple[SubGroup, ...], str] | None:
    """(leaf, path, family) of the sub-group a pod declares itself, by precedence: gputopo's
    annotations, then Kueue's slices and PodSet group; None when it declares none. SourceError
    when the deciding family's annotations are unusable (the message names the annotation)."""
    found = _gputopo_subgroup(annotations)
    if found is not None:
        return (*found, "gputopo")
    found = _kueue_subgroups(labels, annotations)
    if found is not None:
        return (*found, "kueue")
    return None


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
        "PodGroup spec.minMember, or what spec.minSubGroup and spec.subGroups[] give",
        Api("kai-podgroups", "scheduling.run.ai", ("v2alpha2",), "podgroups", "PodGroup"),
        groups_kai,
    ),
)

#: The `Topology` kinds whose level lists come first among the network levels (Kueue, KAI).
TOPOLOGY_APIS: tuple[Api, ...] = (
    Api("kueue-topologies", "kueue.x-k8s.io", ("v1beta2", "v1beta1", "v1alpha1"), "topologies", "Topology"),
    Api("kai-topologies", "kai.scheduler", ("v1alpha1",), "topologies", "Topology"),
)

#: Group objects no pod names but that join others into one gang: Kubernetes' CompositePodGroup
#: (1.37 alpha, gate CompositePodGroup), the parent of PodGroups (`link`). Discovered, optional.
COMPOSITE_API = Api(
    "k8s-compositepodgroups", "scheduling.k8s.io", ("v1alpha3",), "compositepodgroups", "CompositePodGroup"
)
TREE_APIS: tuple[tuple[Api, GroupParser], ...] = ((COMPOSITE_API, groups_k8s_composite),)

#: The last gang source, after every one of `SOURCES`: NVIDIA's ComputeDomain, which a pod joins
#: not by a name of its own but by claiming the domain's channel ResourceClaimTemplate, so only
#: the sidecar, which sees the ComputeDomains, can tell (`compute_domain_gangs`). A pod that
#: names a gang through `SOURCES` is that gang; the ComputeDomain then adds nothing.
#: Discovered, optional (clusters without NVIDIA's DRA driver do not serve it).
COMPUTE_DOMAIN_API = Api(
    "computedomains", "resource.nvidia.com", ("v1beta1",), "computedomains", "ComputeDomain"
)
#: The source label of a ComputeDomain's gang (a pod's `GangRef.source` in the sidecar).
COMPUTE_DOMAIN_LABEL = "resource.nvidia.com ComputeDomain"
DOMAIN_APIS: tuple[tuple[Api, GroupParser], ...] = ((COMPUTE_DOMAIN_API, groups_compute_domain),)

#: Volcano's HyperNodes (cluster-scoped): which of our levels a Volcano tier is
#: (gputopo/gang/hypernodes.py, `tier_level`). Discovered, optional.
HYPERNODE_API = Api("volcano-hypernodes", "topology.volcano.sh", ("v1alpha1",), "hypernodes", "HyperNode")

#: Every API the sidecar reads beside Nodes and Pods (its RBAC must allow get/list/watch on each).
APIS: tuple[Api, ...] = (
    *(s.api for s in SOURCES if s.api is not None),
    *(api for api, _ in TREE_APIS),
    *(api for api, _ in DOMAIN_APIS),
    *TOPOLOGY_APIS,
    HYPERNODE_API,
)


def pod_gang(
    labels: Mapping[str, str], annotations: Mapping[str, str], spec: Mapping[str, Any]
) -> Named | None:
    """The pod's gang by the precedence of `SOURCES`, or None; SourceError when the deciding
    source is named but malformed (a light label without a usable minimum, a Kueue group
    without count). The key has no namespace: the caller's pod namespace comes first."""
    for source in SOURCES:
        found = source.read(source, labels, annotations, spec)
        if found is not None:
            return _with_subgroup(found, labels, annotations)
    return None


def _with_subgroup(named: Named, labels: Mapping[str, str], annotations: Mapping[str, str]) -> Named:
    """The pod's own sub-group declaration: gputopo's annotations beat what the source's reader
    found (KAI's sub-group label), which beats Kueue's slices (docs/scheduler.md precedence)."""
    declared = pod_subgroup(labels, annotations)
    if declared is None or (declared[2] == "kueue" and named.subgroup_source):
        return named
    leaf, path, family = declared
    return replace(named, subgroup=leaf, subgroups=path, subgroup_source=family)


def valid_tree(groups: Iterable[SubGroup]) -> tuple[SubGroup, ...]:
    """The sub-groups of one gang merged (the first of each name wins), less any whose parent
    chain does not reach the root (an unknown parent, a cycle, deeper than MAX_TREE_DEPTH)."""
    by_name: dict[str, SubGroup] = {}
    for g in groups:
        if g.name and len(by_name) < MAX_SUBGROUPS:
            by_name.setdefault(g.name, g)
    ok: dict[str, bool] = {}

    def reaches_root(name: str, depth: int) -> bool:
        if name in ok:
            return ok[name]
        ok[name] = False  # a cycle back here fails
        parent = by_name[name].parent
        good = depth <= MAX_TREE_DEPTH and (
            not parent or (parent in by_name and reaches_root(parent, depth + 1))
        )
        ok[name] = good
        return good

    return tuple(g for g in by_name.values() if reaches_root(g.name, 1))


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
