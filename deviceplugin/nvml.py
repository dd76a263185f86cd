"""The NVML backend: GPUs, every pair's link and XID health events from a real driver.

Discovery builds the same Topology a topology file would, with the codes `nvidia-smi topo -m`
prints, so what an operator reads on the node is what the allocator decides on:

* PCIe level of a pair: `nvmlDeviceGetTopologyCommonAncestor`, mapped as nvidia-smi does:
  INTERNAL (two GPUs on one board) and SINGLE -> PIX, MULTIPLE -> PXB, HOSTBRIDGE -> PHB,
  NODE (= CPU) -> NODE, SYSTEM -> SYS. A pair whose level NVML cannot give is taken as SYS, the
  most pessimistic level, and logged.
* NVLink count of a pair: every link 0..NVML_NVLINK_MAX_LINKS-1 of each GPU whose state is
  enabled; links whose remote end is an NVSwitch (`nvmlDeviceGetNvLinkRemoteDeviceType`) are
  switch links, the others count for the peer GPU whose PCI bus id equals the link's remote bus
  id. A pair's count is its direct links plus, when both GPUs reach NVSwitches, the smaller of
  the two switch-link counts: what nvidia-smi prints (NV18 on every H100 pair) and what a ring
  between them can use. NOT_SUPPORTED / INVALID_ARGUMENT on a link means "no such link"; other
  per-link errors skip the link with a warning. `nvswitch` is set when any GPU has switch links.
  (go-gpuallocator counts only direct links and so sees no NVLink at all on NVSwitch systems.)
* NUMA node: `/sys/bus/pci/devices/<bus id>/numa_node` first (the host node kubelet's Topology
  Manager and NVIDIA's plugin use), then `nvmlDeviceGetNumaNodeId`; negative or unknown -> None.
  The order is deliberate: on Grace systems nvmlDeviceGetNumaNodeId is the NUMA node of the GPU's
  own memory (`GPU NUMA ID` in topo -m), not the host affinity the allocator and kubelet mean.
* Bandwidth: NVML reports the NVLink version per link as an `nvmlNvlinkVersion_t` enum (not the
  marketing generation: A100 reports 5 = "3.1"). One direction per link: 1.0 -> 20 GB/s (P100),
  2.0 / 2.2 / 3.0 / 3.1 / 4.0 -> 25 GB/s (V100, A100, H100), 5.0 -> 50 GB/s (B200, GB200); any
  other value keeps the default. PCIe figures stay at design.md defaults: NVML gives link
  generation and width, but peer-to-peer throughput over PCIe is set by switches, ACS and the
  IOMMU far more than by the link rate, so a figure derived from it would be false precision.
  Explicit constructor overrides beat both.

Discovery runs when asked (`discover()`: at start and on an explicit re-probe), never inside an
RPC. Health: `watch_health` waits on an NVML event set (XID critical errors, and double-bit ECC
reported as XID 48) and turns each event into a HealthEvent; the HealthTracker decides what it
means. A failing wait emits one event for all GPUs and backs off; nothing escapes the loop.

`nvml` is the `pynvml` module (nvidia-ml-py) unless a stand-in is injected (the tests model
whole servers that way).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from deviceplugin.backend import HealthEvent
from deviceplugin.health import ALL_GPUS
from gputopo import jsonlog
from gputopo.links import BandwidthSettings, Link
from gputopo.topology import GPU, Topology

log = logging.getLogger("deviceplugin.nvml")

#: nvmlGpuTopologyLevel_t value -> nvidia-smi code.
TOPOLOGY_LEVEL_CODES: Mapping[int, str] = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
#: nvmlNvlinkVersion_t value -> one-direction GB/s of one link.
NVLINK_VERSION_GBPS: Mapping[int, float] = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 25.0, 6: 25.0, 7: 50.0}
#: XID NVML reports for a double-bit ECC error; the DBE event is mapped to it.
DBE_XID = 48

_NVML_XID_EVENT = 0x8
_NVML_DBE_EVENT = 0x2
_NVML_FEATURE_ENABLED = 1
_NVML_SWITCH = 0x02
_NVML_ERROR_INVALID_ARGUMENT = 2
_NVML_ERROR_NOT_SUPPORTED = 3
_NVML_ERROR_TIMEOUT = 10


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this node (no library, no driver, no permission)."""


@dataclass(frozen=True, slots=True)
class _Links:
    """What one GPU's NVLink scan found."""

    direct: Mapping[str, int]  # normalised peer bus id -> link count
    switch: int
    versions: frozenset[int]


class NvmlBackend:
    """Backend Protocol over NVML; see the module docstring for every rule it applies."""

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
                import pynvml as nvml
            except ImportError as e:  # pragma: no cover - nvidia-ml-py is a dependency
                raise NvmlUnavailable(f"the pynvml module (nvidia-ml-py) is not installed: {e}") from None
        self._nvml = nvml
        self._overrides = (nvlink_gbps_per_link, dict(pcie_gbps) if pcie_gbps else None)
        # Validate overrides now, not at the first probe.
        BandwidthSettings(
            BandwidthSettings().nvlink_gbps_per_link
            if nvlink_gbps_per_link is None
            else nvlink_gbps_per_link,
            dict(pcie_gbps or {}),
        )
        self.name = name
        self.event_timeout_ms = event_timeout_ms
        self.error_backoff_s = error_backoff_s
        self.max_backoff_s = max_backoff_s
        self.sysfs_root = sysfs_root
        self._clock = clock
        self._closed = threading.Event()
        self.last_probe_seconds: float | None = None
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:
            raise NvmlUnavailable(
                f"NVML init failed: {e} (is the NVIDIA driver loaded and visible?)"
            ) from None
        except OSError as e:
            raise NvmlUnavailable(f"NVML init failed: {e}") from None
        self._initialised = True

    # --- discovery ---

    def discover(self) -> Topology:
        """Probe every GPU and pair; O(n * links + n^2) NVML calls, milliseconds on a real node.

        Raises NvmlUnavailable when NVML fails for a whole GPU (lost, reset) or sees none: the
        caller keeps its previous topology or reports why it cannot start."""
        try:
            return self._discover()
        except self._nvml.NVMLError as e:
            raise NvmlUnavailable(f"NVML probe failed: {e}") from None

    def _discover(self) -> Topology:
        nvml = self._nvml
        start = self._clock()
        count = nvml.nvmlDeviceGetCount()
        if count < 1:
            raise NvmlUnavailable("NVML reports no GPUs on this node")
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        gpus = tuple(self._gpu(i, h) for i, h in enumerate(handles))
        bus = [_bus_key(g.pci_bus_id) for g in gpus]
        scans = [self._scan_nvlinks(g.uuid, h) for g, h in zip(gpus, handles, strict=True)]
        links: list[list[Link | None]] = [[None] * count for _ in range(count)]
        for i in range(count):
            for j in range(i + 1, count):
                pcie = self._pcie_code(handles[i], handles[j], gpus[i], gpus[j])
                nv = self._pair_nvlinks(scans[i], scans[j], bus[i], bus[j], gpus[i], gpus[j])
                links[i][j] = links[j][i] = Link(nvlinks=nv, pcie=pcie)
        nvswitch = any(s.switch > 0 for s in scans)
        settings = self._settings(scans)
        elapsed = self._clock() - start
        self.last_probe_seconds = elapsed
        topology = Topology(
            name=self.name,
            gpus=gpus,
            links=tuple(tuple(row) for row in links),
            nvswitch=nvswitch,
            settings=settings,
            description=f"discovered by NVML ({gpus[0].model})",
        )
        jsonlog.event(
            log,
            "discover",
            gpus=count,
            nvswitch=nvswitch,
            nvlink_gbps_per_link=settings.nvlink_gbps_per_link,
            seconds=round(elapsed, 4),
            reason="NVML probe",
        )
        return topology

    def _gpu(self, index: int, handle: Any) -> GPU:
        nvml = self._nvml
        bus_id = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
        return GPU(
            index=index,
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            model=_text(nvml.nvmlDeviceGetName(handle)),
            pci_bus_id=bus_id,
            numa=self._numa(handle, bus_id),
            minor=self._minor(handle),
        )

    def _minor(self, handle: Any) -> int | None:
        """/dev/nvidia<minor> of the card (device specs); None when NVML cannot say."""
        get = getattr(self._nvml, "nvmlDeviceGetMinorNumber", None)
        try:
            minor = get(handle) if get is not None else None
        except Exception:
            return None
        return minor if isinstance(minor, int) and 0 <= minor < 1 << 20 else None

    def _numa(self, handle: Any, bus_id: str) -> int | None:
        path = os.path.join(self.sysfs_root, "bus", "pci", "devices", _bus_key(bus_id), "numa_node")
        try:
            with open(path, encoding="ascii") as f:
                node = int(f.read().strip())
            return node if node >= 0 else None
        except (OSError, ValueError):
            pass
        getter = getattr(self._nvml, "nvmlDeviceGetNumaNodeId", None)
        if getter is None:
            return None
        try:
            node = int(getter(handle))
        except self._nvml.NVMLError:
            return None
        return node if node >= 0 else None

    def _scan_nvlinks(self, uuid: str, handle: Any) -> _Links:
        nvml = self._nvml
        max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 36))
        direct: dict[str, int] = {}
        switch = 0
        versions: set[int] = set()
        for link in range(max_links):
            try:
                if nvml.nvmlDeviceGetNvLinkState(handle, link) != _NVML_FEATURE_ENABLED:
                    continue
                if self._remote_is_switch(handle, link):
                    switch += 1
                else:
                    remote = _bus_key(_text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
                    direct[remote] = direct.get(remote, 0) + 1
                version = self._link_version(handle, link)
                if version is not None:
                    versions.add(version)
            except nvml.NVMLError as e:
                if _code(e) not in (_NVML_ERROR_NOT_SUPPORTED, _NVML_ERROR_INVALID_ARGUMENT):
                    jsonlog.event(
                        log,
                        "nvlink_probe_failed",
                        logging.WARNING,
                        uuid=uuid,
                        link=link,
                        reason=f"NVML error {e}; link skipped",
                    )
        return _Links(direct=direct, switch=switch, versions=frozenset(versions))

    def _remote_is_switch(self, handle: Any, link: int) -> bool:
        nvml = self._nvml
        getter = getattr(nvml, "nvmlDeviceGetNvLinkRemoteDeviceType", None)
        if getter is None:
            return False
        try:
            return bool(getter(handle, link) == _NVML_SWITCH)
        except nvml.NVMLError as e:
            if _code(e) in (_NVML_ERROR_NOT_SUPPORTED, getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13)):
                return False  # older driver: fall back to the remote PCI bus id
            raise

    def _link_version(self, handle: Any, link: int) -> int | None:
        try:
            return int(self._nvml.nvmlDeviceGetNvLinkVersion(handle, link))
        except self._nvml.NVMLError:
            return None

    def _pcie_code(self, a: Any, b: Any, ga: GPU, gb: GPU) -> str:
        try:
            level = int(self._nvml.nvmlDeviceGetTopologyCommonAncestor(a, b))
        except self._nvml.NVMLError as e:
            jsonlog.event(
                log,
                "pcie_level_unknown",
                logging.WARNING,
                gpus=[ga.index, gb.index],
                reason=f"nvmlDeviceGetTopologyCommonAncestor failed ({e}); assuming SYS",
            )
            return "SYS"
        code = TOPOLOGY_LEVEL_CODES.get(level)
        if code is None:
            jsonlog.event(
                log,
                "pcie_level_unknown",
                logging.WARNING,
                gpus=[ga.index, gb.index],
                nvml_level=level,
                reason="unknown nvmlGpuTopologyLevel_t value; assuming SYS",
            )
            return "SYS"
        return code

    def _pair_nvlinks(self, a: _Links, b: _Links, bus_a: str, bus_b: str, ga: GPU, gb: GPU) -> int:
        ab = a.direct.get(bus_b, 0)
        ba = b.direct.get(bus_a, 0)
        if ab != ba:
            jsonlog.event(
                log,
                "nvlink_count_asymmetric",
                logging.WARNING,
                gpus=[ga.index, gb.index],
                counts=[ab, ba],
                reason="the two GPUs report different direct link counts; using the smaller",
            )
        return min(ab, ba) + min(a.switch, b.switch)

    def _settings(self, scans: list[_Links]) -> BandwidthSettings:
        nvlink_override, pcie_override = self._overrides
        nvlink = nvlink_override
        if nvlink is None:
            versions = set().union(*(s.versions for s in scans)) if scans else set()
            known = {NVLINK_VERSION_GBPS[v] for v in versions if v in NVLINK_VERSION_GBPS}
            if versions and not known:
                jsonlog.event(
                    log,
                    "nvlink_version_unknown",
                    logging.WARNING,
                    versions=sorted(versions),
                    reason="no per-link figure for this NVLink version; using the default",
                )
            # Mixed generations in one node do not exist in practice; the slowest is the safe figure.
            nvlink = min(known) if known else BandwidthSettings().nvlink_gbps_per_link
        return BandwidthSettings(nvlink_gbps_per_link=nvlink, pcie_gbps=pcie_override or {})

    # --- health ---

    def watch_health(self, stop: threading.Event, emit: Callable[[HealthEvent], None]) -> None:
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
                    event_set = self._free_event_set(event_set)
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
            if _code(e) != _NVML_ERROR_NOT_SUPPORTED:
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
                    if _code(e) != _NVML_ERROR_NOT_SUPPORTED:
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
            if _code(e) == _NVML_ERROR_TIMEOUT:
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

    def close(self) -> None:
        """Stop any watch loop and release NVML (idempotent)."""
        self._closed.set()
        if self._initialised:
            self._initialised = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass


def _text(value: Any) -> str:
    """pynvml returns bytes from some versions and str from others."""
    return value.decode("ascii", "replace").strip("\x00 ") if isinstance(value, bytes) else str(value).strip()


def _bus_key(bus_id: str) -> str:
    """The sysfs spelling `dddd:bb:dd.f`, so NVML's `00000000:07:00.0`, the legacy `0000:07:00.0`
    and a bare `07:00.0` all compare equal (and name the /sys/bus/pci/devices entry)."""
    text = bus_id.strip().lower()
    parts = text.split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) == 3:
        try:
            return f"{int(parts[0], 16):04x}:{parts[1][-2:]}:{parts[2]}"
        except ValueError:
            pass
    return text


def _code(error: Exception) -> int | None:
    value = getattr(error, "value", None)
    return value if isinstance(value, int) else None
