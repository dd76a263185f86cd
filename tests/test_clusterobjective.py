"""The cluster-level single-pod objective: which kind of server a pod should get."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gputopo.network.nodeview import NodeView
from gputopo.node.allocator import AllocatorPool
from gputopo.node.topofile import load_preset
from gputopo.pod.objective import ClusterObjective, CommProfile, DemandMix, size_class
from gputopo.pod.placement import node_scores

POOL = AllocatorPool()
KINDS = {name: POOL.get(load_preset(name)) for name in ("hgx-h100", "dgx1-v100", "pcie8-plx")}


def view(name: str, kind: str, free: set[int] | None = None) -> NodeView:
    alloc = KINDS[kind]
    return NodeView(name, {}, alloc.n, frozenset(range(alloc.n) if free is None else free), alloc)


def best_node(scores: dict[str, int]) -> str:
    top = max(scores.values())
    (name,) = [n for n, s in scores.items() if s == top]
    return name


def test_a_single_gpu_pod_breaks_the_server_worth_least_to_others() -> None:
    """All whole: a 1-GPU pod gains alike everywhere, so it takes a GPU where the 8-, 4- and
    2-GPU groups it breaks are slowest — the PCIe box, not the NVSwitch box."""
    nodes = [view("h100", "hgx-h100"), view("dgx1", "dgx1-v100"), view("pcie", "pcie8-plx")]
    assert best_node(node_scores(1, nodes, objective=ClusterObjective())) == "pcie"
    # the first cut sent it to the NVSwitch box: its leftover groups have the best rings
    assert best_node(node_scores(1, nodes)) == "h100"


def test_an_8_gpu_ring_goes_to_the_best_server_with_room() -> None:
    nodes = [view("h100", "hgx-h100"), view("dgx1", "dgx1-v100"), view("pcie", "pcie8-plx")]
    objective = ClusterObjective()
    assert best_node(node_scores(8, nodes, objective=objective)) == "h100"
    # with no NVSwitch box free the DGX-1 (NVLink ring) beats the PCIe box
    assert best_node(node_scores(8, nodes[1:], objective=objective)) == "dgx1"


def test_a_partly_used_node_is_filled_before_a_whole_one_is_broken() -> None:
    """Two free GPUs left on an H100: taking them costs only 2-GPU groups, while breaking a
    whole PCIe box costs its 8-GPU group and adds fragmentation for 8-GPU demand."""
    nodes = [view("pcie", "pcie8-plx"), view("h100-part", "hgx-h100", {6, 7})]
    assert best_node(node_scores(2, nodes, objective=ClusterObjective())) == "h100-part"


def test_good_enough_is_relative_to_what_is_free_now() -> None:
    """A 2-GPU pod on an NVLink pair of a DGX-1 is within the band of an NVSwitch pair only
    if the band is wide; with a narrow band the H100 wins on efficiency."""
    nodes = [view("h100", "hgx-h100"), view("dgx1", "dgx1-v100")]
    wide = ClusterObjective(band=0.2)
    narrow = ClusterObjective(band=0.01)
    assert best_node(node_scores(2, nodes, objective=wide)) == "dgx1"  # in band: the cheaper node
    assert best_node(node_scores(2, nodes, objective=narrow)) == "h100"


def test_demand_mix_follows_what_it_observes() -> None:
    mix = DemandMix(half_life=64, refresh=1)
    for _ in range(200):
        mix.observe(8, gang=True)
    assert mix.whole(8) > 0.9 and mix.single(8) < 0.1
    for _ in range(400):
        mix.observe(1)
    assert mix.single(1) > 0.9
    assert sum(mix.single(m) for m in (1, 2, 4, 8)) + (mix.whole(8) - mix.single(8)) == pytest.approx(1.0)
    v = mix.version
    mix.observe(0)  # nothing asked, nothing learnt
    assert mix.version == v
    assert [size_class(g) for g in (1, 2, 3, 4, 5, 8, 16)] == [1, 2, 4, 4, 8, 8, 8]
    # shares a caller reads move only every `refresh` observations: its score caches survive
    slow = DemandMix(refresh=4)
    slow.observe(1)
    frozen, version = slow.single(1), slow.version
    for _ in range(3):
        slow.observe(1)
        assert slow.single(1) == frozen and slow.version == version
    slow.observe(1)
    assert slow.single(1) > frozen and slow.version == version + 1


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        ClusterObjective(band=1.5)
    with pytest.raises(ValueError):
        ClusterObjective(frag_weight=-1)
    with pytest.raises(ValueError):
        DemandMix(prior={1: 0.0})
    with pytest.raises(ValueError):
        CommProfile(mix="no-such-mix")


@settings(max_examples=60, deadline=None)
@given(
    gpus=st.sampled_from([1, 2, 3, 4, 8]),
    frees=st.lists(
        st.tuples(st.sampled_from(sorted(KINDS)), st.sets(st.integers(0, 7))), min_size=1, max_size=6
    ),
)
def test_scores_rank_every_fitting_node_and_refuse_the_rest(gpus: int, frees: list) -> None:
    nodes = [view(f"n{i}", kind, free) for i, (kind, free) in enumerate(frees)]
    scores = node_scores(gpus, nodes, objective=ClusterObjective())
    for v in nodes:
        assert (scores[v.name] == 0) == (len(v.free) < gpus), v
        assert 0 <= scores[v.name] <= 10
    fitting = [v for v in nodes if len(v.free) >= gpus]
    if fitting:
        # the top-scored node's job efficiency is within the band of the best offered
        objective = ClusterObjective()
        objective.learn(KINDS.values())
        effs = {
            v.name: objective.efficiency(
                v.allocator.exact,  # type: ignore[union-attr]
                gpus,
                v.allocator.choose(sorted(v.free), gpus).ring_mbps,  # type: ignore[union-attr]
            )
            for v in fitting
        }
        top = max(scores.values())
        winners = [n for n in effs if scores[n] == top]
        assert all(effs[n] >= 0.95 * max(effs.values()) - 1e-9 for n in winners)


def test_the_sidecar_prioritizes_by_the_cluster_objective_over_http() -> None:
    """Through the extender's real HTTP server: a 1-GPU pod is steered to the PCIe box, an
    8-GPU ring to the NVSwitch box, and filtering a pod twice counts its demand once."""
    from gputopo.network.cluster import parse_cluster
    from scheduler import defaults
    from scheduler.extender import Extender
    from scheduler.picture.feed import from_cluster
    from scheduler.web.server import Server
    from tests import fake_apiserver as fk
    from tests.test_scheduler_http import Client, args

    nodes = [{"name": "h100", "gpus": "hgx-h100"}, {"name": "pcie", "gpus": "pcie8-plx"}]
    state = from_cluster(parse_cluster({"nodes": nodes}))
    ext = Extender(state, defaults.DEFAULT_LEVELS, clock=lambda: 1000.0)
    server = Server(ext, "127.0.0.1", 0)
    server.start()
    try:
        client = Client(server)
        names = ["h100", "pcie"]

        def best(gpus: int, name: str) -> str:
            status, out = client.post("/prioritize", args(fk.pod("ml", name, gpus), names))
            assert status == 200
            scores = {h["Host"]: h["Score"] for h in out}
            return max(scores, key=lambda n: scores[n])

        assert best(1, "one") == "pcie"
        assert best(8, "eight") == "h100"
        before = ext.objective.mix.observations
        for _ in range(2):
            client.post("/filter", args(fk.pod("ml", "again", 2), names))
        assert ext.objective.mix.observations == before + 1
    finally:
        server.stop()


def test_another_mix_at_the_same_version_is_weighed_afresh() -> None:
    """The cost memos are keyed on the mix version, and two mixes count versions alike: an
    objective handed another mix (as a warm copy is handed to a fresh sidecar) answers as a
    fresh objective over that mix, not from what it kept for the old one."""
    alloc = AllocatorPool().get(load_preset("hgx-h100"))
    small, large = DemandMix({1: 1.0}), DemandMix({8: 1.0})
    assert small.version == large.version
    free = frozenset(range(8)) - {3}
    obj = ClusterObjective(small)
    choice = alloc.choose(free, 2)
    before = (obj.cost(alloc, free, choice), obj.take_cost(alloc, free, choice.indices))
    obj.mix = large
    fresh = ClusterObjective(large)
    after = (obj.cost(alloc, free, choice), obj.take_cost(alloc, free, choice.indices))
    assert after == (fresh.cost(alloc, free, choice), fresh.take_cost(alloc, free, choice.indices))
    assert after != before  # the two mixes do weigh this set differently
