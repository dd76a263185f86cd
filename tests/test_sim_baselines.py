"""Today's allocators as the simulator models them, on hand-checked cases.

The DGX-1 expectations are go-gpuallocator's own test expectations (node-anchors.md §2.5): a
compatibility check that best-effort-pairs reproduces the policy people run, quirks included.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gputopo.node.policies.pairpoints import pair_points
from gputopo.node.policies.search import best_combo, best_effort, kubelet_order
from gputopo.node.topofile import load_preset
from gputopo.node.topology import Topology, make_topology
from tests.strategies import topologies

PRESETS = Path(__file__).resolve().parent.parent / "gputopo" / "node" / "presets"

# go-gpuallocator's DGX-1 Volta model: PIX within {0,1},{2,3},{4,5},{6,7}, PHB otherwise in a socket.
DGX1_POINTS = [
    [0, 150, 130, 230, 210, 10, 10, 10],
    [150, 0, 230, 130, 10, 210, 10, 10],
    [130, 230, 0, 250, 10, 10, 110, 10],
    [230, 130, 250, 0, 10, 10, 10, 110],
    [210, 10, 10, 10, 0, 150, 130, 230],
    [10, 210, 10, 10, 150, 0, 230, 130],
    [10, 10, 110, 10, 130, 230, 0, 250],
    [10, 10, 10, 110, 230, 130, 250, 0],
]


@pytest.fixture(scope="module")
def dgx1() -> np.ndarray:
    doc = json.loads((PRESETS / "dgx1-v100.json").read_text())
    pix = {(0, 1), (2, 3), (4, 5), (6, 7)}
    doc["pcie"] = [
        [
            "X"
            if i == j
            else "PIX"
            if (min(i, j), max(i, j)) in pix
            else "PHB"
            if (i < 4) == (j < 4)
            else "SYS"
            for j in range(8)
        ]
        for i in range(8)
    ]
    return pair_points(Topology.from_dict(doc), nvswitch_visible=False)


def test_pair_points_match_the_published_dgx1_matrix(dgx1: np.ndarray) -> None:
    assert dgx1.tolist() == DGX1_POINTS


@pytest.mark.parametrize(
    ("available", "size", "required", "want"),
    [
        ([0, 2, 4, 5], 2, [], (4, 5)),
        ([0, 4, 5, 6], 2, [], (5, 6)),
        ([0, 1, 3], 2, [], (0, 3)),
        ([0, 1, 4], 2, [], (0, 4)),
        (list(range(8)), 1, [4], (4,)),
        (list(range(8)), 2, [4], (4, 7)),
        (list(range(8)), 4, [4], (4, 5, 6, 7)),
        (list(range(8)), 4, [0, 2, 4, 6], (0, 2, 4, 6)),
        ([0, 1, 2], 2, [5], ()),  # required not available
        (list(range(8)), 2, [0, 1, 2], ()),  # more required than size
        ([0, 1], 3, [0, 1, 2], ()),  # more required than available
    ],
)
def test_best_effort_reproduces_go_gpuallocator_expectations(
    dgx1: np.ndarray, available: list[int], size: int, required: list[int], want: tuple[int, ...]
) -> None:
    got = best_effort(dgx1, available, size, required)
    assert tuple(sorted(got)) == want  # type: ignore[type-var]


@pytest.mark.parametrize(
    ("size", "runs", "want"),
    [
        (2, 4, [(0, 3), (1, 2), (4, 7), (5, 6)]),  # partition look-ahead beats greedy {2,3}
        (4, 2, [(0, 1, 2, 3), (4, 5, 6, 7)]),
        (8, 1, [tuple(range(8))]),
        (1, 8, [(i,) for i in range(8)]),  # size 1: always available[0]
    ],
)
def test_best_effort_sequential_runs(
    dgx1: np.ndarray, size: int, runs: int, want: list[tuple[int, ...]]
) -> None:
    free = list(range(8))
    got = []
    for _ in range(runs):
        group = best_effort(dgx1, free, size)
        got.append(tuple(sorted(group)))  # type: ignore[type-var]
        free = [g for g in free if g not in group]
    assert got == want


def test_best_effort_returns_the_padded_group() -> None:
    """go-gpuallocator PR #80: 5 free GPUs, one NVLink pair, size 3 -> [4, 5, nil]."""
    points = pair_points(load_preset("a100-pcie-nvlink-pairs"), nvswitch_visible=False)
    assert best_effort(points, [0, 1, 4, 5, 6], 3) == (4, 5, None)
    # with a multiple of the size there is no padding and the answer is a real group
    assert None not in best_effort(points, [0, 1, 4, 5, 6, 7], 3)


def test_rtx8000_pairs_first() -> None:
    points = pair_points(load_preset("rtx8000-4"), nvswitch_visible=False)
    first = best_effort(points, [0, 1, 2, 3], 2)
    assert first == (0, 3)
    assert best_effort(points, [1, 2], 2) == (1, 2)


def test_nvswitch_links_are_invisible_to_best_effort_but_not_to_hami() -> None:
    h100 = load_preset("hgx-h100")
    blind = pair_points(h100, nvswitch_visible=False)
    seen = pair_points(h100, nvswitch_visible=True)
    # NUMA 0 = GPUs 0-3: same socket reads as PHB (30), across as SYS (10); no NVLink points at all
    assert blind[0, 1] == 30 and blind[0, 4] == 10 and blind.max() == 30
    assert seen[0, 1] == 1800 + 30 and seen[0, 4] == 1800 + 10
    # the NVSwitch-blind policy keeps a 4-GPU job in one socket, by PCIe points alone
    assert best_effort(blind, list(range(8)), 4) == (0, 1, 2, 3)


def test_pcie_level_under_nvlink_is_inferred_from_numa() -> None:
    topo = make_topology([["X", "NV2", "NV2"], ["NV2", "X", "SYS"], ["NV2", "SYS", "X"]], numa=[0, 0, 1])
    points = pair_points(topo, nvswitch_visible=False)
    assert points[0, 1] == 200 + 30  # same NUMA: PHB
    assert points[0, 2] == 200 + 10  # different NUMA: SYS
    assert points[1, 2] == 10


def test_best_combo_least_connected_single_and_best_pair() -> None:
    points = pair_points(load_preset("a100-pcie-nvlink-pairs"), nvswitch_visible=True)
    # 0-2 is an NV12 pair; 1 is linked to neither of them: it is the card to give away
    assert best_combo(points, [0, 1, 2], 1) == (1,)
    # every NV12 pair scores 1230; the first in combination order wins
    assert best_combo(points, list(range(8)), 2) == (0, 2)
    assert best_combo(points, [0, 1], 2) == (0, 1)
    assert best_combo(points, [0], 2) == ()


def test_best_combo_has_no_look_ahead(dgx1: np.ndarray) -> None:
    """Greedy pair sum takes {2,3} (250) where go-gpuallocator's look-ahead takes {0,3}."""
    assert best_combo(dgx1, list(range(8)), 2) == (2, 3)


def test_kubelet_order_is_random_but_reproducible() -> None:
    free = list(range(8))
    draws = [kubelet_order(free, 2, random.Random(s)) for s in range(40)]
    assert all(len(d) == 2 and set(d) <= set(free) for d in draws)
    assert len(set(draws)) > 5  # not index order
    assert draws == [kubelet_order(free, 2, random.Random(s)) for s in range(40)]
    assert kubelet_order(free, 9, random.Random(0)) == ()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_baselines_answer_within_their_contract(data: st.DataObject) -> None:
    """Whatever the layout: a set of the asked size drawn from the free GPUs holding the
    required ones, or nothing; only best-effort may hold its padding placeholder."""
    topo = data.draw(topologies(max_gpus=8))
    free = sorted(data.draw(st.sets(st.integers(0, topo.n - 1), min_size=1)))
    size = data.draw(st.integers(1, len(free)))
    required = data.draw(st.lists(st.sampled_from(free), max_size=size, unique=True))
    blind = pair_points(topo, nvswitch_visible=False)
    got = best_effort(blind, free, size, required)
    assert len(got) == size
    real = [g for g in got if g is not None]
    assert set(real) <= set(free) and set(required) <= set(real) and len(set(real)) == len(real)
    if len(real) < size:
        assert len(free) % size != 0 and size - len(real) == (-len(free)) % size
    combo = best_combo(pair_points(topo, nvswitch_visible=True), free, size)
    assert len(combo) == size and set(combo) <= set(free)
    assert sorted(combo) == list(combo)
