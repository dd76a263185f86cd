"""NVML health: XID critical errors (and double-bit ECC, reported as XID 48) as HealthEvents.

`XidWatch.run` waits on an NVML event set and turns each event into a HealthEvent; the
HealthTracker decides what it means. A failing wait emits one event for all GPUs and backs off;
nothing escapes the loop. A node where no GPU reports events is left unwatched rather than
marked Unhealthy, as NVIDIA's plugin does (its `internal/rm/health.go`, kept apart from device
discovery there as `deviceplugin.nvml_topology` is here).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from deviceplugin.backend import HealthEvent
from deviceplugin.health import ALL_GPUS
from deviceplugin.nvmlapi import NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_TIMEOUT
from deviceplugin.nvmlapi import code as _code
from deviceplugin.nvmlapi import text as _text
from gputopo import jsonlog

log = logging.getLogger("deviceplugin.nvml")

#: XID NVML reports for a double-bit ECC error; the DBE event is mapped to it.
DBE_XID = 48

_NVML_XID_EVENT = 0x8
_NVML_DBE_EVENT = 0x2


class XidWatch:
    """The event-set loop of one NVML backend; `closed` is the backend's, set on close."""

    def __init__(
        self,
        nvml: Any,
        closed: threading.Event,
        *,
        event_timeout_ms: int = 1000,
        error_backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
    ) -> None:
        self._nvml = nvml
        self._closed = closed
        self.event_timeout_ms = event_timeout_ms
        self.error_backoff_s = error_backoff_s
        self.max_backoff_s = max_backoff_s

    def run(self, stop: threading.Event, emit: Callable[[HealthEvent], None]) -> None:
        """Wait on NVML XID / DBE events until `stop`; NVML failures become all-GPU events."""
        backoff = self.error_backoff_s
        event_set: Any = None
        while not (stop.is_set() or self._closed.is_set()):
            try:
                if event_set is None:
                    event_set = self._register_events()
                    if event_set is None:
                        while not (stop.wait(0.2) or self._closed.is_set()):
                            pass
                        return
                self._wait_once(event_set, emit)
                backoff = self.error_backoff_s
            except Exception as e:  # the watcher must outlive any driver or consumer failure
                emit_all = isinstance(e, self._nvml.NVMLError)
                jsonlog.event(
                    log,
                    "health_watch_error",
                    logging.ERROR,
                    backoff_s=backoff,
                    reason=f"{type(e).__name__}: {e}" + ("; marking all GPUs" if emit_all else ""),
                )
                if emit_all:
                    self._safe_emit(emit, HealthEvent(uuid=ALL_GPUS, reason=f"NVML event watch failed: {e}"))
                    self._free_event_set(event_set)
                    event_set = None
                stop.wait(backoff)
                backoff = min(backoff * 2, self.max_backoff_s)
        self._free_event_set(event_set)

    def _register_events(self) -> Any:
        """A registered event set, or None when no GPU here can report events (health unwatched,
        as NVIDIA's plugin does: marking every GPU Unhealthy would take a working node down)."""
        nvml = self._nvml
        wanted = int(getattr(nvml, "nvmlEventTypeXidCriticalError", _NVML_XID_EVENT)) | int(
            getattr(nvml, "nvmlEventTypeDoubleBitEccError", _NVML_DBE_EVENT)
        )
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as e:
            if _code(e) != NVML_ERROR_NOT_SUPPORTED:
                raise
            jsonlog.event(
                log, "health_watch_disabled", logging.WARNING, reason="NVML events not supported on this node"
            )
            return None
        watched = 0
        try:
            for i in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
                try:
                    mask = wanted & int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
                    if mask:
                        nvml.nvmlDeviceRegisterEvents(handle, mask, event_set)
                except nvml.NVMLError as e:
                    if _code(e) != NVML_ERROR_NOT_SUPPORTED:
                        raise
                    mask = 0
                if mask:
                    watched += 1
                else:
                    jsonlog.event(
                        log,
                        "health_events_unsupported",
                        logging.WARNING,
                        uuid=uuid,
                        reason="GPU does not report XID events; its health is not watched",
                    )
        except BaseException:
            self._free_event_set(event_set)
            raise
        if not watched:
            self._free_event_set(event_set)
            jsonlog.event(
                log, "health_watch_disabled", logging.WARNING, reason="no GPU on this node reports XID events"
            )
            return None
        jsonlog.event(log, "health_watch_started", gpus=watched, reason="NVML event set registered")
        return event_set

    def _wait_once(self, event_set: Any, emit: Callable[[HealthEvent], None]) -> None:
        nvml = self._nvml
        try:
            data = nvml.nvmlEventSetWait(event_set, self.event_timeout_ms)
        except nvml.NVMLError as e:
            if _code(e) == NVML_ERROR_TIMEOUT:
                return
            raise
        kind = int(data.eventType)
        try:
            uuid = _text(nvml.nvmlDeviceGetUUID(data.device))
        except nvml.NVMLError as e:
            uuid, why = ALL_GPUS, f" on an unidentified GPU ({e})"
        else:
            why = ""
        if kind & int(getattr(nvml, "nvmlEventTypeXidCriticalError", _NVML_XID_EVENT)):
            xid = int(data.eventData)
            self._safe_emit(emit, HealthEvent(uuid=uuid, reason=f"XID {xid}{why}", xid=xid))
        elif kind & int(getattr(nvml, "nvmlEventTypeDoubleBitEccError", _NVML_DBE_EVENT)):
            self._safe_emit(emit, HealthEvent(uuid=uuid, reason=f"double-bit ECC error{why}", xid=DBE_XID))

    def _safe_emit(self, emit: Callable[[HealthEvent], None], event: HealthEvent) -> None:
        try:
            emit(event)
        except Exception as e:
            jsonlog.event(
                log, "health_emit_failed", logging.ERROR, uuid=event.uuid, reason=f"{type(e).__name__}: {e}"
            )

    def _free_event_set(self, event_set: Any) -> None:
        if event_set is not None:
            try:
                self._nvml.nvmlEventSetFree(event_set)
            except self._nvml.NVMLError:
                pass
