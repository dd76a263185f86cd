"""Today's in-node GPU choices as `GpuPolicy` objects: what kubelet, NVIDIA and HAMi would pick.

Each class stands for one system people run instead of gputopo, so that the simulator can
compare against it and an operator can run it on one node (`--policy`) to A/B gputopo's choice
against it on real jobs. They share three rules that make every policy look alike downstream:

* a request is checked by the exact allocator's `validate` (same refusals, same reasons, as
  `AllocationError`), so the device plugin never validates twice;
* the chosen set is scored by the exact allocator's tables (`score_masks`): its `Choice` carries
  the ring bandwidth, leftover disruption and pair sum gputopo's objective gives that set, which
  is what gang planning, the sidecar's predictions and the metrics read;
* tables (pair points) are built once per topology, answers cached per (free, must, size) where
  the policy is deterministic; free GPUs are offered in ascending index order (the real systems
  follow kubelet's random map order, which decides their ties).

The search functions themselves live in `search.py`, checked against the published
expectations of the systems they model (node-anchors.md §1.5, §2, §4).
"""

from __future__ import annotations

import random
from collections.abc import Iterable

import numpy as np

from gputopo.node.allocator import AllocationError, Allocator, Choice
from gputopo.node.policies.pairpoints import pair_points
from gputopo.node.policies.search import best_combo, best_effort
from gputopo.node.topology import Topology

_CACHE_LIMIT = 1 << 16


def mask_indices(mask: int, n: int) -> list[int]:
    return [i for i in range(n) if mask >> i & 1]


def _mask(indices: Iterable[int | None]) -> int:
    mask = 0
    for i in indices:
        if i is not None:
            mask |= 1 << i
    return mask


class KubeletOrder:
    """kubelet with no preferred allocation (a plugin without GetPreferredAllocation, or NVIDIA's
    plugin on a node whose devices it cannot align): the must-include GPUs, then the first IDs of
    a Go map's iteration, which is effectively random. `rng` stands for that order so runs
    are reproducible; it is drawn from once per answer (never cached: kubelet does not repeat
    itself)."""

    name = "kubelet-default"

    def __init__(self, topology: Topology, *, allocator: Allocator | None = None, rng: random.Random) -> None:
        self._exact = allocator if allocator is not None else Allocator(topology)
        self._n = topology.n
        self._rng = rng
        self._scores: dict[tuple[int, int], Choice] = {}  # the draw is random, its keys are not
        self._rest: dict[int, list[int]] = {}  # at most 2^n masks, index lists in ascending order

    @property
    def exact(self) -> Allocator:
        """The allocator that scores (and validates) this policy's answers."""
        return self._exact

    def choose(self, free: Iterable[int], size: int, must: Iterable[int] = ()) -> Choice:
        free_mask, must_mask = self._exact.validate(free, size, must)
        rest = self._rest.get(free_mask & ~must_mask)
        if rest is None:
            rest = self._rest[free_mask & ~must_mask] = mask_indices(free_mask & ~must_mask, self._n)
        picked = must_mask | _mask(self._rng.sample(rest, size - must_mask.bit_count()))
        key = (picked, free_mask)
        hit = self._scores.get(key)
        if hit is None:
            if len(self._scores) >= _CACHE_LIMIT:
                self._scores.clear()
            hit = self._scores[key] = self._exact.score_masks(picked, free_mask)
        return hit


class CachedPolicy:
    """A deterministic in-node choice: answers (or refusals) kept per (free, must, size), so a
    subclass states only `_answer` (the baselines here, the simulator's DRA first fit)."""

    name = ""

    def __init__(self, topology: Topology, allocator: Allocator | None) -> None:
        self._exact = allocator if allocator is not None else Allocator(topology)
        self._n = topology.n
        self._cache: dict[tuple[int, int, int], Choice | str] = {}

    @property
    def exact(self) -> Allocator:
        """The allocator that scores (and validates) this policy's answers."""
        return self._exact

    def choose(self, free: Iterable[int], size: int, must: Iterable[int] = ()) -> Choice:
        free_mask, must_mask = self._exact.validate(free, size, must)
        key = (free_mask, must_mask, size)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._answer(free_mask, must_mask, size)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = hit
        if isinstance(hit, str):
            raise AllocationError(hit, "refused")
        return hit

    def _answer(self, free_mask: int, must_mask: int, size: int) -> Choice | str:
        raise NotImplementedError


class BestEffortPairs(CachedPolicy):
    """NVIDIA k8s-device-plugin's GetPreferredAllocation: go-gpuallocator's best-effort policy over
    pair points from NVML's direct links, so NVSwitch nodes look PCIe-only to it.

    Its search can return its padding placeholder (go-gpuallocator PR #80), on which the real
    plugin panics. `faithful=True` (the simulator) refuses those requests, as kubelet sees that
    node fail them; by default (a node A/B-testing NVIDIA's choice, and the sidecar predicting
    it) the pick skips the padded group as that PR's fix does, so no valid request is refused."""

    name = "best-effort-pairs"

    def __init__(
        self, topology: Topology, *, allocator: Allocator | None = None, faithful: bool = False
    ) -> None:
        super().__init__(topology, allocator)
        self._points: np.ndarray = pair_points(topology, nvswitch_visible=False)
        self._faithful = faithful

    def _answer(self, free_mask: int, must_mask: int, size: int) -> Choice | str:
        group = best_effort(
            self._points,
            mask_indices(free_mask, self._n),
            size,
            mask_indices(must_mask, self._n),
            exclude_padding=not self._faithful,
        )
        if None in group:
            return "go-gpuallocator's best-effort answer holds its padding placeholder (the NVIDIA plugin panics)"
        if not group:
            return "go-gpuallocator's best-effort policy gave no answer"
        return self._exact.score_masks(_mask(group), free_mask)


class BestCombo(CachedPolicy):
    """HAMi's topology-aware GPU fit (v2.10): one card = the one least connected to the other
    free cards; several = the combination with the largest pair-point sum, no look-ahead, over
    pair points that count NVSwitch links."""

    name = "best-combo"

    def __init__(self, topology: Topology, *, allocator: Allocator | None = None) -> None:
        super().__init__(topology, allocator)
        self._points: np.ndarray = pair_points(topology, nvswitch_visible=True)

    def _answer(self, free_mask: int, must_mask: int, size: int) -> Choice | str:
        group = best_combo(
            self._points, mask_indices(free_mask, self._n), size, mask_indices(must_mask, self._n)
        )
        if not group:
            return "HAMi's best-combination fit gave no answer"
        return self._exact.score_masks(_mask(group), free_mask)
