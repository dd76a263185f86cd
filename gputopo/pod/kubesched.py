"""A model of kube-scheduler's own node choice for one pod, with the extender as deployed.

The sidecar does not pick a single pod's node; kube-scheduler does, by adding the extender's
prioritize score to its own score plugins and taking the best total (ties at random). The
simulator uses this model so that its `gputopo` column is what a cluster running deploy/
gets, not what `placement.place_pod` alone would choose. The model (docs/simulator.md):

  total(node) = extender score (0..10) x EXTENDER_WEIGHT x MAX_NODE_SCORE / MAX_EXTENDER_PRIORITY
              + NodeResourcesFit LeastAllocated (0..100) x LEAST_ALLOCATED_WEIGHT

kube-scheduler scales an extender's 0..10 to its 0..100 plugin range (MaxNodeScore /
MaxExtenderPriority = 10) and multiplies by the extender's configured weight (20 in
deploy/base/scheduler/kube-scheduler-config.yaml). LeastAllocated has weight 1 in the default
profile and scores cpu and memory, not GPUs; pods on GPU nodes ask for CPU and memory in
proportion to their GPUs, so the model reads the node's allocated share as its GPU share.
The other default plugins (TaintToleration, NodeAffinity, PodTopologySpread, InterPodAffinity,
ImageLocality, BalancedAllocation) score every node of a homogeneous simulated cluster alike
and are left out. selectHost then takes the highest total, choosing uniformly at random among
equal totals (kube-scheduler samples reservoir-style; same distribution).

Pure: the random source is passed in.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

#: kube-scheduler's plugin score range and the extender's (framework.MaxNodeScore,
#: extenderv1.MaxExtenderPriority).
MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10
#: The extender's weight as deploy/ configures it.
EXTENDER_WEIGHT = 20
#: NodeResourcesFit's weight in the default profile (scoring strategy LeastAllocated).
LEAST_ALLOCATED_WEIGHT = 1


def least_allocated(free_after: int, capacity: int) -> int:
    """LeastAllocated's 0..100: the share of the node left unrequested after placing the pod
    (integer arithmetic, as kube-scheduler's `(capacity - requested) * MaxNodeScore / capacity`)."""
    if capacity <= 0:
        return 0
    return max(0, min(free_after, capacity)) * MAX_NODE_SCORE // capacity


def total_score(extender: int, free_after: int, capacity: int, *, weight: int = EXTENDER_WEIGHT) -> int:
    """kube-scheduler's total for one node: the scaled, weighted extender score plus LeastAllocated."""
    scaled = extender * weight * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)
    return scaled + least_allocated(free_after, capacity) * LEAST_ALLOCATED_WEIGHT


def select_host(scored: Sequence[tuple[int, int]], rng: random.Random) -> int:
    """The index of the chosen entry of `(total, count)` pairs, where `count` nodes share that
    total (a class of identical nodes): the best total wins, ties uniformly over the nodes, so a
    class is chosen in proportion to its size. Returns the index into `scored`; -1 if empty."""
    best: int | None = None
    tied: list[tuple[int, int]] = []  # (index, count) of the entries at the best total so far
    for k, (t, c) in enumerate(scored):
        if c <= 0:
            continue
        if best is None or t > best:
            best, tied = t, [(k, c)]
        elif t == best:
            tied.append((k, c))
    if best is None:
        return -1
    if len(tied) == 1:
        return tied[0][0]
    pick = rng.randrange(sum(c for _, c in tied))
    for k, c in tied:
        if pick < c:
            return k
        pick -= c
    raise AssertionError("unreachable: pick is below the total count")
