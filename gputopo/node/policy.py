"""The one seam for "which GPUs on this node": a `GpuPolicy`, and the registry of known ones.

go-gpuallocator's strength is that a policy is one method; gputopo keeps that shape. Everything
that picks GPUs inside a node — the device plugin's GetPreferredAllocation, the sidecar's
prediction of what a node's plugin will answer, gang planning, the simulator — takes a
`GpuPolicy` and nothing else, so the policy a node runs is a setting (`--policy`), not a fork.

A policy answers `choose(free, size, must)` with a `Choice` whose keys are the exact
allocator's for the set it picked, or raises `AllocationError` with the reason. `name` is what
the plugin publishes in its node annotation, so the sidecar predicts with the same policy.

| name | stands for | module |
|---|---|---|
| `gputopo` | the exact node objective (design.md §2) | `gputopo.node.allocator.Allocator` |
| `kubelet-default` | kubelet without a preferred allocation: random order | `policies.baselines.KubeletOrder` |
| `best-effort-pairs` | NVIDIA k8s-device-plugin (go-gpuallocator best-effort) | `policies.baselines.BestEffortPairs` |
| `best-combo` | HAMi's topology-aware best combination | `policies.baselines.BestCombo` |
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Protocol

from gputopo.node.allocator import Allocator, AllocatorPool, Choice
from gputopo.node.policies.baselines import BestCombo, BestEffortPairs, KubeletOrder
from gputopo.node.policies.pairpoints import pair_points
from gputopo.node.topology import Topology

DEFAULT_POLICY = "gputopo"
POLICY_NAMES: tuple[str, ...] = ("gputopo", "kubelet-default", "best-effort-pairs", "best-combo")


class GpuPolicy(Protocol):
    """Which `size` GPUs of `free` (GPU indices) a node hands out, holding `must`."""

    @property
    def name(self) -> str:
        """The registry name (`POLICY_NAMES`)."""
        ...

    def choose(self, free: Iterable[int], size: int, must: Iterable[int] = ()) -> Choice:
        """The chosen set with the exact allocator's keys for it; AllocationError if refused."""
        ...

    @property
    def exact(self) -> Allocator:
        """The exact allocator of the node's topology: every policy scores its answers with
        it, and the cluster objective prices what a placement leaves free with it."""
        ...


class UnknownPolicyError(ValueError):
    """A policy name outside `POLICY_NAMES`; the message lists the known ones."""


def check_name(name: str) -> str:
    """`name` if it is a known policy, else UnknownPolicyError (for flags and annotations)."""
    if name not in POLICY_NAMES:
        raise UnknownPolicyError(f"unknown policy {name!r} (known: {', '.join(POLICY_NAMES)})")
    return name


def policy_by_name(
    name: str,
    topology: Topology,
    *,
    pool: AllocatorPool | None = None,
    rng: random.Random | None = None,
    faithful: bool = False,
) -> GpuPolicy:
    """A fresh policy for one topology. The exact allocator comes from `pool` when given (shared
    tables); `rng` is kubelet-default's stand-in for map order (default: seeded with 0);
    `faithful` keeps a modelled system's known crash as a refusal (the simulator counts those as
    admission failures; daemons leave it off so no valid request is refused)."""
    check_name(name)
    exact = pool.get(topology) if pool is not None else Allocator(topology)
    if name == "gputopo":
        return exact
    if name == "kubelet-default":
        return KubeletOrder(topology, allocator=exact, rng=rng if rng is not None else random.Random(0))
    if name == "best-effort-pairs":
        return BestEffortPairs(topology, allocator=exact, faithful=faithful)
    return BestCombo(topology, allocator=exact)


class PolicyPool:
    """One policy per (name, what that policy reads of the topology), for a whole cluster.

    gputopo reads only the bandwidth matrix (so it shares `AllocatorPool`'s key); the baselines
    also read pair points, which two topologies with one bandwidth matrix may not share (the
    PCIe level under an NVLink). An explicit object owned by its caller, never module state."""

    def __init__(self, allocators: AllocatorPool | None = None, rng: random.Random | None = None) -> None:
        self.allocators = allocators if allocators is not None else AllocatorPool()
        self._rng = rng if rng is not None else random.Random(0)
        self._by_key: dict[tuple[str, bytes, bytes], GpuPolicy] = {}

    def get(self, name: str, topology: Topology) -> GpuPolicy:
        if name == "gputopo":
            return self.allocators.get(topology)
        check_name(name)
        bw = topology.bandwidth_mbps
        points = pair_points(topology, nvswitch_visible=True)  # the blind matrix follows from it + nvswitch
        switch = b"\1" if topology.nvswitch else b"\0"
        key = (name, bw.shape[0].to_bytes(2, "little") + bw.tobytes(), points.tobytes() + switch)
        hit = self._by_key.get(key)
        if hit is None:
            hit = self._by_key[key] = policy_by_name(name, topology, pool=self.allocators, rng=self._rng)
        return hit

    def __len__(self) -> int:
        return len(self._by_key)
