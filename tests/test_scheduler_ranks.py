"""Prioritize's kept picture (`scheduler.picture.ranks.Ranks`) answers what the per-node path
does (classes grouped name by name, `node_scores` of one node per class with the reservation
rule, the leaf packing of `Leaves.pack_scores`), after random sequences of node rewrites, bad
annotations, deletions, bound pods, own binds, reservations, pods seen ending and relists; for
the filter's own answer asked back, the whole candidate list, a subset of it, and in every
pod size. Its encoded reply is the JSON of the same pairs; the sidecar over HTTP answers from it."""

from __future__ import annotations

import random
import time

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from gputopo.network.levels import NetworkIndex
from gputopo.network.nodeview import ChoiceMemo
from gputopo.pod.leafpack import Leaves
from gputopo.pod.objective import ClusterObjective, DemandMix
from scheduler.extender import _class_scores, _per_node_scores
from scheduler.picture.cache import ClusterCache
from scheduler.picture.classes import NodeClass, NodeViews
from scheduler.picture.ranks import Ranked
from scheduler.picture.views import ViewBuilder
from tests import fake_apiserver as fk
from tests.test_scheduler_incremental import UNIVERSE, ops, replay


def per_node(
    views: NodeViews,
    names: list[str],
    gpus: int,
    leaves: Leaves,
    net: NetworkIndex,
    memo: ChoiceMemo,
    objective: ClusterObjective,
) -> list[int]:
    """The per-node path the extender falls back to (`_per_node_scores`)."""

    def score(reps: list[NodeClass], rep_names: list[str]) -> list[int]:
        return _class_scores(gpus, reps, [views[n] for n in rep_names], memo, objective)

    return _per_node_scores(names, views, net, leaves, score)


def check(plan: list, seed: int) -> int:
    """Replay `plan`; after each step compare the kept answer with the per-node path. Returns
    how many questions the kept picture answered (the rest fell back, as they must)."""
    rng = random.Random(seed)
    builder = ViewBuilder()
    cache = ClusterCache(("leaf",))
    memo, objective = ChoiceMemo(), ClusterObjective(DemandMix())
    answered = 0
    for snap, assumed, versions, by_node in replay(plan):
        views = builder.build(snap, assumed, versions[0], by_node, versions[1])
        net = cache.network(snap)
        leaves = Leaves.of(net)
        for gpus in rng.sample(range(1, 9), 3):
            ok, _, _ = views.split(UNIVERSE, gpus)  # the filter: keeps the candidate list
            subset = [n for n in UNIVERSE if rng.random() < 0.6]
            repeats = ok + ok[:2]  # a name asked twice scores as once
            for names in (ok, list(UNIVERSE), subset, repeats, ok):

                def score(
                    reps: list[NodeClass], rep_names: list[str], gpus: int = gpus, views: NodeViews = views
                ) -> list[int]:
                    return _class_scores(gpus, reps, [views[n] for n in rep_names], memo, objective)

                got = builder.ranks.rank(names, gpus, views.class_map(), net, leaves, score)
                want = per_node(views, names, gpus, leaves, net, memo, objective)
                if got is None:
                    continue
                answered += 1
                assert list(got.scores) == want, (names, gpus)
                assert orjson.loads(got.encode()) == [
                    {"Host": n, "Score": s} for n, s in zip(names, want, strict=True)
                ]
        # a candidate the network index does not hold: the per-node path answers
        outsider = builder.ranks.rank(
            ["elsewhere"], 1, views.class_map(), net, leaves, lambda r, n: [0] * len(r)
        )
        assert outsider is None
    return answered


@settings(max_examples=120, deadline=None)
@given(st.lists(ops, min_size=1, max_size=30), st.integers(0, 2**16))
def test_kept_scores_equal_the_per_node_path(plan: list, seed: int) -> None:
    check(plan, seed)


def test_the_kept_picture_answers_after_rewrites_binds_and_reservations() -> None:
    """A fixed sequence that exercises each patch (not only fallbacks): every step is answered."""
    base = [("rewrite", n, "dgx-a100", frozenset(), frozenset(), False) for n in UNIVERSE]
    plan = [
        *base,
        ("rewrite", "n1", "dgx-a100", frozenset({0, 1}), frozenset(), False),
        ("assume", "n2", 0, frozenset({0, 1, 2, 3})),
        ("reserve", "n3", 1, frozenset({4, 5})),
        ("pods", "n4", 3),
        ("rewrite", "n5", "dgx1-v100", frozenset({1}), frozenset(), True),
        ("delete", "n6"),
        ("release", 1),
        ("unassume", 0),
        ("relist",),
        ("rewrite", "n0", "rtx8000-4", frozenset({0}), frozenset(), False),
    ]
    assert check(plan, 0) >= 2 * 3 * (len(plan) - len(UNIVERSE))


def test_ranked_pairs_and_encoding_without_kept_fragments() -> None:
    r = Ranked(["a", 'b"c'], [3, 10])
    assert r.pairs() == [("a", 3), ('b"c', 10)]
    assert orjson.loads(r.encode()) == [{"Host": "a", "Score": 3}, {"Host": 'b"c', "Score": 10}]
    assert Ranked([], []).encode() == b"[]"


def test_the_sidecar_answers_prioritize_from_the_kept_picture_over_http() -> None:
    """Over HTTP on a generated fat tree: filter, then prioritize of its answer, each size, with
    binds between; each reply equals the per-node path's scores for the same views."""
    import http.client

    from gputopo.network.cluster import generate_cluster
    from scheduler.extender import Extender
    from scheduler.model import parse_pod
    from scheduler.picture.feed import from_cluster
    from scheduler.web.server import Server

    mix = {"dgx-a100": 2.0, "hgx-h100": 1.0, "dgx1-v100": 1.0}
    snap = generate_cluster(1, 4, 5, mix, 3, busy_fraction=0.3)
    state = from_cluster(snap)
    ext = Extender(state, snap.levels, clock=time.time)
    srv = Server(ext, "127.0.0.1", 0)
    srv.start()
    try:
        conn = http.client.HTTPConnection(*srv.address, timeout=30)

        def post(path: str, doc: object) -> object:
            conn.request("POST", path, orjson.dumps(doc), {"Content-Type": "application/json"})
            return orjson.loads(conn.getresponse().read())

        names = sorted(state.snapshot().nodes)
        kept_before = 0
        for i in range(12):
            p = fk.pod("ml", f"p{i}", (1, 2, 4, 8)[i % 4])
            got = post("/filter", {"Pod": p, "NodeNames": names})
            assert isinstance(got, dict)
            ok = got["NodeNames"]
            if not ok:
                continue
            reply = post("/prioritize", {"Pod": p, "NodeNames": ok})
            assert isinstance(reply, list)
            info = parse_pod(p)
            with ext._lock:
                snap_now, views = ext._current(time.time())
                net = ext.cache.network(snap_now)
                want = per_node(views, ok, info.gpus, Leaves.of(net), net, ext.gangs.memo(), ext.objective)
            assert [(h["Host"], h["Score"]) for h in reply] == list(zip(ok, want, strict=True))
            kept_before += 1
            best = max(reply, key=lambda h: h["Score"])["Host"]
            meta = p["metadata"]
            bound = post(
                "/bind",
                {
                    "PodName": meta["name"],
                    "PodNamespace": meta["namespace"],
                    "PodUID": meta["uid"],
                    "Node": best,
                },
            )
            assert bound == {"Error": ""}
        assert kept_before >= 8
    finally:
        srv.stop()
