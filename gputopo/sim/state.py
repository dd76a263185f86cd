"""The simulated cluster: nodes, their topologies and labels, and who holds which GPU.

Nodes of the same topology with the same free GPUs answer every allocation question the same
way, so the state keeps them grouped into equivalence classes keyed by (topology, free mask).
A pod then costs one decision per class instead of one per node: a 64-node cluster rarely
has more than a few dozen classes, a 1,000-node one not many more.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gputopo.network.levels import HOSTNAME
from gputopo.node.topology import Topology


@dataclass(frozen=True)
class SimNode:
    """One node: its name, the index of its topology in `SimCluster.topologies`, its labels."""

    name: str
    topology: int
    labels: Mapping[str, str] = field(default_factory=dict)
    allocated: frozenset[int] = frozenset()


@dataclass(frozen=True)
class SimCluster:
    """The static part: distinct topologies, nodes in name order, network levels (smallest first)."""

    topologies: tuple[Topology, ...]
    nodes: tuple[SimNode, ...]
    levels: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ValueError("a cluster needs at least one node")
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError("node names must be unique")
        for node in self.nodes:
            if not 0 <= node.topology < len(self.topologies):
                raise ValueError(f"node {node.name}: unknown topology index {node.topology}")
            n = self.topologies[node.topology].n
            if any(not 0 <= g < n for g in node.allocated):
                raise ValueError(f"node {node.name}: allocated GPU out of range 0..{n - 1}")

    def domain(self, node: int, level: str) -> str:
        """The node's domain at `level`; a node without the label (or with an empty value, as
        gputopo.network.levels reads it for the planner) is its own domain."""
        spec = self.nodes[node]
        if level == HOSTNAME:
            return spec.name
        value = spec.labels.get(level)
        return f"{level}={value}" if value else f"node:{spec.name}"

    def common_level(self, nodes: Sequence[int]) -> str | None:
        """The smallest level whose one domain holds every node; None if no level does."""
        unique = set(nodes)
        for level in self.levels:
            if len({self.domain(n, level) for n in unique}) == 1:
                return level
        return None

    @property
    def capacity(self) -> int:
        return sum(self.topologies[n.topology].n for n in self.nodes)


class ClusterState:
    """Mutable free-GPU bookkeeping of one simulation run (owned by that run, never shared)."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self.size = [cluster.topologies[n.topology].n for n in cluster.nodes]
        self.topo = [n.topology for n in cluster.nodes]
        self.mask = [
            ((1 << s) - 1) & ~_mask_of(n.allocated) for s, n in zip(self.size, cluster.nodes, strict=True)
        ]
        self.classes: dict[tuple[int, int], set[int]] = {}
        self.hist = [0] * (max(self.size) + 1)  # hist[f] = nodes with f free GPUs
        self.free_total = 0
        self.now = 0.0  # the simulation's clock, set by the engine before each placement pass
        #: groupings whose free GPUs `take` and `give` keep current (`group_free`)
        self._tracked: dict[int, tuple[Sequence[int], list[int]]] = {}
        for i, m in enumerate(self.mask):
            self._enter(i, m)

    def _enter(self, node: int, mask: int) -> None:
        self.classes.setdefault((self.topo[node], mask), set()).add(node)
        free = mask.bit_count()
        self.hist[free] += 1
        self.free_total += free

    def _leave(self, node: int, mask: int) -> None:
        key = (self.topo[node], mask)
        members = self.classes[key]
        members.discard(node)
        if not members:
            del self.classes[key]
        free = mask.bit_count()
        self.hist[free] -= 1
        self.free_total -= free

    def take(self, node: int, gpus: Sequence[int]) -> None:
        bits = _mask_of(gpus)
        old = self.mask[node]
        if bits & ~old or len(gpus) != bits.bit_count():
            raise ValueError(f"GPUs {list(gpus)} are not free on node {self.cluster.nodes[node].name}")
        self._leave(node, old)
        self.mask[node] = old & ~bits
        self._enter(node, self.mask[node])
        if self._tracked:
            self._regroup(node, -bits.bit_count())

    def give(self, node: int, gpus: Sequence[int]) -> None:
        bits = _mask_of(gpus)
        old = self.mask[node]
        if bits & old:
            raise ValueError(f"GPUs {list(gpus)} are already free on node {self.cluster.nodes[node].name}")
        self._leave(node, old)
        self.mask[node] = old | bits
        self._enter(node, self.mask[node])
        if self._tracked:
            self._regroup(node, bits.bit_count())

    def group_free(self, groups: Sequence[int], count: int) -> list[int]:
        """Free GPUs per group of nodes (`groups[node]`: its group, 0..count-1, or -1 for none),
        counted now and then kept current by `take` and `give`: a policy that asks after every
        placement (the leaves' free GPUs, `gputopo.pod.leafpack`) reads a sum instead of adding
        up the group's nodes each time. The same `groups` object gets the same list back; the
        caller must not change either."""
        hit = self._tracked.get(id(groups))
        if hit is not None and hit[0] is groups:
            if len(hit[1]) != count:  # one grouping, one count: its kept list cannot change size
                raise ValueError(f"groups already kept with {len(hit[1])} groups, not {count}")
            return hit[1]
        if len(groups) != len(self.mask) or any(not -1 <= g < count for g in groups):
            raise ValueError(f"groups must give each of {len(self.mask)} nodes a group in -1..{count - 1}")
        totals = [0] * count
        for node, g in enumerate(groups):
            if g >= 0:
                totals[g] += self.mask[node].bit_count()
        self._tracked[id(groups)] = (groups, totals)
        return totals

    def _regroup(self, node: int, delta: int) -> None:
        for groups, totals in self._tracked.values():
            g = groups[node]
            if g >= 0:
                totals[g] += delta

    def free(self, node: int) -> tuple[int, ...]:
        m = self.mask[node]
        return tuple(i for i in range(self.size[node]) if m >> i & 1)

    def slots(self, pod_gpus: int) -> int:
        """How many pods of `pod_gpus` GPUs fit at once, counting GPUs per node only."""
        return sum(count * (free // pod_gpus) for free, count in enumerate(self.hist) if count)

    def could_fit(self, pods: Sequence[int]) -> bool:
        """A necessary condition every policy shares: enough free GPUs on enough nodes."""
        if len(pods) == 1:  # the common case, kept cheap: some node has that many free
            size = pods[0]
            return size <= self.free_total and any(self.hist[size:])
        if sum(pods) > self.free_total:
            return False
        return all(self.slots(g) >= pods.count(g) for g in set(pods))


def _mask_of(indices: Sequence[int] | frozenset[int]) -> int:
    out = 0
    for i in indices:
        out |= 1 << i
    return out
