"""Capacity promised to a planned gang member but not yet bound, and binds not yet published.

Reservations are explicit values with an expiry, not side effects hidden in a filter: every
other pod and gang sees reserved GPUs as taken, a bind turns a reservation into an allocation,
and a plan that stops binding gives its capacity back when its time runs out. The clock is
passed in by the caller so tests decide when things expire.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Reservation:
    pod: str  # "namespace/name" of the member
    gang: str  # "namespace/group"
    node: str
    gpus: tuple[int, ...]  # GPU indices held (empty when the node's topology is unknown)
    count: int  # GPUs held
    expires_at: float


@dataclass(frozen=True)
class Assumed:
    """A pod the sidecar bound, with the GPUs it expects the node to give it: the node's
    annotation lags behind the bind, so until it catches up these GPUs are taken."""

    pod: str
    node: str
    gpus: tuple[int, ...]
    count: int
    at: float
    uid: str = ""  # the pod's UID: a pod recreated under the same name is another pod


class Reservations:
    """The table of live reservations. Not thread-safe: the caller's lock guards it."""

    def __init__(self) -> None:
        self._by_pod: dict[str, Reservation] = {}
        self._by_gang: dict[str, dict[str, Reservation]] = {}  # a gang's are touched together
        self.version = 0
        self._earliest = float("inf")  # at most the earliest expiry held: `expired` skips the scan before it

    def add(self, items: Iterable[Reservation]) -> None:
        by_pod, by_gang = self._by_pod, self._by_gang
        for r in items:
            if r.pod in by_pod:  # `release_pod` of a pod without one changes nothing
                self.release_pod(r.pod)
            by_pod[r.pod] = r
            mine = by_gang.get(r.gang)
            if mine is None:
                mine = by_gang[r.gang] = {}
            mine[r.pod] = r
            if r.expires_at < self._earliest:
                self._earliest = r.expires_at
        self.version += 1

    @property
    def earliest(self) -> float:
        """At most the earliest expiry held (inf when none): nothing expires before it."""
        return self._earliest

    def get(self, pod: str) -> Reservation | None:
        return self._by_pod.get(pod)

    def release_pod(self, pod: str) -> Reservation | None:
        r = self._by_pod.pop(pod, None)
        if r is not None:
            mine = self._by_gang[r.gang]
            del mine[pod]
            if not mine:
                del self._by_gang[r.gang]
            self.version += 1
        return r

    def release_gang(self, gang: str) -> list[Reservation]:
        gone = list(self._by_gang.pop(gang, {}).values())
        for r in gone:
            del self._by_pod[r.pod]
        if gone:
            self.version += 1
        return gone

    def holds(self, gang: str) -> bool:
        """Whether any member of the gang still holds a reservation."""
        return gang in self._by_gang

    def renew_gang(self, gang: str, expires_at: float) -> int:
        """Push a gang's expiry out (it is making progress); returns how many were renewed."""
        mine = self._by_gang.get(gang, {})
        for pod, r in mine.items():
            if r.expires_at != expires_at:  # members binding at one instant renew to the same time
                mine[pod] = self._by_pod[pod] = Reservation(
                    r.pod, r.gang, r.node, r.gpus, r.count, expires_at
                )
        if mine:
            self._earliest = min(self._earliest, expires_at)
        return len(mine)

    def expired(self, now: float) -> set[str]:
        """Gangs with at least one reservation past its time."""
        if now < self._earliest:
            return set()
        self._earliest = min((r.expires_at for r in self._by_pod.values()), default=float("inf"))
        return {r.gang for r in self._by_pod.values() if r.expires_at <= now}

    def on_node(self, node: str, *, excluding: str = "") -> list[Reservation]:
        return [r for r in self._by_pod.values() if r.node == node and r.pod != excluding]

    def by_node(self) -> dict[str, list[Reservation]]:
        out: dict[str, list[Reservation]] = {}
        for r in self._by_pod.values():
            out.setdefault(r.node, []).append(r)
        return out

    def __iter__(self) -> Iterator[Reservation]:
        return iter(list(self._by_pod.values()))

    def __len__(self) -> int:
        return len(self._by_pod)
