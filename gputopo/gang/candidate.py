"""A domain's candidate gang plan with its objective values (`Candidate`), ranked by the gang
objective of design.md §5 (`gputopo.gang.planner`). Made by `gputopo.gang.domain` and
`gputopo.gang.singleoffer`, and kept in the caller's `gputopo.gang.memo.PlanMemo`: below both,
so the memo can name it. Pure data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gputopo.network.nodeview import Quality
from gputopo.node.allocator import Choice


@dataclass(frozen=True)
class Candidate:
    """A feasible placement inside one domain, with its objective values."""

    domain: int
    nodes_used: int
    worst: Quality
    spans: tuple[int, ...]  # (3b): domains touched per lower level, largest level first
    domain_free: int
    assignment: tuple[tuple[int, int, Choice | None], ...]  # (member index, node position, choice)
    # (4): `gang.cost.plan_cost` of the assignment, when its maker already worked it out
    cost: float | None = field(default=None, compare=False)

    def rank(self, cost: float = 0.0) -> tuple[int, _Desc, tuple[int, ...], float, int, int]:
        """Sort key: smaller is better — (2) fewest nodes, (3) best worst, (3b) fewest
        sub-domains, (4) least cost to future demand (`gang.cost`), then fullest, (5) name."""
        return (self.nodes_used, _Desc(self.worst), self.spans, cost, self.domain_free, self.domain)


@dataclass(frozen=True)
class _Desc:
    """Reverses the order of a tuple inside a sort key."""

    value: Quality

    def __lt__(self, other: _Desc) -> bool:
        return self.value > other.value
