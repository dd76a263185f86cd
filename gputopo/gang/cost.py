"""The cluster objective inside gang planning: what a gang plan costs future demand.

Candidate domains that the gang objective (design.md §5 (1)-(3b): level, fewest nodes, best
worst member, fewest sub-domains) leaves equal were ordered by raw best fit, the fewest free
GPUs. Free GPUs are not what later jobs need: two free GPUs of a DGX-1's NVLink quad are worth
more to the 2-GPU jobs that come next than two of a PCIe box, and a node left with 7 free
GPUs is no room for a gang member while one left empty is. `plan_cost` prices a plan in the
single-pod objective's unit (`ClusterObjective.take_cost`, GPU-seconds of ideal work per second
lost to the demand mix), summed over the nodes the plan touches, so single pods and gangs are
judged by the same account of the future; best fit stays as the tie-break after it.
Pure: no I/O, no clock, no globals.
"""

from __future__ import annotations

from collections.abc import Sequence

from gputopo.network.nodeview import NodeView
from gputopo.node.allocator import Choice
from gputopo.pod.objective import ClusterObjective

#: Costs are rounded to this many decimals so that equal plans compare equal.
DIGITS = 6


def plan_cost(
    objective: ClusterObjective,
    views: Sequence[NodeView | None],
    assignment: Sequence[tuple[int, int, Choice | None]],
) -> float:
    """The objective's cost of `assignment` ((member, node position, choice) triples over
    `views`); nodes of unknown topology cost nothing (the objective knows nothing of them)."""
    taken: dict[int, list[int]] = {}
    for _, pos, choice in assignment:
        if choice is not None:
            taken.setdefault(pos, []).extend(choice.indices)
    cost = 0.0
    for pos, gpus in taken.items():
        view = views[pos]
        if view is None or view.allocator is None:
            continue
        cost += objective.take_cost(view.allocator, view.free, gpus)
    return round(cost, DIGITS)
