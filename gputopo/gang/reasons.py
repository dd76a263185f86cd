"""Why a gang fits nowhere, in words a person reads (`planner.plan_gang`'s NoPlan reasons).

Pure: no I/O, no clock, no globals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gputopo.network.levels import CLUSTER, short_name


@dataclass(frozen=True)
class Miss:
    """Why a level had no domain for the gang: its roomiest domain, for the reason text."""

    level: str
    domain: str
    free: int
    slots: int
    feasible_aggregate: bool


def _describe(sizes: Sequence[int]) -> str:
    counts: dict[int, int] = {}
    for g in sizes:
        counts[g] = counts.get(g, 0) + 1
    parts = [
        f"{n} pod{'s' if n > 1 else ''} x {g} GPU{'s' if g > 1 else ''}"
        for g, n in sorted(counts.items(), reverse=True)
    ]
    total = sum(sizes)
    return " + ".join(parts) + (f" = {total} GPUs" if len(parts) > 1 or counts[sizes[0]] > 1 else "")


def no_plan_reason(gang: str, sizes: Sequence[int], miss: Miss) -> str:
    """Why the last level tried failed: the whole cluster, or the required level."""
    what = _describe(sizes)
    n, g = len(sizes), max(sizes)
    room = (
        f"room for {miss.slots} of the {n} pods"
        if len(set(sizes)) == 1
        else f"room for {miss.slots} pods of {g} GPUs"
    )
    tail = " (the free GPUs are too fragmented to pack the pods)" if miss.feasible_aggregate else ""
    if miss.level == CLUSTER:
        return f"the whole cluster cannot hold gang {gang} ({what}): {miss.free} free GPUs, {room}{tail}"
    return (
        f"no {short_name(miss.level)} domain can hold gang {gang} ({what}); "
        f"best {miss.level}={miss.domain} has {miss.free} free GPUs, {room}{tail}"
    )
