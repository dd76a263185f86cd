"""A long-lived extender (its views rebuilt incrementally, node by node and class by class, as
annotations change under it) answers filter and prioritize exactly as a fresh Extender built on
the same cluster state, over real HTTP; and prioritize, which scores one node per class, gives
what `node_scores` gives over every candidate, with the leaf packing (`gputopo.pod.leafpack`).

Property-tested on small random clusters: several server models under the deterministic
policies (kubelet-default breaks ties at random, so two extenders may legitimately draw
different sets under it), nodes of unknown topology, bad annotations coming and going, binds
(whose nodes take the general path while the watch lags), and every node's in-use and
unhealthy sets rewritten at random between calls."""

from __future__ import annotations

import copy
import http.client
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gputopo.network.annotation import NodeTopology
from gputopo.network.levels import NetworkIndex
from gputopo.network.nodeview import ChoiceMemo
from gputopo.node.topofile import load_preset
from gputopo.pod.leafpack import Leaves
from gputopo.pod.objective import ClusterObjective
from gputopo.pod.placement import node_scores
from scheduler import defaults
from scheduler.extender import Extender
from scheduler.model import NodeInfo
from scheduler.picture.feed import FileState
from scheduler.picture.views import ViewBuilder
from scheduler.web.server import Server
from tests import fake_apiserver as fk

MODELS = ("dgx-a100", "dgx1-v100", "pcie8-plx", "rtx8000-4")
TOPOLOGIES = {m: load_preset(m) for m in MODELS}
POLICIES = ("gputopo", "best-effort-pairs", "best-combo")
LEAF = "network.topology.nvidia.com/leaf"


def anchor(model: str) -> str:
    """One node per model whose annotation never goes bad: the cluster always has every model,
    so "the best ring anywhere" is the same for a long-lived and a fresh objective."""
    return f"anchor-{model}"


def good(
    name: str, model: str, allocated: frozenset[int], unhealthy: frozenset[int], policy: str
) -> NodeInfo:
    topo = TOPOLOGIES[model]
    published = NodeTopology(name, topo, unhealthy, allocated, 0.0, "test", policy)
    return NodeInfo(name, {LEAF: f"leaf-{hash(name) % 2}"}, topo.n, published)


def bad(name: str, capacity: int) -> NodeInfo:
    return NodeInfo(name, {LEAF: "leaf-0"}, capacity, None, "annotation is not JSON")


@st.composite
def rewrite(draw: st.DrawFn, name: str, model: str) -> NodeInfo:
    n = TOPOLOGIES[model].n
    gpus = st.frozensets(st.integers(0, n - 1), max_size=n)
    if not name.startswith("anchor") and draw(st.integers(0, 5)) == 0:
        return bad(name, n)
    return good(
        name,
        model,
        draw(gpus),
        draw(gpus) if draw(st.booleans()) else frozenset(),
        draw(st.sampled_from(POLICIES)),
    )


#: name -> model of the cluster's nodes (plus two nodes that only ever publish a GPU count)
NODES = {anchor(m): m for m in MODELS} | {f"n{i}": MODELS[i % len(MODELS)] for i in range(6)}
COUNT_ONLY = ("plain-0", "plain-1")
NAMES = [*NODES, *COUNT_ONLY]


@st.composite
def rounds(draw: st.DrawFn) -> list[tuple[dict[str, NodeInfo], list[tuple[int, bool]]]]:
    """Per round: the nodes rewritten (a few, or all of them), then pods (GPUs, bind it?)."""
    out = []
    for _ in range(draw(st.integers(1, 4))):
        everyone = draw(st.booleans())
        chosen = sorted(NODES) if everyone else draw(st.lists(st.sampled_from(sorted(NODES)), max_size=4))
        infos = {name: draw(rewrite(name, NODES[name])) for name in chosen}
        pods = draw(
            st.lists(st.tuples(st.sampled_from([1, 1, 2, 3, 4, 8]), st.booleans()), min_size=1, max_size=3)
        )
        out.append((infos, pods))
    return out


def post(server: Server, path: str, doc: Any) -> Any:
    host, port = server.address
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request(
            "POST", path, body=json.dumps(doc).encode(), headers={"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        assert resp.status == 200
        return json.loads(resp.read())
    finally:
        conn.close()


@contextmanager
def served(ext: Extender) -> Iterator[Server]:
    server = Server(ext, "127.0.0.1", 0)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def extender(state: FileState) -> Extender:
    return Extender(state, defaults.DEFAULT_LEVELS, clock=lambda: 1000.0)


def ask(server: Server, pod: dict) -> tuple[Any, Any]:
    args = {"Pod": pod, "Nodes": None, "NodeNames": NAMES}
    return post(server, "/filter", args), post(server, "/prioritize", args)


@settings(max_examples=25, deadline=None)
@given(rounds())
def test_a_long_lived_extender_answers_as_a_fresh_one(plan: list) -> None:
    infos = [good(name, model, frozenset(), frozenset(), "gputopo") for name, model in NODES.items()]
    state = FileState([*infos, *(bad(n, 8) for n in COUNT_ONLY)])
    warm = extender(state)
    with served(warm) as warm_server:
        check(state, warm, warm_server, plan)


def check(state: FileState, warm: Extender, warm_server: Server, plan: list) -> None:
    seq = 0
    for rewritten, pods in plan:
        nodes = state._nodes  # the test stands in for the watch: annotations rewritten in place
        for name, info in rewritten.items():
            nodes[name] = replace(info, pods_know_allocations=False)
        state._changed(nodes=True, gpus=True, names=rewritten)  # the long-lived one redoes those only
        for gpus, do_bind in pods:
            seq += 1
            pod = fk.pod("ml", f"p{seq}", gpus)
            got_filter, got_scores = ask(warm_server, pod)

            fresh = extender(state)  # built now, on the same state, knowing the same demand mix
            fresh.objective.mix = copy.deepcopy(warm.objective.mix)
            fresh._observed = dict(warm._observed)
            with served(fresh) as fresh_server:
                assert ask(fresh_server, pod) == (got_filter, got_scores)

            # one node per class scored == every candidate scored
            builder = ViewBuilder()
            views = builder.build(state.snapshot(), {}, 0, {}, 0)
            objective = ClusterObjective(copy.deepcopy(warm.objective.mix))
            objective.learn(p.exact for p in builder.used_policies.values())
            want = node_scores(gpus, [views[n] for n in NAMES], memo=ChoiceMemo(), objective=objective)
            # ...and the leaf packing over every node's score (gputopo.pod.leafpack)
            snap = state.snapshot()
            net = NetworkIndex.build(
                ((i.name, i.labels) for i in snap.nodes.values()), defaults.DEFAULT_LEVELS
            )
            free = {net.position[n]: views.count(n) or 0 for n in net.nodes}
            want = Leaves.of(net).pack_scores(want, net.position, free.__getitem__)
            assert {s["Host"]: s["Score"] for s in got_scores} == want

            fits = got_filter["NodeNames"]
            assert sorted(fits + list(got_filter["FailedNodes"])) == sorted(NAMES)
            for name in fits:
                assert len(views[name].free) >= gpus
            if do_bind and fits:
                best = max(fits, key=lambda n: ({s["Host"]: s["Score"] for s in got_scores}[n], n))
                bind = {
                    "PodName": f"p{seq}",
                    "PodNamespace": "ml",
                    "PodUID": pod["metadata"]["uid"],
                    "Node": best,
                }
                assert post(warm_server, "/bind", bind) == {"Error": ""}
