"""GPU health as a small state machine fed by backend observations and a clock.

Backends report what they see (an XID, an explicit state, an NVML failure); this tracker alone
decides what that means for kubelet's Healthy/Unhealthy, so the file backend and NVML behave
identically and the rules can be tested without hardware or sleeping.

Rules:

* An XID not in `ignored_xids` marks the GPU Unhealthy and (re)starts its quiet period. The
  default ignored XIDs (13, 31, 43, 45, 68, 109) are application faults (illegal address, MMU
  fault from a user kernel, reset channel, preemption, ...) that say nothing about the card;
  the same list NVIDIA's device plugin ignores.
* An event with neither `xid` nor `healthy` is a failure of the watcher itself (an NVML wait
  error): treated like a critical XID, because the GPU can no longer be vouched for.
* `healthy=True/False` (the file backend, an operator) sets the state directly. An explicit
  Unhealthy is sticky: it never times out, only an explicit Healthy clears it.
* `uuid == ALL_GPUS` applies the event to every GPU (NVML could not say which GPU failed).
  An event for a UUID the tracker does not know changes nothing and is logged: it is either a
  GPU the plugin does not manage (MIG, a hot-added card) or a bug, and must not take healthy
  GPUs down.
* `tick()` returns a GPU to Healthy once it has been quiet for `recovery_seconds` after its
  last XID. `recovery_seconds=None` never recovers (NVIDIA's plugin needs a restart for that;
  users asked for recovery in k8s-device-plugin#234).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from deviceplugin.hardware.backend import ALL_GPUS, HealthEvent
from deviceplugin.settings import IGNORED_XIDS
from gputopo import jsonlog

log = logging.getLogger("deviceplugin.health")


@dataclass(frozen=True, slots=True)
class _Mark:
    """Why a GPU is unhealthy: `since` is the clock of the last bad event, None when sticky."""

    reason: str
    since: float | None


class HealthTracker:
    """Health of a fixed set of GPUs; thread-safe, all time from the injected clock."""

    def __init__(
        self,
        uuids: Iterable[str],
        ignored_xids: Iterable[int] = IGNORED_XIDS,
        recovery_seconds: float | None = 300,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._uuids = tuple(dict.fromkeys(uuids))
        if ALL_GPUS in self._uuids:
            raise ValueError(f"{ALL_GPUS!r} is reserved for events about every GPU")
        if recovery_seconds is not None and not recovery_seconds >= 0:
            raise ValueError(f"recovery_seconds must be >= 0 or None, got {recovery_seconds!r}")
        self.ignored_xids = frozenset(ignored_xids)
        self.recovery_seconds = recovery_seconds
        self._clock = clock
        self._marks: dict[str, _Mark] = {}
        self._lock = threading.Lock()

    def observe(self, event: HealthEvent) -> bool:
        """Apply one observation; True when any GPU's Healthy/Unhealthy state changed."""
        with self._lock:
            if event.uuid == ALL_GPUS:
                targets = self._uuids
            elif event.uuid in self._uuids:
                targets = (event.uuid,)
            else:
                jsonlog.event(
                    log,
                    "health_event_unknown_gpu",
                    logging.WARNING,
                    uuid=event.uuid,
                    event_reason=event.reason,
                    reason="event names a GPU this plugin does not manage; ignored",
                )
                return False
            if event.xid is not None and event.xid in self.ignored_xids:
                jsonlog.event(
                    log,
                    "health_xid_ignored",
                    uuid=event.uuid,
                    xid=event.xid,
                    reason="application-level XID, says nothing about the GPU",
                )
                return False
            changed = False
            for uuid in targets:
                changed |= self._apply(uuid, event)
            return changed

    def _apply(self, uuid: str, event: HealthEvent) -> bool:
        was_healthy = uuid not in self._marks
        if event.healthy is True:
            self._marks.pop(uuid, None)
        elif event.healthy is False:
            self._marks[uuid] = _Mark(event.reason, None)
        else:
            # XID or watcher failure: (re)start the quiet period, but never soften a sticky mark.
            current = self._marks.get(uuid)
            if current is None or current.since is not None:
                self._marks[uuid] = _Mark(event.reason, self._clock())
        healthy = uuid not in self._marks
        if healthy != was_healthy:
            jsonlog.event(
                log,
                "gpu_health_changed",
                uuid=uuid,
                healthy=healthy,
                xid=event.xid,
                reason=event.reason,
            )
        return healthy != was_healthy

    def tick(self) -> bool:
        """Recover GPUs quiet for `recovery_seconds`; True when any came back."""
        if self.recovery_seconds is None:
            return False
        with self._lock:
            now = self._clock()
            back = [
                u
                for u, m in self._marks.items()
                if m.since is not None and now - m.since >= self.recovery_seconds
            ]
            for uuid in back:
                del self._marks[uuid]
                jsonlog.event(
                    log,
                    "gpu_health_changed",
                    uuid=uuid,
                    healthy=True,
                    reason=f"no critical event for {self.recovery_seconds:g}s",
                )
            return bool(back)

    def state(self) -> dict[str, bool]:
        """UUID -> healthy, in the order the GPUs were given."""
        with self._lock:
            return {u: u not in self._marks for u in self._uuids}

    def reason(self, uuid: str) -> str | None:
        """Why a GPU is unhealthy (None when healthy), for logs and metrics."""
        with self._lock:
            mark = self._marks.get(uuid)
            return None if mark is None else mark.reason
