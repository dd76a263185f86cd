"""What `kubectl gputopo` shows, as pure functions of API JSON and a time "now".

Every node's annotation is untrusted: one that does not decode costs its own row (its status
column says why), never the listing. Rings come from the core allocator on the decoded
topology, the same numbers the plugin and the sidecar decide on.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gputopo.gang import explain
from gputopo.gang import sources as gangsources
from gputopo.gang.sources import LEVEL_ANNOTATIONS, Named
from gputopo.network import annotation
from gputopo.node.allocator import AllocatorPool
from gputopo.numerals import ascii_uint
from gputopo.output import ago, short_age, table

TOPOLOGY_ANNOTATION = "gputopo.io/topology"
#: The Event the sidecar writes on a pod at bind: "gputopo predicts GPUs 0,1 on node n1".
PREDICTED_REASON = "GPUsPredicted"
#: reportingComponent of each daemon's Events, and the Node Event reasons that say a node's
#: annotation is not usable (Warning) or usable again (Normal).
PLUGIN_COMPONENT = "gputopo-device-plugin"
SCHEDULER_COMPONENT = "gputopo-scheduler"
NODE_PROBLEM_REASONS = {
    PLUGIN_COMPONENT: ("TopologyNotPublished", "TopologyPublished"),
    SCHEDULER_COMPONENT: ("TopologyRejected", "TopologyAccepted"),
}
#: Request sizes `nodes` shows the best ring for.
RING_SIZES = (2, 4, 8)
#: The sidecar's default limit (scheduler/defaults.py ANNOTATION_MAX_AGE_S): older is "stale".
DEFAULT_MAX_AGE_S = 900.0

#: Pod annotations that ask for a network level (gputopo's own, Kueue's, KAI Scheduler's).
CONSTRAINT_ANNOTATIONS = tuple(
    key for _, required, preferred in LEVEL_ANNOTATIONS for key in (required, preferred)
)


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return _map(obj.get("metadata"))


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """An object's annotations; {} when the object is shaped otherwise."""
    return _map(_meta(obj).get("annotations"))


# ---------------------------------------------------------------------------- nodes


def _capacity(node: Mapping[str, Any], resource: str) -> int | None:
    status = _map(node.get("status"))
    for key in ("allocatable", "capacity"):
        raw = _map(status.get(key)).get(resource)
        if isinstance(raw, str) and (n := ascii_uint(raw)) is not None:
            return n
    return None


def _has_resource(node: Mapping[str, Any], resource: str) -> bool:
    """Whether kubelet lists the GPU resource on the node at all (even "0": a plugin registered
    and every GPU unhealthy, or none advertised yet, is still a GPU node to explain)."""
    status = _map(node.get("status"))
    return any(resource in _map(status.get(key)) for key in ("allocatable", "capacity"))


def node_problems(events: Sequence[Mapping[str, Any]]) -> dict[str, str | None]:
    """What each daemon last said about the node's annotation, from its Node Events: the note
    of a Warning (`TopologyNotPublished` from the plugin, `TopologyRejected` from the sidecar)
    when that is its latest such Event, else None (never said, or fixed since)."""
    latest: dict[str, tuple[float, str | None]] = {}
    for event in events:
        row = event_row(event)
        for component, (bad, good) in NODE_PROBLEM_REASONS.items():
            if row["from"] == component and row["reason"] in (bad, good):
                at = row["time"] if row["time"] is not None else -math.inf
                if component not in latest or at >= latest[component][0]:
                    latest[component] = (at, row["message"] if row["reason"] == bad else None)
    return {component: latest.get(component, (0.0, None))[1] for component in NODE_PROBLEM_REASONS}


#: Node labels by which the plugin's DaemonSet leaves a GPU node out on purpose (the chart's
#: plugin.nodeSelectorTerms and deploy/base: NotIn ["true"], NotIn ["false"]), and why. Such a
#: node has no gputopo annotation by design, which is no plugin problem to chase.
SKIP_LABELS = (
    ("nvidia.com/gpu.deploy.device-plugin", "true", "the GPU Operator's own device plugin runs here"),
    ("gputopo.io/device-plugin", "false", "opted out of gputopo's device plugin"),
)


def skipped_on_purpose(node: Mapping[str, Any]) -> str | None:
    """Why gputopo's plugin does not run on this node by design (each label that says so), or
    None where it should run."""
    labels = _map(_meta(node).get("labels"))
    reasons = [f"{why} ({key}={value})" for key, value, why in SKIP_LABELS if labels.get(key) == value]
    return "; ".join(reasons) or None


def node_row(
    node: Mapping[str, Any],
    *,
    now: float,
    max_age_s: float,
    pool: AllocatorPool,
    resource: str,
    events: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any] | None:
    """One GPU node's summary, or None for a node with neither a gputopo annotation nor the GPU
    resource. `events` are gputopo's Events on this Node: why the plugin cannot publish, why
    the sidecar refuses the annotation."""
    meta = _meta(node)
    name = _str(meta.get("name")) or "?"
    text = _map(meta.get("annotations")).get(TOPOLOGY_ANNOTATION)
    capacity = _capacity(node, resource)
    problems = node_problems(events)
    plugin, sidecar = problems[PLUGIN_COMPONENT], problems[SCHEDULER_COMPONENT]
    skipped = skipped_on_purpose(node)
    row: dict[str, Any] = {
        "name": name,
        "gpus": capacity,
        "free": None,
        "healthy": None,
        "unhealthy": [],
        "allocated": [],
        "best_ring_gbps": {str(k): None for k in RING_SIZES},
        "annotation_age_s": None,
        "status": "ok",
        "policy": None,
        "plugin_version": None,
        "topology": None,
        "nvlink_gbps_per_link": None,
        "plugin_problem": plugin,
        "scheduler_problem": sidecar,
        "skipped": skipped,
    }
    if not isinstance(text, str) or not text:
        if not _has_resource(node, resource):
            return None
        row["status"] = (
            f"skipped on purpose: {skipped}"
            if skipped
            else f"no annotation: plugin says: {plugin}"
            if plugin
            else "no annotation (no gputopo plugin has published here: is it running? see its log)"
        )
        return row
    try:
        value = annotation.decode(text, now=now, max_age_s=math.inf)
    except annotation.AnnotationError as e:
        row["status"] = f"invalid: {e}"
        return row
    topo = value.topology
    free = sorted(value.free)
    row |= {
        "gpus": topo.n,
        "free": len(free),
        "healthy": len(value.healthy),
        "unhealthy": sorted(value.unhealthy),
        "allocated": sorted(value.allocated),
        "annotation_age_s": round(now - value.generated_at, 3),
        "policy": _policy(text),
        "plugin_version": value.plugin_version or None,
        "topology": topo.name,
        "nvlink_gbps_per_link": topo.settings.nvlink_gbps_per_link,
    }
    try:
        alloc = pool.get(topo)
        row["best_ring_gbps"] = {
            str(k): (alloc.choose(free, k).ring_mbps / 1000 if len(free) >= k else None) for k in RING_SIZES
        }
    except Exception as e:  # a node the allocator refuses (more than 16 GPUs) costs its rings only
        row["status"] = f"rings unavailable: {e}"
    if now - value.generated_at > max_age_s:
        row["status"] = f"stale (older than {ago(max_age_s).removesuffix(' ago')}: the sidecar ignores it)"
        if plugin:
            row["status"] += f"; plugin says: {plugin}"
    elif sidecar and row["status"] == "ok":
        row["status"] = f"refused by the scheduler: {sidecar}"
    return row


def _policy(text: str) -> str | None:
    """The policy the plugin published, when it publishes one (a string or an object's name)."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return None
    policy = doc.get("policy") if isinstance(doc, dict) else None
    if isinstance(policy, str):
        return policy or None
    if isinstance(policy, Mapping):
        name = policy.get("name")
        return name if isinstance(name, str) and name else json.dumps(policy, sort_keys=True)
    return None


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


#: Labels that mark a node as having NVIDIA GPUs whether or not a device plugin runs there: the
#: GPU Operator's feature label and Node Feature Discovery's PCI vendor label (the same two the
#: chart's and deploy/'s DaemonSet select on, docs/operator.md "Which nodes run the plugin").
GPU_NODE_LABELS = ("nvidia.com/gpu.present", "feature.node.kubernetes.io/pci-10de.present")


def _unlisted_gpu_nodes(nodes: Sequence[Mapping[str, Any]], listed: Set[str]) -> list[Mapping[str, Any]]:
    out = []
    for node in nodes:
        meta = _meta(node)
        labels = _map(meta.get("labels"))
        name = _str(meta.get("name"))
        if name and name not in listed and any(labels.get(k) == "true" for k in GPU_NODE_LABELS):
            out.append(node)
    return out


def unserved_gpu_nodes(nodes: Sequence[Mapping[str, Any]], listed: Set[str]) -> list[str]:
    """Nodes labelled as GPU nodes that no row lists and that the plugin should serve: no
    device plugin advertises their GPUs (the DaemonSet does not select them, or its pod there
    is not running). Nodes skipped on purpose are skipped_gpu_nodes'."""
    return sorted(
        _str(_meta(n).get("name"))
        for n in _unlisted_gpu_nodes(nodes, listed)
        if skipped_on_purpose(n) is None
    )


def skipped_gpu_nodes(nodes: Sequence[Mapping[str, Any]], listed: Set[str]) -> list[tuple[str, str]]:
    """Nodes labelled as GPU nodes that no row lists and that the DaemonSet leaves out on
    purpose, each with why (skipped_on_purpose): shown as such, not as a plugin to look for."""
    out = []
    for node in _unlisted_gpu_nodes(nodes, listed):
        why = skipped_on_purpose(node)
        if why is not None:
            out.append((_str(_meta(node).get("name")), why))
    return sorted(out)


def render_nodes(
    rows: list[dict[str, Any]],
    *,
    wide: bool = False,
    resource: str = "nvidia.com/gpu",
    unserved: Sequence[str] = (),
    skipped: Sequence[tuple[str, str]] = (),
) -> str:
    hints = []
    if unserved:
        shown = ", ".join(unserved[:10]) + (f" and {len(unserved) - 10} more" if len(unserved) > 10 else "")
        hints.append(
            f"{len(unserved)} node(s) labelled as GPU nodes ({' or '.join(f'{k}=true' for k in GPU_NODE_LABELS)})"
            f" list no {resource}: {shown}. Is the device plugin running there? "
            "(kubectl get ds -A -l app.kubernetes.io/component=device-plugin)"
        )
    if skipped:
        shown = ", ".join(f"{name} ({why})" for name, why in skipped[:10])
        more = f" and {len(skipped) - 10} more" if len(skipped) > 10 else ""
        hints.append(
            f"{len(skipped)} GPU node(s) skipped on purpose (gputopo's device plugin does not run "
            f"there by design): {shown}{more}."
        )
    hint = "\n".join(hints)
    if not rows:
        none = f"No GPU nodes found (no node lists {resource} in its allocatable or capacity, nor has a {TOPOLOGY_ANNOTATION} annotation)."
        return none + ("\n" + hint if hint else "")
    header = ["NODE", "GPUS", "FREE", "HEALTHY", *(f"RING{k}" for k in RING_SIZES), "AGE"]
    if wide:
        header += ["TOPOLOGY", "NVLINK", "PLUGIN", "POLICY", "UNHEALTHY"]
    header.append("STATUS")
    body = []
    for r in rows:
        age = r["annotation_age_s"]
        cells = [
            r["name"],
            _num(r["gpus"]),
            _num(r["free"]),
            _num(r["healthy"]),
            *(_num(r["best_ring_gbps"][str(k)]) for k in RING_SIZES),
            short_age(age),
        ]
        if wide:
            cells += [
                r["topology"] or "-",
                "-" if r["nvlink_gbps_per_link"] is None else f"{r['nvlink_gbps_per_link']:g}",
                r["plugin_version"] or "-",
                r["policy"] or "-",
                ",".join(map(str, r["unhealthy"])) or "-",
            ]
        cells.append(r["status"])
        body.append(cells)
    lines = table(header, body)
    lines.append("")
    lines.append(
        "RINGn: GB/s of the best ring an n-GPU request gets from the node's free GPUs now (- = fewer free)."
    )
    on_purpose = sum(1 for r in rows if r["status"].startswith("skipped on purpose"))
    unusable = sum(
        1
        for r in rows
        if r["status"] != "ok"
        and not r["status"].startswith("rings unavailable")
        and not r["status"].startswith("skipped on purpose")
    )
    if unusable:
        lines.append(
            f"{unusable} of {len(rows)} GPU nodes without a usable annotation: the scheduler counts their "
            "GPUs from allocatable, with no topology (STATUS says why)."
        )
    if on_purpose:
        lines.append(
            f"{on_purpose} of {len(rows)} GPU nodes skipped on purpose by gputopo's device plugin (STATUS "
            "says which label): another plugin serves their GPUs, the scheduler counts them from "
            "allocatable, with no topology."
        )
    if hint:
        lines.append(hint)
    return "\n".join(lines)


# ---------------------------------------------------------------------------- why


def _strings(value: Any) -> dict[str, str]:
    """Labels or annotations as the API gives them: strings only (anything else is no key)."""
    return {k: v for k, v in _map(value).items() if isinstance(k, str) and isinstance(v, str)}


def gang_of(pod: Mapping[str, Any]) -> Named | None:
    """The pod's gang exactly as the sidecar reads it (the core's table of gang sources, the
    same precedence): its source, key, name and, where the pod says so, the quorum. None for a
    pod on its own; `sources.SourceError` when the deciding source is named but unusable
    (the sidecar refuses such a pod, with the same message)."""
    meta = _meta(pod)
    return gangsources.pod_gang(
        _strings(meta.get("labels")), _strings(meta.get("annotations")), _map(pod.get("spec"))
    )


def member_gang(pod: Mapping[str, Any]) -> Named | None:
    """`gang_of`, with a pod whose gang fields are unusable counted in no gang."""
    try:
        return gang_of(pod)
    except gangsources.SourceError:
        return None


def same_gang(a: Named | None, b: Named | None) -> bool:
    """Two pods (of one namespace) the sidecar counts in one gang: same source, same key (a
    Workload's replica keys are gangs of their own)."""
    if a is None or b is None:
        return False
    return (a.source.name, a.key) == (b.source.name, b.key)


def object_kind(gang: Named) -> str:
    """The kind of the gang's group object (whose Events `why` shows)."""
    return gang.source.api.kind if gang.source.api is not None else "PodGroup"


def parse_time(text: Any) -> float | None:
    """RFC 3339 as the API server writes it, to Unix seconds; None for anything else."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def event_time(event: Mapping[str, Any]) -> float | None:
    """When an Event last happened, as finely as it says: the latest of series.lastObservedTime,
    eventTime (microseconds: events.k8s.io/v1, kube-scheduler's own) and lastTimestamp (whole
    seconds: core/v1), so an event repeated later wins, and of two in the same second the one
    with microseconds is ordered by them; else firstTimestamp, else when it was created."""
    times = [
        t
        for t in (
            parse_time(_map(event.get("series")).get("lastObservedTime")),
            parse_time(event.get("eventTime")),
            parse_time(event.get("lastTimestamp")),
            parse_time(event.get("deprecatedLastTimestamp")),  # the same, as events.k8s.io/v1 spells it
        )
        if t is not None
    ]
    if times:
        return max(times)
    return (
        parse_time(event.get("firstTimestamp"))
        or parse_time(event.get("deprecatedFirstTimestamp"))
        or parse_time(_meta(event).get("creationTimestamp"))
    )


def _count(value: Any) -> int | None:
    """An Event's count as the API carries it: a positive integer (not a bool, not a string)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def event_row(event: Mapping[str, Any]) -> dict[str, Any]:
    """An Event as either API lists it: core/v1 (`involvedObject`, `message`, `count`, `source`)
    or events.k8s.io/v1 (`regarding`, `note`, `series`/`deprecatedCount`, `reportingController`,
    `deprecatedSource`)."""
    involved = _map(event.get("involvedObject")) or _map(event.get("regarding"))
    source = _map(event.get("source")) or _map(event.get("deprecatedSource"))
    when = event_time(event)
    series = _map(event.get("series")).get("count")
    count = next(
        (c for c in (series, event.get("count"), event.get("deprecatedCount")) if _count(c) is not None), 1
    )
    return {
        "time": when,
        "object": f"{_str(involved.get('kind')).lower() or '?'}/{_str(involved.get('name'))}",
        "type": _str(event.get("type")) or "Normal",
        "reason": _str(event.get("reason")),
        "message": " ".join((_str(event.get("message")) or _str(event.get("note"))).split()),
        "from": _str(event.get("reportingComponent"))
        or _str(event.get("reportingController"))
        or _str(source.get("component"))
        or "-",
        "count": count,
    }


_PREDICTION = re.compile(r"gputopo predicts GPUs ([0-9,]+) on node (\S+)")


def predictions(events: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """Pod name -> {"gpus": "0,1", "node": "n1"}: the newest `GPUsPredicted` Event on each pod
    (the sidecar writes it at bind; `gputopo predicts GPUs 0,1 on node n1`)."""
    best: dict[str, tuple[float, dict[str, str]]] = {}
    for event in events:
        row = event_row(event)
        if row["reason"] != PREDICTED_REASON or not row["object"].startswith("pod/"):
            continue
        m = _PREDICTION.search(row["message"])
        if m is None:
            continue
        name = row["object"].removeprefix("pod/")
        at = row["time"] if row["time"] is not None else -math.inf
        if name not in best or at >= best[name][0]:
            best[name] = (at, {"gpus": m.group(1), "node": m.group(2)})
    return {name: value for name, (_, value) in best.items()}


def member_row(
    pod: Mapping[str, Any], predicted: Mapping[str, Mapping[str, str]] | None = None
) -> dict[str, Any]:
    meta = _meta(pod)
    name = _str(meta.get("name"))
    guess = (predicted or {}).get(name)
    return {
        "name": name,
        "phase": _str(_map(pod.get("status")).get("phase")) or "Pending",
        "node": _str(_map(pod.get("spec")).get("nodeName")) or None,
        "predicted_gpus": guess["gpus"] if guess else None,
        "predicted_node": guess["node"] if guess else None,
    }


def why_document(
    pod: Mapping[str, Any],
    *,
    gang: Named | None,
    gang_object: Mapping[str, Any] | None,
    members: Sequence[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]],
    gang_error: str | None = None,
    predicted: Mapping[str, Mapping[str, str]] | None = None,
    tree: CompositeTree | None = None,
) -> dict[str, Any]:
    """The decision for a pod (and its gang), with every Event on the pod and its gang object
    (oldest first, by the finest time each carries). `gang_error`: why the pod's gang fields are
    unusable (the sidecar refuses the pod). `predicted`: the GPUs the sidecar predicted per pod
    name (`predictions`); the pod's own are also read from `events`. `tree`: the
    CompositePodGroup tree the pod's PodGroup sits under (`composite_tree`; `members` and
    `events` then cover the whole tree and its root). A gang that is a tree gets `gang.tree`
    (`tree_document`), and its members their sub-group; a flat gang's document is unchanged."""
    meta = _meta(pod)
    predicted = {**predictions(events), **(predicted or {})}
    me = member_row(pod, predicted)
    rows = sorted((event_row(e) for e in events), key=lambda e: (e["time"] is None, e["time"] or 0.0))
    gputopo_annotations = {
        k: v
        for k, v in _map(meta.get("annotations")).items()
        if isinstance(k, str) and k.startswith("gputopo.io/")
    }
    doc: dict[str, Any] = {
        "pod": f"{_str(meta.get('namespace'))}/{me['name']}",
        "phase": me["phase"],
        "node": me["node"],
        "decision": "",  # below, once the events are sorted
        "predicted_gpus": me["predicted_gpus"],
        "predicted_node": me["predicted_node"],
        "constraints": {
            k: v
            for k, v in _map(meta.get("annotations")).items()
            if k in CONSTRAINT_ANNOTATIONS and isinstance(v, str)
        },
        "annotations": gputopo_annotations,
        "gang": None,
        "gang_error": gang_error,
        "events": rows,
    }
    if gang is not None:
        namespace = _str(meta.get("namespace"))
        member_rows = sorted((member_row(m, predicted) for m in members), key=lambda m: m["name"])
        doc["gang"] = {
            "name": f"{namespace}/{gang.name}",
            "source": gang.field,
            "api": gang.source.label,
            "object": None if gang_object is None else _str(gang_object.get("kind")) or object_kind(gang),
            "has_object": gang.source.api is not None,
            "min_member": gangsources.quorum(gang, namespace, gang_object),
            "quorum_from": gang.source.quorum,
            "object_levels": _object_levels(gang, namespace, gang_object),
            "members": member_rows,
            "bound": sum(1 for m in member_rows if m["node"]),
        }
        found = tree_document(pod, gang, namespace, gang_object, members, rows, tree)
        if found is not None:
            doc["gang"]["tree"], subgroups = found
            for m in member_rows:
                m["subgroup"] = subgroups.get(m["name"], "")
    if me["node"]:
        doc["decision"] = f"bound to {me['node']}"
    else:
        latest = next((e for e in reversed(rows) if e["reason"]), None)
        doc["decision"] = "waits: " + (
            f"{latest['reason']}: {latest['message']}"
            if latest
            else "no Event yet (nothing decided or reported)"
        )
    return doc


def _object_levels(gang: Named, namespace: str, obj: Mapping[str, Any] | None) -> dict[str, str] | None:
    """The levels the gang's group object sets (a Kubernetes PodGroup's topology key, a KAI
    PodGroup's topologyConstraint): the sidecar uses them unless gputopo's annotations set some."""
    group = gangsources.object_group(gang, namespace, obj)
    if group is None or not (group.required_level or group.preferred_level):
        return None
    levels = {"required": group.required_level, "preferred": group.preferred_level}
    return {k: v for k, v in levels.items() if v}


# ---------------------------------------------------------------------------- trees

#: The sidecar's Events that carry a tree gang's decision, in `gputopo.gang.explain`'s words.
TREE_REASONS = ("GangPlanned", "GangReplanned", "GangUnschedulable")


@dataclass(frozen=True)
class CompositeTree:
    """A CompositePodGroup tree as the sidecar links it: the root (the gang, with its quorum
    and sub-groups) and every PodGroup's Group (`root` set to the root's key)."""

    root: gangsources.Group
    index: Mapping[str, gangsources.Group]

    @property
    def object(self) -> str:
        """The root's kind/name: the object the sidecar writes the gang's Events on."""
        ref = self.root.ref or {}
        return f"{ref.get('kind', 'CompositePodGroup')}/{ref.get('name', '?')}"


def composite_tree(
    gang: Named | None,
    namespace: str,
    gang_object: Mapping[str, Any] | None,
    podgroups: Sequence[Mapping[str, Any]],
    composites: Sequence[Mapping[str, Any]],
) -> CompositeTree | None:
    """The CompositePodGroup tree the pod's PodGroup sits under, linked exactly as the sidecar
    links it (`sources.link` over the namespace's PodGroups and CompositePodGroups), or None:
    the pod's gang is not a Kubernetes PodGroup, its PodGroup names no parent, or the chain
    does not reach a root (the sidecar then makes no tree either: its pods wait)."""
    if gang is None or gang.source.name != "k8s-podgroup" or gang_object is None:
        return None
    if not gangsources.dig(gang_object, "spec", "parentCompositePodGroupName"):
        return None
    default = gang.source.api.api_version if gang.source.api is not None else ""
    groups: list[gangsources.Group] = []
    for parse, objs, fallback in (
        (gangsources.groups_k8s_podgroup, podgroups, default),
        (gangsources.groups_k8s_composite, composites, gangsources.COMPOSITE_API.api_version),
    ):
        for obj in objs:
            version = obj.get("apiVersion")
            groups += parse(obj, version if isinstance(version, str) and version else fallback)
    index = gangsources.link(groups)
    mine = index.get(f"{namespace}/{gang.key}")
    root = index.get(mine.root) if mine is not None and mine.root else None
    return None if root is None else CompositeTree(root, index)


def tree_member(pod: Mapping[str, Any], namespace: str, tree: CompositeTree) -> str | None:
    """The sub-group ("podgroup:NAME") of a pod whose PodGroup is in `tree`, else None."""
    named = member_gang(pod)
    if named is None or named.source.name != "k8s-podgroup":
        return None
    group = tree.index.get(f"{namespace}/{named.key}")
    return named.key if group is not None and group.root == tree.root.key else None


def _subgroup_of(pod: Mapping[str, Any], namespace: str, tree: CompositeTree | None) -> str:
    if tree is not None:
        return tree_member(pod, namespace, tree) or ""
    named = member_gang(pod)
    return named.subgroup if named is not None else ""


def tree_document(
    pod: Mapping[str, Any],
    gang: Named,
    namespace: str,
    gang_object: Mapping[str, Any] | None,
    members: Sequence[Mapping[str, Any]],
    rows: Sequence[Mapping[str, Any]],
    tree: CompositeTree | None,
) -> tuple[dict[str, Any], dict[str, str]] | None:
    """`gang.tree` of `why`'s document, and each member's sub-group by pod name; None for a
    flat gang (no tree object, no sub-group on the pod or its group object, and no tree
    decision among the Events), whose document stays as it was.

    The tree's shape comes from the objects; where each sub-group went and why comes from the
    sidecar's newest Event that carries a tree decision (`gputopo.gang.explain`): a plan (the
    root, then every sub-group with its domain, level, nodes and reason) or, for a tree that
    waits, the sub-group that cannot be placed and why."""
    obj_group = gangsources.object_group(gang, namespace, gang_object)
    kind_tree = obj_group is not None and bool(obj_group.subgroups)
    plan: dict[str, Any] | None = None
    stuck: dict[str, str] | None = None
    source: Mapping[str, Any] | None = None
    own: tuple[dict[str, Any], Mapping[str, Any]] | None = None  # this pod's own GangPlanned entry
    me = f"pod/{_str(_meta(pod).get('name'))}"
    for row in reversed(rows):  # newest first
        if row["from"] != SCHEDULER_COMPONENT or row["reason"] not in TREE_REASONS:
            continue
        if row["reason"] == "GangUnschedulable":
            stuck = explain.parse_stuck(row["message"])
        else:
            plan = explain.parse_plan(row["message"])
            entry = explain.parse_own(row["message"]) if row["object"] == me and own is None else None
            if entry is not None:
                own = (entry, row)
        if plan is not None or stuck is not None:
            source = row
            break
    if plan is None and own is not None and (stuck is None or _newer(own[1], source)):
        # no tree Event on a group object newer than the pod's own (a tree without one: Kueue
        # slices, gputopo.io/subgroup on a gang with none): the pod's own Event still says
        # where its sub-group went
        stuck, source = None, own[1]
        plan = {"subgroups": [own[0]], "omitted": 0, "omitted_nodes": 0, "own_only": True}
    if tree is None and not kind_tree and not gang.subgroup and source is None:
        return None
    meta = _meta(pod)
    subgroups = {_str(_meta(m).get("name")): _subgroup_of(m, namespace, tree) for m in members}
    obj: str | None
    quorum: int | None
    if tree is not None:
        obj, quorum = tree.object, tree.root.min_member
    elif gang_object is not None and obj_group is not None:
        obj, quorum = (
            f"{_str(gang_object.get('kind')) or object_kind(gang)}/{gang.name}",
            obj_group.min_member,
        )
    else:
        obj, quorum = None, gang.min_member
    doc: dict[str, Any] = {
        "object": obj,
        "quorum": quorum,
        "subgroup": subgroups.get(_str(meta.get("name")), "") or _subgroup_of(pod, namespace, tree),
        "state": "planned" if plan is not None else "waiting" if stuck is not None else "unknown",
        "event": None if source is None else {"reason": source["reason"], "object": source["object"]},
        "root": None,
        "subgroups": [],
        "omitted": 0,
        "omitted_nodes": 0,
        "stuck": stuck,
    }
    if plan is not None:
        doc["subgroups"] = plan.pop("subgroups")
        doc["omitted"], doc["omitted_nodes"] = plan.pop("omitted"), plan.pop("omitted_nodes")
        doc["root"] = None if plan.pop("own_only", False) else plan
    return doc, subgroups


def _newer(a: Mapping[str, Any], b: Mapping[str, Any] | None) -> bool:
    """Whether Event row `a` is newer than `b` (rows without a time count as oldest)."""
    if b is None:
        return True
    return (a["time"] if a["time"] is not None else -math.inf) > (
        b["time"] if b["time"] is not None else -math.inf
    )


def _render_tree(tree: Mapping[str, Any], gang: Mapping[str, Any]) -> list[str]:
    """The tree as `why` prints it: root then sub-groups indented, this pod's marked."""
    mine = tree["subgroup"]
    where = f"tree {tree['object']}" if tree["object"] else "tree"
    quorum = "" if tree["quorum"] is None else f", quorum {tree['quorum']}"
    member = f"this pod is in sub-group {mine}" if mine else "this pod is in no sub-group (the root)"
    lines = [f"{where}{quorum}: {member}"]
    event = tree["event"]
    said = f" (the sidecar's {event['reason']} Event on {event['object']})" if event else ""
    root = tree["root"]
    if tree["state"] == "planned":
        lines.append(f"  planned{said}:")
        if root is not None:
            label = tree["object"] or f"gang {gang['name']}"
            text = f"    {label} {explain.ARROW} {root['domain']} ({root['level']}, {root['how']})"
            text += f" on {root['node_count']} nodes"
            if root["offered"] is not None:
                text += f", within the {root['offered']} nodes offered"
            if root["why"]:
                text += f": {root['why']}"
            lines.append(text)
        else:
            lines.append(
                "    (the tree's own Event is on no group object: only this pod's sub-group is known)"
            )
        for g in tree["subgroups"]:
            nodes = ",".join(g["nodes"]) + (f",+{g['more_nodes']}" if g["more_nodes"] else "")
            line = (
                f"    {'  ' * g['depth']}{g['name']} {explain.ARROW} {g['domain']} ({g['level']}, {g['how']})"
                f" on {nodes}"
            )
            if g["why"]:
                line += f": {g['why']}"
            if mine and g["name"] == mine:
                line += "  <- this pod"
            lines.append(line)
        if tree["omitted"]:
            lines.append(
                f"      and {tree['omitted']} more sub-groups on {tree['omitted_nodes']} nodes "
                "(the Event's 1 KiB note holds no more)"
            )
    elif tree["stuck"] is not None:
        stuck = tree["stuck"]
        lines.append(
            f"  waiting{said}: sub-group {stuck['path']} ({stuck['asks']}) cannot be placed in "
            f"{stuck['within']}: {stuck['reason']}"
        )
    else:
        lines.append(
            "  no tree decision yet (no GangPlanned or GangUnschedulable Event of the sidecar names one)"
        )
    return lines


def render_why(doc: Mapping[str, Any], *, now: float, wide: bool = False) -> str:
    lines = [f"pod {doc['pod']}: {doc['phase']}, {doc['decision']}"]
    if doc["predicted_gpus"]:
        lines.append(
            f"predicted GPUs: {doc['predicted_gpus']} on {doc['predicted_node'] or doc['node'] or '?'} "
            f"(the sidecar's {PREDICTED_REASON} Event at bind)"
        )
    if doc["constraints"]:
        lines.append("asks for: " + ", ".join(f"{k}={v}" for k, v in doc["constraints"].items()))
    if doc.get("gang_error"):
        lines.append(f"gang: unusable, the sidecar refuses this pod: {doc['gang_error']}")
    gang = doc.get("gang")
    if gang:
        quorum = "?" if gang["min_member"] is None else str(gang["min_member"])
        if gang["object"]:
            obj = f"{gang['object']} found"
        elif gang["has_object"]:
            obj = "no gang object found"
        else:
            obj = f"{gang['api']}, no gang object"
        lines.append(
            f"gang {gang['name']} (from {gang['source']}; {obj}): "
            f"{gang['bound']} of {len(gang['members'])} members bound, quorum {quorum} "
            f"({gang['quorum_from']})"
        )
        if gang["object_levels"]:
            shown = ", ".join(f"{k} {v}" for k, v in gang["object_levels"].items())
            lines.append(
                f"  its {gang['object']} asks for: {shown} (unless gputopo.io annotations set the levels)"
            )
        tree = gang.get("tree")
        if tree is not None:
            lines += _render_tree(tree, gang)
            members = [
                [
                    m["name"],
                    m.get("subgroup") or "-",
                    m["phase"],
                    m["node"] or "-",
                    m["predicted_gpus"] or "-",
                ]
                for m in gang["members"]
            ]
            header = ["MEMBER", "SUB-GROUP", "PHASE", "NODE", "PREDICTED GPUS"]
        else:
            members = [
                [m["name"], m["phase"], m["node"] or "-", m["predicted_gpus"] or "-"] for m in gang["members"]
            ]
            header = ["MEMBER", "PHASE", "NODE", "PREDICTED GPUS"]
        lines += table(header, members, indent="  ")
    if wide and doc["annotations"]:
        lines.append("annotations:")
        lines += [f"  {k}: {v}" for k, v in doc["annotations"].items()]
    events = doc["events"]
    if events:
        lines.append("events (oldest first):")
        rows = [
            [
                "-" if e["time"] is None else short_age(now - e["time"]),
                e["object"],
                e["type"],
                e["reason"] or "-",
                *([e["from"], str(e["count"])] if wide else []),
                e["message"],
            ]
            for e in events
        ]
        header = ["AGE", "OBJECT", "TYPE", "REASON", *(["FROM", "COUNT"] if wide else []), "MESSAGE"]
        lines += table(header, rows, indent="  ")
    else:
        lines.append("events: none on the pod or its gang object")
    return "\n".join(lines)
