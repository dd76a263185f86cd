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
