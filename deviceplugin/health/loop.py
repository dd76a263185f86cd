"""Health watching off the RPC path: backend events -> tracker -> a new snapshot.

Two threads: one blocks in `backend.watch_health` (NVML event wait or the file poll), one
ticks the tracker's recovery clock. Whenever either changes a GPU's state, links are probed
again (`backend.discover()`, since a failing GPU can drop its NVLinks) and a new snapshot is
published; the store reuses the allocator when the topology came back equal. RPCs never wait
for any of this: they keep answering from the previous snapshot until the new one is swapped
in.

A GPU the tracker was not started with (a topology whose GPU set changed on re-discovery) is
reported Healthy: the tracker follows the GPUs found at start, and kubelet remains the
authority on what it offers.
"""

from __future__ import annotations

import logging
import threading

from deviceplugin.hardware.backend import Backend, HealthEvent
from deviceplugin.health.tracker import HealthTracker
from deviceplugin.metrics import Metrics
from deviceplugin.state import Snapshot, SnapshotStore
from gputopo import jsonlog

log = logging.getLogger("deviceplugin.healthloop")


class HealthLoop:
    def __init__(
        self,
        backend: Backend,
        tracker: HealthTracker,
        store: SnapshotStore,
        metrics: Metrics,
        tick_seconds: float = 1.0,
    ) -> None:
        self._backend = backend
        self._tracker = tracker
        self._store = store
        self._metrics = metrics
        self._tick_seconds = tick_seconds
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        self._stop.clear()
        self._threads = [
            threading.Thread(target=self._watch, name="health-watch", daemon=True),
            threading.Thread(target=self._tick, name="health-tick", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        self._threads = []

    def _watch(self) -> None:
        try:
            self._backend.watch_health(self._stop, self._on_event)
        except Exception as e:  # the devices stay advertised as last known; say why watching ended
            jsonlog.event(
                log,
                "health_watch_failed",
                logging.ERROR,
                reason=f"{type(e).__name__}: {e}; health no longer watched",
            )

    def _tick(self) -> None:
        while not self._stop.wait(self._tick_seconds):
            if self._tracker.tick():
                self.refresh("recovery period elapsed")

    def _on_event(self, event: HealthEvent) -> None:
        if self._tracker.observe(event):
            self.refresh(event.reason)

    def refresh(self, cause: str) -> Snapshot:
        """Re-probe links, publish the tracker's health, count and log each transition."""
        with self._lock:
            previous = self._store.current()
            topology = previous.topology
            try:
                topology = self._backend.discover()
            except Exception as e:
                jsonlog.event(
                    log,
                    "rediscover_failed",
                    logging.WARNING,
                    reason=f"{type(e).__name__}: {e}; keeping the previous topology",
                )
            health = self._tracker.state()
            reasons = {u: r for u in health if (r := self._tracker.reason(u))}
            try:
                snap = self._store.update(topology, health, reasons)
            except Exception as e:  # the allocator refuses the new layout: the health change still counts
                jsonlog.event(
                    log,
                    "rediscover_rejected",
                    logging.WARNING,
                    topology=topology.name,
                    reason=f"{type(e).__name__}: {e}; keeping the previous topology",
                )
                snap = self._store.update(previous.topology, health, reasons)
            for gpu in snap.gpus:
                before, after = previous.healthy(gpu.uuid), snap.healthy(gpu.uuid)
                if before != after:
                    self._metrics.health_transitions.labels("healthy" if after else "unhealthy").inc()
                    jsonlog.event(
                        log,
                        "health_transition",
                        uuid=gpu.uuid,
                        index=gpu.index,
                        healthy=after,
                        reason=reasons.get(gpu.uuid, cause),
                    )
            self.export_gauges(snap)
            if snap.allocator is not previous.allocator:
                jsonlog.event(
                    log,
                    "allocator_rebuilt",
                    topology=snap.topology.name,
                    reason="re-discovered links differ from the previous topology",
                )
            return snap

    def export_gauges(self, snap: Snapshot) -> None:
        healthy = sum(1 for g in snap.gpus if snap.healthy(g.uuid))
        self._metrics.devices.labels("healthy").set(healthy)
        self._metrics.devices.labels("unhealthy").set(len(snap.gpus) - healthy)
        self._metrics.export_health((g.index, g.uuid, snap.healthy(g.uuid)) for g in snap.gpus)
