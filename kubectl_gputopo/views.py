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

from gputopo.gang import sources as gangsources
from gputopo.gang.sources import LEVEL_ANNOTATIONS, Named
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
    gang: Named | None,
    gang_object: Mapping[str, Any] | None,
    members: Sequence[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]],
    gang_error: str | None = None,
) -> dict[str, Any]:
    """The decision for a pod (and its gang), with every Event on the pod and its gang object.
    `gang_error`: why the pod's gang fields are unusable (the sidecar refuses the pod)."""
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
        "gang_error": gang_error,
        "events": rows,
    }
    if gang is not None:
        namespace = _str(meta.get("namespace"))
        member_rows = sorted((member_row(m) for m in members), key=lambda m: m["name"])
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
    """The levels the gang's group object sets (a Kubernetes PodGroup's topologyKey, a KAI
    PodGroup's topologyConstraint): the sidecar uses them unless gputopo's annotations set some."""
    group = gangsources.object_group(gang, namespace, obj)
    if group is None or not (group.required_level or group.preferred_level):
        return None
    levels = {"required": group.required_level, "preferred": group.preferred_level}
    return {k: v for k, v in levels.items() if v}


def render_why(doc: Mapping[str, Any], *, now: float, wide: bool = False) -> str:
    lines = [f"pod {doc['pod']}: {doc['phase']}, {doc['decision']}"]
    if doc["predicted_gpus"]:
        lines.append(
            f"predicted GPUs: {doc['predicted_gpus']} on {doc['node'] or '?'} ({PREDICTED_ANNOTATION})"
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
