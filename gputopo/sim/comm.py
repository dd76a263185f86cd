"""The communication model that turns a placement into a job-time estimate.

A data-parallel training step is `compute_s` of compute plus one ring all-reduce of
`allreduce_bytes`; a ring all-reduce over k GPUs moves 2(k-1)/k of the bytes through its
slowest hop. Inside a node that hop is the ring bandwidth of the pod's GPU set (the node
objective's key 1, from gputopo.allocator); between nodes it is the bandwidth of the smallest
network level whose one domain holds every pod. A trace's duration is taken as the time at an
ideal placement, so a job runs `duration * step(actual) / step(ideal)`.
All constants are documented in docs/simulator.md and can be overridden.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gputopo.network.levels import ACCELERATOR, CORE, HOSTNAME, LEAF, SPINE, ZONE

#: One-direction GB/s per GPU of an inter-node ring hop whose endpoints share a domain of the level.
DEFAULT_LEVEL_GBPS: Mapping[str, float] = MappingProxyType(
    {
        ACCELERATOR: 450.0,  # multi-node NVLink domain (NVL72-style)
        LEAF: 25.0,  # one 200 Gb/s NIC per GPU under the same leaf switch
        SPINE: 12.5,  # through the spine, 2:1 oversubscribed
        CORE: 6.25,
        ZONE: 3.125,
    }
)


@dataclass(frozen=True)
class CommModel:
    """Step-time model; see the module docstring. Bandwidths in GB/s, one direction."""

    allreduce_bytes: float = 1e9  # fp16 gradients of a 500 M-parameter model
    compute_s: float = 0.2  # compute per step
    level_gbps: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_LEVEL_GBPS))
    cluster_gbps: float = 3.125  # members with no common domain at any level

    def network_gbps(self, level: str | None) -> float:
        """Inter-node hop bandwidth when the smallest common level is `level` (None = none)."""
        if level is None:
            return self.cluster_gbps
        if level == HOSTNAME:
            return math.inf
        return self.level_gbps.get(level, self.cluster_gbps)

    def step_s(self, gpus: int, ring_gbps: float) -> float:
        """Seconds per step of a `gpus`-GPU job whose ring's slowest hop runs at `ring_gbps`."""
        if gpus <= 1:
            return self.compute_s
        if ring_gbps <= 0:
            raise ValueError("a multi-GPU ring needs a positive bandwidth")
        if math.isinf(ring_gbps):
            return self.compute_s
        return self.compute_s + 2.0 * (gpus - 1) / gpus * self.allreduce_bytes / (ring_gbps * 1e9)
