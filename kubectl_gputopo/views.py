"""What `kubectl gputopo` shows, as pure functions of API JSON and a time "now".

Every node's annotation is untrusted: one that does not decode costs its own row (its status
column says why), never the listing. Rings come from the core allocator on the decoded
topology, the same numbers the plugin and the sidecar decide on.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from gputopo.network import annotation
from gputopo.node.allocator import AllocatorPool
from gputopo.numerals import ascii_uint
from gputopo.output import ago, short_age, table

TOPOLOGY_ANNOTATION = "gputopo.io/topology"
#: The GPU indices the sidecar predicts for a bound pod (written at bind).
PREDICTED_ANNOTATION = "gputopo.io/predicted-gpus"
#: Request sizes `nodes` shows the best ring for.
RING_SIZES = (2, 4, 8)
#: The sidecar's default limit (scheduler/defaults.py ANNOTATION_MAX_AGE_S): older is "stale".
DEFAULT_MAX_AGE_S = 900.0

# Gang membership, in the sidecar's precedence order (docs/gang.md).
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
LIGHT_GROUP_LABEL = "pod-group.scheduling.sigs.k8s.io/name"
LIGHT_MIN_LABEL = "pod-group.scheduling.sigs.k8s.io/min-available"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
#: Pod annotations that ask for a network level (gputopo's own, Kueue's, KAI Scheduler's).
CONSTRAINT_ANNOTATIONS = (
    "gputopo.io/required-topology",
    "gputopo.io/preferred-topology",
    "kueue.x-k8s.io/podset-required-topology",
    "kueue.x-k8s.io/podset-preferred-topology",
    "kai.scheduler/topology-required-placement",
    "kai.scheduler/topology-preferred-placement",
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


def node_row(
    node: Mapping[str, Any], *, now: float, max_age_s: float, pool: AllocatorPool, resource: str
) -> dict[str, Any] | None:
    """One GPU node's summary, or None for a node with neither a gputopo annotation nor GPUs."""
    meta = _meta(node)
    name = _str(meta.get("name")) or "?"
    text = _map(meta.get("annotations")).get(TOPOLOGY_ANNOTATION)
    capacity = _capacity(node, resource)
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
    }
    if not isinstance(text, str) or not text:
        if not capacity:
            return None
        row["status"] = "no annotation (is the gputopo plugin running there?)"
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


def render_nodes(rows: list[dict[str, Any]], *, wide: bool = False) -> str:
    if not rows:
        return "No GPU nodes found (no node has a gputopo.io/topology annotation or GPUs)."
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
    return "\n".join(lines)


# ---------------------------------------------------------------------------- why


def gang_of(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """The pod's gang, as the sidecar reads it: the API it names, the group and, where the pod
    says so, the quorum. None for a pod on its own."""
    meta = _meta(pod)
    labels = _map(meta.get("labels"))
    annotations = _map(meta.get("annotations"))
    spec = _map(pod.get("spec"))
    if name := _str(labels.get(POD_GROUP_LABEL)):
        return {"source": f"label {POD_GROUP_LABEL}", "api": "scheduling.x-k8s.io", "name": name}
    if name := _str(labels.get(LIGHT_GROUP_LABEL)):
        quorum = ascii_uint(_str(labels.get(LIGHT_MIN_LABEL)))
        return {"source": f"label {LIGHT_GROUP_LABEL}", "api": None, "name": name, "min_member": quorum}
    if name := _str(_map(spec.get("schedulingGroup")).get("podGroupName")):
        return {"source": "spec.schedulingGroup.podGroupName", "api": "workload-podgroup", "name": name}
    ref = _map(spec.get("workloadRef"))
    if name := _str(ref.get("name")):
        group = _str(ref.get("podGroup"))
        return {"source": "spec.workloadRef", "api": "workload", "name": name, "pod_group": group}
    if name := _str(annotations.get(VOLCANO_GROUP_ANNOTATION)):
        return {"source": f"annotation {VOLCANO_GROUP_ANNOTATION}", "api": "volcano", "name": name}
    return None


def same_gang(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    if a is None or b is None:
        return False
    return (a["source"], a["name"], a.get("pod_group")) == (b["source"], b["name"], b.get("pod_group"))


def _count(value: Any) -> int | None:
    """A quorum as the API carries it: a positive integer (not a bool, not a string)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def min_member(gang: Mapping[str, Any], obj: Mapping[str, Any] | None) -> int | None:
    """The gang's quorum from its object (PodGroup minMember, Workload API gang.minCount)."""
    if gang.get("min_member") is not None:
        return _count(gang["min_member"])
    if obj is None:
        return None
    spec = _map(obj.get("spec"))
    if (count := _count(spec.get("minMember"))) is not None:
        return count
    if (count := _count(_map(_map(spec.get("schedulingPolicy")).get("gang")).get("minCount"))) is not None:
        return count
    groups = spec.get("podGroups")
    for group in groups if isinstance(groups, list) else []:
        if isinstance(group, Mapping) and group.get("name") == gang.get("pod_group"):
            return _count(_map(_map(group.get("policy")).get("gang")).get("minCount"))
    return None


def parse_time(text: Any) -> float | None:
    """RFC 3339 as the API server writes it, to Unix seconds; None for anything else."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def event_row(event: Mapping[str, Any]) -> dict[str, Any]:
    involved = _map(event.get("involvedObject"))
    source = _map(event.get("source"))
    when = (
        parse_time(event.get("lastTimestamp"))
        or parse_time(event.get("eventTime"))
        or parse_time(event.get("firstTimestamp"))
        or parse_time(_meta(event).get("creationTimestamp"))
    )
    count = event.get("count")
    return {
        "time": when,
        "object": f"{_str(involved.get('kind')).lower() or '?'}/{_str(involved.get('name'))}",
        "type": _str(event.get("type")) or "Normal",
        "reason": _str(event.get("reason")),
        "message": " ".join(_str(event.get("message")).split()),
        "from": _str(event.get("reportingComponent")) or _str(source.get("component")) or "-",
        "count": count if isinstance(count, int) else 1,
    }


def predicted(pod: Mapping[str, Any]) -> str | None:
    """The predicted-GPUs annotation as written (a JSON list or comma-separated indices/UUIDs)."""
    raw = _map(_meta(pod).get("annotations")).get(PREDICTED_ANNOTATION)
    if not isinstance(raw, str) or not raw.strip():
        return None
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return " ".join(raw.split())
    if isinstance(doc, list):
        return ",".join(str(x) for x in doc)
    if isinstance(doc, Mapping) and isinstance(doc.get("gpus"), list):
        return ",".join(str(x) for x in doc["gpus"])
    return " ".join(raw.split())


def member_row(pod: Mapping[str, Any]) -> dict[str, Any]:
    meta = _meta(pod)
    return {
        "name": _str(meta.get("name")),
        "phase": _str(_map(pod.get("status")).get("phase")) or "Pending",
        "node": _str(_map(pod.get("spec")).get("nodeName")) or None,
        "predicted_gpus": predicted(pod),
    }


def why_document(
    pod: Mapping[str, Any],
    *,
    gang: dict[str, Any] | None,
    gang_object: Mapping[str, Any] | None,
    members: Sequence[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """The decision for a pod (and its gang), with every Event on the pod and its gang object."""
    meta = _meta(pod)
    me = member_row(pod)
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
        "constraints": {
            k: v
            for k, v in _map(meta.get("annotations")).items()
            if k in CONSTRAINT_ANNOTATIONS and isinstance(v, str)
        },
        "annotations": gputopo_annotations,
        "gang": None,
        "events": rows,
    }
    if gang is not None:
        quorum = min_member(gang, gang_object)
        member_rows = sorted((member_row(m) for m in members), key=lambda m: m["name"])
        doc["gang"] = {
            "name": f"{_str(meta.get('namespace'))}/{gang['name']}",
            "source": gang["source"],
            "object": None if gang_object is None else _str(gang_object.get("kind")) or "PodGroup",
            "min_member": quorum,
            "members": member_rows,
            "bound": sum(1 for m in member_rows if m["node"]),
        }
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


def render_why(doc: Mapping[str, Any], *, now: float, wide: bool = False) -> str:
    lines = [f"pod {doc['pod']}: {doc['phase']}, {doc['decision']}"]
    if doc["predicted_gpus"]:
        lines.append(
            f"predicted GPUs: {doc['predicted_gpus']} on {doc['node'] or '?'} ({PREDICTED_ANNOTATION})"
        )
    if doc["constraints"]:
        lines.append("asks for: " + ", ".join(f"{k}={v}" for k, v in doc["constraints"].items()))
    gang = doc.get("gang")
    if gang:
        quorum = "?" if gang["min_member"] is None else str(gang["min_member"])
        obj = f"{gang['object']} found" if gang["object"] else "no gang object found"
        lines.append(
            f"gang {gang['name']} (from {gang['source']}; {obj}): "
            f"{gang['bound']} of {len(gang['members'])} members bound, quorum {quorum}"
        )
        members = [
            [m["name"], m["phase"], m["node"] or "-", m["predicted_gpus"] or "-"] for m in gang["members"]
        ]
        lines += table(["MEMBER", "PHASE", "NODE", "PREDICTED GPUS"], members, indent="  ")
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
