"""Gangs waiting for a domain of their own level, as the simulated sidecar last asked them.

A gang that waits for its own level (`gputopo.gang.levelwait`) is the head of its shape's queue,
which the engine tries again after every departure: on the default run 7,863 of 9,511 gang
asks end that way, each a pass over every node's view. The tracker says what such an answer
can change with (`gang.levelwait.LevelWait`): the spill time (the tracker checks it,
`GangTracker.repeat_wait`), a domain of the level reaching the gang's count of slots, or the
cluster no longer having them. Only frees add slots, and only on their own nodes, so this
keeps per waiting gang each domain's slots short of the count and the free masks they were
counted on: a retry compares masks, looks at the nodes that changed, and asks the tracker
for real only when a domain may now hold the gang.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress
from operator import ne

from gputopo.gang.levelwait import LevelWait
from gputopo.network.levels import NetworkIndex
from gputopo.sim.state import ClusterState

#: Waiting gangs kept (one per queued gang at most; the oldest are forgotten past this).
MAX_PARKED = 100_000


@dataclass
class _Parked:
    wait: LevelWait
    domain: list[int]  # per node (the state's order): its domain of the wait's level
    short: dict[int, int]  # domain -> slots it lacks to hold the gang (every one > 0)
    spare: int  # slots of the whole cluster beyond the gang's count (>= 0)
    masks: list[int]  # the free masks `short` and `spare` were counted on


class LevelWaits:
    """The waiting gangs of one simulated sidecar, by job id."""

    def __init__(self, names: Sequence[str]) -> None:
        self._names = list(names)  # node names in the state's order
        self._domains: dict[str, tuple[NetworkIndex, list[int]]] = {}
        self._parked: dict[int, _Parked] = {}

    def __len__(self) -> int:
        return len(self._parked)

    def park(self, job: int, wait: LevelWait | None, state: ClusterState) -> None:
        """Keep the tracker's answer for `job`, found on the state's free masks now (None:
        the answer was another, so the next ask is for real)."""
        self._parked.pop(job, None)
        if wait is None:
            return
        domain = self._domain_ids(wait.index, wait.level)
        size, count = wait.size, wait.count
        slots: dict[int, int] = {}
        for d, mask in zip(domain, state.mask, strict=True):
            slots[d] = slots.get(d, 0) + mask.bit_count() // size
        short = {d: count - k for d, k in slots.items()}
        spare = sum(slots.values()) - count
        if min(short.values()) <= 0 or spare < 0:  # not an answer for these masks: ask again
            return
        if len(self._parked) >= MAX_PARKED:
            del self._parked[next(iter(self._parked))]
        self._parked[job] = _Parked(wait, domain, short, spare, list(state.mask))

    def unchanged(self, job: int, state: ClusterState) -> LevelWait | None:
        """The parked answer while it still holds on the state's capacity: no domain of its
        level reached the gang's count of slots since it was parked, and the cluster still has
        that many (time is the tracker's to check). None when asking could answer otherwise
        (or `job` is not parked): then it is forgotten."""
        p = self._parked.get(job)
        if p is None:
            return None
        old, now = p.masks, state.mask
        if now == old:  # nothing changed since it was last asked (a third of the asks): it holds
            return p.wait
        size, domain, short, spare = p.wait.size, p.domain, p.short, p.spare
        gained: list[int] = []  # the domains whose slots changed, each as often as its nodes
        for i in compress(range(len(now)), map(ne, now, old)):  # the nodes whose mask changed
            delta = now[i].bit_count() // size - old[i].bit_count() // size
            if delta:
                d = domain[i]
                short[d] -= delta
                spare += delta
                gained.append(d)
        p.masks, p.spare = now[:], spare
        # a domain may hold the gang now, or the cluster cannot (the planner says why): on the
        # counts after every change, as a count from scratch would find them
        if spare < 0 or any(short[d] <= 0 for d in gained):
            del self._parked[job]
            return None
        return p.wait

    def forget(self, job: int) -> None:
        self._parked.pop(job, None)

    def _domain_ids(self, index: NetworkIndex, level: str) -> list[int]:
        hit = self._domains.get(level)
        if hit is None or hit[0] is not index:
            ids = index.level(level).domain_id
            hit = self._domains[level] = (index, [int(ids[index.position[n]]) for n in self._names])
        return hit[1]
