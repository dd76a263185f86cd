"""A memo shared across planning calls (as the gang tracker and the simulator share one) must
not change a plan: every plan made with the shared memo equals the plan of a fresh memo, while
the cluster changes a few nodes at a time between gangs (so most domains' evaluations are
reused, and the changed ones must not be)."""

from __future__ import annotations

import random

import pytest

from gputopo.gang.memo import PlanMemo
from gputopo.gang.planner import GangPlan, GangSpec, Member, plan_gang
from gputopo.network.levels import NetworkIndex
from gputopo.network.nodeview import NodeView
from gputopo.node.allocator import AllocatorPool
from gputopo.node.topology import make_topology
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
    shared = PlanMemo()
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
    assert planned > 10 and shared.held  # the memo was filled and plans were made


@pytest.mark.parametrize("seed", range(4))
def test_a_memo_shared_by_planners_with_different_objectives_gives_each_its_own_plan(seed: int) -> None:
    """One memo, two cluster objectives that order nodes differently (no fragmentation weight
    and a heavy one; all-small and all-large demand): a domain worked out for one must not be
    read back for the other, though the views, the shape and the mix versions are the same."""
    from gputopo.pod.objective import ClusterObjective, DemandMix

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
    shared = PlanMemo()
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


@pytest.mark.parametrize("seed", range(3))
def test_plans_ranked_by_an_objective_with_a_shared_memo_equal_fresh_plans(seed: int) -> None:
    """The same with the cluster objective (4) that the tracker passes, while nodes also change
    server now and then (another allocator at the same name): the node layout kept in the memo
    learns only the servers it has not seen, finds the largest node again only when a GPU
    count changed, and the single-offer path's picks (kept with their spans) stay the fresh
    memo's. The fresh side uses a fresh objective over the same demand mix each time, so what
    the shared one learned must be exactly every server in the views."""
    from gputopo.pod.objective import ClusterObjective, DemandMix

    cluster = default_cluster()
    pool = AllocatorPool()
    servers = [pool.get(t) for t in cluster.topologies]
    # a 2-GPU server with the best pair of all: learning it changes every 2-GPU efficiency
    servers.append(pool.get(make_topology([["X", "NV36"], ["NV36", "X"]], name="pair")))
    index = NetworkIndex.build(((n.name, n.labels) for n in cluster.nodes), cluster.levels)
    server = [n.topology for n in cluster.nodes]
    masks = [(1 << servers[s].n) - 1 for s in server]
    made: dict[tuple[int, int, int], NodeView] = {}

    def view(i: int) -> NodeView:
        key = (i, server[i], masks[i])
        if key not in made:
            node, alloc = cluster.nodes[i], servers[server[i]]
            free = frozenset(g for g in range(alloc.n) if masks[i] >> g & 1)
            made[key] = NodeView(node.name, node.labels, alloc.n, free, alloc)
        return made[key]

    rng = random.Random(seed)
    mix = DemandMix()
    shared, objective = PlanMemo(), ClusterObjective(mix)
    planned = 0
    ever: set[int] = set()  # every server the views have held (learning only adds)
    for step in range(40):
        for i in rng.sample(range(len(masks)), 3):
            if rng.random() < 0.15 + 0.1 * seed:
                server[i] = rng.randrange(len(servers))
            masks[i] = rng.getrandbits(servers[server[i]].n)
        views = [view(i) for i in range(len(masks))]
        g = rng.choice([1, 2, 8, 8])
        mix.observe(g)  # the mix moves on: the objective's take costs with it
        spec = GangSpec(f"ns/g{step}", tuple(Member(f"ns/p{k}", g) for k in range(rng.randint(2, 8))))
        kept = plan_gang(spec, views, cluster.levels, index=index, memo=shared, objective=objective)
        fresh = plan_gang(spec, views, cluster.levels, index=index, objective=ClusterObjective(mix))
        assert kept == fresh
        ever |= {id(v.allocator.exact) for v in views if v.allocator is not None}
        assert objective.learned == len(ever)  # the layout learned each new server at once
        planned += isinstance(fresh, GangPlan)
    assert planned > 10 and any(s == len(servers) - 1 for s in server)


def test_a_kept_layout_finds_the_largest_node_again_when_gpu_counts_change() -> None:
    """The layout kept in the memo keeps the largest node's GPU count until a changed node's
    count differs: servers swapped for smaller ones (and back) answer as a fresh memo, "the
    largest node has 2" included."""
    pool = AllocatorPool()
    big = pool.get(default_cluster().topologies[1])
    pair = pool.get(make_topology([["X", "NV4"], ["NV4", "X"]], name="pair"))
    index = NetworkIndex.build([(f"n{i}", {}) for i in range(3)], ("kubernetes.io/hostname",))
    spec = GangSpec("ns/g", (Member("ns/a", 4), Member("ns/b", 4)))
    shared = PlanMemo()
    reasons = []
    for step in ([big] * 3, [pair, big, pair], [pair] * 3, [big, pair, pair], [big] * 3):
        views = [NodeView(f"n{i}", {}, a.n, frozenset(range(a.n)), a) for i, a in enumerate(step)]
        kept = plan_gang(spec, views, ("kubernetes.io/hostname",), index=index, memo=shared)
        assert kept == plan_gang(spec, views, ("kubernetes.io/hostname",), index=index)
        reasons.append(getattr(kept, "reason", ""))
    assert [isinstance(r, str) and "the largest node has 2" in r for r in reasons] == [0, 0, 1, 0, 0]
