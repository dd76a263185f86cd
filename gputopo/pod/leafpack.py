"""Network-level packing of single pods: among the nodes the objective ranks best, the ones
under the fullest leaf switch with room, so that empty leaves stay whole for gangs.

The single-pod objective (`gputopo.pod.objective`) ranks nodes by what the job gets and what
the placement costs the GPUs it leaves on that node; it does not see the network. Where many
nodes rank equal (every empty node of a kind, for a 1-GPU pod), kube-scheduler then chooses at
random among them, so single pods scatter over every leaf and a multi-node gang seldom finds a
leaf with room when it starts (docs/objective.md, "Network-level packing"). Kueue's Topology
Aware Scheduling starts an unconstrained pod set at the fitting domain with the least free
capacity (LeastFreeCapacity, under its default profile TASProfileMixed; KEP-2724), and KAI
Scheduler selects the domain with less available resources relative to the request
(bin-packing, its docs/topology/README.md): a leaf that already runs pods takes the next one.
This module is that step for the extender's scores:

  among the nodes at the top score (`placement.MAX_SCORE`: the best key of the objective and
  any the 0..10 scale cannot tell from it), those under the leaf with the FEWEST free GPUs keep
  it; the others get one point less, so kube-scheduler's choice (the top total, LeastAllocated
  deciding among the top score) stays within the fullest leaf. Free GPUs are counted over every
  node of the leaf, not only the candidates: a leaf is as whole as its nodes are free.

It sits below the objective's ranking, not inside its key: only the top score decides where
kube-scheduler puts the pod (a point of the extender's score, x200 after its weight, outweighs
LeastAllocated's 0..100), so a leaf term in the key would split the top the same way but also
reorder nodes nobody chooses, crowding the ranks of the nodes below (the scale has 10 steps).
Nodes of unknown topology score neutral and are never at the top; nodes without a leaf label
keep their score (no leaf to keep whole: a one-node domain holds no gang).

The leaf is the first of the cluster's network levels that names a leaf switch: Topograph's
fabric tier 0 (the switch nearest the node) or `network.topology.nvidia.com/leaf`, the one a
node carries. A cluster whose levels name neither (its own Kueue or KAI Topology, say: rack,
block) packs its smallest level above the node and its NVLink domain.

Pure: no I/O, no clock, no globals. The sidecar's prioritize (`scheduler.extender`) and the
simulator's deployed policy (`gputopo.sim.policies.podclasses`) call `Leaves.fullest` (the
simulator by `fullest_by_room`, with the leaves' free GPUs it keeps).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gputopo.network.levels import (
    ACCELERATOR,
    FABRIC_TIER_PREFIX,
    GPU_CLIQUE,
    HOSTNAME,
    LEAF,
    XCLR_DOMAIN,
    XCLR_SUB_DOMAIN,
    NetworkIndex,
)
from gputopo.pod.placement import MAX_SCORE

#: The levels that name a node's leaf switch, as the cluster may label them (a node carries one
#: family: Topograph's fabric tiers, tier 0 nearest the node, or the older leaf label).
LEAF_LEVELS: tuple[str, ...] = (f"{FABRIC_TIER_PREFIX}0", LEAF)
#: Levels below any switch: the node itself and its NVLink domain (gputopo.network.levels).
_BELOW_SWITCH = frozenset({HOSTNAME, XCLR_SUB_DOMAIN, XCLR_DOMAIN, ACCELERATOR, GPU_CLIQUE})


def leaf_levels(levels: Iterable[str]) -> list[str]:
    """The levels, of a cluster's smallest-first list, that name a node's leaf: those of
    `LEAF_LEVELS` configured (a node takes the first it carries), else the smallest level above
    the node and its NVLink domain, else none."""
    levels = list(levels)
    named = [lv for lv in levels if lv in LEAF_LEVELS]
    if named:
        return named
    return [lv for lv in levels if lv not in _BELOW_SWITCH][:1]


@dataclass(frozen=True)
class Leaves:
    """Each node's leaf (by position of a `NetworkIndex`: names in sorted order) and the nodes
    of each leaf; built once per index (it depends on labels only)."""

    leaf: tuple[int, ...]  # leaf id per node position, -1 for a node without a leaf label
    members: tuple[tuple[int, ...], ...]  # node positions per leaf id

    @classmethod
    def of(cls, net: NetworkIndex) -> Leaves:
        """The leaves of an index: per node, its domain at the first of `leaf_levels` that the
        node is labelled with (an unlabelled node is a one-node domain there,
        spelled `node/<name>`: no leaf)."""
        levels = [net.level(lv) for lv in leaf_levels(net.levels)]
        ids: dict[tuple[str, str], int] = {}
        leaf = []
        for pos in range(len(net.nodes)):
            got = -1
            for lx in levels:
                name = lx.names[int(lx.domain_id[pos])]
                if not name.startswith("node/"):
                    got = ids.setdefault((lx.level, name), len(ids))
                    break
            leaf.append(got)
        members: list[list[int]] = [[] for _ in ids]
        for pos, d in enumerate(leaf):
            if d >= 0:
                members[d].append(pos)
        return cls(tuple(leaf), tuple(tuple(m) for m in members))

    @property
    def active(self) -> bool:
        """Whether more than one leaf exists (else packing changes nothing)."""
        return len(self.members) > 1

    def fullest(self, candidates: Iterable[int], free: Callable[[int], int]) -> list[int]:
        """The candidates (node positions) the packing keeps, in their order: those under the
        leaf with the fewest free GPUs among the candidates' leaves (`free(pos)`: a node's free
        GPUs, summed over every node of the leaf), ties between leaves all kept, and every
        candidate without a leaf."""
        members = self.members
        return self.fullest_by_room(candidates, lambda d: sum(map(free, members[d])))

    def fullest_by_room(self, candidates: Iterable[int], room: Callable[[int], int]) -> list[int]:
        """`fullest` with each leaf's free GPUs given whole (`room(leaf id)`, the sum `fullest`
        counts): for a caller that keeps those sums as GPUs are taken and freed (the simulator,
        which asks after every placement), instead of adding up the leaf's nodes each time."""
        leaf = self.leaf
        cands = list(candidates)
        touched = {leaf[pos] for pos in cands}
        touched.discard(-1)
        if len(touched) < 2:  # one leaf (or none): nothing to choose
            return cands
        rooms = {d: room(d) for d in touched}
        least = min(rooms.values())
        return [pos for pos in cands if leaf[pos] < 0 or rooms[leaf[pos]] == least]

    def pack_scores(
        self, scores: Mapping[str, int], position: Mapping[str, int], free: Callable[[int], int]
    ) -> dict[str, int]:
        """The extender's scores with the packing applied: nodes at the top score (MAX_SCORE)
        outside `fullest` get one point less (module docstring); the others as given.
        `position` maps the names to the index's positions (a name not in it keeps its score)."""
        top = MAX_SCORE
        at_top = [position[n] for n, s in scores.items() if s == top and n in position]
        out = dict(scores)
        if len(at_top) < 2:
            return out
        kept = set(self.fullest(at_top, free))
        if len(kept) == len(at_top):
            return out
        names = {position[n]: n for n in scores if n in position}
        for pos in at_top:
            if pos not in kept:
                out[names[pos]] = top - 1
        return out
