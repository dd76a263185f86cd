"""The cluster-level objective for a single pod: what the job gains on a node against what the
placement costs the jobs that come after it.

The node objective (design.md §2, `allocator`) is exact inside one node and stays unchanged:
it picks the GPU set once the node is chosen. Which node — which kind of server — a pod should
get is a cluster-level question. Ranking nodes by the absolute ring bandwidth they offer (the
first cut) sent every small multi-GPU pod to the NVSwitch boxes while any had room; the 8-GPU
jobs after them then ran on PCIe boxes at 2.4x their ideal time (Philly replay: 0.975x the
throughput of kubelet's spreading, 366 h mean queueing against 183 h). This module ranks the
candidate nodes of one pod, larger first, by

  1. **good enough**: the job's efficiency on the node (the step time the measured job-time
     model, gputopo.jobtime, gives its set, relative to the best set of that size any server of
     the cluster offers, expected over the default mix of workload profiles: `CommProfile`)
     within `band` of the best efficiency any candidate offers now. A 1-GPU pod is efficient
     everywhere; an 8-GPU ring-bound job only on the best kind of server that has room.
  2. **least cost** among those: what the placement takes from the future, in the same unit
     (GPU-seconds of ideal work per second):
       - value lost: for groups of 8, 4 and 2 GPUs, the demand share of single pods of that
         size x the group's efficiency on this server x how many disjoint best groups the node
         keeps — a 4-GPU hole in an H100 costs more than the same hole in a PCIe box;
       - plus `frag_weight` x the growth of expected fragmentation (FGD, Alibaba ATC '23):
         for each size m, free GPUs a pod of m cannot use (|free| mod m), weighted by the
         demand share of m (gang members count as 8) and by the server's efficiency for m.
  3. the first cut's key: ring bandwidth, best fit, least disruption, pair sum.

Below the key, among the nodes at the extender's top score, the fullest leaf decides
(`gputopo.pod.leafpack`: the objective does not see the network).

Demand shares come from a `DemandMix` the caller feeds with the pods it sees (the sidecar: every
pod it filters; the simulator: every job as it arrives), with a prior until it has seen some.
docs/objective.md has why this one won (on the first job-time model) and how it measures on the
measured one.

Pure: no I/O, no clock, no globals; the caller owns the mix and the objective.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import combinations

from gputopo.jobtime.model import (
    RING_BUSBW_ENUMERATE_MAX,
    Nics,
    comm_s,
    intra_busbw_gbps,
    ring_busbw_gbps,
    step_s,
)
from gputopo.jobtime.profiles import PROFILE_MIXES, PROFILES, Profile
from gputopo.network.levels import NetworkIndex
from gputopo.node.allocator import DISRUPTION_SIZES, Allocator, Choice
from gputopo.node.policy import GpuPolicy

#: Pod size classes of the demand mix: 1, 2, 4, 8 (a pod of 3 counts as 4, of 5..8 as 8;
#: members of multi-node gangs count as 8, they take whole nodes).
SIZE_CLASSES: tuple[int, ...] = (1, 2, 4, 8)
#: Demand before anything was observed: a plain mix of the size classes' GPU shares.
DEFAULT_PRIOR: Mapping[int, float] = {1: 0.2, 2: 0.1, 4: 0.2, 8: 0.5}


#: A known-topology node's order for one pod (larger first): see `single_key`.
SingleKey = tuple[int, int, tuple[tuple[int, int, int], ...], int]


def single_key(free: frozenset[int], choice: Choice, gpus: int) -> SingleKey:
    """Order of nodes for one pod, larger first: ring of its set, then best fit (fewest GPUs
    left free: the emptier nodes stay whole for big jobs), then the node objective's least
    disruption (same leftover count, so the tuples compare like for like), then pair sum."""
    return (choice.ring_mbps, -(len(free) - gpus), choice.disruption, choice.pair_sum_mbps)


def size_class(gpus: int) -> int:
    """The class a pod of `gpus` GPUs counts in."""
    for m in SIZE_CLASSES:
        if gpus <= m:
            return m
    return SIZE_CLASSES[-1]


@dataclass(frozen=True)
class CommProfile:
    """How much a job's speed depends on the GPUs it gets, read from the measured job-time model
    (gputopo.jobtime.model: the all-reduce busbw of the set, its step time with overlap), the
    model the simulator runs jobs by. A pod does not say which model it trains, so a set's
    efficiency is the expected one over a mix of workload profiles (gputopo.jobtime.profiles):
    by default the simulator's default mix, so the sidecar weighs placements by the jobs the
    default run measures them on."""

    mix: str = "default"
    #: a job that declared what it trains (gputopo.io/profile, or its gradient bytes and compute
    #: seconds): its own profile replaces the mix
    profile: Profile | None = None

    def __post_init__(self) -> None:
        if self.mix not in PROFILE_MIXES:
            raise ValueError(f"unknown profile mix {self.mix!r} (known: {', '.join(PROFILE_MIXES)})")

    def shares(self) -> list[tuple[Profile, float]]:
        """(profile, share of jobs) of the mix, shares summing to 1; the declared profile alone
        when there is one."""
        if self.profile is not None:
            return [(self.profile, 1.0)]
        items = [(PROFILES[name], share) for name, share in PROFILE_MIXES[self.mix].items() if share > 0]
        total = sum(share for _, share in items)
        return [(p, share / total) for p, share in items]

    @cached_property
    def _shares(self) -> tuple[tuple[Profile, float], ...]:
        """`shares()`, worked out once (the fields are frozen); `efficiency` reads it per call."""
        return tuple(self.shares())

    def efficiency(self, gpus: int, busbw_gbps: float, best_gbps: float) -> float:
        """Expected ideal step time over actual of a `gpus`-GPU job whose all-reduce runs at
        `busbw_gbps` against `best_gbps` (the best set of that size anywhere): 1.0 at the best,
        less on a slower set; never above 1."""
        if gpus < 2 or busbw_gbps >= best_gbps:
            return 1.0
        eff = 0.0
        for p, share in self._shares:
            ideal = step_s(p.compute_s, p.overlap, comm_s(p.grad_bytes, gpus, best_gbps))
            actual = step_s(p.compute_s, p.overlap, comm_s(p.grad_bytes, gpus, max(busbw_gbps, 1e-3)))
            eff += share * ideal / actual
        return eff


class DemandMix:
    """GPU demand by size class, decayed so it follows the workload (`half_life` GPUs of
    observed demand halve the weight of what came before). The shares callers read are frozen
    for `refresh` observations at a time: they move slowly anyway, and the callers' caches of
    scores (keyed on `version`) then survive between pods."""

    def __init__(
        self, prior: Mapping[int, float] = DEFAULT_PRIOR, half_life: float = 20_000.0, refresh: int = 256
    ) -> None:
        if half_life <= 0:
            raise ValueError("half_life must be positive")
        total = sum(prior.get(m, 0.0) for m in SIZE_CLASSES)
        if total <= 0:
            raise ValueError("the prior needs a positive share for some size class")
        self._decay = 0.5 ** (1.0 / half_life)
        # the prior weighs as much as 100 GPUs of demand: a few pods already move it
        self._single = [100.0 * prior.get(m, 0.0) / total for m in SIZE_CLASSES]  # SIZE_CLASSES' order
        self._gang = 0.0
        self._version = 0
        self._refresh = max(1, refresh)
        self._pending = 0  # observations since the shares were frozen
        self.observations = 0  # pods observed in all
        self._steps: dict[int, tuple[float, int]] = {}  # gpus -> (decay**gpus, its class's place)
        self._frozen = self._shares()

    @property
    def version(self) -> int:
        """Changes whenever the shares may have: callers key their caches on it."""
        return self._version

    def observe(self, gpus: int, *, gang: bool = False) -> None:
        """One pod of `gpus` GPUs (a member of a multi-node gang when `gang`)."""
        if gpus < 1:
            return
        step = self._steps.get(gpus)  # the same float `decay**gpus` gives, found once per size
        if step is None:
            if len(self._steps) > 1024:
                self._steps.clear()
            step = self._steps[gpus] = (self._decay**gpus, SIZE_CLASSES.index(size_class(gpus)))
        factor = step[0]
        single = self._single = [v * factor for v in self._single]
        self._gang *= factor
        if gang:
            self._gang += gpus
        else:
            single[step[1]] += gpus
        self._pending += 1
        self.observations += 1
        if self._pending >= self._refresh or self._version == 0:
            self._pending = 0
            self._frozen = self._shares()
            self._version += 1

    def single(self, m: int) -> float:
        """Share of GPU demand from single-node pods of class m."""
        return self._frozen[0].get(m, 0.0)

    def whole(self, m: int) -> float:
        """Share of GPU demand that needs room for class m, gang members counted as 8."""
        return self._frozen[1].get(m, 0.0)

    def _shares(self) -> tuple[dict[int, float], dict[int, float]]:
        total = sum(self._single) + self._gang
        single = {m: v / total for m, v in zip(SIZE_CLASSES, self._single, strict=True)}
        whole = dict(single)
        whole[SIZE_CLASSES[-1]] = single.get(SIZE_CLASSES[-1], 0.0) + self._gang / total
        return single, whole


class ClusterObjective:
    """Ranks the candidate nodes of one pod (module docstring). Owns bounded caches keyed by
    allocator and free mask; the allocators should come from one `AllocatorPool`."""

    def __init__(
        self,
        mix: DemandMix | None = None,
        comm: CommProfile | None = None,
        *,
        band: float = 0.05,
        frag_weight: float = 1.0,
    ) -> None:
        if not 0 <= band < 1:
            raise ValueError(f"band must be within 0..1, got {band!r}")
        if frag_weight < 0:
            raise ValueError(f"frag_weight must be >= 0, got {frag_weight!r}")
        self._mix = mix if mix is not None else DemandMix()
        self.comm = comm or CommProfile()
        self.band = band
        self.frag_weight = frag_weight
        #: oversubscription above each level for the gang prediction (`gang.predict`); None:
        #: the model's defaults (`DEFAULT_OVERSUBSCRIPTION`), the simulator sets its run's table
        self.oversubscription: Mapping[str, float] | None = None
        self._best: dict[int, float] = {}  # size -> best busbw (GB/s) over every allocator seen
        self._busbws: dict[tuple[Allocator, int, int], float] = {}  # see `busbw`
        self._seen: set[int] = set()  # id() of allocators folded into _best
        self._keep: list[Allocator] = []  # ...kept alive so their ids stay theirs
        self._values: dict[tuple[int, int, int], float] = {}  # (allocator id, mask, mix version)
        self._costs: dict[tuple[object, ...], float] = {}  # see `_cost`
        self._recipes: dict[tuple[object, ...], _Recipe] = {}  # see `_cost`
        self._weighed: tuple[DemandMix, int, dict[int, float], dict[int, float]] | None = None
        self._terms: dict[tuple[int, int], list[tuple[int, float, int]]] = {}  # see `_value`
        self._effs: dict[tuple[Allocator, int, int], float] = {}  # (allocator, gpus, ring MB/s)
        self._worths: dict[int, list[tuple[int, float]]] = {}  # allocator id -> see `_frag_growth`
        self._takes: dict[tuple[object, ...], float] = {}  # see `take_cost`
        self._sets: dict[tuple[Allocator, tuple[int, ...]], float] = {}  # see `set_busbw`
        #: `gang.predict`'s memo of a node's NICs by (server model, NIC labels)
        self.nic_memo: dict[tuple[str | None, ...], Nics] = {}
        #: `gang.predict.bound_busbw`'s answers (they change only when a server is learned)
        self.bound_memo: dict[tuple[object, ...], float] = {}
        #: `gang.predict.bounds_busbw`'s answers: every level's bound for one gang shape at once
        self.bounds_memo: dict[tuple[object, ...], tuple[float, ...]] = {}
        self._domain_lists: tuple[object, dict[str, list[int]]] | None = None
        self._bounds: dict[int, float] = {}  # size -> `best_busbw`, until another server is learned
        self._declared: dict[Profile, ClusterObjective] = {}  # see `declared`
        #: a declared objective's parent: what a placement costs the jobs after it is the mix's
        #: question, not the declaring pod's, so its costs are the parent's (None: its own)
        self._future: ClusterObjective | None = None

    @property
    def mix(self) -> DemandMix:
        """The demand mix the costs weigh by. The memos of costs are keyed on its version, and
        two mixes count versions alike: setting another mix (a warm copy handed to a fresh
        sidecar) empties them."""
        return self._mix

    @mix.setter
    def mix(self, mix: DemandMix) -> None:
        if mix is not self._mix:
            self._mix = mix
            self._values.clear()
            self._costs.clear()
            self._takes.clear()
            self._weighed = None

    def learn(self, allocators: Iterable[Allocator]) -> None:
        """Fold servers into "the best ring this size can get anywhere" (idempotent)."""
        for a in allocators:
            if id(a) in self._seen:
                continue
            self._seen.add(id(a))
            self._keep.append(a)
            for m in range(2, a.n + 1):
                self._best[m] = max(self._best.get(m, 0.0), self.busbw(a, m, a.best_ring_mbps(m)))
            self._values.clear()
            self._costs.clear()
            self._recipes.clear()
            self._terms.clear()
            self._effs.clear()
            self._worths.clear()
            self._takes.clear()
            self._bounds.clear()
            self.bound_memo.clear()
            self.bounds_memo.clear()
        for sibling in self._declared.values():
            sibling.learn(self._keep)

    def declared(self, profile: Profile | None) -> ClusterObjective:
        """The objective for a pod or gang that declared `profile` (itself for None): the same
        demand mix, band and learned servers; the job's own efficiency (good enough, the gang's
        predicted job time) read for that profile alone, what the placement costs the jobs
        after it (value lost, fragmentation) still the mix's, this objective's own costs.
        Kept per profile (a handful: the named ones, and a custom one per distinct triple)."""
        if profile is None or profile == self.comm.profile:
            return self
        hit = self._declared.get(profile)
        if hit is None:
            if len(self._declared) > 64:
                self._declared.clear()
            hit = ClusterObjective(
                self._mix, CommProfile(self.comm.mix, profile), band=self.band, frag_weight=self.frag_weight
            )
            hit.oversubscription = self.oversubscription
            hit._future = self
            hit.learn(self._keep)
            self._declared[profile] = hit
        elif hit._mix is not self._mix:
            hit.mix = self._mix
        return hit

    def domain_lists(self, index: NetworkIndex) -> dict[str, list[int]]:
        """Each level's domain ids of `index` as plain lists, kept for the last index asked
        (a scheduler keeps one index per label version)."""
        kept = self._domain_lists
        if kept is None or kept[0] is not index:
            kept = self._domain_lists = (
                index,
                {lv: index.level(lv).domain_id.tolist() for lv in index.levels},
            )
        return kept[1]

    @property
    def servers(self) -> tuple[Allocator, ...]:
        """The servers `learn` has folded in, in the order it saw them."""
        return tuple(self._keep)

    def best_busbw(self, gpus: int) -> float:
        """The most busbw (GB/s) any set of `gpus` GPUs gets on any learned server (inf for one
        GPU, or a size no learned server has: nothing known bounds it). Not `_best`, the best
        ring's: on a direct-NVLink mesh a set with a weaker ring can reach more (DGX-1 V100: 5
        GPUs on the best ring 46 GB/s, another 5 with more links each 60), so every set of a
        mesh up to `RING_BUSBW_ENUMERATE_MAX` GPUs is read once per (server, size)."""
        if gpus < 2:
            return math.inf
        hit = self._bounds.get(gpus)
        if hit is None:
            hit = 0.0
            for a in self._keep:
                if a.n < gpus:
                    continue
                if a.topology.nvswitch or a.n > RING_BUSBW_ENUMERATE_MAX:
                    hit = max(hit, self.busbw(a, gpus, a.best_ring_mbps(gpus)))
                else:
                    hit = max(hit, max(self.set_busbw(a, s) for s in combinations(range(a.n), gpus)))
            hit = self._bounds[gpus] = hit if hit > 0 else math.inf
        return hit

    def set_busbw(self, alloc: Allocator, gpus: Sequence[int]) -> float:
        """The model's busbw of exactly these GPUs of this server (`intra_busbw_gbps`), kept."""
        key = (alloc, tuple(gpus))
        hit = self._sets.get(key)
        if hit is None:
            if len(self._sets) > 200_000:
                self._sets.clear()
            hit = self._sets[key] = intra_busbw_gbps(alloc.topology, key[1], alloc.ring_mbps(key[1]))
        return hit

    def busbw(self, alloc: Allocator, gpus: int, ring_mbps: int) -> float:
        """The model's all-reduce busbw of `gpus` GPUs of this server at a ring of `ring_mbps`
        (gputopo.jobtime.model.ring_busbw_gbps), kept per (server, size, ring)."""
        key = (alloc, gpus, ring_mbps)
        hit = self._busbws.get(key)
        if hit is None:
            if len(self._busbws) > 200_000:
                self._busbws.clear()
            hit = self._busbws[key] = ring_busbw_gbps(alloc, gpus, ring_mbps)
        return hit

    def efficiency(self, alloc: Allocator, gpus: int, ring_mbps: int) -> float:
        """The job's expected efficiency (`CommProfile.efficiency`) on `gpus` GPUs of this
        server at a ring of `ring_mbps`, against the best set of that size on any server the
        objective has learned; kept per (server, size, ring) until it learns another server."""
        key = (alloc, gpus, ring_mbps)
        hit = self._effs.get(key)
        if hit is None:
            if gpus < 2:
                return 1.0
            if id(alloc) not in self._seen:
                self.learn((alloc,))
            if len(self._effs) > 200_000:
                self._effs.clear()
            bw = self.busbw(alloc, gpus, ring_mbps)
            hit = self._effs[key] = self.comm.efficiency(gpus, bw, self._best.get(gpus, bw))
        return hit

    def keys(
        self, gpus: int, candidates: Mapping[tuple[GpuPolicy, frozenset[int]], Choice]
    ) -> dict[tuple[GpuPolicy, frozenset[int]], tuple[object, ...]]:
        """A comparable key (larger is better) per (allocator, free set) that fits `gpus`,
        given the allocator's choice on it."""
        self.learn(p.exact for p, _ in candidates)
        eff = {(p, free): self.efficiency(p.exact, gpus, c.ring_mbps) for (p, free), c in candidates.items()}
        floor = self.floor(eff.values())
        out: dict[tuple[GpuPolicy, frozenset[int]], tuple[object, ...]] = {}
        for (policy, free), choice in candidates.items():
            e = eff[(policy, free)]
            out[(policy, free)] = self.key(gpus, policy, free, choice, e, e >= floor)
        return out

    @property
    def learned(self) -> int:
        """How many servers `learn` has folded in: efficiencies (`efficiency`) change only
        when this does, so a caller may keep them, with the mix version for the costs."""
        return len(self._seen)

    def floor(self, effs: Iterable[float]) -> float:
        """The least efficiency that is good enough (`keys`' step 1: a candidate of efficiency
        `e` is when `e >= floor`) among candidates of these efficiencies. Called once per
        ranking: it also keeps the memos bounded."""
        if len(self._values) > 200_000:
            self._values.clear()
        if len(self._costs) > 200_000:
            self._costs.clear()
        if len(self._terms) > 200_000:
            self._terms.clear()
        if len(self._recipes) > 200_000:
            self._recipes.clear()
        return (1 - self.band) * max(effs, default=1.0)

    def key(
        self, gpus: int, policy: GpuPolicy, free: frozenset[int], choice: Choice, eff: float, ok: bool
    ) -> tuple[object, ...]:
        """One candidate's key in `keys` given its efficiency `eff` (`efficiency` of its
        choice's ring) and whether it is good enough (`eff >= floor` of the ranking): the
        candidates meet only through the floor, the rest is the candidate's own (a function of
        the allocator, the sets and the mix version)."""
        second = self._cost(policy.exact, free, choice) if ok else round(eff, 6)
        return (ok, second, single_key(free, choice, gpus))

    def cost(self, policy: GpuPolicy, free: frozenset[int], choice: Choice) -> float:
        """The second part of a good-enough candidate's key (`key(..., ok=True)[1]`), for a
        caller that keeps the rest of the key (it depends on no mix version)."""
        return self._cost(policy.exact, free, choice)

    def take_cost(self, policy: GpuPolicy, free: frozenset[int], taken: Iterable[int]) -> float:
        """What taking `taken` out of a node's `free` GPUs costs future demand: `keys`' least
        cost (value lost + frag_weight x fragmentation growth), for the gang planner's tie order."""
        if self._future is not None:
            return self._future.take_cost(policy, free, taken)
        alloc = policy.exact
        if id(alloc) not in self._seen:
            self.learn((alloc,))
        # A function of the allocator, the two sets, the mix version and the weight (what the
        # objective learned clears this memo): the planner asks the same few again and again.
        gpus = tuple(taken)
        key = (alloc, free, gpus, self._mix.version, self.frag_weight)
        hit = self._takes.get(key)
        if hit is None:
            if len(self._takes) > 200_000:
                self._takes.clear()
            f_mask = _mask(free)
            r_mask = f_mask & ~_mask(gpus)
            cost = self._value(alloc, f_mask) - self._value(alloc, r_mask)
            cost += self.frag_weight * self._frag_growth(alloc, f_mask.bit_count(), r_mask.bit_count())
            hit = self._takes[key] = cost
        return hit

    def _cost(self, alloc: Allocator, free: frozenset[int], choice: Choice) -> float:
        """The second key of a good-enough candidate: minus what taking `choice` out of `free`
        costs the future (value lost plus weighted fragmentation growth), rounded. A function of
        the allocator, the sets, the mix version and the weight: memoised on them. What does not
        depend on the mix (the groups of both sets and their efficiencies, the change of each
        size's leftover) is kept across versions (`_recipes`): a new version only weighs it, with
        `_value`'s and `_frag_growth`'s arithmetic in their order, so the floats are theirs."""
        if self._future is not None:
            return self._future._cost(alloc, free, choice)
        key = (alloc, free, choice.indices, self._mix.version, self.frag_weight)
        hit = self._costs.get(key)
        if hit is None:
            recipe = self._recipes.get(key[:3])
            if recipe is None:
                f_mask = _mask(free)
                r_mask = f_mask & ~_mask(choice.indices)
                before, after = f_mask.bit_count(), r_mask.bit_count()
                recipe = self._recipes[key[:3]] = (
                    self._terms_of(alloc, f_mask),
                    self._terms_of(alloc, r_mask),
                    [(m, worth, (after % m) - (before % m)) for m, worth in self._worths_of(alloc)],
                )
            single, whole = self._weights()
            cost = sum([single[m] * eff * count for m, eff, count in recipe[0]]) - sum(
                [single[m] * eff * count for m, eff, count in recipe[1]]
            )
            growth = 0.0
            for m, worth, delta in recipe[2]:
                growth += whole[m] * worth * delta
            cost += self.frag_weight * growth
            hit = self._costs[key] = -round(cost, 6)
        return hit

    def _weights(self) -> tuple[dict[int, float], dict[int, float]]:
        """The mix's factors of this version as `_cost` multiplies them: `single(m) * m` (the
        first product of `_value`'s terms, so the same float) and `whole(m)`, per size a group
        or a leftover can have; kept for one mix object and version."""
        mix, kept = self._mix, self._weighed
        if kept is None or kept[0] is not mix or kept[1] != mix.version:
            sizes = sorted({*SIZE_CLASSES, *DISRUPTION_SIZES})
            kept = self._weighed = (
                mix,
                mix.version,
                {m: mix.single(m) * m for m in sizes},
                {m: mix.whole(m) for m in sizes},
            )
        return kept[2], kept[3]

    def _value(self, alloc: Allocator, mask: int) -> float:
        """Ideal GPU-seconds per second that single pods of 2, 4 and 8 could still get here."""
        key = (id(alloc), mask, self._mix.version)
        hit = self._values.get(key)
        if hit is None:
            terms = self._terms_of(alloc, mask)
            hit = sum(self._mix.single(m) * m * eff * count for m, eff, count in terms)
            self._values[key] = hit
        return hit

    def _terms_of(self, alloc: Allocator, mask: int) -> list[tuple[int, float, int]]:
        """(size, efficiency of its best group, how many) of the groups a free mask offers: they
        do not depend on the mix, so they are kept across versions."""
        terms = self._terms.get((id(alloc), mask))
        if terms is None:
            free = [i for i in range(alloc.n) if mask >> i & 1]
            terms = self._terms[(id(alloc), mask)] = [
                (m, self.efficiency(alloc, m, best), count) for m, best, count in alloc.groups(free)
            ]
        return terms

    def _worths_of(self, alloc: Allocator) -> list[tuple[int, float]]:
        """The server's worth per size class above 1 (`_frag_growth`): not the mix's."""
        worths = self._worths.get(id(alloc))
        if worths is None:
            worths = self._worths[id(alloc)] = [
                (m, self.efficiency(alloc, m, alloc.best_ring_mbps(m)) if alloc.n >= m else 0.0)
                for m in SIZE_CLASSES[1:]
            ]
        return worths

    def _frag_growth(self, alloc: Allocator, before: int, after: int) -> float:
        """FGD's growth of expected fragmentation, each size weighted by this server's worth to it."""
        growth = 0.0
        for m, worth in self._worths_of(alloc):
            growth += self._mix.whole(m) * worth * ((after % m) - (before % m))
        return growth


#: What `ClusterObjective._cost` keeps of one (allocator, free set, choice) across mix versions:
#: the groups of the free set and of what stays (`_terms_of`), and per size class above 1 the
#: server's worth and the change of the leftover `|free| mod m`.
_Recipe = tuple[list[tuple[int, float, int]], list[tuple[int, float, int]], list[tuple[int, float, int]]]


def _mask(indices: Iterable[int]) -> int:
    mask = 0
    for i in indices:
        mask |= 1 << i
    return mask
