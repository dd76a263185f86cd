"""The one seam for "which GPUs on this node": a `GpuPolicy`, and the registry of known ones.

go-gpuallocator's strength is that a policy is one method; gputopo keeps that shape. Everything
that picks GPUs inside a node — the device plugin's GetPreferredAllocation, the sidecar's
prediction of what a node's plugin will answer, gang planning, the simulator — takes a
`GpuPolicy` and nothing else, so the policy a node runs is a setting (`--policy`), not a fork.

A policy answers `choose(free, size, must)` with a `Choice` whose keys are the exact
allocator's for the set it picked, or raises `AllocationError` with the reason. `name` is what
the plugin publishes in its node annotation, so the sidecar predicts with the same policy.

`REGISTRY` is the one list of in-node policies: each entry names the policy, builds it, and
says what the simulator needs to run it as the system it stands for (`SimSpec`: the node
ranking that system pairs it with, whether alike questions get alike answers, its rule when
it shares GPUs). The flag choices, the annotation check, the plugin, the CLI and the
simulator's rows all read it, so a new in-node policy is one entry here (and its test).

| name | stands for | module |
|---|---|---|
| `gputopo` | the exact node objective (design.md §2) | `gputopo.node.allocator.Allocator` |
| `kubelet-default` | kubelet without a preferred allocation: random order | `policies.baselines.KubeletOrder` |
| `best-effort-pairs` | NVIDIA k8s-device-plugin (go-gpuallocator best-effort) | `policies.baselines.BestEffortPairs` |
| `best-combo` | HAMi's topology-aware best combination | `policies.baselines.BestCombo` |
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

from gputopo.node.allocator import Allocator, AllocatorPool, Choice
from gputopo.node.policies.baselines import BestCombo, BestEffortPairs, KubeletOrder
from gputopo.node.policies.pairpoints import pair_points
from gputopo.node.topology import Topology

DEFAULT_POLICY = "gputopo"


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


#: Builds one policy for a topology from the exact allocator of that topology, the random
#: source kubelet-default draws its map order from, and `faithful` (see `policy_by_name`).
PolicyFactory = Callable[[Topology, Allocator, random.Random, bool], GpuPolicy]


@dataclass(frozen=True)
class SimSpec:
    """What the simulator needs to run an in-node policy as the system it stands for.

    `rank` is the node ranking that system pairs the in-node choice with: `least` allocated
    (kube-scheduler's spread), `most` allocated (HAMi's binpack), or `extender` (kube-scheduler
    with gputopo's extender: the simulator runs the sidecar's lifecycle). `deterministic`: alike
    questions get alike answers, so the simulator may cache them. `share_rule`: how it places a
    fractional pod under `--gpu-sharing` (`spread`, `binpack`), None when the system it stands
    for hands out whole GPUs only."""

    rank: Literal["least", "most", "extender"]
    deterministic: bool
    share_rule: Literal["spread", "binpack"] | None = None


@dataclass(frozen=True)
class InNodePolicy:
    """One registered in-node policy: its name, its factory, and how the simulator runs it.
    `exact` marks the exact allocator itself, which reads only the bandwidth matrix (so
    `PolicyPool` shares `AllocatorPool`'s tables for it)."""

    name: str
    make: PolicyFactory
    sim: SimSpec
    exact: bool = False


def _exact(topology: Topology, exact: Allocator, rng: random.Random, faithful: bool) -> GpuPolicy:
    return exact


def _kubelet(topology: Topology, exact: Allocator, rng: random.Random, faithful: bool) -> GpuPolicy:
    return KubeletOrder(topology, allocator=exact, rng=rng)


def _pairs(topology: Topology, exact: Allocator, rng: random.Random, faithful: bool) -> GpuPolicy:
    return BestEffortPairs(topology, allocator=exact, faithful=faithful)


def _combo(topology: Topology, exact: Allocator, rng: random.Random, faithful: bool) -> GpuPolicy:
    return BestCombo(topology, allocator=exact)


#: Every in-node policy, in the order flags, errors and the simulator's tables list them.
REGISTRY: tuple[InNodePolicy, ...] = (
    InNodePolicy("gputopo", _exact, SimSpec("extender", deterministic=True), exact=True),
    InNodePolicy("kubelet-default", _kubelet, SimSpec("least", deterministic=False, share_rule="spread")),
    InNodePolicy("best-effort-pairs", _pairs, SimSpec("least", deterministic=True)),
    InNodePolicy("best-combo", _combo, SimSpec("most", deterministic=True, share_rule="binpack")),
)
POLICY_NAMES: tuple[str, ...] = tuple(p.name for p in REGISTRY)


class UnknownPolicyError(ValueError):
    """A policy name outside `POLICY_NAMES`; the message lists the known ones."""


def registered(name: str) -> InNodePolicy:
    """The registry entry of `name`, else UnknownPolicyError (for flags and annotations)."""
    for entry in REGISTRY:
        if entry.name == name:
            return entry
    raise UnknownPolicyError(f"unknown policy {name!r} (known: {', '.join(POLICY_NAMES)})")


def check_name(name: str) -> str:
    """`name` if it is a known policy, else UnknownPolicyError (for flags and annotations)."""
    return registered(name).name


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
    entry = registered(name)
    exact = pool.get(topology) if pool is not None else Allocator(topology)
    return entry.make(topology, exact, rng if rng is not None else random.Random(0), faithful)


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
        if registered(name).exact:
            return self.allocators.get(topology)
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
