"""Volcano's HyperNodes as the network levels they stand for: which of our levels a Volcano tier is.

A Volcano gang (`networkTopology {highestTierAllowed | highestTierName}` on its PodGroup or on a
`subGroupPolicy[]` entry) names a tier of HyperNodes, not a node label. Where the cluster has
HyperNode objects (`topology.volcano.sh/v1alpha1`, cluster-scoped: volcano-sh/apis
pkg/apis/topology/v1alpha1/hypernode_types.go), they say which nodes each tier-t HyperNode
holds, and so which of our levels that tier is: the smallest level one of whose domains holds
every tier-t HyperNode's nodes (`HyperTiers.build`). A gang kept in one domain of that level
may span a little more than one HyperNode where the two disagree, never less: the level the
planner knows is the closest it can keep, and the gang is never refused for a HyperNode the
labels cannot tell apart. Without HyperNodes of a tier the label rule stands
(`gputopo.gang.sources.tier_level`).

Members are resolved as Volcano's scheduler does (volcano-sh/volcano
pkg/util/hypernode/member_selector.go `GetMembers`): `exactMatch.name`, `regexMatch.pattern`
(an unanchored search, Go's `MatchString`) over node names, `labelMatch` (a LabelSelector,
not empty) over node labels; a member of type HyperNode is the named (or matching) HyperNodes'
nodes. A `tierName` shared by HyperNodes of two tiers takes the last one listed, as Volcano's
`HyperNodeTierNameMap`.

Pure functions of API JSON; a HyperNode that cannot be read (no tier, no usable member, a bad
pattern) is skipped with its reason, never an exception.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gputopo.network.levels import domain_of

MAX_HYPERNODES = 10_000
MAX_MEMBERS = 1_000
MAX_DEPTH = 16  # HyperNodes nested deeper are not resolved (Volcano's tiers are a handful)
MAX_PATTERN = 1_024
#: a group holding a quantifier, itself quantified: `(a+)+`, `(a|b*)*`, `(x{2,}){3}`
_NESTED_QUANTIFIER = re.compile(r"\([^()]*[+*?}][^()]*\)\s*[+*{]")


@dataclass(frozen=True)
class Selector:
    """One member's selector: exactly one of a name, a name pattern or a label selector."""

    name: str = ""
    pattern: re.Pattern[str] | None = None
    #: matchLabels as (key, value) pairs and matchExpressions as (key, operator, values)
    labels: tuple[tuple[str, str], ...] = ()
    expressions: tuple[tuple[str, str, tuple[str, ...]], ...] = ()

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        """Whether a node (or a HyperNode, with no labels) of this name is selected."""
        if self.name:
            return name == self.name
        if self.pattern is not None:
            return self.pattern.search(name) is not None
        if not self.labels and not self.expressions:
            return False  # an empty labelMatch selects nothing (member_selector.go)
        if any(labels.get(k) != v for k, v in self.labels):
            return False
        return all(_expression(labels, *e) for e in self.expressions)


def _expression(labels: Mapping[str, str], key: str, op: str, values: tuple[str, ...]) -> bool:
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    return key not in labels  # DoesNotExist (others are refused when parsed)


@dataclass(frozen=True)
class HyperNode:
    name: str
    tier: int
    tier_name: str
    #: (is a HyperNode, selector) per member
    members: tuple[tuple[bool, Selector], ...]


def _selector(raw: Any, node: bool) -> Selector | str:
    """A member's selector, or why it cannot be used."""
    if not isinstance(raw, Mapping):
        return "selector must be an object"
    present = [k for k in ("exactMatch", "regexMatch", "labelMatch") if raw.get(k) is not None]
    if len(present) != 1:
        return "selector needs exactly one of exactMatch, regexMatch, labelMatch"
    kind = present[0]
    body = raw[kind]
    if not isinstance(body, Mapping):
        return f"selector.{kind} must be an object"
    if kind == "exactMatch":
        name = body.get("name")
        if not isinstance(name, str) or not 0 < len(name) <= 253:
            return "selector.exactMatch.name must be a name"
        return Selector(name=name)
    if kind == "regexMatch":
        pattern = body.get("pattern")
        if not isinstance(pattern, str) or not 0 < len(pattern) <= MAX_PATTERN:
            return "selector.regexMatch.pattern must be a non-empty string"
        if _NESTED_QUANTIFIER.search(pattern):
            # Go's RE2 is linear; Python's backtracking engine is not: a quantified group with
            # a quantifier inside could take exponential time on a node name
            return f"selector.regexMatch.pattern {pattern[:64]!r}: nested quantifiers are not supported"
        try:
            return Selector(pattern=re.compile(pattern))
        except (re.error, RecursionError, OverflowError):
            return f"selector.regexMatch.pattern {pattern[:64]!r} is not a regular expression"
    if not node:
        return "selector.labelMatch applies to members of type Node only"
    found = label_selector(body)
    return f"selector.labelMatch: {found}" if isinstance(found, str) else found


def label_selector(body: Mapping[str, Any]) -> Selector | str:
    """A metav1.LabelSelector (matchLabels, matchExpressions), or why it cannot be used."""
    match = body.get("matchLabels") or {}
    exprs = body.get("matchExpressions") or []
    if not isinstance(match, Mapping) or not isinstance(exprs, list):
        return "must be a LabelSelector"
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in match.items()):
        return "matchLabels must map strings to strings"
    expressions: list[tuple[str, str, tuple[str, ...]]] = []
    for e in exprs[:64]:
        key, op, values = dig(e, "key"), dig(e, "operator"), dig(e, "values") or []
        if (
            not isinstance(key, str)
            or op not in ("In", "NotIn", "Exists", "DoesNotExist")
            or not isinstance(values, list)
            or not all(isinstance(v, str) for v in values)
        ):
            return "matchExpressions: each needs key, operator In|NotIn|Exists|DoesNotExist"
        expressions.append((key, op, tuple(values)))
    return Selector(labels=tuple(sorted(match.items())), expressions=tuple(expressions))


def dig(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, Mapping) else None


def parse_hypernode(obj: Mapping[str, Any]) -> HyperNode | str:
    """A HyperNode, or why it cannot be used (the reason names the field)."""
    meta, spec = dig(obj, "metadata"), dig(obj, "spec")
    name = dig(meta, "name")
    if not isinstance(name, str) or not 0 < len(name) <= 253:
        return "metadata.name must be a name"
    if not isinstance(spec, Mapping):
        return "spec must be an object"
    tier = spec.get("tier")
    if isinstance(tier, bool) or not isinstance(tier, int) or not 0 <= tier <= 64:
        return "spec.tier must be an integer in 0..64"
    tier_name = spec.get("tierName", "")
    if not isinstance(tier_name, str) or len(tier_name) > 253:
        return "spec.tierName must be a string of at most 253 characters"
    raw = spec.get("members")
    if not isinstance(raw, list) or not 0 < len(raw) <= MAX_MEMBERS:
        return f"spec.members must be a list of 1..{MAX_MEMBERS} members"
    members: list[tuple[bool, Selector]] = []
    for i, m in enumerate(raw):
        kind = dig(m, "type")
        if kind not in ("Node", "HyperNode"):
            return f"spec.members[{i}].type must be Node or HyperNode"
        sel = _selector(dig(m, "selector"), kind == "Node")
        if isinstance(sel, str):
            return f"spec.members[{i}].{sel}"
        members.append((kind == "HyperNode", sel))
    return HyperNode(name, tier, tier_name, tuple(members))


class Resolver:
    """The nodes each HyperNode holds (of `nodes`: name -> labels), through nested HyperNodes,
    each HyperNode resolved once and label selectors answered from an index of the nodes'
    labels: the tier map is rebuilt whenever node labels change, for clusters of thousands of
    nodes and hundreds of HyperNodes. A cycle or a chain deeper than MAX_DEPTH contributes
    nothing more."""

    def __init__(self, by_name: Mapping[str, HyperNode], nodes: Mapping[str, Mapping[str, str]]) -> None:
        self.by_name, self.nodes = by_name, nodes
        self._held: dict[str, frozenset[str]] = {}
        self._index: dict[tuple[str, str], set[str]] | None = None

    def _by_label(self) -> dict[tuple[str, str], set[str]]:
        if self._index is None:
            self._index = {}
            for n, labels in self.nodes.items():
                for kv in labels.items():
                    self._index.setdefault(kv, set()).add(n)
        return self._index

    def select(self, sel: Selector) -> set[str]:
        """The nodes a Node member's selector takes."""
        if sel.name:
            return {sel.name} if sel.name in self.nodes else set()
        if sel.pattern is not None:
            return {n for n in self.nodes if sel.pattern.search(n)}
        if not sel.labels and not sel.expressions:
            return set()
        if sel.labels:
            index = self._by_label()
            sets = sorted((index.get(kv, set()) for kv in sel.labels), key=len)
            found = set(sets[0]).intersection(*sets[1:])
        else:
            found = set(self.nodes)
        return {n for n in found if all(_expression(self.nodes[n], *e) for e in sel.expressions)}

    def held(self, hn: HyperNode, path: frozenset[str] = frozenset()) -> frozenset[str]:
        """The nodes `hn` holds."""
        known = self._held.get(hn.name)
        if known is not None:
            return known
        if hn.name in path or len(path) >= MAX_DEPTH:
            return frozenset()
        inner = path | {hn.name}
        out: set[str] = set()
        for is_hyper, sel in hn.members:
            if not is_hyper:
                out |= self.select(sel)
                continue
            if sel.name:
                children = [self.by_name[sel.name]] if sel.name in self.by_name else []
            else:
                children = [c for c in self.by_name.values() if sel.matches(c.name, {})]
            for child in children:
                out |= self.held(child, inner)
        result = self._held[hn.name] = frozenset(out)
        return result


@dataclass(frozen=True)
class HyperTiers:
    """What the cluster's HyperNodes say about the tiers: tier -> our level (None: no level
    holds the tier's HyperNodes, i.e. the whole cluster), and tierName -> tier."""

    levels: Mapping[int, str | None] = field(default_factory=dict)
    names: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        hypernodes: Iterable[HyperNode],
        nodes: Mapping[str, Mapping[str, str]],
        levels: Sequence[str],
    ) -> HyperTiers:
        """Tier t is the smallest of `levels` one of whose domains holds all the nodes of each
        tier-t HyperNode (a HyperNode holding no known node says nothing); a tier whose
        HyperNodes hold no known node is left to the label rule."""
        listed = list(hypernodes)[:MAX_HYPERNODES]
        resolver = Resolver({h.name: h for h in listed}, nodes)
        names: dict[str, int] = {}
        spans: dict[int, list[frozenset[str]]] = {}
        for h in listed:
            if h.tier_name:
                names[h.tier_name] = h.tier
            held = resolver.held(h)
            if held:
                spans.setdefault(h.tier, []).append(held)
        out: dict[int, str | None] = {}
        for tier, sets in spans.items():
            out[tier] = next(
                (lv for lv in levels if all(_one_domain(held, nodes, lv) for held in sets)), None
            )
        return cls(out, names)


def _one_domain(held: frozenset[str], nodes: Mapping[str, Mapping[str, str]], level: str) -> bool:
    """Whether every node of `held` is in one domain of `level` (stops at the first that is not)."""
    it = iter(held)
    first = next(it)
    domain = domain_of(first, nodes[first], level)
    return all(domain_of(n, nodes[n], level) == domain for n in it)
