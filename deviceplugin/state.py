"""What the plugin currently advertises: one immutable snapshot, swapped whole on every change.

RPC handlers read `store.current()` once and work on that value, so a health change in the
middle of a GetPreferredAllocation can never mix two device lists. The node's GPU policy (the
exact Allocator unless `--policy` names a baseline) travels in the snapshot: it is built once
per discovered topology (never per RPC) and reused as long as the topology stays equal, however
often health changes.

Listeners (the Node publisher, later the PodResources reconciler) subscribe to snapshots here
instead of being wired into the daemon, and each ListAndWatch stream waits on the store for a
version newer than the one it last sent.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gputopo import jsonlog
from gputopo.node.policy import DEFAULT_POLICY, GpuPolicy, policy_by_name
from gputopo.node.topology import GPU, Topology

log = logging.getLogger("deviceplugin.state")

Listener = Callable[["Snapshot"], None]


@dataclass(frozen=True)
class Snapshot:
    """The topology, its GPU policy (`allocator`) and each GPU's health, as advertised to kubelet.

    `health[uuid]` is True for Healthy; `reasons[uuid]` is the last event that changed it."""

    version: int
    topology: Topology
    allocator: GpuPolicy
    health: Mapping[str, bool]
    reasons: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def gpus(self) -> tuple[GPU, ...]:
        return self.topology.gpus

    def index_of(self, uuid: str) -> int | None:
        return self.topology.index_by_uuid.get(uuid)

    def healthy(self, uuid: str) -> bool:
        return self.health.get(uuid, True)


def make_snapshot(
    version: int,
    topology: Topology,
    health: Mapping[str, bool],
    reasons: Mapping[str, str] | None = None,
    previous: Snapshot | None = None,
    policy: str | None = None,
) -> Snapshot:
    """A snapshot that reuses `previous.allocator` when the topology did not change; the policy
    is `policy`, else the previous snapshot's, else gputopo's."""
    name = policy or (previous.allocator.name if previous is not None else DEFAULT_POLICY)
    allocator = (
        previous.allocator
        if previous is not None and previous.topology == topology and previous.allocator.name == name
        else policy_by_name(name, topology)
    )
    known = {g.uuid for g in topology.gpus}
    return Snapshot(
        version=version,
        topology=topology,
        allocator=allocator,
        health=MappingProxyType({u: bool(health.get(u, True)) for u in sorted(known)}),
        reasons=MappingProxyType({u: r for u, r in (reasons or {}).items() if u in known}),
    )


class SnapshotStore:
    """Holds the current Snapshot; wakes ListAndWatch streams and notifies listeners on change."""

    def __init__(self, initial: Snapshot) -> None:
        self._cond = threading.Condition()
        self._current = initial
        self._closed = False
        self._listeners: list[Listener] = []

    def current(self) -> Snapshot:
        return self._current

    @property
    def closed(self) -> bool:
        return self._closed

    def update(self, topology: Topology, health: Mapping[str, bool], reasons: Mapping[str, str]) -> Snapshot:
        """Publish a new snapshot (allocator rebuilt only if the topology differs)."""
        with self._cond:
            snap = make_snapshot(self._current.version + 1, topology, health, reasons, self._current)
            self._current = snap
            self._cond.notify_all()
            listeners = list(self._listeners)
        for listener in listeners:
            self._notify(listener, snap)
        return snap

    def wait_newer(
        self, version: int, timeout: float, cancelled: threading.Event | None = None
    ) -> Snapshot | None:
        """The current snapshot once its version exceeds `version`; None on timeout, close, or
        once `cancelled` is set (and `wake()` called): a stream whose client left ends at once."""
        with self._cond:
            self._cond.wait_for(
                lambda: (
                    self._closed
                    or self._current.version > version
                    or (cancelled is not None and cancelled.is_set())
                ),
                timeout,
            )
            if self._closed or self._current.version <= version:
                return None
            return self._current

    def wake(self) -> None:
        """Make every waiter re-check its condition (after setting its `cancelled` event)."""
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        """End every waiting stream; later waits return None at once."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def add_listener(self, listener: Listener) -> None:
        """Call `listener(snapshot)` now and after every change (topology or health).

        This is the hook for the Node publisher: it runs on the thread that made the change,
        so a listener should hand slow work (API calls) to its own thread. A failing listener
        is logged and never stops the others or the health loop."""
        with self._cond:
            self._listeners.append(listener)
            snap = self._current
        self._notify(listener, snap)

    def _notify(self, listener: Listener, snap: Snapshot) -> None:
        try:
            listener(snap)
        except Exception as e:
            jsonlog.event(
                log,
                "listener_failed",
                logging.ERROR,
                listener=repr(listener),
                version=snap.version,
                reason=f"{type(e).__name__}: {e}",
            )
