"""The policies of `simulate --jobs tree`: gputopo's tree planner and the peers as each one
behaves on a tree job (TP groups of k 4-GPU pods, DP replicas; gputopo.sim.trees), modelled
from the upstream APIs and docs listed in /work/shared/reference/gang-apis-2026.md.

| policy         | what it is told                                    | how it places (modelled)                  |
|----------------|----------------------------------------------------|-------------------------------------------|
| gputopo        | a tree: sub-group per TP group, required the NVLink domain; the gang at gputopo's default, preferred at the smallest level (one rack, then a leaf, then a spine) | `plan_gang` -> `plan_tree`, the planner the sidecar runs |
| kueue-slices   | podset-preferred-topology: leaf; podset-slice-required-topology: NVLink domain, podset-slice-size: k | Kueue TAS BestFit counted in slices, top-down |
| kai-subgroups  | PodGroup topologyConstraint preferred leaf; subGroups[] of k pods, required the NVLink domain | domains binpacked, sub-groups one by one |
| kube-tas       | one PodGroup, schedulingConstraints.topology[0].key: the smallest level one domain of which can hold the whole job (the NVLink domain up to 18 trays, else the leaf) | one candidate placement per domain, MostAllocated; pods LeastAllocated, random ties |
| volcano-hard   | networkTopology {mode: hard, highestTierAllowed: 2} (tier 1 the NVLink domain, 2 the leaf) | the lowest tier's fullest HyperNode that holds the job; pods in it at random |
| volcano-soft   | the same, mode: soft                               | as hard, else anywhere                    |
| gang-blind     | a gang (minMember = pods), no topology             | pods one by one, LeastAllocated, random ties, all or nothing |

Sources (stored snapshots named in gang-apis-2026.md): Kueue v0.19
`site/content/en/docs/concepts/topology_aware_scheduling.md` and `apis/kueue/v1beta2/
topology_types.go` (slice annotations; BestFit, `gputopo.sim.policies.peers.best_fit_domains`);
KAI `docs/topology/multilevel.md` and `pkg/apis/scheduling/v2alpha2/podgroup_types.go`
(subGroups with topologyConstraint; binpack is KAI's default placement strategy); Kubernetes
1.37 `scheduling/v1beta1/types.go` and the "Topology-Aware Workload Scheduling" concept page
(TopologyPlacement generates one placement per value of the one key; NodeResourcesFit scores a
placement MostAllocated; PodGroupPodsCount; per-pod scoring stays LeastAllocated); Volcano
`pkg/apis/scheduling/v1beta1/types.go` (networkTopology mode, highestTierAllowed) and the
HyperNode auto-discovery guide (tiers from the bottom, tier 1 first).

What no model here does: preemption, Kueue's quota, KAI's consolidation, 1.37's
CompositePodGroup (alpha: a PodGroup per TP group would give kube-scheduler sub-groups; the
brief models the beta, one key per PodGroup) and Volcano's partitionPolicy. Every policy places
a job of one pod (4 GPUs or fewer) by the same rule, so that the columns measure the tree
placement: the HGX servers first (an operator's node affinity keeps small jobs off the racks),
the fullest node that holds it, GPUs by gputopo's Allocator. The in-node GPU choice of a tree
pod is the Allocator's too: a tray's four GPUs are the whole tray, and the job-time model reads
the nodes, not the indices.

Pure: each policy owns its random source (seeded), no I/O.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from itertools import pairwise
from types import MappingProxyType

from gputopo.gang.memo import PlanMemo
from gputopo.gang.planner import plan_gang
from gputopo.gang.spec import GangSpec, Member, NoPlan, SubGroup
from gputopo.network.levels import ACCELERATOR, HOSTNAME, LEAF, NetworkIndex
from gputopo.network.nodeview import NodeView
from gputopo.node.allocator import AllocationError, Allocator
from gputopo.pod.objective import ClusterObjective, DemandMix
from gputopo.sim.policies.base import Failure, Slot, mask_list
from gputopo.sim.policies.peers import best_fit_domains
from gputopo.sim.state import ClusterState, SimCluster
from gputopo.sim.trees import TRAY_GPUS, Tree
from gputopo.sim.workload import Job

#: Volcano's highestTierAllowed for every tree job: tier 1 the NVLink domain, tier 2 the leaf.
VOLCANO_TIER = 2


class TreePolicy:
    """What every tree policy shares: the single-pod rule, GPU choice, and the wrapper that
    turns an ordered list of nodes (pod i on the i-th) into slots."""

    name = "tree"

    def __init__(
        self, cluster: SimCluster, allocators: Sequence[Allocator], trees: Mapping[int, Tree], seed: int
    ) -> None:
        self.cluster = cluster
        self.allocators = allocators
        self.trees = trees
        self.rng = random.Random(seed)
        n = len(cluster.nodes)
        self.levels = cluster.levels
        self.domains = {level: [cluster.domain(i, level) for i in range(n)] for level in cluster.levels}
        # nodes outside any multi-node NVLink domain (the HGX servers): single pods go there first
        size: dict[str, int] = {}
        for d in self.domains[ACCELERATOR]:
            size[d] = size.get(d, 0) + 1
        self.loose = [size[self.domains[ACCELERATOR][i]] == 1 for i in range(n)]
        # per level, the most tree pods one domain holds on an empty cluster
        self.empty: dict[str, int] = {}
        for level in self.levels:
            per: dict[str, int] = {}
            for i, d in enumerate(self.domains[level]):
                per[d] = per.get(d, 0) + cluster.topologies[cluster.nodes[i].topology].n // TRAY_GPUS
            self.empty[level] = max(per.values())

    def smallest(self, tree: Tree) -> str | None:
        """The smallest level above the node one domain of which holds the whole tree on an
        empty cluster (None: only the cluster does): what a user names for a one-level peer."""
        for level in self.levels[1:]:
            if self.empty[level] >= tree.trays:
                return level
        return None

    def place(self, state: ClusterState, job: Job) -> list[Slot] | Failure:
        tree = self.trees.get(job.id)
        if tree is None:
            return self._single(state, job.pods[0])
        got = self.tree(state, job, tree)
        if isinstance(got, Failure):
            return got
        return self._slots(state, got)

    def tree(self, state: ClusterState, job: Job, tree: Tree) -> list[int] | Failure:
        """Pod i's node for every pod of the tree (ranks in order), or why not."""
        raise NotImplementedError

    def _single(self, state: ClusterState, size: int) -> list[Slot] | Failure:
        best: tuple[bool, int, int] | None = None
        for i, m in enumerate(state.mask):
            free = m.bit_count()
            if free >= size:
                key = (not self.loose[i], free, i)
                if best is None or key < best:
                    best = key
        if best is None:
            return Failure(f"no node has {size} free GPUs")
        return self._slots(state, [best[2]], size)

    def _slots(
        self, state: ClusterState, nodes: Sequence[int], size: int = TRAY_GPUS
    ) -> list[Slot] | Failure:
        slots: list[Slot] = []
        try:
            for node in nodes:
                alloc = self.allocators[state.topo[node]]
                try:
                    gpus = tuple(sorted(alloc.choose(mask_list(state.mask[node], alloc.n), size).indices))
                except AllocationError:
                    return Failure(f"no usable set of {size} GPUs on {self.cluster.nodes[node].name}")
                state.take(node, gpus)
                slots.append((node, gpus))
        finally:
            for node, gpus in slots:
                state.give(node, gpus)
        return slots

    # helpers for the peers

    def pods_fit(self, state: ClusterState) -> list[int]:
        return [m.bit_count() // TRAY_GPUS for m in state.mask]

    def by_domain(self, level: str, nodes: Sequence[int] | None = None) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        names = self.domains[level]
        for i in range(len(names)) if nodes is None else nodes:
            out.setdefault(names[i], []).append(i)
        return out

    def one_by_one(
        self, state: ClusterState, nodes: Sequence[int], count: int, score: Callable[[int, int], float] | None
    ) -> list[int] | None:
        """`count` pods over `nodes`, one at a time, each on a node with room at the best
        `score(free GPUs, node size)` (None: any node with room), random among ties: how
        kube-scheduler and Volcano place a group's pods one after the other."""
        free = {n: state.mask[n].bit_count() for n in nodes}
        out: list[int] = []
        for _ in range(count):
            room = [n for n in nodes if free[n] >= TRAY_GPUS]
            if not room:
                return None
            if score is not None:
                scored = [(score(free[n] - TRAY_GPUS, state.size[n]), n) for n in room]
                top = max(s for s, _ in scored)
                room = [n for s, n in scored if s == top]
            pick = room[self.rng.randrange(len(room))] if len(room) > 1 else room[0]
            free[pick] -= TRAY_GPUS
            out.append(pick)
        return out


def least_allocated(free_after: int, size: int) -> float:
    """kube-scheduler's NodeResourcesFit LeastAllocated for GPUs: the share left free."""
    return free_after / size


class GputopoTrees(TreePolicy):
    """The tree as the sidecar receives it (a KAI PodGroup with subGroups, a CompositePodGroup,
    Kueue slices: gputopo.gang.sources maps each to this GangSpec), planned by `plan_gang`,
    which hands a spec with sub-groups to `plan_tree`: each TP group a sub-group required in
    one NVLink domain, the gang's own level left at gputopo's default (design.md §5: preferred
    at the smallest level), so the tree goes into one rack when one holds it, else one leaf,
    else one spine, else the cluster: "replicas preferred in one leaf" with the rack tried
    first. Naming the leaf as the gang's preferred level instead (what KAI and Kueue are told)
    makes plan_tree start there and put each TP group in the fullest rack of that leaf, which
    splits replicas one rack would have held (docs/simulator.md has the numbers)."""

    name = "gputopo"

    def __init__(
        self, cluster: SimCluster, allocators: Sequence[Allocator], trees: Mapping[int, Tree], seed: int
    ) -> None:
        super().__init__(cluster, allocators, trees, seed)
        self.index = NetworkIndex.build(((n.name, n.labels) for n in cluster.nodes), cluster.levels)
        self.memo = PlanMemo()
        # the sidecar's cluster objective (its gang prediction ranks a sub-group's candidate
        # plans by predicted job time: a TP group on the faster NVLink domain, not merely the
        # fewest nodes); the demand it learns is the tree pods' and single pods' own
        self.objective = ClusterObjective(DemandMix())
        self.objective.learn(allocators)
        self.position = {n.name: i for i, n in enumerate(cluster.nodes)}
        self._views: dict[tuple[int, int], NodeView] = {}
        self._seen: set[int] = set()

    def view(self, node: int, mask: int) -> NodeView:
        hit = self._views.get((node, mask))
        if hit is None:
            if len(self._views) > 100_000:
                self._views.clear()
            spec = self.cluster.nodes[node]
            alloc = self.allocators[spec.topology]
            free = frozenset(i for i in range(alloc.n) if mask >> i & 1)
            hit = self._views[(node, mask)] = NodeView(spec.name, spec.labels, alloc.n, free, alloc)
        return hit

    def tree(self, state: ClusterState, job: Job, tree: Tree) -> list[int] | Failure:
        key = f"sim/job-{job.id}"
        members = tuple(Member(f"{key}-{i}", TRAY_GPUS, f"tp{i // tree.tp}") for i in range(tree.trays))
        groups = tuple(
            SubGroup(f"tp{j}", required_level=ACCELERATOR, min_count=tree.tp) for j in range(tree.replicas)
        )
        spec = GangSpec(key, members, groups=groups)
        views = [self.view(i, m) for i, m in enumerate(state.mask) if m.bit_count() >= TRAY_GPUS]
        if not views:
            return Failure("no node has a free tray")
        if job.id not in self._seen:
            self._seen.add(job.id)
            for _ in range(tree.trays):
                self.objective.mix.observe(TRAY_GPUS, gang=True)
        plan = plan_gang(spec, views, self.levels, index=self.index, memo=self.memo, objective=self.objective)
        if isinstance(plan, NoPlan):
            return Failure(plan.reason)
        at = {p.pod: self.position[p.node] for p in plan.placements}
        return [at[m.pod] for m in members]


class KueueSlices(TreePolicy):
    """Kueue TAS with slices (v0.19): one PodSet of the tree's pods with
    `podset-preferred-topology: <leaf>`, `podset-slice-required-topology: <NVLink domain>` and
    `podset-slice-size: k`. Capacity is counted in slices (pods that fit in an NVLink domain,
    divided by k), the search runs top-down as for any TAS PodSet: the preferred level, then
    each larger one until one domain holds every slice (at the top, several domains), BestFit
    at each level down to the slice level; each slice's pods then BestFit over its domain's
    nodes. A slice never straddles NVLink domains; the replicas may land in different leaves."""

    name = "kueue-slices"

    def tree(self, state: ClusterState, job: Job, tree: Tree) -> list[int] | Failure:
        fit = self.pods_fit(state)
        k = tree.tp
        racks = self.by_domain(ACCELERATOR)
        slices = {d: sum(fit[n] for n in nodes) // k for d, nodes in racks.items()}
        # the levels Kueue's Topology lists, top first, down to the slice level
        above = [
            lv for lv in reversed(self.levels) if lv not in (HOSTNAME, ACCELERATOR) and self._carried(lv)
        ]
        rep = {d: nodes[0] for d, nodes in racks.items()}

        def rooms(level: str, within: set[str] | None, parent: str | None) -> tuple[list[str], list[int]]:
            per: dict[str, int] = {}
            for d, s in slices.items():
                node = rep[d]
                if parent is not None and within is not None and self.domains[parent][node] not in within:
                    continue
                name = d if level == ACCELERATOR else self.domains[level][node]
                per[name] = per.get(name, 0) + s
            names = sorted(per)
            return names, [per[n] for n in names]

        need = tree.replicas
        start = above.index(LEAF) if LEAF in above else len(above) - 1
        picked: list[tuple[str, int]] = []
        depth = start
        while depth >= 0:
            names, room = rooms(above[depth], None, None)
            if any(r >= need for r in room) or depth == 0:
                picked = [(names[i], c) for i, c in best_fit_domains(room, need, names)]
                break
            depth -= 1
        if not picked:
            return Failure(f"no set of NVLink domains holds {need} slices of {k} pods")
        chain = [*above[depth:], ACCELERATOR]
        for up, down in pairwise(chain):
            nxt: list[tuple[str, int]] = []
            for parent, count in picked:
                names, room = rooms(down, {parent}, up)
                got = best_fit_domains(room, count, names)
                if not got:
                    return Failure(f"slices of {k} pods do not fit under {parent}")
                nxt += [(names[i], c) for i, c in got]
            picked = nxt
        out: list[int] = []
        for rack, count in picked:
            nodes = racks[rack]
            got = best_fit_domains(
                [fit[n] for n in nodes], count * k, [self.cluster.nodes[n].name for n in nodes]
            )
            for i, pods in got:
                out += [nodes[i]] * pods
        return out

    def _carried(self, level: str) -> bool:
        return any(n.labels.get(level) for n in self.cluster.nodes)


class KaiSubGroups(TreePolicy):
    """KAI with sub-groups (v2alpha2): the PodGroup's topologyConstraint prefers the leaf, each
    TP group is a subGroup of k pods whose topologyConstraint requires the NVLink domain. The
    job's domain is sought from the preferred level up (the whole cluster last), domains in
    KAI's default binpack order (the fewest free GPUs that hold the job first); in each, the
    sub-groups are placed one after another, each in the fullest NVLink domain that still holds
    it, pods on the fullest nodes; the first domain where every sub-group fits is taken."""

    name = "kai-subgroups"

    def tree(self, state: ClusterState, job: Job, tree: Tree) -> list[int] | Failure:
        fit = self.pods_fit(state)
        start = self.levels.index(LEAF)
        for level in [*self.levels[start:], None]:
            doms = self.by_domain(level) if level is not None else {"cluster": list(range(len(fit)))}
            ok = [
                (sum(fit[n] for n in nodes), d)
                for d, nodes in doms.items()
                if sum(fit[n] for n in nodes) >= tree.trays
            ]
            for _, d in sorted(ok):
                got = self._in(doms[d], fit, tree)
                if got is not None:
                    return got
        return Failure(f"no domain holds {tree.replicas} sub-groups of {tree.tp} pods")

    def _in(self, nodes: list[int], fit: list[int], tree: Tree) -> list[int] | None:
        left = {n: fit[n] for n in nodes}
        out: list[int] = []
        racks = self.by_domain(ACCELERATOR, nodes)
        for _ in range(tree.replicas):
            ok = sorted(
                (sum(left[n] for n in r), d) for d, r in racks.items() if sum(left[n] for n in r) >= tree.tp
            )
            if not ok:
                return None
            rack = racks[ok[0][1]]
            need = tree.tp
            for n in sorted(rack, key=lambda n: (left[n], n)):
                while need and left[n]:
                    left[n] -= 1
                    need -= 1
                    out.append(n)
        return out


class KubeTas(TreePolicy):
    """kube-scheduler 1.37's own topology-aware scheduling: one PodGroup for the whole job,
    `schedulingConstraints.topology[0].key` set as a user would, to the smallest level one
    domain of which can hold the job on an empty cluster (the NVLink domain for up to 18 trays,
    else the leaf, else the spine); no sub-groups. TopologyPlacement makes one candidate
    placement per domain of that key, NodeResourcesFit scores each MostAllocated (the domain
    left fullest), PodGroupPodsCount equal for all that hold the gang; inside the chosen
    domain the pods go one by one at the per-pod LeastAllocated score, random among ties."""

    name = "kube-tas"

    def tree(self, state: ClusterState, job: Job, tree: Tree) -> list[int] | Failure:
        level = self.smallest(tree)
        fit = self.pods_fit(state)
        doms = self.by_domain(level) if level is not None else {"cluster": list(range(len(fit)))}
        best: tuple[float, str] | None = None
        for d, nodes in doms.items():
            if sum(fit[n] for n in nodes) < tree.trays:
                continue
            total = sum(state.size[n] for n in nodes)
            used = total - sum(state.mask[n].bit_count() for n in nodes)
            score = (used + TRAY_GPUS * tree.trays) / total
            if best is None or (-score, d) < (-best[0], best[1]):
                best = (score, d)
        if best is None:
            return Failure(f"no domain of {level} holds the gang's {tree.trays} pods")
        got = self.one_by_one(state, doms[best[1]], tree.trays, least_allocated)
        return got if got is not None else Failure("the gang does not fit its domain")


class VolcanoTiers(TreePolicy):
    """Volcano's network-topology-aware gang (`networkTopology {mode, highestTierAllowed: 2}`):
    HyperNodes from the labels, tier 1 the NVLink domain, tier 2 the leaf. From tier 1 up to the
    highest allowed, the first tier with a HyperNode that holds the whole job wins, its fullest
    such HyperNode (binpack); the pods go one by one onto nodes with room, at random (the
    default nodeorder scores CPU and memory, alike here, and Volcano picks among equal nodes at
    random). `soft` places the job anywhere in the cluster when no HyperNode within the tier
    holds it; `hard` waits."""

    def __init__(
        self,
        cluster: SimCluster,
        allocators: Sequence[Allocator],
        trees: Mapping[int, Tree],
        seed: int,
        *,
        soft: bool,
    ) -> None:
        super().__init__(cluster, allocators, trees, seed)
        self.soft = soft
        self.name = "volcano-soft" if soft else "volcano-hard"
        self.tiers = list(self.levels[1:])

    def allowed(self, tree: Tree) -> list[str]:
        """The tiers the job may use: up to `VOLCANO_TIER`, or up to the smallest one that can
        hold it at all (a user raises highestTierAllowed for a job no leaf holds)."""
        own = self.smallest(tree)
        top = max(VOLCANO_TIER, self.tiers.index(own) + 1 if own in self.tiers else len(self.tiers))
        return self.tiers[:top]

    def tree(self, state: ClusterState, job: Job, tree: Tree) -> list[int] | Failure:
        fit = self.pods_fit(state)
        for level in self.allowed(tree):
            doms = self.by_domain(level)
            ok = sorted(
                (sum(state.mask[n].bit_count() for n in nodes), d)
                for d, nodes in doms.items()
                if sum(fit[n] for n in nodes) >= tree.trays
            )
            if ok:
                got = self.one_by_one(state, doms[ok[0][1]], tree.trays, None)
                if got is not None:
                    return got
        if self.soft:
            got = self.one_by_one(state, list(range(len(fit))), tree.trays, None)
            if got is not None:
                return got
        return Failure(f"no HyperNode up to tier {VOLCANO_TIER} holds {tree.trays} pods")


class GangBlind(TreePolicy):
    """A topology-blind gang scheduler (Coscheduling, or a PodGroup without topology): every
    pod at kube-scheduler's LeastAllocated score, random among ties, all or nothing."""

    name = "gang-blind"

    def tree(self, state: ClusterState, job: Job, tree: Tree) -> list[int] | Failure:
        got = self.one_by_one(state, list(range(len(state.mask))), tree.trays, least_allocated)
        return got if got is not None else Failure(f"fewer than {tree.trays} free trays")


def _volcano(soft: bool) -> Callable[[SimCluster, Sequence[Allocator], Mapping[int, Tree], int], TreePolicy]:
    def build(c: SimCluster, a: Sequence[Allocator], t: Mapping[int, Tree], s: int) -> TreePolicy:
        return VolcanoTiers(c, a, t, s, soft=soft)

    return build


#: The tree policies, in the order `simulate --jobs tree` runs and reports them.
TREE_POLICIES: Mapping[
    str, Callable[[SimCluster, Sequence[Allocator], Mapping[int, Tree], int], TreePolicy]
] = MappingProxyType(
    {
        "gputopo": GputopoTrees,
        "kueue-slices": KueueSlices,
        "kai-subgroups": KaiSubGroups,
        "kube-tas": KubeTas,
        "volcano-hard": _volcano(False),
        "volcano-soft": _volcano(True),
        "gang-blind": GangBlind,
    }
)


def build_tree_policy(
    name: str, cluster: SimCluster, allocators: Sequence[Allocator], trees: Mapping[int, Tree], seed: int
) -> TreePolicy:
    """A fresh tree policy; ValueError naming the known ones for an unknown name."""
    if name not in TREE_POLICIES:
        raise ValueError(f"unknown tree policy {name!r} (known: {', '.join(TREE_POLICIES)})")
    return TREE_POLICIES[name](cluster, allocators, trees, seed)
