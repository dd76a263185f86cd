"""When a multi-GPU pod should wait for a node that gives it that node's best ring.

The single-pod objective (`pod.objective`) ranks the nodes that have room *now*. On a busy
cluster that is usually one node (Philly replay on the default preset: 96-98 % of single-pod
placements had exactly one node with room), and what it offers is whatever the last departure
left: two GPUs behind different PLX switches, four across the sockets of a PCIe box. Such a set
runs the job at a fraction of the speed the same node gives it at its best (a 4-GPU
data-parallel step across the sockets of a PCIe box takes 1.17x as long as inside one, expected over
the default mix of workload profiles by the measured job-time model), and holds
the GPUs that much longer. Measured (docs/objective.md, "pods at best ring"): every such
placement on that run came when no node with room offered better, so no ranking could avoid it;
only waiting for the next departure could. Like a gang's wait for its level, it is opt-in
(issue 18): with the default `spill_after_s` of 0 a pod takes the best node that fits now, and
an operator (--gang-spill-after) or the pod (gputopo.io/topology-wait) asks for the wait.

The rule, as `gang.levelwait`'s for gangs: a pod of 2 GPUs or more is *held* to the nodes whose set is
good enough for it on that node's own scale — the job's efficiency on its set against the
node's best set of that size, by the measured job-time model (gputopo.jobtime, through the
objective's `CommProfile`), within the objective's `band` — for
up to `spill_after_s` from the first time a node with room was not good enough. While held, the
other nodes are filtered out (it waits if none is left); past that it takes what there is, so no
pod waits forever for capacity that other work keeps busy. A node of unknown topology is never
held back (nothing is known to judge it by), and with `spill_after_s` 0 the rule is off (the
default; and the simulator's fill mode, where nothing ever leaves and a wait would be a rejection).

Pure: no I/O, no clock (the caller passes `now`), no globals; the caller owns the instance.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Protocol

from gputopo.jobtime.model import ring_busbw_gbps
from gputopo.network.nodeview import ChoiceMemo
from gputopo.node.allocator import AllocationError, Allocator
from gputopo.node.policy import GpuPolicy
from gputopo.pod.objective import CommProfile


class Kind(Protocol):
    """Nodes alike for a pod: the node's GPU policy (None: topology unknown) and free GPUs."""

    @property
    def allocator(self) -> GpuPolicy | None: ...

    @property
    def free(self) -> frozenset[int]: ...


#: Pods whose first decline is remembered (oldest out beyond this).
MAX_HELD = 100_000


class RingWait:
    """Which nodes a multi-GPU pod accepts now, and since when it has been declining some."""

    def __init__(
        self, comm: CommProfile, band: float, spill_after_s: float, *, max_held: int = MAX_HELD
    ) -> None:
        if not 0 <= band < 1:
            raise ValueError(f"band must be within 0..1, got {band!r}")
        if not spill_after_s >= 0:
            raise ValueError(f"spill_after_s must be >= 0, got {spill_after_s!r}")
        self.comm = comm
        self.band = band
        self.spill_after_s = spill_after_s
        self._max_held = max(1, max_held)
        self._first: dict[Hashable, float] = {}  # pod -> when a node with room was first declined
        self._good: dict[tuple[GpuPolicy, frozenset[int], int], bool] = {}
        self._busbws: dict[tuple[Allocator, int, int], float] = {}  # see `_busbw`

    def good(
        self, policy: GpuPolicy | None, free: frozenset[int], gpus: int, memo: ChoiceMemo | None = None
    ) -> bool:
        """Whether the set the node's policy gives `gpus` GPUs out of `free` is good enough on
        this node: its step time within `band` of the node's best ring's (a function of the
        policy, the free set and the size: memoised on them). A caller that keeps the policy's
        answers in a `memo` (the simulator) has the set asked of it: the same call, made once."""
        if policy is None or gpus < 2:
            return True
        key = (policy, free, gpus)
        hit = self._good.get(key)
        if hit is None:
            if len(self._good) > 200_000:
                self._good.clear()
            try:
                ring = (
                    policy.choose(sorted(free), gpus) if memo is None else memo.choose(policy, free, gpus)
                ).ring_mbps
                best = policy.exact.best_ring_mbps(gpus)
            except AllocationError:  # the node's own policy refuses: nothing to judge it by
                hit = self._good[key] = True
                return hit
            topology = policy.exact
            here = self._busbw(topology, gpus, ring)
            hit = self._good[key] = self.comm.efficiency(
                gpus, here, max(here, self._busbw(topology, gpus, best))
            ) >= (1 - self.band)
        return hit

    def _busbw(self, alloc: Allocator, gpus: int, ring_mbps: int) -> float:
        """gputopo.jobtime.model.ring_busbw_gbps, kept per (server, size, ring)."""
        key = (alloc, gpus, ring_mbps)
        hit = self._busbws.get(key)
        if hit is None:
            if len(self._busbws) > 100_000:
                self._busbws.clear()
            hit = self._busbws[key] = ring_busbw_gbps(alloc, gpus, ring_mbps)
        return hit

    def held(self, pod: Hashable, declined: bool, now: float, spill_after_s: float | None = None) -> bool:
        """Whether `pod` is held to the good nodes now, given that some node with room is not
        good enough (`declined`): its wait starts at the first such answer and ends after
        `spill_after_s` (the pod's own bound, its gputopo.io/topology-wait; None: the
        instance's). Without a declined node nothing is held and no wait starts."""
        spill = self.spill_after_s if spill_after_s is None else spill_after_s
        if not declined or spill <= 0:
            return False
        first = self._first.get(pod)
        if first is None:
            if len(self._first) >= self._max_held:
                del self._first[next(iter(self._first))]
            first = self._first[pod] = now
        return now - first < spill

    def judge(self, gpus: int, spill_after_s: float | None = None) -> Callable[[Kind], bool] | None:
        """The per-kind test a filter applies for a pod of `gpus` GPUs whose own bound is
        `spill_after_s` (None: the instance's); None when such a pod is never held, so there is
        nothing to judge."""
        spill = self.spill_after_s if spill_after_s is None else spill_after_s
        if gpus < 2 or spill <= 0:
            return None
        return lambda k: self.good(k.allocator, k.free, gpus)

    def reason(
        self, pod: Hashable, gpus: int, declined: bool, now: float, spill_after_s: float | None = None
    ) -> str | None:
        """Why the declined nodes are dropped for `pod` now, or None when it is not held
        (`held`; a pod of one GPU never is)."""
        if gpus < 2 or not self.held(pod, declined, now, spill_after_s):
            return None
        return f"waiting {now - self._first[pod]:.0f} s for a node that gives {gpus} GPUs its best ring (ringwait)"

    def forget(self, pod: Hashable) -> None:
        """The pod is placed (or gone): its wait ends."""
        self._first.pop(pod, None)

    def __len__(self) -> int:
        return len(self._first)
