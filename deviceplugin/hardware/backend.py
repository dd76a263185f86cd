"""The hardware seam: where the plugin learns its GPUs, their links and their health.

Two implementations share this Protocol: NVML (real GPUs) and a topology file (no GPUs, for
tests, CI and simulation). Everything above this seam runs the same code for both.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from gputopo.node.links import BandwidthSettings
from gputopo.node.topology import Topology

#: A HealthEvent's `uuid` when the source cannot say which GPU failed (an NVML event wait that
#: broke): the tracker applies it to every GPU. No GPU may be named like it.
ALL_GPUS = "*"


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """A raw observation about one GPU. `xid` is set for NVML XID events; `healthy` is set when
    the source states the health directly (the file backend's health file)."""

    uuid: str
    reason: str
    xid: int | None = None
    healthy: bool | None = None


@dataclass(frozen=True)
class BandwidthOverrides:
    """Per-node bandwidth figures from the operator (design.md §1: both are configurable per
    node), applied over what the topology file or NVML says; None keeps that value."""

    nvlink_gbps_per_link: float | None = None
    pcie_gbps: Mapping[str, float] | None = None

    def apply(self, topology: Topology) -> Topology:
        base = topology.settings
        return topology.with_settings(
            BandwidthSettings(
                nvlink_gbps_per_link=self.nvlink_gbps_per_link or base.nvlink_gbps_per_link,
                pcie_gbps={**base.pcie_gbps, **(self.pcie_gbps or {})},
            )
        )


class Backend(Protocol):
    def discover(self) -> Topology:
        """Probe GPUs and every pair's link. Called at start and after health changes; never in an RPC."""
        ...

    def watch_health(self, stop: threading.Event, emit: Callable[[HealthEvent], None]) -> None:
        """Block, calling `emit` for each health observation, until `stop` is set."""
        ...

    def close(self) -> None: ...
