"""DRA mode's daemon: the shared start path (deviceplugin/daemon.py) with prepared claims, the
slice publisher and the two sockets kubelet dials (registration and DRA).

The same hardware seam, health tracker, health loop and health gauges as device-plugin mode (an
XID makes a GPU unhealthy, a new snapshot follows); here a snapshot goes to the slice publisher,
which republishes the GPU and every set containing it with `healthy: false` (the DeviceClasses
select healthy devices only) and lists them after the free healthy ones (a GPU after every free
healthy GPU, a set after the free healthy sets of its ring level). They are never dropped:
kube-scheduler counts a pool's used counters from the allocated devices it still finds in the
slices, so a device that left them while a claim held it would hand its GPUs to a second claim.

Its own steps: the checkpoint of prepared claims, the publisher and the service are built before
anything serves (`_build`); then the sockets (`_serve`); last the publication starts
(`_reach_out`). Stop withdraws in the other order.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from deviceplugin.daemon import NodeDaemon
from deviceplugin.dra import probe
from deviceplugin.dra.kubeapi import DraApi
from deviceplugin.dra.pcie import roots_for
from deviceplugin.dra.registrar import DraServer
from deviceplugin.dra.service import DraService, PreparedClaims
from deviceplugin.dra.slicepub import SlicePublisher
from deviceplugin.hardware.backend import Backend
from deviceplugin.metrics import Metrics
from deviceplugin.settings import DRA, PluginConfig
from deviceplugin.state import SnapshotStore

log = logging.getLogger("deviceplugin.dra.daemon")

#: Seconds each gRPC call of a health check may take.
PROBE_TIMEOUT_S = 2.0


class DraDaemon(NodeDaemon):
    """One DRA driver on one node; `start()` / `stop()`. `api` reaches the API server's
    `resource.k8s.io` (ResourceSlices written, ResourceClaims read)."""

    mode = DRA
    log = log

    def __init__(
        self,
        config: PluginConfig,
        backend: Backend,
        api: DraApi,
        *,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        health_tick_seconds: float = 1.0,
        publisher_min_interval_s: float = 0.2,
        registrar_poll_s: float = 1.0,
    ) -> None:
        super().__init__(config, backend, metrics, clock, health_tick_seconds)
        if not config.node_name:
            raise ValueError("DRA mode needs the node name")
        self.node_name: str = config.node_name
        self.api = api
        self._min_interval = publisher_min_interval_s
        self._poll = registrar_poll_s
        self.publisher: SlicePublisher | None = None
        self.server: DraServer | None = None
        self.claims: PreparedClaims | None = None
        self._service: DraService | None = None

    # -- the shared start path's steps (deviceplugin/daemon.py) -----------------------------

    def _build(self, store: SnapshotStore) -> None:
        cfg = self.config
        os.makedirs(cfg.plugin_dir, exist_ok=True)
        self.claims = PreparedClaims(os.path.join(cfg.plugin_dir, "prepared.json"))
        self.publisher = SlicePublisher(
            self.node_name,
            self.api,
            driver=cfg.driver_name,
            sizes=cfg.set_sizes,
            max_sets=cfg.max_sets,
            pcie_roots=lambda snap: roots_for(snap, cfg.sysfs),
            min_interval_s=self._min_interval,
        )
        self.publisher.set_in_use(self.claims.in_use())
        store.add_listener(self.publisher.update)
        self._service = DraService(
            store,
            self.api,
            self.claims,
            node_name=self.node_name,
            driver=cfg.driver_name,
            changed=self.publisher.set_in_use,
        )

    def _describe(self) -> dict[str, Any]:
        return {
            "driver": self.config.driver_name,
            "sizes": list(self.config.set_sizes),
            "reason": "topology discovered; publishing ResourceSlices and serving kubelet's DRA calls",
        }

    def _serve(self) -> None:
        assert self._service is not None
        cfg = self.config
        self.server = DraServer(
            self._service,
            driver=cfg.driver_name,
            registry_dir=cfg.registry_dir,
            plugin_dir=cfg.plugin_dir,
            poll_s=self._poll,
        )
        self.server.start()

    def _live(self) -> str | None:
        """Alive when both sockets kubelet dials answer (as `python -m deviceplugin.dra.probe`
        checks them from outside)."""
        return probe.check(self.config.driver_name, self.config.registry_dir, PROBE_TIMEOUT_S)

    def _ready(self) -> str | None:
        """Ready when alive and kubelet has accepted the registration."""
        reason = self._live()
        if reason is not None:
            return reason
        if self.server is None or not self.server.state.registered:
            return "not registered with kubelet yet"
        return None

    def _reach_out(self) -> None:
        assert self.publisher is not None
        self.publisher.start()

    def _withdraw(self) -> None:
        if self.publisher is not None:
            self.publisher.stop()

    def _close(self) -> None:
        if self.server is not None:
            self.server.close()
