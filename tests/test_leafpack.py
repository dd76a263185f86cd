"""Leaf packing of single pods (gputopo.pod.leafpack): among the nodes the objective ranks best,
the ones under the fullest leaf with room keep the top score, so empty leaves stay whole for
gangs. In the core (the ranking of equal nodes), against a brute-force oracle, in the
simulator's deployed policy, and over real HTTP through the sidecar and the kube-scheduler
stand-in."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gputopo.network.cluster import parse_cluster
from gputopo.network.levels import ACCELERATOR, FABRIC_TIER_PREFIX, HOSTNAME, LEAF, SPINE, NetworkIndex
from gputopo.network.nodeview import NodeView
from gputopo.node.allocator import AllocatorPool
from gputopo.node.topofile import load_preset
from gputopo.pod.leafpack import Leaves, leaf_levels
from gputopo.pod.objective import ClusterObjective, DemandMix
from gputopo.pod.placement import MAX_SCORE, node_scores
from gputopo.sim.clusters import from_snapshot
from gputopo.sim.policies.base import Failure
from gputopo.sim.policies.sidecar import SidecarPolicy
from gputopo.sim.state import ClusterState
from scheduler.picture.feed import from_cluster
from tests import fake_apiserver as fk

H100 = AllocatorPool().get(load_preset("hgx-h100"))
LEVELS = (HOSTNAME, LEAF, SPINE)


def _view(name: str, free: int) -> NodeView:
    return NodeView(name, {}, H100.n, frozenset(range(free)), H100)


def _ranked(views: list[NodeView], labels: Mapping[str, Mapping[str, str]], gpus: int = 1) -> dict[str, int]:
    """The core's ranking of a single pod's nodes with the leaf packing, free GPUs counted over
    every node given (candidates or not)."""
    net = NetworkIndex.build(((v.name, labels[v.name]) for v in views), LEVELS)
    free = {net.position[v.name]: len(v.free) for v in views}
    scores = node_scores(gpus, views, objective=ClusterObjective(DemandMix()))
    return Leaves.of(net).pack_scores(scores, net.position, free.__getitem__)


def _labels(leaf: str, spine: str = "s1") -> dict[str, str]:
    return {LEAF: leaf, SPINE: spine}


def test_two_equal_empty_nodes_the_one_in_the_fuller_leaf_ranks_first() -> None:
    """The empty nodes are the objective's best for a 1-GPU pod (same kind, same free set);
    leaf b already runs a full node (8 GPUs free in the leaf against a's 16), so its empty
    node is the one kept at the top."""
    views = [_view("a-n0", 8), _view("a-n1", 8), _view("b-n0", 8), _view("b-n1", 0)]
    labels = {v.name: _labels(v.name[0]) for v in views}
    plain = node_scores(1, views, objective=ClusterObjective(DemandMix()))
    assert plain["a-n0"] == plain["b-n0"] == MAX_SCORE  # the objective alone cannot tell them apart
    packed = _ranked(views, labels)
    assert packed["b-n0"] == MAX_SCORE and packed["a-n0"] == packed["a-n1"] == MAX_SCORE - 1
    assert packed["b-n1"] == 0  # no room: untouched


def test_the_objective_still_decides_before_the_leaf() -> None:
    """A partly used node is the objective's best for a 1-GPU pod (a whole one stays whole);
    its leaf being the emptier one does not move the pod to a whole node of a fuller leaf."""
    views = [_view("a-n0", 3), _view("a-n1", 8), _view("b-n0", 8), _view("b-n1", 0)]
    labels = {v.name: _labels(v.name[0]) for v in views}
    packed = _ranked(views, labels)
    assert packed["a-n0"] == MAX_SCORE
    assert packed["b-n0"] < MAX_SCORE and packed["a-n1"] < MAX_SCORE


def test_nodes_without_a_leaf_keep_their_score_and_one_leaf_changes_nothing() -> None:
    views = [_view("a-n0", 8), _view("a-n1", 8), _view("b-n0", 8), _view("b-n1", 0), _view("x", 8)]
    labels = {v.name: _labels(v.name[0]) for v in views} | {"x": {}}
    packed = _ranked(views, labels)
    assert packed["x"] == MAX_SCORE and packed["b-n0"] == MAX_SCORE and packed["a-n0"] == MAX_SCORE - 1
    same = {v.name: _labels("a") for v in views}
    assert _ranked(views, same) == node_scores(1, views, objective=ClusterObjective(DemandMix()))


def test_a_fabric_tier_0_label_names_the_leaf_where_a_node_carries_it() -> None:
    """Topograph's tier 0 (the switch nearest the node) is the leaf of a node that carries it;
    the older leaf label of a node that does not."""
    tier0 = f"{FABRIC_TIER_PREFIX}0"
    nodes = [("n0", {tier0: "t1", LEAF: "x"}), ("n1", {tier0: "t1", LEAF: "y"}), ("n2", {LEAF: "x"})]
    net = NetworkIndex.build(nodes, (HOSTNAME, tier0, LEAF, SPINE))
    leaves = Leaves.of(net)
    assert leaves.leaf[net.position["n0"]] == leaves.leaf[net.position["n1"]]
    assert leaves.leaf[net.position["n2"]] not in (-1, leaves.leaf[net.position["n0"]])
    none = Leaves.of(NetworkIndex.build(nodes, (HOSTNAME, ACCELERATOR)))  # no switch level at all
    assert not none.active and set(none.leaf) == {-1}


def test_a_cluster_with_its_own_levels_packs_its_smallest_switch_level() -> None:
    """Levels of the cluster's own (a Kueue Topology of rack and block, smallest first): the
    rack is the leaf; the node and its NVLink domain never are."""
    rack, block = "example.com/rack", "example.com/block"
    assert leaf_levels((HOSTNAME, ACCELERATOR, rack, block)) == [rack]
    assert leaf_levels((HOSTNAME, rack, LEAF, block)) == [LEAF]  # a leaf label names it
    assert leaf_levels((HOSTNAME, ACCELERATOR)) == []
    nodes = [
        ("n0", {rack: "r1", block: "b"}),
        ("n1", {rack: "r1", block: "b"}),
        ("n2", {rack: "r2", block: "b"}),
    ]
    leaves = Leaves.of(NetworkIndex.build(nodes, (HOSTNAME, rack, block)))
    assert leaves.leaf[0] == leaves.leaf[1] != leaves.leaf[2] and leaves.active
    free = [0, 2, 8]  # rack r1 has 2 GPUs free, r2 8: r1's node is kept
    assert leaves.fullest([1, 2], free.__getitem__) == [1]


_cluster = st.lists(
    st.tuples(st.sampled_from(["", "a", "b", "c"]), st.integers(0, 8), st.sampled_from([0, 1, 5, 9, 10])),
    min_size=1,
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(_cluster)
def test_pack_scores_equal_a_brute_force_oracle(nodes: list[tuple[str, int, int]]) -> None:
    """Random leaves, free GPUs and scores: the nodes at the top score in a leaf of the fewest
    free GPUs (summed over every node of the leaf) among the top nodes' leaves keep it, so do
    nodes without a leaf; the other top nodes lose one point; nothing else moves."""
    names = [f"n{i:02d}" for i in range(len(nodes))]
    net = NetworkIndex.build(
        ((n, {LEAF: leaf} if leaf else {}) for n, (leaf, _, _) in zip(names, nodes, strict=True)), LEVELS
    )
    free = {net.position[n]: f for n, (_, f, _) in zip(names, nodes, strict=True)}
    scores = {n: s for n, (_, _, s) in zip(names, nodes, strict=True)}
    got = Leaves.of(net).pack_scores(scores, net.position, free.__getitem__)
    room = {leaf: sum(f for lf, f, _ in nodes if lf == leaf) for leaf, _, _ in nodes if leaf}
    top_leaves = {leaf for leaf, _, s in nodes if leaf and s == MAX_SCORE}
    least = min((room[leaf] for leaf in top_leaves), default=None)
    for n, (leaf, _, s) in zip(names, nodes, strict=True):
        demoted = s == MAX_SCORE and leaf != "" and len(top_leaves) > 1 and room[leaf] != least
        assert got[n] == (s - 1 if demoted else s)
    assert (MAX_SCORE in scores.values()) == (MAX_SCORE in got.values())


@settings(max_examples=200, deadline=None)
@given(_cluster, st.data())
def test_fullest_by_room_is_fullest_with_the_leaves_sums(
    nodes: list[tuple[str, int, int]], data: Any
) -> None:
    """The simulator's form (each leaf's free GPUs given whole) keeps exactly the candidates,
    in their order, that `fullest` keeps adding up the leaf's nodes."""
    names = [f"n{i:02d}" for i in range(len(nodes))]
    net = NetworkIndex.build(
        ((n, {LEAF: leaf} if leaf else {}) for n, (leaf, _, _) in zip(names, nodes, strict=True)), LEVELS
    )
    leaves = Leaves.of(net)
    free = [0] * len(nodes)
    for n, (_, f, _) in zip(names, nodes, strict=True):
        free[net.position[n]] = f
    rooms = [sum(free[p] for p in members) for members in leaves.members]
    cands = data.draw(st.lists(st.integers(0, len(nodes) - 1), unique=True))
    assert leaves.fullest_by_room(cands, rooms.__getitem__) == leaves.fullest(cands, free.__getitem__)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 8), st.booleans()), max_size=60))
def test_the_states_leaf_sums_follow_every_take_and_give(steps: list[tuple[int, int, bool]]) -> None:
    """`ClusterState.group_free` kept by `take` and `give` equals a count from scratch after
    random takes and gives (a grouping with a node in no group, -1)."""
    cluster = from_snapshot(parse_cluster({"levels": list(LEVELS), "nodes": _two_leaves_nodes()}))
    state = ClusterState(cluster)
    groups = (0, 0, -1, 1)  # a-n0, a-n1 in group 0; b-n0 in none; b-n1 in group 1
    kept = state.group_free(groups, 2)
    assert state.group_free(groups, 2) is kept  # the same list, kept current
    for node, gpus, take in steps:
        free = state.free(node)
        used = [g for g in range(8) if g not in free]
        if take and len(free) >= gpus:
            state.take(node, free[:gpus])
        elif not take and used:
            state.give(node, used[:gpus])
        scratch = [0, 0]
        for n, g in enumerate(groups):
            if g >= 0:
                scratch[g] += len(state.free(n))
        assert kept == scratch


def test_a_grouping_that_does_not_fit_the_state_is_refused() -> None:
    cluster = from_snapshot(parse_cluster({"levels": list(LEVELS), "nodes": _two_leaves_nodes()}))
    state = ClusterState(cluster)
    for groups, count in (((0, 0, 0), 1), ((0, 0, 0, 2), 2), ((0, -2, 0, 0), 1)):
        with pytest.raises(ValueError, match="groups must give each of 4 nodes"):
            state.group_free(groups, count)
    kept = (0, 0, -1, 1)
    state.group_free(kept, 2)
    with pytest.raises(ValueError, match="already kept with 2 groups, not 3"):
        state.group_free(kept, 3)


def _two_leaves() -> Any:
    """Leaf a: two whole DGX A100 nodes; leaf b: one whole and one full. Every node a 1-GPU pod
    can take is empty and of one kind: the objective ranks them equal."""
    return from_cluster(parse_cluster({"levels": list(LEVELS), "nodes": _two_leaves_nodes()}))


def _two_leaves_nodes() -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "labels": {HOSTNAME: name, LEAF: leaf, SPINE: "s1"},
            "gpus": "dgx-a100",
            "allocated": used,
        }
        for name, leaf, used in (
            ("a-n0", "a", []),
            ("a-n1", "a", []),
            ("b-n0", "b", []),
            ("b-n1", "b", list(range(8))),
        )
    ]


def test_the_simulated_sidecar_puts_a_single_pod_in_the_fuller_leaf() -> None:
    """The simulator's deployed policy decides as the sidecar: on every seed (kube-scheduler's
    draw among equal totals) the 1-GPU pod goes to b-n0, and a 2-GPU one next to it; with leaf
    b's full node freed the leaves are equal and both are drawn."""
    cluster = from_snapshot(parse_cluster({"levels": list(LEVELS), "nodes": _two_leaves_nodes()}))
    names = [n.name for n in cluster.nodes]
    pool = AllocatorPool()
    drawn = set()
    for seed in range(20):
        pol = SidecarPolicy(
            "gputopo", cluster, [pool.get(t) for t in cluster.topologies], random.Random(seed), planner=True
        )
        state = ClusterState(cluster)
        got = pol.place_pod(state, 1)
        assert not isinstance(got, Failure) and names[got[0]] == "b-n0"
        state.take(*got)
        again = pol.place_pod(state, 2)
        assert not isinstance(again, Failure) and names[again[0]] == "b-n0"
        state.give(*got)
        full = names.index("b-n1")
        state.give(full, range(8))  # 16 GPUs free under each leaf: no leaf is fuller
        equal = pol.place_pod(state, 1)
        assert not isinstance(equal, Failure)
        drawn.add(names[equal[0]][0])
    assert drawn == {"a", "b"}


def test_the_sidecar_puts_a_single_pod_in_the_fuller_leaf_over_http(running) -> None:
    """Over real HTTP (filter -> prioritize -> bind by the kube-scheduler stand-in, which takes
    the best score and breaks ties by name): the pod lands on b-n0, under the leaf that already
    runs a full node, not on a-n0, the first of the equal nodes by name."""
    clock = [1000.0]
    _, standin = running(_two_leaves(), clock)
    pod = fk.pod("ml", "single", 1)
    out = standin.run([pod], clock=clock, idle_rounds=2)
    assert out.bound == {"ml/single": "b-n0"}
    second = fk.pod("ml", "second", 1)  # leaf b still has the fewer free GPUs: b-n0 again
    assert standin.run([second], clock=clock, idle_rounds=2).bound == {"ml/second": "b-n0"}
