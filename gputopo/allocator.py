"""The node objective (design.md §2) and the exact allocator that maximises it.

(API fixed; implementation in progress.)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gputopo.topology import Topology


class AllocationError(ValueError):
    """A request that cannot be answered (size out of range, must-include not free, …)."""


@dataclass(frozen=True, slots=True)
class Choice:
    """A candidate set S drawn from the free set F, with its objective keys (larger is better)."""

    indices: tuple[int, ...]                       # sorted GPU indices of S
    ring_mbps: int                                 # key 1: ring bandwidth of S
    disruption: tuple[tuple[int, int, int], ...]   # key 2: (m, best ring MB/s of an m-subset of R, count)
    pair_sum_mbps: int                             # key 3: sum of pair bandwidths of S

    def key(self) -> tuple:
        """Comparable objective key: larger is better (ties broken by smallest sorted indices)."""
        raise NotImplementedError


class Allocator:
    """Exact GetPreferredAllocation for one topology (n <= 16 GPUs). Build once, call often."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology

    def choose(self, free: Iterable[int], size: int, must: Iterable[int] = ()) -> Choice:
        """The best set of `size` GPU indices from `free`, containing `must`."""
        raise NotImplementedError

    def rank(self, free: Iterable[int], size: int, must: Iterable[int] = (), top: int = 5) -> list[Choice]:
        """The `top` best candidates in objective order (the first equals choose())."""
        raise NotImplementedError

    def evaluate(self, chosen: Iterable[int], free: Iterable[int]) -> Choice:
        """Objective keys of a given set S taken from F (S ⊆ F)."""
        raise NotImplementedError

    def ring_mbps(self, indices: Iterable[int]) -> int:
        """Ring bandwidth of a set: the weakest hop of its best ring (0 for one GPU)."""
        raise NotImplementedError

    def best_ring_mbps(self, size: int) -> int:
        """Best ring bandwidth any `size`-subset of an empty node reaches."""
        raise NotImplementedError
