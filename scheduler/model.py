"""Values the sidecar reasons about, parsed once at the edge from Kubernetes JSON.

Pods and Nodes arrive as API JSON (from kube-scheduler's request, a watch event or a snapshot
file). Everything is validated here into frozen values, so the planning code never meets a
half-formed dict and a malformed request becomes one clear `BadInput` instead of a traceback.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gputopo.gang import sources as gangsources
from gputopo.gang.hypernodes import HyperNode
from gputopo.gang.planner import SubGroup
from gputopo.gang.sources import Tier
from gputopo.jobtime.profiles import Profile, ProfileError, declared_profile
from gputopo.network.annotation import NodeTopology
from gputopo.numerals import ascii_uint
from scheduler import defaults, sources


class BadInput(ValueError):
    """A request or object that cannot be understood; the message is shown to the caller."""


@dataclass(frozen=True)
class GangRef:
    """A pod's gang: its key and what the pod's own labels/annotations say about it."""

    key: str  # "namespace/group"
    min_member: int | None  # from the light label; None = read it from the PodGroup object
    required_level: str | None = None
    preferred_level: str | None = None
    source: str = ""  # the API that named the gang (scheduler/sources.py)
    level_source: str = ""  # the annotation family the levels came from; "" = none
    #: the pod's leaf sub-group of the gang ("" = directly in the root), `planner.SubGroup.name`
    subgroup: str = ""
    #: the gang's sub-groups as this pod knows them: its own declared path, or (resolved) the
    #: group object's whole tree; the extender merges its members' (`sources.valid_tree`)
    groups: tuple[SubGroup, ...] = ()
    subgroup_source: str = ""  # "gputopo", "kai", "kueue", "group" (the object's tree) or ""
    #: the key the pod names when its group object put it in a larger gang (a PodGroup under a
    #: CompositePodGroup: the pod names podgroup:X, its gang is the root composite's); "" = key
    named: str = ""
    #: Volcano's networkTopology tier, mapped onto a level when the gang is planned
    tier: Tier | None = None
    #: the pod's labels, kept for a gang whose group object selects sub-groups by label
    #: (Volcano's `subGroupPolicy[]`: `gputopo.gang.sources.partition_of`); () for others
    labels: tuple[tuple[str, str], ...] = ()
    #: Volcano: (sub-group, tier) of the pod's partition, mapped onto a level when planned
    subgroup_tiers: tuple[tuple[str, Tier], ...] = ()


@dataclass(frozen=True)
class PodInfo:
    namespace: str
    name: str
    uid: str
    gpus: int
    node: str = ""  # spec.nodeName: bound already
    phase: str = "Pending"
    gang: GangRef | None = None
    #: gputopo.io/topology-wait: how long this pod waits for its best topology (None: the
    #: sidecar's --gang-spill-after)
    topology_wait_s: float | None = None
    #: metadata.creationTimestamp as Unix seconds (None when absent or unreadable): where a
    #: sidecar taking over re-derives a waiting gang's wait clock (docs/operator.md "Failover")
    created: float | None = None
    #: ResourceClaims (names in the pod's namespace) the pod uses: its GPUs on a DRA cluster
    #: when it asks through claims (sized by scheduler/live/dra.py from the claims' requests)
    claims: tuple[str, ...] = ()
    #: ResourceClaimTemplates the pod names (`spec.resourceClaims[].resourceClaimTemplateName`):
    #: a ComputeDomain's channel template makes the pod a member of that domain's gang
    #: (scheduler/live/kinds.py `ExtraKinds.resolve`)
    claim_templates: tuple[str, ...] = ()
    #: what the pod trains, when it (or its gang's group object) declares it: gputopo.io/profile,
    #: or gputopo.io/gradient-bytes and gputopo.io/compute-seconds (gputopo/jobtime/profiles.py)
    profile: Profile | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def active(self) -> bool:
        """Holds (or will hold) resources: not finished."""
        return self.phase not in ("Succeeded", "Failed")


@dataclass(frozen=True)
class NodeInfo:
    """One node: labels, GPU count, and what its plugin published (None = unknown topology)."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    gpu_capacity: int = 0
    topology: NodeTopology | None = None
    topology_problem: str = ""  # why `topology` is None, for the warning log
    pods_know_allocations: bool = True  # False in file mode: `topology.allocated` is the whole truth


class NodeChanges:
    """The names of the nodes whose planning inputs changed (their NodeInfo, or the GPUs their
    bound pods hold), in order, kept by a cluster state beside the snapshots it hands out.

    Whatever is derived per node from a snapshot (the views, the filter's answers, the network
    index) is kept from one snapshot to the next; without this it would have to compare every
    node to find the one whose annotation was rewritten, and at 60,000 nodes that comparison
    alone costs more than the filter it serves. With it a change costs what changed: `since`
    names the nodes changed between two snapshots. It answers None when it cannot tell (the
    state relisted, or the log was cut short), and the reader then redoes every node.
    Thread-safe: a state marks under its own lock while a filter reads."""

    __slots__ = ("_base", "_floor", "_limit", "_lock", "_names")

    def __init__(self, limit: int = 1 << 20) -> None:
        self._lock = threading.Lock()
        self._names: list[str] = []
        self._base = 0  # the sequence number of `_names[0]`
        self._floor = 0  # `since` an earlier number than this cannot be told
        self._limit = max(2, limit)

    @property
    def seq(self) -> int:
        """The sequence number the next change gets: a snapshot records it as its own."""
        with self._lock:
            return self._base + len(self._names)

    def mark(self, names: Iterable[str]) -> None:
        """These nodes changed (added, rewritten, deleted, or their bound pods' GPUs)."""
        with self._lock:
            self._names.extend(names)
            if len(self._names) > self._limit:  # bounded: the older half is forgotten
                cut = len(self._names) // 2
                del self._names[:cut]
                self._base += cut
                self._floor = self._base

    def reset(self) -> None:
        """Any node may have changed (a relist, a change not told node by node)."""
        with self._lock:  # a new sequence number: no `since` across it can be told
            self._base += len(self._names) + 1
            self._names = []
            self._floor = self._base

    def since(self, seq: int, upto: int) -> list[str] | None:
        """The nodes changed from sequence number `seq` to `upto` (repeats possible), or None
        when that cannot be told."""
        with self._lock:
            if seq < self._floor or seq > upto or upto > self._base + len(self._names):
                return None
            return self._names[seq - self._base : upto - self._base]


@dataclass(frozen=True)
class Snapshot:
    """The cluster at one instant: what the planner is given."""

    nodes: Mapping[str, NodeInfo]
    pods: Mapping[str, PodInfo]
    min_members: Mapping[str, int]  # PodGroup objects: "ns/name" -> minMember
    version: int = 0  # changes whenever anything above changes
    pod_gpus: Mapping[str, int] = field(default_factory=dict)  # node -> GPUs its bound, active pods hold
    #: node -> pods seen ending there whose GPUs its annotation still lists: those count as free
    ended: Mapping[str, frozenset[str]] = field(default_factory=dict)
    levels: tuple[str, ...] = ()  # network levels the cluster defines (Topology objects); () = configured
    #: Volcano's HyperNodes (which level each tier is: gputopo/gang/hypernodes.py); () = none
    hypernodes: tuple[HyperNode, ...] = ()
    #: changes whenever a node is added or removed or its labels change, and only then: the
    #: network index (which nodes share a domain) is rebuilt on it, not on every annotation
    #: rewrite a bind causes. 0 = not tracked: the index is then rebuilt whenever `nodes` is a
    #: new mapping.
    labels_version: int = 0
    #: the state's change log and this snapshot's place in it (`NodeChanges`): None = unknown,
    #: whatever is derived from an earlier snapshot is redone for every node
    changes: NodeChanges | None = None
    changes_seq: int = 0


def _obj(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise BadInput(f"{where} must be an object")
    return value


def _str_map(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    m = _obj(value, where)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in m.items()):
        raise BadInput(f"{where} must map strings to strings")
    return dict(m)


def parse_quantity(value: Any, where: str) -> int:
    """A whole-GPU quantity ("2", 2); fractions, units and absurd counts are refused."""
    if isinstance(value, bool):
        raise BadInput(f"{where} must be a whole number")
    if isinstance(value, str) and _digits(value.strip()):
        value = int(value.strip())
    if not isinstance(value, int):
        raise BadInput(f"{where} must be a whole number of GPUs, got {value!r}")
    if not 0 <= value <= defaults.MAX_GPUS_PER_POD:
        raise BadInput(f"{where} = {value} is out of range 0..{defaults.MAX_GPUS_PER_POD}")
    return value


def _digits(text: str) -> bool:
    """Plain ASCII digits of a sane length: `str.isdigit` also accepts "²" and 5,000-digit
    strings, which `int` then refuses with a ValueError."""
    return ascii_uint(text) is not None


def _container_gpus(containers: Any, where: str, resource: str) -> list[int]:
    if containers is None:
        return []
    if not isinstance(containers, list):
        raise BadInput(f"{where} must be a list")
    out = []
    for k, c in enumerate(containers):
        c = _obj(c, f"{where}[{k}]")
        res = _obj(c.get("resources") or {}, f"{where}[{k}].resources")
        limits = _obj(res.get("limits") or {}, f"{where}[{k}].resources.limits")
        requests = _obj(res.get("requests") or {}, f"{where}[{k}].resources.requests")
        raw = limits.get(resource, requests.get(resource, 0))
        gpus = parse_quantity(raw, f"{where}[{k}] {resource}")
        for name in {*limits, *requests}:  # DRA through a DeviceClass's extendedResourceName
            size = _dra_extended_size(name) if isinstance(name, str) else None
            if size is not None and name != resource:
                gpus += size * parse_quantity(limits.get(name, requests.get(name, 0)), f"{where}[{k}] {name}")
        out.append(gpus)
    return out


def _dra_extended_size(name: str) -> int | None:
    """GPUs one unit of a gputopo DeviceClass's extended resource is (`gputopo.io/gpu`: 1,
    `gputopo.io/nvlink-<k>`: k; deploy/components/dra), else None. Another Helm release's
    classes are the same under a subdomain (`<stem>.gputopo.io/nvlink-<k>`: defaults.py)."""
    domain, slash, resource = name.partition("/")
    if not slash or not _in_class_domain(domain):
        return None
    if resource == "gpu":
        return 1
    digits = resource.removeprefix("nvlink-")
    if digits != resource and _digits(digits):
        size = int(digits)
        return size if 2 <= size <= defaults.MAX_GPUS_PER_POD else None
    return None


def _in_class_domain(domain: str) -> bool:
    """gputopo.io itself or a subdomain of it (a release's own DeviceClass domain)."""
    base = defaults.DRA_CLASS_DOMAIN
    return domain == base or (domain.endswith("." + base) and len(domain) > len(base) + 1)


def _claim_names(spec: Mapping[str, Any], status: Mapping[str, Any]) -> tuple[str, ...]:
    """The ResourceClaims a pod uses: named directly (`spec.resourceClaims[].resourceClaimName`)
    or generated from a template (`status.resourceClaimStatuses[].resourceClaimName`)."""
    out: list[str] = []
    for entries, where in (
        (spec.get("resourceClaims"), "spec"),
        (status.get("resourceClaimStatuses"), "status"),
    ):
        if entries is None:
            continue
        if not isinstance(entries, list):
            raise BadInput(f"Pod.{where} resource claims must be a list")
        for e in entries:
            name = e.get("resourceClaimName") if isinstance(e, Mapping) else None
            if isinstance(name, str) and name and name not in out:
                out.append(name)
    return tuple(out[:64])


def _claim_templates(spec: Mapping[str, Any]) -> tuple[str, ...]:
    """The ResourceClaimTemplates a pod names, in spec order (a bad entry is skipped: the claim
    names' reader above refuses a non-list)."""
    entries = spec.get("resourceClaims")
    out: list[str] = []
    for e in entries if isinstance(entries, list) else []:
        name = e.get("resourceClaimTemplateName") if isinstance(e, Mapping) else None
        if isinstance(name, str) and 0 < len(name) <= 253 and name not in out:
            out.append(name)
    return tuple(out[:64])


def parse_pod(raw: Any, resource: str = defaults.RESOURCE_NAME) -> PodInfo:
    """A v1.Pod JSON object as kube-scheduler or the API server sends it."""
    pod = _obj(raw, "Pod")
    meta = _obj(pod.get("metadata"), "Pod.metadata")
    spec = _obj(pod.get("spec") or {}, "Pod.spec")
    status = _obj(pod.get("status") or {}, "Pod.status")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise BadInput("Pod.metadata.name is required")
    namespace = meta.get("namespace") or "default"
    if not isinstance(namespace, str):
        raise BadInput("Pod.metadata.namespace must be a string")
    uid = meta.get("uid") or ""
    labels = _str_map(meta.get("labels"), "Pod.metadata.labels")
    annotations = _str_map(meta.get("annotations"), "Pod.metadata.annotations")
    main = sum(_container_gpus(spec.get("containers"), "Pod.spec.containers", resource))
    inits = spec.get("initContainers")
    init_gpus = _container_gpus(inits, "Pod.spec.initContainers", resource)
    # As Kubernetes counts: an init container runs alone (beside the sidecars started before it);
    # a sidecar (restartPolicy: Always) keeps running beside everything after it, the app included.
    sidecars = peak = 0
    for c, g in zip(inits or [], init_gpus, strict=True):
        if c.get("restartPolicy") == "Always":
            sidecars += g
            peak = max(peak, sidecars)
        else:
            peak = max(peak, sidecars + g)
    gpus = max(main + sidecars, peak)
    if gpus > defaults.MAX_GPUS_PER_POD:
        raise BadInput(f"Pod asks for {gpus} GPUs, more than {defaults.MAX_GPUS_PER_POD}")
    node = spec.get("nodeName") or ""
    phase = status.get("phase") or "Pending"
    if not isinstance(node, str) or not isinstance(phase, str) or not isinstance(uid, str):
        raise BadInput("Pod.spec.nodeName, Pod.status.phase and metadata.uid must be strings")
    try:
        wait = sources.level_wait(annotations)
        profile = declared_profile(annotations)
    except (sources.SourceError, ProfileError) as e:
        raise BadInput(str(e)) from None
    return PodInfo(
        namespace=namespace,
        name=name,
        uid=uid,
        gpus=gpus,
        node=node,
        phase=phase,
        gang=_gang(namespace, labels, annotations, spec),
        topology_wait_s=wait,
        created=_timestamp(meta.get("creationTimestamp")),
        claims=_claim_names(spec, status),
        claim_templates=_claim_templates(spec),
        profile=profile,
    )


def _timestamp(raw: Any) -> float | None:
    """An RFC 3339 timestamp as the API server writes it, in Unix seconds; None for anything
    else (a bad one costs the pod its creation time, never its parse)."""
    if not isinstance(raw, str) or len(raw) > 64:
        return None
    try:
        parsed = datetime.fromisoformat(raw)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None
    return parsed.timestamp()


def _gang(
    namespace: str, labels: Mapping[str, str], annotations: Mapping[str, str], spec: Mapping[str, Any]
) -> GangRef | None:
    """The pod's gang from whichever API names it, by one precedence (scheduler/sources.py)."""
    try:
        g = sources.pod_gang(namespace, labels, annotations, spec)
    except sources.SourceError as e:
        raise BadInput(str(e)) from None
    if g is None:
        return None
    kept = tuple(sorted(labels.items()))[:MAX_KEPT_LABELS] if g.source in LABELLED_SOURCES else ()
    return GangRef(
        g.key,
        g.min_member,
        g.required_level,
        g.preferred_level,
        g.source,
        g.level_source,
        g.subgroup,
        g.groups,
        g.subgroup_source,
        labels=kept,
    )


#: Gang sources whose group objects select sub-groups by pod label (Volcano's subGroupPolicy)
LABELLED_SOURCES = frozenset(s.label for s in gangsources.SOURCES if s.name == "volcano")
MAX_KEPT_LABELS = 64


def parse_node_names(args: Mapping[str, Any]) -> tuple[list[str], bool]:
    """The candidate nodes of an ExtenderArgs, and whether they came as NodeNames (cache mode)."""
    names = args.get("NodeNames")
    if names is not None:
        # C-level checks (a per-name Python test costs ~1-2 ms per 20,000 names, twice a cycle):
        # `str.join` refuses anything but strings, `in` finds an empty one
        try:
            if not isinstance(names, list) or "" in names:
                raise TypeError
            "".join(names)
        except TypeError:
            raise BadInput("NodeNames must be a list of node names") from None
        return names, True
    nodes = args.get("Nodes")
    if nodes is None:
        raise BadInput("one of NodeNames or Nodes is required")
    items = _obj(nodes, "Nodes").get("items")
    if items is None:
        items = []
    if not isinstance(items, list):
        raise BadInput("Nodes.items must be a list")
    out = []
    for k, item in enumerate(items):
        meta = _obj(_obj(item, f"Nodes.items[{k}]").get("metadata"), f"Nodes.items[{k}].metadata")
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise BadInput(f"Nodes.items[{k}].metadata.name is required")
        out.append(name)
    return out, False


def node_gpu_capacity(node: Mapping[str, Any], resource: str = defaults.RESOURCE_NAME) -> int:
    """GPUs a Node reports allocatable (0 when absent or unreadable)."""
    status = node.get("status") or {}
    alloc = (status.get("allocatable") or status.get("capacity") or {}) if isinstance(status, Mapping) else {}
    if not isinstance(alloc, Mapping):
        return 0
    raw = alloc.get(resource, 0)
    if type(raw) is str and 0 < len(raw) <= 4 and raw.isascii() and raw.isdigit():  # "8": the usual
        value = int(raw)
        if value <= defaults.MAX_GPUS_PER_POD:
            return value
    try:
        return parse_quantity(raw, "allocatable")
    except BadInput:
        return 0
