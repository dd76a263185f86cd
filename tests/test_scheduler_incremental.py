"""The views a long-lived ViewBuilder keeps up to date node by node (the state's change log,
`scheduler.model.NodeChanges`) equal a from-scratch build of the same snapshot, and the filter
answers it keeps and patches (`scheduler.picture.classes.Answers`) equal a fresh pass over the
candidates: after random sequences of node rewrites, bad annotations, additions, deletions,
bound pods' GPUs, own binds, reservations, pods seen ending and relists. Also: FileState and
the Layered maps it hands out stay equal to its store."""

from __future__ import annotations

from collections.abc import Iterator

from hypothesis import given, settings
from hypothesis import strategies as st

from gputopo.gang.reservations import Assumed, Reservation
from gputopo.network.annotation import NodeTopology
from gputopo.network.levels import CLUSTER, NetworkIndex
from gputopo.node.topofile import load_preset
from scheduler.model import NodeChanges, NodeInfo, Snapshot
from scheduler.picture import classes as nodeclasses
from scheduler.picture import views as viewbuilder
from scheduler.picture.cache import ClusterCache
from scheduler.picture.classes import NodeViews
from scheduler.picture.feed import FileState
from scheduler.picture.layered import Layered
from scheduler.picture.views import ViewBuilder

TOPOLOGIES = {m: load_preset(m) for m in ("dgx-a100", "dgx1-v100", "rtx8000-4")}
UNIVERSE = [f"n{i}" for i in range(7)]  # the candidates offered: some may not exist (unknown)


def info(name: str, model: str, allocated: frozenset[int], unhealthy: frozenset[int], lag: bool) -> NodeInfo:
    topo = TOPOLOGIES[model]
    allocated = frozenset(g for g in allocated if g < topo.n)
    unhealthy = frozenset(g for g in unhealthy if g < topo.n)
    published = NodeTopology(name, topo, unhealthy, allocated, 10.0, "test")
    return NodeInfo(name, {"leaf": leaf_of(name)}, topo.n, published, pods_know_allocations=lag)


def leaf_of(name: str) -> str:
    """Three leaves over the universe, so that leaf packing has nodes to choose between."""
    return str(int(name[1:]) % 3)


gpu_sets = st.frozensets(st.integers(0, 7), max_size=8)
ops = st.one_of(
    st.tuples(
        st.just("rewrite"),
        st.sampled_from(UNIVERSE),
        st.sampled_from(sorted(TOPOLOGIES)),
        gpu_sets,
        gpu_sets,
        st.booleans(),
    ),
    st.tuples(st.just("bad"), st.sampled_from(UNIVERSE), st.integers(0, 8)),
    st.tuples(st.just("delete"), st.sampled_from(UNIVERSE)),
    st.tuples(st.just("pods"), st.sampled_from(UNIVERSE), st.integers(0, 10)),
    st.tuples(st.just("assume"), st.sampled_from(UNIVERSE), st.integers(0, 3), gpu_sets),
    st.tuples(st.just("unassume"), st.integers(0, 3)),
    st.tuples(st.just("reserve"), st.sampled_from(UNIVERSE), st.integers(0, 3), gpu_sets),
    st.tuples(st.just("release"), st.integers(0, 3)),
    st.tuples(st.just("end"), st.sampled_from(UNIVERSE)),
    st.tuples(st.just("relist")),
    st.tuples(st.just("nothing")),
)


def same_views(long: NodeViews, fresh: NodeViews, nodes: dict[str, NodeInfo]) -> None:
    assert list(long) == list(fresh) == list(nodes)
    # the one-pass values()/items() (`NodeViews.every_view`) give the views `[]` gives
    assert [(v.name, v.free) for v in long.values()] == [(n, fresh[n].free) for n in nodes]
    assert [(n, v.free) for n, v in long.items()] == [(n, fresh[n].free) for n in nodes]
    assert all(long[n] is v for n, v in long.items())
    for name in nodes:
        a, b = long.node_class(name), fresh.node_class(name)
        assert a is not None and b is not None
        assert (a.gpu_count, a.free, a.offer, a.held, a.allocator is None) == (
            b.gpu_count,
            b.free,
            b.offer,
            b.held,
            b.allocator is None,
        ), name
        assert long[name].free == fresh[name].free and long[name].labels == fresh[name].labels
    for gpus in range(1, 9):  # eight sizes: all kept (`Answers.MAX_SIZES`)
        want = fresh._split(UNIVERSE, gpus, None)
        assert long.split(UNIVERSE, gpus) == want  # kept and patched, or a pass of its own
        assert long.split(UNIVERSE, gpus) == want  # the kept answer, asked again
        assert long.split(list(UNIVERSE), gpus) == want  # an equal list, another object


@settings(max_examples=150, deadline=None)
@given(st.lists(ops, min_size=1, max_size=30))
def test_incremental_views_equal_a_fresh_build(plan: list) -> None:
    check(plan)


@settings(max_examples=60, deadline=None)
@given(st.lists(ops, min_size=1, max_size=30))
def test_answers_redone_in_one_pass_equal_a_fresh_build(plan: list) -> None:
    """As above, with every patch of a kept answer made by the one-pass redo (the path a
    change of more than `REDO_AFTER` nodes takes)."""
    kept = nodeclasses.REDO_AFTER
    nodeclasses.REDO_AFTER = 0
    try:
        check(plan)
    finally:
        nodeclasses.REDO_AFTER = kept


@settings(max_examples=60, deadline=None)
@given(st.lists(ops, min_size=1, max_size=30), st.sampled_from([-(10**6), 2, 4]))
def test_views_folded_into_a_new_base_equal_a_fresh_build(plan: list, fold_after: int) -> None:
    """As above, with the views carried over folded into a new base at every build, or once a
    few were made or changed since the last fold (the path a build takes at scale once many
    were)."""
    kept = viewbuilder.FOLD_VIEWS_AFTER
    viewbuilder.FOLD_VIEWS_AFTER = fold_after
    try:
        check(plan)
    finally:
        viewbuilder.FOLD_VIEWS_AFTER = kept


def test_a_node_changed_after_a_fold_is_not_read_from_the_base() -> None:
    """Views folded into a base, then a node changed twice over builds that do not fold: its
    view is its new one, not the base's (the nodes changed since are carried as out of date)."""
    kept = viewbuilder.FOLD_VIEWS_AFTER
    viewbuilder.FOLD_VIEWS_AFTER = 4
    try:
        base = [("rewrite", n, "dgx-a100", frozenset(), frozenset(), False) for n in UNIVERSE]
        one, two = frozenset({0, 1}), frozenset({0, 1, 2})
        check(
            [
                *base,
                ("nothing",),
                ("rewrite", "n1", "dgx-a100", one, frozenset(), False),
                ("nothing",),
                ("rewrite", "n1", "dgx-a100", two, frozenset(), False),
                ("rewrite", "n2", "dgx-a100", two, frozenset(), False),
                ("nothing",),
            ]
        )
    finally:
        viewbuilder.FOLD_VIEWS_AFTER = kept


def test_a_fold_drops_the_base_views_of_nodes_changed_since() -> None:
    """A node changed after a fold, its view not read again, then a fold: the new base holds
    no view of it from before its change."""
    kept = viewbuilder.FOLD_VIEWS_AFTER
    viewbuilder.FOLD_VIEWS_AFTER = 2
    try:
        base = [("rewrite", n, "dgx-a100", frozenset(), frozenset(), False) for n in UNIVERSE]
        plan = [
            *base,
            ("nothing",),  # every view read: they fold into a base at the next build
            ("rewrite", "n1", "dgx-a100", frozenset({0}), frozenset(), False),
            ("rewrite", "n2", "dgx-a100", frozenset({0, 1}), frozenset(), False),  # out of date
            ("rewrite", "n3", "dgx-a100", frozenset({0, 1}), frozenset(), False),  # out of date
            ("rewrite", "n4", "dgx-a100", frozenset({0}), frozenset(), False),  # folds again
        ]
        long = ViewBuilder()
        for step, (snap, assumed, versions, by_node) in enumerate(replay(plan)):
            got = long.build(snap, assumed, versions[0], by_node, versions[1])
            if step == len(base):
                for name in UNIVERSE:
                    got[name]
        fresh = ViewBuilder().build(snap, assumed, versions[0], by_node, versions[1])
        for name in ("n2", "n3"):
            assert got[name].free == fresh[name].free == frozenset(range(2, 8))
    finally:
        viewbuilder.FOLD_VIEWS_AFTER = kept


def test_a_bind_forgotten_and_a_reservation_released_restore_the_common_class() -> None:
    base = [("rewrite", n, "dgx-a100", frozenset(), frozenset(), False) for n in UNIVERSE[:3]]
    check([*base, ("assume", "n1", 0, frozenset({0, 1})), ("unassume", 0)])
    check([*base, ("reserve", "n2", 1, frozenset({3})), ("release", 1)])
    check([*base, ("pods", "n0", 3), ("rewrite", "n0", "dgx1-v100", frozenset({1}), frozenset(), True)])


def replay(
    plan: list,
) -> Iterator[tuple[Snapshot, dict[str, Assumed], list[int], dict[str, list[Reservation]]]]:
    """Each step's snapshot, own binds, (assumed, reservations) versions and reservations by node."""
    nodes: dict[str, NodeInfo] = {}
    pod_gpus: dict[str, int] = {}
    ended: dict[str, frozenset[str]] = {}
    assumed: dict[str, Assumed] = {}
    reserved: dict[str, Reservation] = {}
    log = NodeChanges(limit=16)  # small: the log is cut now and then, and builds start over
    versions = [0, 0]
    labels_version, last_labels = 1, {}
    for step, op in enumerate(plan):
        kind = op[0]
        if kind == "rewrite":
            _, name, model, allocated, unhealthy, lag = op
            nodes[name] = info(name, model, allocated, unhealthy, lag)
            log.mark([name])
        elif kind == "bad":
            nodes[op[1]] = NodeInfo(op[1], {"leaf": "x"}, op[2], None, "annotation is not JSON")
            log.mark([op[1]])
        elif kind == "delete":
            nodes.pop(op[1], None)
            log.mark([op[1]])
        elif kind == "pods":
            pod_gpus[op[1]] = op[2]
            log.mark([op[1]])
        elif kind == "assume":
            _, name, k, gpus = op
            assumed[f"ns/a{k}"] = Assumed(f"ns/a{k}", name, tuple(sorted(gpus)), len(gpus), 20.0)
            versions[0] += 1
        elif kind == "unassume":
            if assumed.pop(f"ns/a{op[1]}", None) is not None:
                versions[0] += 1
        elif kind == "reserve":
            _, name, k, gpus = op
            node = nodes.get(name)
            n = node.topology.topology.n if node is not None and node.topology is not None else 0
            held = tuple(sorted(g for g in gpus if g < n))
            reserved[f"ns/r{k}"] = Reservation(f"ns/r{k}", "ns/g", name, held, len(held) or 1, 1e9)
            versions[1] += 1
        elif kind == "release":
            if reserved.pop(f"ns/r{op[1]}", None) is not None:
                versions[1] += 1
        elif kind == "end":
            ended = {**ended, op[1]: frozenset({f"ns/e{step}"})}
        elif kind == "relist":
            log.reset()
        by_node: dict[str, list[Reservation]] = {}
        for r in reserved.values():
            by_node.setdefault(r.node, []).append(r)
        labels = {n: i.labels for n, i in nodes.items()}
        if labels != last_labels:  # as the live store counts: a node added, removed or relabelled
            labels_version, last_labels = labels_version + 1, labels
        snap = Snapshot(
            Layered.of(nodes),
            {},
            {},
            step,
            dict(pod_gpus),
            dict(ended),
            changes=log,
            changes_seq=log.seq,
            labels_version=labels_version,
        )
        yield snap, assumed, versions, by_node


def check(plan: list) -> None:
    long = ViewBuilder()
    cache = ClusterCache(("leaf",))
    for snap, assumed, versions, by_node in replay(plan):
        nodes = dict(snap.nodes)
        got = long.build(snap, assumed, versions[0], by_node, versions[1])
        want = ViewBuilder().build(snap, assumed, versions[0], by_node, versions[1])
        same_views(got, want, nodes)
        fresh = ViewBuilder()
        fresh.build(snap, assumed, versions[0], by_node, versions[1])
        assert long.conflicts == fresh.conflicts
        net = cache.network(snap)  # kept while no node's labels changed, else rebuilt
        want_net = NetworkIndex.build(((i.name, i.labels) for i in nodes.values()), ("leaf",))
        assert (net.nodes, dict(net.position)) == (want_net.nodes, dict(want_net.position))
        for level in ("leaf", CLUSTER):
            got_level, want_level = net.level(level), want_net.level(level)
            assert list(got_level.names) == list(want_level.names)
            assert [m.tolist() for m in got_level.members] == [m.tolist() for m in want_level.members]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(UNIVERSE), gpu_sets, st.booleans()), min_size=1, max_size=20))
def test_file_state_hands_out_its_store(plan: list) -> None:
    """The snapshot's node map (layered on the last one) equals the store, in its order."""
    state = FileState([info(n, "dgx-a100", frozenset(), frozenset(), False) for n in UNIVERSE[:4]])
    for name, allocated, remove in plan:
        if remove:
            state.remove_node(name)
        else:
            state._nodes[name] = info(name, "dgx1-v100", allocated, frozenset(), False)
            state._changed(nodes=True, names=[name])
        snap = state.snapshot()
        assert list(snap.nodes.items()) == list(state._nodes.items())
        assert snap.changes is state.changes
