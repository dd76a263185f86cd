"""Network levels (design.md §5): which nodes share a network domain, at every level at once.

A level is a node-label key; its domains are the label's values. Levels are ordered smallest
domain first, so "the smallest level whose one domain holds a gang" is a walk up the list.
A node without a level's label is a domain of its own at that level: an unlabelled node is
assumed to share nothing with anybody, which is the safe reading for collective traffic.

The gang planner asks the same question (how much room does each domain have?) thousands of
times per plan, so the grouping is done once per set of node labels in a `NetworkIndex`:
per level, one integer domain id per node, in arrays that numpy can sum per domain in one
call. Node positions and domain ids are both in name order, so "name order" tie-breaks are
plain integer comparisons.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

HOSTNAME = "kubernetes.io/hostname"
ACCELERATOR = "network.topology.nvidia.com/accelerator"
LEAF = "network.topology.nvidia.com/leaf"
SPINE = "network.topology.nvidia.com/spine"
CORE = "network.topology.nvidia.com/core"
ZONE = "topology.kubernetes.io/zone"

#: Smallest domain first: one node, its NVLink domain, leaf switch, spine, core, zone.
DEFAULT_LEVELS: tuple[str, ...] = (HOSTNAME, ACCELERATOR, LEAF, SPINE, CORE, ZONE)

# NVIDIA Topograph >= 1.0 (pkg/topology/topology.go): an accelerator domain with an optional
# sub-domain nested in it, and a fabric of any depth, tier 0 being the switch nearest the node.
XCLR_SUB_DOMAIN = "accelerator.topograph.run/sub-domain"
XCLR_DOMAIN = "accelerator.topograph.run/domain"
FABRIC_TIER_PREFIX = "fabric.topograph.run/tier-"
FABRIC_TIERS = 8  # tiers recognised by default (Kueue allows 8 levels, fabrics have 2-4)
#: NVIDIA GPU operator's NVLink partition label (`<ClusterUUID>.<CliqueID>`), written on
#: Multi-Node NVLink systems; Topograph's DRA provider reads it as the accelerator domain.
GPU_CLIQUE = "nvidia.com/gpu.clique"

#: Every level family the sidecar recognises by default, smallest domain first and the newest
#: family first within each kind of domain: Topograph >= 1.0, then its releases before 1.0
#: (design.md §5). A node carries one family, so the other family's levels are one-node domains
#: to it and change nothing. The clique comes after both accelerator labels: it decides only
#: for nodes that have neither, as the NVLink domain.
RECOGNISED_LEVELS: tuple[str, ...] = (
    HOSTNAME,
    XCLR_SUB_DOMAIN,
    XCLR_DOMAIN,
    ACCELERATOR,
    GPU_CLIQUE,
    *(f"{FABRIC_TIER_PREFIX}{n}" for n in range(FABRIC_TIERS)),
    LEAF,
    SPINE,
    CORE,
    ZONE,
)

#: Pseudo-level (and its single domain) for "the whole cluster": the last resort of a preferred
#: constraint. `*` can never be a label key, so it cannot collide with a configured level.
CLUSTER = "*"

# Kubernetes label keys: optional DNS-subdomain prefix (<= 253) + "/" + name (<= 63).
_NAME_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_PREFIX_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class LevelError(ValueError):
    """A network level list that cannot be used; the message names the offending entry."""


def is_label_key(key: object) -> bool:
    """Whether `key` is a syntactically valid Kubernetes label key."""
    if not isinstance(key, str) or not key:
        return False
    prefix, slash, name = key.rpartition("/")
    if "/" in prefix or (slash and not prefix):
        return False
    if prefix and (len(prefix) > 253 or not _PREFIX_RE.match(prefix)):
        return False
    return len(name) <= 63 and bool(_NAME_RE.match(name))


def validate_levels(levels: object, *, where: str = "levels") -> tuple[str, ...]:
    """The levels as a tuple, or LevelError: a non-empty list of distinct label keys."""
    if isinstance(levels, (str, bytes)) or not isinstance(levels, Sequence):
        raise LevelError(f"{where}: must be a list of node-label keys, smallest domain first")
    if not levels:
        raise LevelError(f"{where}: must name at least one level")
    seen: set[str] = set()
    for i, key in enumerate(levels):
        if not is_label_key(key):
            raise LevelError(f"{where}[{i}]: {key!r} is not a valid node-label key")
        if key in seen:
            raise LevelError(f"{where}[{i}]: {key!r} is listed twice")
        seen.add(key)
    return tuple(levels)


def short_name(level: str) -> str:
    """`network.topology.nvidia.com/leaf` -> `leaf`, for reasons a person reads."""
    if level == CLUSTER:
        return "cluster"
    if level == HOSTNAME:
        return "node"
    return level.rpartition("/")[2]


def domain_of(node_name: str, labels: Mapping[str, str], level: str) -> str:
    """The node's domain at `level`: the label's value; the node name at the hostname level.

    An unlabelled node is its own domain, spelled `node/<name>`: label values cannot contain
    `/`, so it never merges with a real domain that happens to share the node's name."""
    if level == CLUSTER:
        return CLUSTER
    if level == HOSTNAME:
        return node_name
    value = labels.get(level)
    if value is None or value == "":
        return f"node/{node_name}"
    return value


class _Named(Sequence[str]):
    """Domain names of a level where every node is its own domain, made on demand: a
    5,000-node cluster has several such levels (hostname, and any level nobody labels)."""

    def __init__(self, nodes: tuple[str, ...], prefix: str) -> None:
        self._nodes, self._prefix = nodes, prefix

    def __len__(self) -> int:
        return len(self._nodes)

    def __getitem__(self, i: int) -> str:  # type: ignore[override]
        return self._prefix + self._nodes[i]


class _Groups(Sequence[np.ndarray]):
    """Node positions of each domain: slices of one sorted array, cut on demand."""

    def __init__(self, order: np.ndarray, bounds: np.ndarray) -> None:
        self._order, self._bounds = order, bounds

    def __len__(self) -> int:
        return len(self._bounds) - 1

    def __getitem__(self, d: int) -> np.ndarray:  # type: ignore[override]
        return self._order[self._bounds[d] : self._bounds[d + 1]]


@dataclass(frozen=True)
class LevelIndex:
    """The domains of one level: `domain_id[pos]` for every node position, names in order."""

    level: str
    domain_id: np.ndarray  # int64, one per node position
    names: Sequence[str]  # domain names, sorted; id = position in this sequence
    members: Sequence[np.ndarray]  # node positions of each domain, ascending (= name order)

    @property
    def count(self) -> int:
        return len(self.names)


@dataclass(frozen=True)
class NetworkIndex:
    """Node positions and per-level domains, built once per set of node labels.

    It depends on names and labels only, never on free GPUs, so a scheduler can keep one per
    label version and hand it to every planning call."""

    levels: tuple[str, ...]
    nodes: tuple[str, ...]  # node names, sorted
    position: Mapping[str, int]
    by_level: Mapping[str, LevelIndex] = field(repr=False)

    @classmethod
    def build(cls, nodes: Iterable[tuple[str, Mapping[str, str]]], levels: Sequence[str]) -> NetworkIndex:
        """From (name, labels) pairs; duplicate node names are an error."""
        levels = validate_levels(levels)
        pairs = sorted(nodes, key=lambda p: p[0])
        names = tuple(p[0] for p in pairs)
        position = {name: i for i, name in enumerate(names)}
        if len(position) != len(names):
            dup = next(a for a, b in itertools.pairwise(names) if a == b)
            raise ValueError(f"node {dup!r} is listed twice")
        present: set[str] = set()
        for _, labels in pairs:
            present.update(labels)
        by_level = {lv: _level_index(lv, names, pairs, lv in present) for lv in (*levels, CLUSTER)}
        return cls(levels=levels, nodes=names, position=position, by_level=by_level)

    def level(self, level: str) -> LevelIndex:
        """The domains of a configured level, or of the CLUSTER pseudo-level."""
        try:
            return self.by_level[level]
        except KeyError:
            raise LevelError(f"{level!r} is not one of the network levels {list(self.levels)}") from None

    def domain(self, node: str, level: str) -> str:
        """The name of `node`'s domain at `level` (as domain_of would compute it)."""
        lx = self.level(level)
        return lx.names[int(lx.domain_id[self.position[node]])]

    def free_per_domain(self, level: str, per_node: np.ndarray) -> np.ndarray:
        """Sum a per-position quantity (free GPUs, member slots…) over each domain of `level`."""
        lx = self.level(level)
        return np.bincount(lx.domain_id, weights=per_node, minlength=lx.count).astype(np.int64)


def _level_index(
    level: str, nodes: tuple[str, ...], pairs: Sequence[tuple[str, Mapping[str, str]]], labelled: bool
) -> LevelIndex:
    """Positions are in name order, so when every node is its own domain ("node/<name>" sorts
    like the names) the ids are the positions and nothing needs sorting."""
    n = len(nodes)
    if level == CLUSTER:
        return _frozen(level, np.zeros(n, dtype=np.int64), (CLUSTER,) if n else ())
    if level == HOSTNAME or not labelled:
        ids = np.arange(n, dtype=np.int64)
        return _frozen(level, ids, _Named(nodes, "" if level == HOSTNAME else "node/"))
    values = np.array([labels.get(level) or "node/" + name for name, labels in pairs])
    names, inverse = np.unique(values, return_inverse=True)
    return _frozen(level, inverse.astype(np.int64).reshape(-1), tuple(str(v) for v in names))


def _frozen(level: str, domain_id: np.ndarray, names: Sequence[str]) -> LevelIndex:
    order = np.argsort(domain_id, kind="stable")
    bounds = np.searchsorted(domain_id[order], np.arange(len(names) + 1))
    domain_id.setflags(write=False)
    return LevelIndex(level, domain_id, names, _Groups(order, bounds))
