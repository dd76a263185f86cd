"""The GpuPolicy seam: every registered policy answers like its modelled system, refuses what the
exact allocator refuses with the same reasons, and carries the exact allocator's keys."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gputopo.node.allocator import AllocationError, Allocator, AllocatorPool, Choice
from gputopo.node.policies.baselines import BestCombo, BestEffortPairs, KubeletOrder
from gputopo.node.policies.pairpoints import pair_points
from gputopo.node.policies.search import best_combo, best_effort, kubelet_order
from gputopo.node.policy import (
    DEFAULT_POLICY,
    POLICY_NAMES,
    GpuPolicy,
    PolicyPool,
    UnknownPolicyError,
    policy_by_name,
)
from gputopo.node.topofile import load_preset
from gputopo.node.topology import make_topology
from tests.oracle import brute_force_choose
from tests.strategies import requests, topologies

PAIRS = load_preset("a100-pcie-nvlink-pairs")  # NV12 pairs 0-2, 1-3, 4-5, 6-7; SYS otherwise


def test_registry_names_and_default() -> None:
    assert DEFAULT_POLICY == "gputopo"
    assert POLICY_NAMES == ("gputopo", "kubelet-default", "best-effort-pairs", "best-combo")
    for name in POLICY_NAMES:
        assert policy_by_name(name, PAIRS).name == name
    assert isinstance(policy_by_name("gputopo", PAIRS), Allocator)
    with pytest.raises(
        UnknownPolicyError, match="known: gputopo, kubelet-default, best-effort-pairs, best-combo"
    ):
        policy_by_name("binpack", PAIRS)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_policy_returns_a_valid_set_with_the_exact_keys(data: st.DataObject) -> None:
    topo = data.draw(topologies(max_gpus=8))
    free, size, must = data.draw(requests(topo))
    exact = Allocator(topo)
    for name in POLICY_NAMES:
        policy: GpuPolicy = policy_by_name(name, topo, rng=random.Random(data.draw(st.integers(0, 9))))
        choice = policy.choose(free, size, must)
        assert isinstance(choice, Choice)
        assert len(choice.indices) == size and set(must) <= set(choice.indices) <= set(free)
        assert choice == exact.evaluate(choice.indices, free), name  # scored by the exact tables
    assert policy_by_name("gputopo", topo).choose(free, size, must).indices == brute_force_choose(
        topo, free, size, must
    )


BAD = [
    ((0, 1), 0, ()),  # size 0
    ((0, 1), -2, ()),
    ((0, 1), 3, ()),  # more than free
    ((), 1, ()),
    ((0, 1), 1, (0, 1)),  # must over size
    ((0, 1), 2, (5,)),  # must not free
    ((0, 9), 1, ()),  # index out of range
    ((0, 1), True, ()),  # not an integer size
]


@pytest.mark.parametrize(("free", "size", "must"), BAD)
def test_every_policy_refuses_what_the_allocator_refuses_with_its_reason(free, size, must) -> None:
    with pytest.raises(AllocationError) as want:
        Allocator(PAIRS).choose(free, size, must)
    for name in POLICY_NAMES:
        with pytest.raises(AllocationError) as got:
            policy_by_name(name, PAIRS).choose(free, size, must)
        assert (got.value.kind, str(got.value)) == (want.value.kind, str(want.value)), name
    assert want.value.kind != "refused"


def test_kubelet_order_draws_like_the_simulators_function() -> None:
    """Same seeds, same sets: the simulator's default table cannot move by the refactor."""
    free = [0, 2, 3, 5, 6, 7]
    for seed in range(30):
        policy = KubeletOrder(PAIRS, rng=random.Random(seed))
        ref = random.Random(seed)
        for size in (1, 2, 4, 3):
            assert policy.choose(free, size).indices == kubelet_order(free, size, ref)
    # must-include GPUs are always in, the rest drawn from what is left
    policy = KubeletOrder(PAIRS, rng=random.Random(1))
    assert all(3 in policy.choose(free, 2, [3]).indices for _ in range(20))


def test_best_effort_pairs_wraps_go_gpuallocator_and_fixes_its_padding_crash() -> None:
    points = pair_points(PAIRS, nvswitch_visible=False)
    faithful = BestEffortPairs(PAIRS, faithful=True)
    fixed = BestEffortPairs(PAIRS)
    # go-gpuallocator PR #80: 5 free, size 3 -> [4, 5, nil]; the NVIDIA plugin panics on it
    assert best_effort(points, [0, 1, 4, 5, 6], 3) == (4, 5, None)
    with pytest.raises(AllocationError, match="padding") as e:
        faithful.choose([0, 1, 4, 5, 6], 3)
    assert e.value.kind == "refused"
    with pytest.raises(AllocationError, match="padding"):  # the refusal is cached, and still raised
        faithful.choose([6, 5, 4, 1, 0], 3)
    # the fix picks the partition's real group
    assert fixed.choose([0, 1, 4, 5, 6], 3).indices == (0, 1, 6)
    for free in itertools.chain.from_iterable(itertools.combinations(range(8), k) for k in range(1, 9)):
        for size in range(1, len(free) + 1):
            want = best_effort(points, list(free), size)
            if None in want:
                continue
            assert fixed.choose(free, size).indices == tuple(sorted(want))  # type: ignore[type-var]
            assert faithful.choose(free, size).indices == tuple(sorted(want))  # type: ignore[type-var]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_best_combo_with_must_include_is_the_best_pair_sum_holding_them(data: st.DataObject) -> None:
    topo = data.draw(topologies(min_gpus=2, max_gpus=7))
    free, size, must = data.draw(requests(topo))
    points = pair_points(topo, nvswitch_visible=True)
    got = BestCombo(topo).choose(free, size, must).indices
    assert set(must) <= set(got)
    if size == 1:
        want = best_combo(points, free, 1, must)
    else:
        score = {
            c: sum(int(points[a][b]) for a, b in itertools.combinations(c, 2))
            for c in itertools.combinations(free, size)
            if set(must) <= set(c)
        }
        best = max(score.values())
        want = next(c for c in itertools.combinations(free, size) if c in score and score[c] == best)
    assert got == tuple(want)
    if not must:
        assert got == best_combo(points, free, size)


def test_policy_pool_shares_one_policy_per_name_and_what_it_reads() -> None:
    pool = PolicyPool()
    same = load_preset("a100-pcie-nvlink-pairs")
    assert pool.get("best-combo", PAIRS) is pool.get("best-combo", same)
    assert pool.get("gputopo", PAIRS) is pool.allocators.get(PAIRS)
    assert pool.get("best-effort-pairs", PAIRS) is not pool.get("best-combo", PAIRS)
    # one bandwidth matrix, another PCIe level under the NVLink (NUMA): other pair points
    a = make_topology([["X", "NV2"], ["NV2", "X"]], numa=[0, 0])
    b = make_topology([["X", "NV2"], ["NV2", "X"]], numa=[0, 1])
    assert AllocatorPool().get(a) is not None and (a.bandwidth_mbps == b.bandwidth_mbps).all()
    assert pool.get("best-combo", a) is not pool.get("best-combo", b)
    with pytest.raises(UnknownPolicyError):
        pool.get("spread", a)


def test_prefer_cli_asks_the_named_policy(capsys) -> None:
    import json

    from gputopo.cli import main

    args = ["prefer", "--topology", "a100-pcie-nvlink-pairs", "--size", "1", "--available", "1,2,3,4,5,6,7"]
    assert main([*args, "--json", "--policy", "best-effort-pairs"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["policy"] == "best-effort-pairs" and doc["chosen"]["gpus"] == [1]  # available[0]
    assert doc["alternatives"][0]["gpus"] == [2]  # gputopo's rank: least disruption
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["chosen"]["gpus"] == [2]
    assert main([*args, "--policy", "spread"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "known: gputopo, kubelet-default, best-effort-pairs, best-combo" in err[0]
