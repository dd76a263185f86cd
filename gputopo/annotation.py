"""The Node annotation the device plugin publishes and the scheduler sidecar reads.

It is the only channel between the two daemons, so it is versioned, validated strictly on the
way in, and small: the link matrix travels as one space-separated string of `topo -m` codes per
row (a 16-GPU node stays near 3 KiB, far below the 256 KiB annotation limit). Freshness is judged
against a time the caller passes in, never a clock read here, so the core stays pure and tests
decide what "now" is. Schema: docs/annotation.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gputopo.policy import DEFAULT_POLICY, POLICY_NAMES
from gputopo.topology import Topology, TopologyError

#: Schema version written by encode(); decode() accepts exactly this one.
VERSION = 1
#: The Kubernetes limit on the total size of a Node's annotations.
ANNOTATION_LIMIT_BYTES = 256 * 1024
#: A generated-at time this far in the future is treated as corrupt (clock skew allowance).
MAX_FUTURE_SKEW_S = 300.0

_REQUIRED = ("version", "node", "generatedAt", "pluginVersion", "gpus", "links", "allocated")


class AnnotationError(ValueError):
    """The annotation is missing, stale, of another version or corrupt; the message says which."""


@dataclass(frozen=True)
class NodeTopology:
    """What a node's plugin last said: its GPUs, their links and health, and which are in use."""

    node: str
    topology: Topology
    unhealthy: frozenset[int]
    allocated: frozenset[int]
    generated_at: float
    plugin_version: str
    policy: str = DEFAULT_POLICY  # the in-node GPU policy the plugin runs (gputopo.policy)

    @property
    def healthy(self) -> frozenset[int]:
        return frozenset(range(self.topology.n)) - self.unhealthy

    @property
    def free(self) -> frozenset[int]:
        """Healthy GPUs not in use, as the plugin saw them at `generated_at`."""
        return self.healthy - self.allocated


def encode(value: NodeTopology) -> str:
    """The compact JSON text to store under the annotation key."""
    topo = value.topology
    n = topo.n
    for idx in value.unhealthy | value.allocated:
        if not 0 <= idx < n:
            raise AnnotationError(f"GPU index {idx} out of range for {n} GPUs")
    doc = {
        "version": VERSION,
        "node": value.node,
        "generatedAt": value.generated_at,
        "pluginVersion": value.plugin_version,
        "name": topo.name,
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "model": g.model,
                "numa": g.numa,
                "healthy": g.index not in value.unhealthy,
            }
            for g in topo.gpus
        ],
        "links": [" ".join(topo.code(i, j) for j in range(n)) for i in range(n)],
        "nvswitch": topo.nvswitch,
        "nvlinkGbpsPerLink": topo.settings.nvlink_gbps_per_link,
        "pcieGbps": dict(topo.settings.pcie_gbps),
        "allocated": sorted(value.allocated),
    }
    if value.policy != DEFAULT_POLICY:  # optional: absent means gputopo (docs/annotation.md)
        doc["policy"] = value.policy
    return json.dumps(doc, separators=(",", ":"), sort_keys=False)


def decode(text: str | None, *, now: float, max_age_s: float) -> NodeTopology:
    """Parse and validate an annotation read at time `now`; older than `max_age_s` is stale."""
    if text is None or text == "":
        raise AnnotationError("annotation missing")
    if len(text) > ANNOTATION_LIMIT_BYTES:
        raise AnnotationError(f"annotation too large ({len(text)} bytes)")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise AnnotationError(f"annotation is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise AnnotationError("annotation must be a JSON object")
    missing = [k for k in _REQUIRED if k not in doc]
    if missing:
        raise AnnotationError(f"annotation lacks {', '.join(missing)}")
    version = doc["version"]
    if version != VERSION or isinstance(version, bool):
        raise AnnotationError(f"annotation version {version!r} not supported (want {VERSION})")
    node = _str(doc, "node")
    plugin_version = _str(doc, "pluginVersion", allow_empty=True)
    generated = doc["generatedAt"]
    if not isinstance(generated, (int, float)) or isinstance(generated, bool) or not math.isfinite(generated):
        raise AnnotationError("generatedAt must be a number of seconds since the epoch")
    if generated > now + MAX_FUTURE_SKEW_S:
        raise AnnotationError(f"generatedAt is {generated - now:.0f}s in the future")
    age = now - generated
    if age > max_age_s:
        raise AnnotationError(f"annotation stale: {age:.0f}s old (limit {max_age_s:.0f}s)")
    gpus_raw = doc["gpus"]
    if not isinstance(gpus_raw, list) or not gpus_raw:
        raise AnnotationError("gpus must be a non-empty list")
    links_raw = doc["links"]
    if not isinstance(links_raw, list) or not all(isinstance(r, str) for r in links_raw):
        raise AnnotationError("links must be a list of strings")
    unhealthy: set[int] = set()
    for k, g in enumerate(gpus_raw):
        if not isinstance(g, dict):
            raise AnnotationError(f"gpus[{k}] must be an object")
        healthy = g.get("healthy", True)
        if not isinstance(healthy, bool):
            raise AnnotationError(f"gpus[{k}].healthy must be true or false")
        if not healthy:
            unhealthy.add(g.get("index", k) if isinstance(g.get("index", k), int) else k)
    try:
        topology = Topology.from_dict(
            {
                "name": doc.get("name") or node,
                "gpus": gpus_raw,
                "links": [row.split() for row in links_raw],
                "nvswitch": doc.get("nvswitch", False),
                "nvlink_gbps_per_link": doc.get("nvlinkGbpsPerLink", 25.0),
                "pcie_gbps": doc.get("pcieGbps") or {},
            }
        )
    except (TopologyError, ValueError, TypeError) as e:
        raise AnnotationError(f"topology: {e}") from None
    allocated = _indices(doc["allocated"], topology, "allocated")
    policy = doc.get("policy", DEFAULT_POLICY)
    if not isinstance(policy, str) or policy not in POLICY_NAMES:
        raise AnnotationError(f"policy {str(policy)[:64]!r} unknown (known: {', '.join(POLICY_NAMES)})")
    return NodeTopology(
        node=node,
        topology=topology,
        unhealthy=frozenset(unhealthy),
        allocated=allocated,
        generated_at=float(generated),
        plugin_version=plugin_version,
        policy=policy,
    )


def indices_of(topology: Topology, ids: Iterable[str | int]) -> frozenset[int]:
    """GPU indices of a mix of indices and UUIDs (what kubelet reports are UUIDs)."""
    return _indices(list(ids), topology, "ids")


def _indices(raw: Any, topology: Topology, where: str) -> frozenset[int]:
    if not isinstance(raw, list):
        raise AnnotationError(f"{where} must be a list")
    out: set[int] = set()
    by_uuid: Mapping[str, int] = topology.index_by_uuid
    for item in raw:
        if isinstance(item, int) and not isinstance(item, bool):
            if not 0 <= item < topology.n:
                raise AnnotationError(f"{where}: GPU index {item} out of range for {topology.n} GPUs")
            out.add(item)
        elif isinstance(item, str) and item in by_uuid:
            out.add(by_uuid[item])
        else:
            raise AnnotationError(f"{where}: unknown GPU {item!r}")
    return frozenset(out)


def _str(doc: Mapping[str, Any], key: str, *, allow_empty: bool = False) -> str:
    value = doc[key]
    if not isinstance(value, str) or (not value and not allow_empty):
        raise AnnotationError(f"{key} must be a {'' if allow_empty else 'non-empty '}string")
    return value


def make(
    node: str,
    topology: Topology,
    *,
    generated_at: float,
    plugin_version: str,
    unhealthy: Iterable[int] = (),
    allocated: Iterable[int] = (),
    policy: str = DEFAULT_POLICY,
) -> NodeTopology:
    """Convenience constructor with plain iterables (the publisher's and tests' entry point)."""
    return NodeTopology(
        node=node,
        topology=topology,
        unhealthy=frozenset(unhealthy),
        allocated=frozenset(allocated),
        generated_at=generated_at,
        plugin_version=plugin_version,
        policy=policy,
    )


__all__ = [
    "ANNOTATION_LIMIT_BYTES",
    "VERSION",
    "AnnotationError",
    "NodeTopology",
    "decode",
    "encode",
    "indices_of",
    "make",
]
