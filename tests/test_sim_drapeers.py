"""The simulator's DRA peers: kube-scheduler's first fit over NVIDIA-style per-GPU devices and over
gputopo's set devices, each checked against a brute-force reading of the slices."""

from __future__ import annotations

import math
from itertools import combinations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gputopo.network.levels import DEFAULT_LEVELS, LEAF
from gputopo.node.allocator import AllocationError, Allocator
from gputopo.node.draslices import build_slices, first_fit
from gputopo.node.topofile import load_preset
from gputopo.sim.engine import RunConfig
from gputopo.sim.policies.drapeers import DraFirstFit, DraGputopoSets
from gputopo.sim.run import compare
from gputopo.sim.state import SimCluster, SimNode
from gputopo.sim.workload import Job

DGX1 = load_preset("dgx1-v100")
DGX2 = load_preset("dgx2-v100")
DGX2_ALLOC = Allocator(DGX2)  # built once: its tables take a while on 16 GPUs


def best_ring(alloc: Allocator, free: list[int], size: int) -> int:
    return max(alloc.ring_mbps(c) for c in combinations(free, size))


def test_the_issue_example_first_fit_gets_the_slow_ring_and_sets_the_fast_one() -> None:
    alloc = Allocator(DGX1)
    free = [1, 2, 3, 4, 5, 6, 7]
    ff = DraFirstFit(alloc).choose(free, 4)
    sets = DraGputopoSets(alloc).choose(free, 4)
    assert ff.indices == (1, 2, 3, 4)
    assert ff.ring_mbps == 6_000
    assert sets.indices == (4, 5, 6, 7)
    assert sets.ring_mbps == 25_000


@settings(max_examples=60, deadline=None)
@given(st.sets(st.integers(0, 7), min_size=1), st.integers(1, 8))
def test_first_fit_is_the_stock_allocator_over_per_gpu_slices(free: set[int], size: int) -> None:
    alloc = Allocator(DGX1)
    if size > len(free):
        with pytest.raises(AllocationError):
            DraFirstFit(alloc).choose(sorted(free), size)
        return
    got = DraFirstFit(alloc).choose(sorted(free), size).indices
    # the slice's GPU devices in order, the first `size` whose counters are free
    devices = [
        d["name"]
        for d in build_slices(DGX1, alloc, "n", healthy=range(8), free=range(8))[1]["spec"]["devices"]
    ]
    want = [int(name.split("-")[1]) for name in devices if int(name.split("-")[1]) in free][:size]
    assert got == tuple(want)


@settings(max_examples=60, deadline=None)
@given(st.sets(st.integers(0, 7), min_size=2), st.sampled_from([2, 4, 8]))
def test_set_devices_give_the_published_first_free_set_which_is_a_best_ring(
    free: set[int], size: int
) -> None:
    """The peer answers what first fit over the published slices answers; an answer is a
    best-ring set of the free GPUs. Every set is published (DGX-1's 70 4-sets over two slices
    since issue 30), so first fit refuses only with fewer than `size` GPUs free."""
    alloc = Allocator(DGX1)
    peer = DraGputopoSets(alloc)
    slices = build_slices(DGX1, alloc, "n", healthy=range(8), free=sorted(free))
    hit = first_fit(slices, size, sorted(set(range(8)) - free)) if size <= len(free) else None
    if hit is None:
        assert size > len(free)
        with pytest.raises(AllocationError):
            peer.choose(sorted(free), size)
        return
    got = peer.choose(sorted(free), size)
    assert got.indices == hit[1] == alloc.choose(sorted(free), size).indices
    assert got.ring_mbps == best_ring(alloc, sorted(free), size)


def test_a_free_set_cut_from_the_slice_is_refused_not_invented() -> None:
    """Publication keeps ring levels best first; when the better levels (none of whose sets is
    free) fill the slice, no free set is listed and the claim has no device on this node, as
    kube-scheduler would find. One set per slice makes that happen on a DGX-1's pairs."""
    alloc = Allocator(DGX1)
    top = alloc.best_ring_mbps(2)
    free = next(
        list(f)
        for f in combinations(range(8), 3)
        if all(alloc.ring_mbps(p) < top for p in combinations(f, 2))
    )
    with pytest.raises(AllocationError):
        DraGputopoSets(alloc, max_sets=1).choose(free, 2)
    assert DraGputopoSets(alloc).choose(free, 2).ring_mbps == best_ring(alloc, free, 2)


@settings(max_examples=40, deadline=None)
@given(st.sets(st.integers(0, 7), min_size=3), st.sampled_from([1, 3]))
def test_sizes_without_a_set_class_take_the_first_free_gpu_devices_as_published(
    free: set[int], size: int
) -> None:
    alloc = Allocator(DGX1)
    slices = build_slices(DGX1, alloc, "n", healthy=range(8), free=sorted(free))
    order = [int(d["name"].split("-")[1]) for d in slices[1]["spec"]["devices"]]
    want = tuple(sorted([i for i in order if i in free][:size]))
    assert DraGputopoSets(alloc).choose(sorted(free), size).indices == want
    if size == 1:  # one device of the GPU class: kube-scheduler's first fit, the allocator's GPU
        assert (
            want
            == first_fit(slices, 1, sorted(set(range(8)) - free))[1]
            == alloc.choose(sorted(free), 1).indices
        )


def test_both_peers_run_through_compare_side_by_side() -> None:
    """One DGX-1 with GPU 0 taken, then a 4-GPU pod: the issue's case through the engine. First
    fit's pod is off its best ring, the set device's is on it."""
    c = SimCluster(
        topologies=(DGX1,),
        nodes=(SimNode("dgx", 0, {LEAF: "a"}, frozenset({0})),),
        levels=DEFAULT_LEVELS,
    )
    jobs = [Job(id=0, submit=0.0, duration=math.inf, pods=(4,))]
    res = {
        r.policy: r for r in compare(c, jobs, ("dra-first-fit", "dra-gputopo-sets"), RunConfig(mode="fill"))
    }
    assert res["dra-first-fit"].placed == res["dra-gputopo-sets"].placed == 1
    assert res["dra-first-fit"].best_ring_share == 0.0
    assert res["dra-gputopo-sets"].best_ring_share == 1.0


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sets(st.integers(0, 15), min_size=4), st.sampled_from([2, 4, 8]))
def test_set_devices_on_a_16_gpu_node_read_the_slices_as_kube_scheduler_would(
    free: set[int], size: int
) -> None:
    """DGX-2: 1,820 4-sets and 12,870 8-sets of one ring level, all published over many slices
    (issue 30). The peer's answer is what first fit over the published slices gives, refusal
    (only with fewer than `size` GPUs free) included."""
    topo, alloc = DGX2, DGX2_ALLOC
    slices = build_slices(topo, alloc, "n", healthy=range(16), free=sorted(free))
    hit = first_fit(slices, size, sorted(set(range(16)) - free)) if size <= len(free) else None
    peer = DraGputopoSets(alloc)
    if hit is None:
        with pytest.raises(AllocationError):
            peer.choose(sorted(free), size)
    else:
        assert peer.choose(sorted(free), size).indices == hit[1]
