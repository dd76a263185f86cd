"""A memo shared across planning calls (as the gang tracker and the simulator share one) must
not change a plan: every plan made with the shared memo equals the plan of a fresh memo, while
the cluster changes a few nodes at a time between gangs (so most domains' evaluations are
reused, and the changed ones must not be)."""

from __future__ import annotations

import random

import pytest

from gputopo.allocator import AllocatorPool
from gputopo.gang import ChoiceMemo, GangPlan, GangSpec, Member, NodeView, plan_gang
from gputopo.network import NetworkIndex
from gputopo.sim.clusters import default_cluster


@pytest.mark.parametrize("seed", range(4))
def test_plans_with_a_shared_memo_equal_plans_with_a_fresh_one(seed: int) -> None:
    cluster = default_cluster()
    pool = AllocatorPool()
    allocators = [pool.get(t) for t in cluster.topologies]
    index = NetworkIndex.build(((n.name, n.labels) for n in cluster.nodes), cluster.levels)
    sizes = [cluster.topologies[n.topology].n for n in cluster.nodes]
    masks = [(1 << s) - 1 for s in sizes]
    made: dict[tuple[int, int], NodeView] = {}  # one view object per (node, free mask), as the sim

    def view(i: int) -> NodeView:
        key = (i, masks[i])
        if key not in made:
            node = cluster.nodes[i]
            free = frozenset(g for g in range(sizes[i]) if masks[i] >> g & 1)
            made[key] = NodeView(node.name, node.labels, sizes[i], free, allocators[node.topology])
        return made[key]

    rng = random.Random(seed)
    shared = ChoiceMemo()
    planned = 0
    for step in range(40):
        for i in rng.sample(range(len(masks)), 3):  # a few nodes change between gangs
            masks[i] = rng.getrandbits(sizes[i])
        views = [view(i) for i in range(len(masks))]
        g = rng.choice([1, 2, 4, 8])
        spec = GangSpec(f"ns/g{step}", tuple(Member(f"ns/p{k}", g) for k in range(rng.randint(2, 12))))
        with_shared = plan_gang(spec, views, cluster.levels, index=index, memo=shared)
        fresh = plan_gang(spec, views, cluster.levels, index=index)
        assert with_shared == fresh
        planned += isinstance(fresh, GangPlan)
    assert planned > 10 and shared.domains  # the memo was filled and plans were made


@pytest.mark.parametrize("seed", range(4))
def test_a_memo_shared_by_planners_with_different_objectives_gives_each_its_own_plan(seed: int) -> None:
    """One memo, two cluster objectives that order nodes differently (no fragmentation weight
    and a heavy one; all-small and all-large demand): a domain worked out for one must not be
    read back for the other, though the views, the shape and the mix versions are the same."""
    from gputopo.clusterobjective import ClusterObjective, DemandMix

    cluster = default_cluster()
    pool = AllocatorPool()
    allocators = [pool.get(t) for t in cluster.topologies]
    index = NetworkIndex.build(((n.name, n.labels) for n in cluster.nodes), cluster.levels)
    sizes = [cluster.topologies[n.topology].n for n in cluster.nodes]
    rng = random.Random(seed)
    objectives = [
        ClusterObjective(DemandMix({1: 1.0}), frag_weight=0.0),
        ClusterObjective(DemandMix({8: 1.0}), frag_weight=10.0),
    ]
    shared = ChoiceMemo()
    differed = 0
    for step in range(40):
        masks = [rng.getrandbits(s) | rng.getrandbits(s) for s in sizes]
        views = []
        for i, node in enumerate(cluster.nodes):
            free = frozenset(g for g in range(sizes[i]) if masks[i] >> g & 1)
            views.append(NodeView(node.name, node.labels, sizes[i], free, allocators[node.topology]))
        g = rng.choice([1, 2])  # several members per node: the domain evaluation's path
        spec = GangSpec(f"ns/g{step}", tuple(Member(f"ns/p{k}", g) for k in range(rng.randint(3, 10))))
        fresh = [plan_gang(spec, views, cluster.levels, index=index, objective=o) for o in objectives]
        for o, want in zip(objectives, fresh, strict=True):
            assert plan_gang(spec, views, cluster.levels, index=index, memo=shared, objective=o) == want
        differed += fresh[0] != fresh[1]
    assert differed  # the two objectives do disagree somewhere, or the test would prove nothing
