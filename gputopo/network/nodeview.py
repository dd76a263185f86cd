"""What the placers know of one node, and what they answer with.

Shared by single-pod placement (`gputopo.pod.placement`) and gang planning (`gputopo.gang.planner`): a
node's free GPUs and allocator at one instant (`NodeView`), a pod's node and GPU set
(`Placement`), the caller-owned memo of allocator answers (`ChoiceMemo`), and how a member's
set compares across nodes (`member_quality`). Pure: no I/O, no clock, no globals.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gputopo.node.allocator import Choice
from gputopo.node.policy import GpuPolicy

#: A member's GPU set as the gang compares it across nodes: (ring MB/s, pair-sum MB/s).
Quality = tuple[int, ...]
#: Quality of a set on a node of unknown topology: below every measured set.
UNKNOWN_QUALITY: Quality = ()


@dataclass(frozen=True)
class NodeView:
    """What the planner knows of one node at one instant."""

    name: str
    labels: Mapping[str, str]
    gpu_count: int
    free: frozenset[int]  # free GPU indices (healthy, not allocated, not reserved)
    allocator: GpuPolicy | None = None  # the node's policy; None = topology unknown: neutral score

    def __post_init__(self) -> None:
        # Free sets are dictionary keys of the planner's memo: a plain set would not hash.
        if type(self.free) is not frozenset:
            object.__setattr__(self, "free", frozenset(self.free))


@dataclass(frozen=True)
class Placement:
    pod: str
    node: str
    gpus: tuple[int, ...]  # GPU indices the node allocator would give (empty if unknown topology)
    choice: Choice | None = None


class ChoiceMemo:
    """Allocator answers per (allocator, free set, size).

    Owned by the caller, never global: one per planning call by default, or one per cluster
    snapshot when the caller wants repeated plans (filter retries, the simulator) to be cheap.
    The gang planner's memo extends it with its own answers (`gputopo.gang.memo.PlanMemo`)."""

    def __init__(self) -> None:
        self._answers: dict[tuple[GpuPolicy, frozenset[int], int], Choice] = {}

    def choose(self, allocator: GpuPolicy, free: frozenset[int], size: int) -> Choice:
        key = (allocator, free, size)
        hit = self._answers.get(key)
        if hit is None:
            hit = self._answers[key] = allocator.choose(sorted(free), size)
        return hit

    def __len__(self) -> int:
        return len(self._answers)


def member_quality(choice: Choice | None) -> Quality:
    """How good a member's set is, comparable across nodes: ring bandwidth, then pair sum.

    The node objective's other keys do not carry across nodes: least disruption describes
    the node's leftovers (its tuple changes shape with the number of free GPUs), and the
    index tie-break means nothing between two machines. Leftovers are (4)'s business."""
    if choice is None:
        return UNKNOWN_QUALITY
    return (choice.ring_mbps, choice.pair_sum_mbps)
