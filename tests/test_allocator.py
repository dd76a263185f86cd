"""The allocator against the brute-force oracle of design.md §2, plus known layouts."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gputopo.node.allocator import AllocationError, Allocator
from gputopo.node.topofile import load_preset
from gputopo.node.topology import Topology, make_topology
from tests.oracle import Oracle
from tests.strategies import requests, topologies


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_matches_oracle_up_to_8_gpus(data: st.DataObject) -> None:
    topo = data.draw(topologies(max_gpus=8))
    alloc, oracle = Allocator(topo), Oracle(topo)
    for _ in range(3):
        free, size, must = data.draw(requests(topo))
        got = alloc.choose(free, size, must)
        want = oracle.choose(free, size, must)
        assert got.indices == want, (free, size, must)
        assert got.key() == oracle.key(want, free)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_best_ring_exact_up_to_16_gpus(data: st.DataObject) -> None:
    topo = data.draw(topologies(min_gpus=9, max_gpus=16))
    alloc, oracle = Allocator(topo), Oracle(topo)
    free, size, must = data.draw(requests(topo))
    size = min(size, 4) if len(free) > 12 else size  # keeps the oracle's enumeration small
    must = must[:size]
    got = alloc.choose(free, size, must)
    assert set(must) <= set(got.indices) <= set(free) and len(got.indices) == size
    assert got.ring_mbps == oracle.ring(got.indices) == oracle.best_ring(free, size, must)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_answer_independent_of_offer_order(data: st.DataObject) -> None:
    topo = data.draw(topologies(min_gpus=2, max_gpus=8))
    alloc = Allocator(topo)
    free, size, must = data.draw(requests(topo))
    shuffled = data.draw(st.permutations(free))
    assert alloc.choose(shuffled, size, must) == alloc.choose(free, size, must)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_rank_starts_with_choice_and_is_sorted(data: st.DataObject) -> None:
    topo = data.draw(topologies(min_gpus=2, max_gpus=8))
    alloc = Allocator(topo)
    free, size, must = data.draw(requests(topo))
    ranked = alloc.rank(free, size, must, top=10)
    assert ranked[0] == alloc.choose(free, size, must)
    keys = [c.key() for c in ranked]
    assert keys == sorted(keys, reverse=True)
    assert len({c.indices for c in ranked}) == len(ranked)


def test_dgx1_pairs_take_nvlink2_and_keep_groups() -> None:
    alloc = Allocator(load_preset("dgx1-v100"))
    first = alloc.choose(range(8), 2)
    assert alloc.topology.code(*first.indices) == "NV2"
    # four 2-GPU pods in a row: each lands on an NV2 pair and never breaks the next one's
    free = set(range(8))
    for _ in range(4):
        c = alloc.choose(free, 2)
        assert c.ring_mbps == 50_000
        free -= set(c.indices)
    assert not free


def test_single_gpu_takes_card_whose_partner_is_busy() -> None:
    # NVLink-bridged pairs 0-2, 1-3, 4-5, 6-7; GPU 0 busy: the lone GPU 2 is the least disruptive
    alloc = Allocator(load_preset("a100-pcie-nvlink-pairs"))
    assert alloc.choose([1, 2, 3, 4, 5, 6, 7], 1).indices == (2,)


def test_nvswitch_nodes_are_not_pcie_only() -> None:
    alloc = Allocator(load_preset("hgx-h100"))
    assert alloc.best_ring_mbps(8) == 18 * 25_000
    assert alloc.choose(range(8), 4).ring_mbps == 450_000


def test_sixteen_gpus_build_and_answer() -> None:
    alloc = Allocator(load_preset("dgx2-v100"))
    rng = random.Random(3)
    for _ in range(20):
        free = rng.sample(range(16), rng.randint(1, 16))
        size = rng.randint(1, len(free))
        c = alloc.choose(free, size)
        assert len(c.indices) == size and set(c.indices) <= set(free)


def test_ring_of_full_dgx1_is_the_nvlink2_cycle() -> None:
    alloc = Allocator(load_preset("dgx1-v100"))
    assert alloc.ring_mbps(range(8)) == 50_000
    assert alloc.ring_mbps([0, 1, 2, 3]) == 25_000
    assert alloc.ring_mbps([5]) == 0


@pytest.mark.parametrize(
    ("free", "size", "must", "why"),
    [
        ([0, 1], 0, [], "at least 1"),
        ([0, 1], 3, [], "more than the 2 free"),
        ([0, 1], 1, [2], "must be free"),
        ([0, 1, 2], 1, [0, 1], "exceed size"),
        ([0, 9], 1, [], "not in 0..3"),
        ([0, -1], 1, [], "not in 0..3"),
    ],
)
def test_bad_requests_raise_clear_errors(free: list[int], size: int, must: list[int], why: str) -> None:
    alloc = Allocator(
        make_topology(
            [
                ["X", "NV1", "SYS", "SYS"],
                ["NV1", "X", "SYS", "SYS"],
                ["SYS", "SYS", "X", "PIX"],
                ["SYS", "SYS", "PIX", "X"],
            ]
        )
    )
    with pytest.raises(AllocationError, match=why):
        alloc.choose(free, size, must)


def test_cache_returns_same_answer() -> None:
    alloc = Allocator(load_preset("pcie8-plx"))
    assert alloc.choose([0, 1, 2, 5], 2) is alloc.choose([5, 2, 1, 0], 2)


def test_pool_shares_allocators_between_equal_matrices() -> None:
    from gputopo.node.allocator import AllocatorPool

    pool = AllocatorPool()
    a = load_preset("dgx1-v100")
    b = Topology.from_dict(
        a.to_dict() | {"gpus": [g.to_dict() | {"uuid": f"GPU-x{g.index}"} for g in a.gpus]}
    )
    assert pool.get(a) is pool.get(b)
    assert pool.get(load_preset("hgx-h100")) is not pool.get(a)
    assert len(pool) == 2


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_full_objective_matches_oracle_beyond_8_gpus(data: st.DataObject) -> None:
    """The tables are exact for every key above 8 GPUs too: many free GPUs and small requests,
    so that the leftover set holds several 4-GPU groups (count4 > 1 matters)."""
    topo = data.draw(topologies(min_gpus=10, max_gpus=12))
    alloc, oracle = Allocator(topo), Oracle(topo)
    free = tuple(sorted(data.draw(st.sets(st.integers(0, topo.n - 1), min_size=9, max_size=topo.n))))
    size = data.draw(st.integers(1, 3))
    must = tuple(data.draw(st.permutations(free))[: data.draw(st.integers(0, 1))])
    got = alloc.choose(free, size, must)
    want = oracle.choose(free, size, must)
    assert got.indices == want and got.key() == oracle.key(want, free)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=topologies(min_gpus=1, max_gpus=8))
def test_tabulated_answers_equal_the_search_on_every_free_set(topo: Topology) -> None:
    """Up to 8 GPUs `choose` without must-include reads a table filled at build; `rank` always
    runs the candidate search. They must agree on every (free set, size) there is."""
    alloc = Allocator(topo)
    for mask in range(1, 1 << topo.n):
        free = [i for i in range(topo.n) if mask >> i & 1]
        for size in range(1, len(free) + 1):
            assert alloc.choose(free, size) == alloc.rank(free, size, top=1)[0], (free, size)
