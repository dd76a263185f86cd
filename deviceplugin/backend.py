"""The hardware seam: where the plugin learns its GPUs, their links and their health.

Two implementations share this Protocol: NVML (real GPUs) and a topology file (no GPUs, for
tests, CI and simulation). Everything above this seam runs the same code for both.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gputopo.topology import Topology


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """A raw observation about one GPU. `xid` is set for NVML XID events; `healthy` is set when
    the source states the health directly (the file backend's health file)."""

    uuid: str
    reason: str
    xid: int | None = None
    healthy: bool | None = None


class Backend(Protocol):
    def discover(self) -> Topology:
        """Probe GPUs and every pair's link. Called at start and after health changes; never in an RPC."""
        ...

    def watch_health(self, stop: threading.Event, emit: Callable[[HealthEvent], None]) -> None:
        """Block, calling `emit` for each health observation, until `stop` is set."""
        ...

    def close(self) -> None: ...
