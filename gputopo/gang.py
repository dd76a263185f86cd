"""Gang placement (design.md §5): all members of a PodGroup in the smallest network domain.

(API fixed; implementation in progress by the scheduler work. Pure: no I/O, no globals.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gputopo.allocator import Allocator, Choice


@dataclass(frozen=True)
class NodeView:
    """What the planner knows of one node at one instant."""

    name: str
    labels: Mapping[str, str]
    gpu_count: int
    free: frozenset[int]  # free GPU indices (healthy, not allocated, not reserved)
    allocator: Allocator | None = None  # None = topology unknown: GPUs are interchangeable, neutral score


@dataclass(frozen=True)
class Member:
    pod: str  # "namespace/name"
    gpus: int  # GPUs the pod asks for (nvidia.com/gpu)


@dataclass(frozen=True)
class GangSpec:
    key: str  # "namespace/group-name"
    members: tuple[Member, ...]  # the members to place now (pending ones)
    required_level: str | None = None  # gputopo.io/required-topology (a level's label key)
    preferred_level: str | None = None  # gputopo.io/preferred-topology


@dataclass(frozen=True)
class Placement:
    pod: str
    node: str
    gpus: tuple[int, ...]  # GPU indices the node allocator would give (empty if unknown topology)
    choice: Choice | None = None


@dataclass(frozen=True)
class GangPlan:
    gang: str
    level: str  # the label key of the level whose one domain holds every member
    domain: str  # that domain's label value
    placements: tuple[Placement, ...]


@dataclass(frozen=True)
class NoPlan:
    gang: str
    reason: str  # readable: why nothing fits


def plan_gang(spec: GangSpec, nodes: Sequence[NodeView], levels: Sequence[str]) -> GangPlan | NoPlan:
    """Plan every member at once under the gang objective of design.md §5."""
    raise NotImplementedError


def node_scores(gpus: int, nodes: Sequence[NodeView]) -> dict[str, int]:
    """Prioritize for a single pod: each node scored 0..10 by the best GPU set it can give
    (node objective), then by least disruption of what stays free. Nodes that cannot fit get 0."""
    raise NotImplementedError
