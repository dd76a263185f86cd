"""The NVML backend: GPUs, every pair's link and XID health events from a real driver.

This module owns NVML's lifetime (init once, shutdown on close), waits on NVML's XID events
(`XidWatch`) and presents both halves as the Backend Protocol (`NvmlBackend`). Topology
discovery, the rules that map NVML's answers to `nvidia-smi topo -m` codes, NUMA and bandwidth,
is `deviceplugin.hardware.nvml_topology`, as NVIDIA's plugin keeps device discovery apart from its
`internal/rm/health.go`; `python -m deviceplugin.hardware.nvml_probe` prints what discovery finds.

Discovery runs when asked (`discover()`: at start and on an explicit re-probe), never inside an
RPC. Health: XID critical errors (and double-bit ECC, reported as XID 48) become HealthEvents;
`watch_health` waits on an NVML event set until stopped or closed, and the HealthTracker decides
what an event means. A failing wait emits one event for all GPUs and backs off; nothing escapes
the loop. A node where no GPU reports events is left unwatched rather than marked Unhealthy, as
NVIDIA's plugin does.

`nvml` is the `pynvml` module (nvidia-ml-py) unless a stand-in is injected (the tests model
whole servers that way).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from deviceplugin.hardware.backend import ALL_GPUS, HealthEvent
from deviceplugin.hardware.nvml_topology import (
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_TIMEOUT,
    NvmlUnavailable,
    TopologyProbe,
    error_code,
    text,
)
from gputopo import jsonlog
from gputopo.node.topology import Topology

__all__ = ["DBE_XID", "NvmlBackend", "NvmlUnavailable", "XidWatch"]

log = logging.getLogger("deviceplugin.nvml")

#: XID NVML reports for a double-bit ECC error; the DBE event is mapped to it.
DBE_XID = 48

_NVML_XID_EVENT = 0x8
_NVML_DBE_EVENT = 0x2


class NvmlBackend:
    """Backend Protocol over NVML: discovery and health watch share one initialised NVML."""

    def __init__(
        self,
        *,
        nvlink_gbps_per_link: float | None = None,
        pcie_gbps: Mapping[str, float] | None = None,
        name: str = "nvml",
        event_timeout_ms: int = 1000,
        error_backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        sysfs_root: str = "/sys",
        nvml: Any = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if nvml is None:
            try:
                import pynvml
            except ImportError as e:  # pragma: no cover - nvidia-ml-py is a dependency
                raise NvmlUnavailable(f"the pynvml module (nvidia-ml-py) is not installed: {e}") from None
            nvml = pynvml
        self._nvml = nvml
        self._probe = TopologyProbe(
            nvml,
            nvlink_gbps_per_link=nvlink_gbps_per_link,
            pcie_gbps=pcie_gbps,
            name=name,
            sysfs_root=sysfs_root,
            clock=clock,
        )
        self.name = name
        self._closed = threading.Event()
        self._xid = XidWatch(
            nvml,
            self._closed,
            event_timeout_ms=event_timeout_ms,
            error_backoff_s=error_backoff_s,
            max_backoff_s=max_backoff_s,
        )
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:
            raise NvmlUnavailable(
                f"NVML init failed: {e} (is the NVIDIA driver loaded and visible?)"
            ) from None
        except OSError as e:
            raise NvmlUnavailable(f"NVML init failed: {e}") from None
        self._initialised = True

    @property
    def last_probe_seconds(self) -> float | None:
        """How long the last `discover()` took, or None before the first."""
        return self._probe.last_probe_seconds

    def discover(self) -> Topology:
        """Probe every GPU and pair (`TopologyProbe.discover`); NvmlUnavailable when NVML fails
        for a whole GPU or sees none."""
        return self._probe.discover()

    def watch_health(self, stop: threading.Event, emit: Callable[[HealthEvent], None]) -> None:
        """Wait on NVML XID / DBE events until `stop` or close; NVML failures become all-GPU events."""
        self._xid.run(stop, emit)

    def close(self) -> None:
        """Stop any watch loop and release NVML (idempotent)."""
        self._closed.set()
        if self._initialised:
            self._initialised = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass


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
            if error_code(e) != NVML_ERROR_NOT_SUPPORTED:
                raise
            jsonlog.event(
                log, "health_watch_disabled", logging.WARNING, reason="NVML events not supported on this node"
            )
            return None
        watched = 0
        try:
            for i in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                uuid = text(nvml.nvmlDeviceGetUUID(handle))
                try:
                    mask = wanted & int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
                    if mask:
                        nvml.nvmlDeviceRegisterEvents(handle, mask, event_set)
                except nvml.NVMLError as e:
                    if error_code(e) != NVML_ERROR_NOT_SUPPORTED:
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
            if error_code(e) == NVML_ERROR_TIMEOUT:
                return
            raise
        kind = int(data.eventType)
        try:
            uuid = text(nvml.nvmlDeviceGetUUID(data.device))
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
