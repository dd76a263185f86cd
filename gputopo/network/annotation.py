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
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from itertools import chain, repeat
from typing import Any

import orjson

from gputopo.node.links import MAX_GBPS, PCIE_LEVELS
from gputopo.node.policy import DEFAULT_POLICY, POLICY_NAMES
from gputopo.node.topology import GPU, Topology, TopologyError, gpu

#: Schema version written by encode(); decode() accepts exactly this one. Optional keys (`pods`)
#: are added within a version: readers ignore keys they do not know (docs/annotation.md).
VERSION = 1
#: The Kubernetes limit on the total size of a Node's annotations.
ANNOTATION_LIMIT_BYTES = 256 * 1024
#: A generated-at time this far in the future is treated as corrupt (clock skew allowance).
MAX_FUTURE_SKEW_S = 300.0
#: Bounds of the schema: every number and length an annotation carries is checked against one,
#: because the annotation comes from another machine and the sidecar reads it for the cluster.
MAX_GPUS = 64  # GPUs one annotation may describe (the sidecar's allocator handles 16)
MAX_TIME_S = 1e11  # generatedAt: seconds since the epoch, year ~5100 at most
MAX_NAME_CHARS = 253  # a DNS subdomain: node and topology names
MAX_TEXT_CHARS = 256  # uuid, model, pci_bus_id, pluginVersion
MAX_NUMA = 1023
MAX_PODS = 4 * MAX_GPUS  # entries of the pod -> GPUs map
MAX_POD_KEY_CHARS = 63 + 1 + 253  # "namespace/name"

_REQUIRED = ("version", "node", "generatedAt", "pluginVersion", "gpus", "links", "allocated")
_REQUIRED_KEYS = frozenset(_REQUIRED)


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
    policy: str = DEFAULT_POLICY  # the in-node GPU policy the plugin runs (gputopo.node.policy)
    #: pod "namespace/name" -> GPU indices kubelet assigned it (None: the plugin sent no map)
    pods: Mapping[str, frozenset[int]] | None = None

    @property
    def healthy(self) -> frozenset[int]:
        return frozenset(range(self.topology.n)) - self.unhealthy

    @property
    def free(self) -> frozenset[int]:
        """Healthy GPUs not in use, as the plugin saw them at `generated_at`."""
        return self.healthy - self.allocated


class Shapes:
    """Topologies decoded before, by everything an annotation says of them but the GPUs: its
    name, link rows, NVSwitch flag and bandwidth figures. A cluster has thousands of servers of
    a handful of models, whose annotations differ by GPU UUIDs (and in-use sets); with this a
    decode of another server of a known model checks its GPUs and shares the model's links,
    their validation and its bandwidth matrix (`Topology.with_gpus`) instead of parsing the
    matrix again (at 60,000 nodes ~10x the whole decode's time). Owned by its caller (the
    sidecar's store); bounded, cleared whole when full."""

    def __init__(self, limit: int = 4096) -> None:
        self._by_key: dict[Hashable, Topology] = {}
        self._limit = max(1, limit)

    def get(self, key: Hashable) -> Topology | None:
        return self._by_key.get(key)

    def put(self, key: Hashable, topology: Topology) -> None:
        if len(self._by_key) >= self._limit:
            self._by_key.clear()
        self._by_key[key] = topology

    def __len__(self) -> int:
        return len(self._by_key)


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
    if value.pods is not None:
        doc["pods"] = {k: sorted(v) for k, v in sorted(value.pods.items())}
    return json.dumps(doc, separators=(",", ":"), sort_keys=False)


def decode(
    text: str | bytes | None, *, now: float, max_age_s: float, shapes: Shapes | None = None
) -> NodeTopology:
    """Parse and validate an annotation read at time `now`; older than `max_age_s` is stale.
    With `shapes`, a topology whose model was decoded before shares that model's links
    (`Shapes`); the result is equal either way.

    Total: any input gives a NodeTopology whose every number is in range, or AnnotationError
    with the reason (property-tested with random mutations in tests/test_annotation_fuzz.py)."""
    if text is None or len(text) == 0:
        raise AnnotationError("annotation missing")
    if len(text) > ANNOTATION_LIMIT_BYTES:
        raise AnnotationError(f"annotation too large ({len(text)} bytes)")
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise AnnotationError(f"annotation is not UTF-8: {e.reason} at byte {e.start}") from None
    if not isinstance(text, str):
        raise AnnotationError("annotation must be text")
    try:  # orjson: ~4x faster; what it refuses (NaN, huge ints, lone surrogates) json reads as before
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError) as e:  # ValueError covers ints of > 4,300 digits
            raise AnnotationError(f"annotation is not JSON: {str(e)[:200]}") from None
    if not isinstance(doc, dict):
        raise AnnotationError("annotation must be a JSON object")
    if not doc.keys() >= _REQUIRED_KEYS:
        missing = [k for k in _REQUIRED if k not in doc]
        raise AnnotationError(f"annotation lacks {', '.join(missing)}")
    version = doc["version"]
    if version != VERSION or isinstance(version, bool):
        raise AnnotationError(f"annotation version {_short(version)} not supported (want {VERSION})")
    node = _str(doc, "node", limit=MAX_NAME_CHARS)
    plugin_version = _str(doc, "pluginVersion", allow_empty=True)
    generated = doc["generatedAt"]
    if type(generated) is not float or not 0.0 <= generated <= MAX_TIME_S:  # NaN fails the range too
        generated = _number(generated, "generatedAt", 0.0, MAX_TIME_S)
    if generated > now + MAX_FUTURE_SKEW_S:
        raise AnnotationError(f"generatedAt is {generated - now:.0f}s in the future")
    age = now - generated
    if age > max_age_s:
        raise AnnotationError(f"annotation stale: {age:.0f}s old (limit {max_age_s:.0f}s)")
    gpus_raw = doc["gpus"]
    if not isinstance(gpus_raw, list) or not gpus_raw:
        raise AnnotationError("gpus must be a non-empty list")
    if len(gpus_raw) > MAX_GPUS:
        raise AnnotationError(f"gpus lists {len(gpus_raw)} GPUs, more than {MAX_GPUS}")
    n = len(gpus_raw)
    links_raw = doc["links"]
    if not isinstance(links_raw, list) or not all(map(isinstance, links_raw, repeat(str))):
        raise AnnotationError("links must be a list of strings")
    if len(links_raw) != n:
        raise AnnotationError(f"links has {len(links_raw)} rows for {n} GPUs")
    if max(map(len, links_raw)) > 17 * n:  # n codes of at most 16 characters and their separators
        i, row = next((i, row) for i, row in enumerate(links_raw) if len(row) > 17 * n)
        raise AnnotationError(f"links[{i}] is {len(row)} characters long for {n} GPUs")
    name = doc.get("name") or node
    if not isinstance(name, str) or len(name) > MAX_NAME_CHARS:
        raise AnnotationError(f"name must be a string of at most {MAX_NAME_CHARS} characters")
    nvlink = doc.get("nvlinkGbpsPerLink", 25.0)
    if type(nvlink) is not float or not 0.0 < nvlink <= MAX_GBPS:
        nvlink = _number(nvlink, "nvlinkGbpsPerLink", 0.0, MAX_GBPS)
    pcie = doc.get("pcieGbps") or {}
    if not isinstance(pcie, dict) or len(pcie) > 2 * len(PCIE_LEVELS) or max(map(len, pcie), default=0) > 8:
        raise AnnotationError("pcieGbps must be an object of PCIe level -> GB/s")
    pcie_gbps = {
        k: float(v)
        if type(v) is float and 0.0 < v <= MAX_GBPS
        else _number(v, f"pcieGbps[{_short(k)}]", 0.0, MAX_GBPS)
        for k, v in pcie.items()
    }  # the plugin's plain floats checked inline; anything else (and its message) by `_number`
    nvswitch = doc.get("nvswitch", False)
    shape = None
    if shapes is not None and isinstance(nvswitch, bool):
        shape = (name, tuple(links_raw), nvswitch, nvlink, tuple(pcie_gbps.items()))
    known = shapes.get(shape) if shapes is not None and shape is not None else None
    fast = _known_shape(known, gpus_raw) if known is not None else None
    if fast is not None:
        topology, unhealthy = fast
    else:
        unhealthy = set()
        for k, g in enumerate(gpus_raw):
            _check_gpu(g, k)
            if not g.get("healthy", True):
                unhealthy.add(g.get("index", k))
        try:
            topology = Topology.from_dict(
                {
                    "name": name,
                    "gpus": gpus_raw,
                    "links": [row.split() for row in links_raw],
                    "nvswitch": nvswitch,
                    "nvlink_gbps_per_link": nvlink,
                    "pcie_gbps": pcie_gbps,
                }
            )
        except (TopologyError, ValueError, TypeError, OverflowError) as e:
            raise AnnotationError(f"topology: {str(e)[:300]}") from None
        if shapes is not None and shape is not None and known is None:
            shapes.put(shape, topology)
    allocated = _indices(doc["allocated"], topology, "allocated")
    policy = doc.get("policy", DEFAULT_POLICY)
    if not isinstance(policy, str) or policy not in POLICY_NAMES:
        raise AnnotationError(f"policy {str(policy)[:64]!r} unknown (known: {', '.join(POLICY_NAMES)})")
    pods = _pods(doc.get("pods"), topology, allocated)
    out = object.__new__(NodeTopology)  # its fields as its __init__ sets them, ~3x faster
    out.__dict__.update(
        node=node,
        topology=topology,
        unhealthy=frozenset(unhealthy),
        allocated=allocated,
        generated_at=generated,
        plugin_version=plugin_version,
        policy=policy,
        pods=pods,
    )
    return out


#: A GPU entry as `encode` writes it: these keys in this order, their values of these types.
_PLAIN_KEYS = ("index", "uuid", "model", "numa", "healthy")
_PLAIN_TYPES = (int, str, str, int, bool)


def _plain(n: int) -> tuple[list[str], list[type]]:
    """The keys and the value types of `n` plain GPU entries, in order (cached)."""
    got = _PLAIN_BY_N.get(n)
    if got is None:
        got = _PLAIN_BY_N[n] = (list(_PLAIN_KEYS) * n, list(_PLAIN_TYPES) * n)
    return got


_PLAIN_BY_N: dict[int, tuple[list[str], list[type]]] = {}


def _known_shape(known: Topology, raw: list[Any]) -> tuple[Topology, set[int]] | None:
    """The topology of a server of `known`'s model with the GPUs `raw` lists, and its unhealthy
    GPUs, when every GPU entry is of the plain form the plugin writes (index in order, a UUID,
    strings and numbers in range; what `_check_gpu` and `Topology.from_dict` accept and read
    the same way) and the UUIDs are unique. None for anything else: the full path then decodes
    it, with its reasons.

    Entries exactly as `encode` writes them (its keys in its order, values of its types, a NUMA
    node given) are checked all together: their keys, then their values' types, as one list
    each, then each field's values as a slice of the values (a dozen C-level passes instead of
    ~15 Python steps per GPU), and their GPU objects are left to be made when first read
    (`Topology.with_gpu_columns`): the two were most of a decode. Any other form is read a GPU
    at a time (`_known_shape_each`)."""
    n = len(raw)
    if n != known.n:
        return None
    keys, types = _plain(n)
    if set(map(type, raw)) != {dict} or list(chain.from_iterable(raw)) != keys:
        return _known_shape_each(known, raw)
    values = list(chain.from_iterable(map(dict.values, raw)))
    if list(map(type, values)) != types:  # exact types: no bool for an int, no float for a NUMA node
        return _known_shape_each(known, raw)
    uuids, models, numas = values[1::5], values[2::5], values[3::5]
    if (
        values[0::5] != list(range(n))
        or min(map(len, uuids)) == 0
        or max(map(len, uuids)) > MAX_TEXT_CHARS
        or len(set(uuids)) != n
        or max(map(len, models)) > MAX_TEXT_CHARS
        or min(numas) < -1
        or max(numas) > MAX_NUMA
    ):
        return None
    if min(numas) < 0:  # -1: no NUMA node, as `Topology.from_dict` reads it
        numas = [None if v < 0 else v for v in numas]
    healthy = values[4::5]
    unhealthy = {k for k in range(n) if not healthy[k]} if False in healthy else set()
    return known.with_gpu_columns(uuids, models, numas), unhealthy


def _known_shape_each(known: Topology, raw: list[Any]) -> tuple[Topology, set[int]] | None:
    """`_known_shape`, a GPU entry at a time (entries of another form than `encode`'s)."""
    n = len(raw)
    gpus: list[GPU] = []
    unhealthy: set[int] = set()
    for k, g in enumerate(raw):
        if type(g) is not dict:
            return None
        get = g.get
        index, uuid, numa = get("index", k), get("uuid"), get("numa")
        model, bus, healthy = get("model", ""), get("pci_bus_id", ""), get("healthy", True)
        if (
            type(index) is not int
            or index != k
            or type(uuid) is not str
            or not 0 < len(uuid) <= MAX_TEXT_CHARS
            or type(model) is not str
            or len(model) > MAX_TEXT_CHARS
            or type(bus) is not str
            or len(bus) > MAX_TEXT_CHARS
            or type(healthy) is not bool
            or not (numa is None or (type(numa) is int and -1 <= numa <= MAX_NUMA))
        ):
            return None
        gpus.append(gpu(k, uuid, model, bus, numa if numa is None or numa >= 0 else None))
        if not healthy:
            unhealthy.add(k)
    if len({g.uuid for g in gpus}) != n:  # what `Topology.with_gpus` checks beside the above
        return None
    return known.sharing_links(tuple(gpus)), unhealthy


def _short(value: Any) -> str:
    """A value for an error message, cut short (the value may be 256 KiB of garbage)."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**18 else "<a huge integer>"
    return text if len(text) <= 40 else text[:37] + "..."


def _number(value: Any, where: str, low: float, high: float) -> float:
    """A finite JSON number in (low, high] (low itself allowed when it is 0 and `where` is a time)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AnnotationError(f"{where} must be a number, got {_short(value)}")
    # compare before converting: float(10**400) raises OverflowError, and NaN compares false
    if isinstance(value, float) and not math.isfinite(value):
        raise AnnotationError(f"{where} must be finite, got {value!r}")
    in_range = (low <= value <= high) if where == "generatedAt" else (low < value <= high)
    if not in_range:
        bracket = "[" if where == "generatedAt" else "("
        raise AnnotationError(f"{where} must be in {bracket}{low:g}, {high:g}], got {_short(value)}")
    return float(value)


def _check_gpu(g: Any, k: int) -> None:
    """Types and sizes of one `gpus` entry (Topology checks indices and uniqueness)."""
    if not isinstance(g, dict):
        raise AnnotationError(f"gpus[{k}] must be an object")
    index = g.get("index", k)
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < MAX_GPUS:
        raise AnnotationError(f"gpus[{k}].index must be an integer 0..{MAX_GPUS - 1}")
    for key in ("uuid", "model", "pci_bus_id"):
        value = g.get(key)
        if value is not None and (not isinstance(value, str) or len(value) > MAX_TEXT_CHARS):
            raise AnnotationError(f"gpus[{k}].{key} must be a string of at most {MAX_TEXT_CHARS} characters")
    numa = g.get("numa")
    if numa is not None and (
        isinstance(numa, bool) or not isinstance(numa, int) or not -1 <= numa <= MAX_NUMA
    ):
        raise AnnotationError(f"gpus[{k}].numa must be null or an integer -1..{MAX_NUMA}")
    if not isinstance(g.get("healthy", True), bool):
        raise AnnotationError(f"gpus[{k}].healthy must be true or false")


def _pods(raw: Any, topology: Topology, allocated: frozenset[int]) -> Mapping[str, frozenset[int]] | None:
    """The optional pod -> GPUs map; every GPU named must be one `allocated` lists."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or len(raw) > MAX_PODS:
        raise AnnotationError(f"pods must be an object of at most {MAX_PODS} pods")
    out: dict[str, frozenset[int]] = {}
    for key, ids in raw.items():
        if not 0 < len(key) <= MAX_POD_KEY_CHARS or key.count("/") != 1:
            raise AnnotationError(f"pods: key {_short(key)} is not namespace/name")
        if not isinstance(ids, list) or len(ids) > topology.n:
            raise AnnotationError(f"pods[{_short(key)}] must be a list of at most {topology.n} GPUs")
        gpus = _indices(ids, topology, f"pods[{_short(key)}]")
        if not gpus <= allocated:
            raise AnnotationError(
                f"pods[{_short(key)}] names GPUs {sorted(gpus - allocated)} not in allocated"
            )
        out[key] = gpus
    return out


def indices_of(topology: Topology, ids: Iterable[str | int]) -> frozenset[int]:
    """GPU indices of a mix of indices and UUIDs (what kubelet reports are UUIDs)."""
    return _indices(list(ids), topology, "ids")


def _indices(raw: Any, topology: Topology, where: str) -> frozenset[int]:
    if not isinstance(raw, list):
        raise AnnotationError(f"{where} must be a list")
    if len(raw) > 4 * MAX_GPUS:
        raise AnnotationError(f"{where} lists {len(raw)} GPUs, more than {4 * MAX_GPUS}")
    out: set[int] = set()
    n = topology.n
    for item in raw:
        if type(item) is int or (isinstance(item, int) and not isinstance(item, bool)):
            if not 0 <= item < n:
                raise AnnotationError(f"{where}: GPU index {item} out of range for {n} GPUs")
            out.add(item)
        elif isinstance(item, str) and item in topology.index_by_uuid:  # made on first use
            out.add(topology.index_by_uuid[item])
        else:
            raise AnnotationError(f"{where}: unknown GPU {_short(item)}")
    return frozenset(out)


def _str(doc: Mapping[str, Any], key: str, *, allow_empty: bool = False, limit: int = MAX_TEXT_CHARS) -> str:
    value = doc[key]
    if not isinstance(value, str) or (not value and not allow_empty) or len(value) > limit:
        raise AnnotationError(
            f"{key} must be a {'' if allow_empty else 'non-empty '}string of at most {limit} characters"
        )
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
    pods: Mapping[str, Iterable[int]] | None = None,
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
        pods=None if pods is None else {k: frozenset(v) for k, v in pods.items()},
    )


__all__ = [
    "ANNOTATION_LIMIT_BYTES",
    "VERSION",
    "AnnotationError",
    "NodeTopology",
    "Shapes",
    "decode",
    "encode",
    "indices_of",
    "make",
]
