"""The NVML backend: GPUs, every pair's link and XID health events from a real driver.

Two halves, as NVIDIA's plugin splits them: topology discovery (`deviceplugin.nvml_topology`:
the rules that map NVML's answers to `nvidia-smi topo -m` codes, NUMA and bandwidth) and the XID
event watch (`deviceplugin.nvml_health`). This module owns NVML's lifetime (init once, shutdown
on close) and presents both as the Backend Protocol.

Discovery runs when asked (`discover()`: at start and on an explicit re-probe), never inside an
RPC. Health: `watch_health` waits on an NVML event set until stopped or closed.

`nvml` is the `pynvml` module (nvidia-ml-py) unless a stand-in is injected (the tests model
whole servers that way).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from deviceplugin.backend import HealthEvent
from deviceplugin.nvml_health import DBE_XID, XidWatch
from deviceplugin.nvml_topology import NVLINK_VERSION_GBPS, TOPOLOGY_LEVEL_CODES, TopologyProbe
from deviceplugin.nvmlapi import NvmlUnavailable
from gputopo.node.topology import Topology

__all__ = ["DBE_XID", "NVLINK_VERSION_GBPS", "TOPOLOGY_LEVEL_CODES", "NvmlBackend", "NvmlUnavailable"]


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
