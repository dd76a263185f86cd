"""The DRA node daemon: backend, health, prepared claims, slice publisher and the two sockets.

The same hardware seam, health tracker and health loop as device-plugin mode (an XID makes a GPU
unhealthy, a new snapshot follows); here a snapshot goes to the slice publisher, which marks the
GPU and every set containing it `healthy: false` (the DeviceClasses stop selecting them) and
moves them behind the healthy ones. They are never dropped: kube-scheduler counts a pool's used
counters from the allocated devices it still finds in the slices, so a device that left them
while a claim held it would hand its GPUs to a second claim. Start
order: discover (a bad topology fails before anything is served), build the publisher and the
service, serve, then start health and publication; stop runs the other way round.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

from deviceplugin import settings
from deviceplugin.dra import probe
from deviceplugin.dra.kubeapi import DraApi
from deviceplugin.dra.pcie import roots_for
from deviceplugin.dra.registrar import DraServer
from deviceplugin.dra.service import DraService, PreparedClaims
from deviceplugin.dra.slicepub import SlicePublisher
from deviceplugin.hardware.backend import Backend
from deviceplugin.health.loop import HealthLoop
from deviceplugin.health.tracker import HealthTracker
from deviceplugin.metrics import Metrics
from deviceplugin.state import SnapshotStore, make_snapshot
from gputopo import jsonlog
from gputopo.node import draslices
from gputopo.node.topology import TopologyError

log = logging.getLogger("deviceplugin.dra.daemon")


@dataclass(frozen=True)
class DraSettings:
    """What DRA mode adds to the device plugin's settings (deviceplugin/dra/__main__.py)."""

    node_name: str
    driver: str = draslices.DRIVER
    registry_dir: str = "/var/lib/kubelet/plugins_registry"
    plugins_dir: str = "/var/lib/kubelet/plugins"
    sizes: Sequence[int] = draslices.DEFAULT_SIZES
    max_sets: int = draslices.MAX_SETS_PER_SIZE
    sysfs: str = "/sys"
    ignored_xids: Sequence[int] = settings.IGNORED_XIDS
    health_recovery_seconds: float = 0.0
    metrics_port: int = 0
    backend_kind: str = "file"

    @property
    def plugin_dir(self) -> str:
        return os.path.join(self.plugins_dir, self.driver)


#: Seconds each gRPC call of a health check may take.
PROBE_TIMEOUT_S = 2.0


class DraDaemon:
    def __init__(
        self,
        settings: DraSettings,
        backend: Backend,
        api: DraApi,
        *,
        metrics: Metrics | None = None,
        health_tick_seconds: float = 1.0,
        publisher_min_interval_s: float = 0.2,
        registrar_poll_s: float = 1.0,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.api = api
        self.metrics = metrics or Metrics()
        self._tick = health_tick_seconds
        self._min_interval = publisher_min_interval_s
        self._poll = registrar_poll_s
        self.store: SnapshotStore | None = None
        self.publisher: SlicePublisher | None = None
        self.server: DraServer | None = None
        self.health: HealthLoop | None = None
        self.claims: PreparedClaims | None = None

    def start(self) -> None:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        s = self.settings
        topology = self.backend.discover()
        try:
            tracker = HealthTracker(
                [g.uuid for g in topology.gpus], s.ignored_xids, s.health_recovery_seconds or None
            )
        except ValueError as e:
            raise TopologyError(f"{topology.name}: {e}") from None
        self.store = SnapshotStore(make_snapshot(1, topology, tracker.state()))
        os.makedirs(s.plugin_dir, exist_ok=True)
        self.claims = PreparedClaims(os.path.join(s.plugin_dir, "prepared.json"))
        self.publisher = SlicePublisher(
            s.node_name,
            self.api,
            driver=s.driver,
            sizes=s.sizes,
            max_sets=s.max_sets,
            pcie_roots=lambda snap: roots_for(snap, s.sysfs),
            min_interval_s=self._min_interval,
        )
        self.publisher.set_in_use(self.claims.in_use())
        self.store.add_listener(self.publisher.update)
        service = DraService(
            self.store,
            self.api,
            self.claims,
            node_name=s.node_name,
            driver=s.driver,
            changed=self.publisher.set_in_use,
        )
        jsonlog.event(
            log,
            "starting",
            mode="dra",
            topology=topology.name,
            gpus=topology.n,
            driver=s.driver,
            node=s.node_name,
            sizes=list(s.sizes),
            reason="topology discovered; publishing ResourceSlices and serving kubelet's DRA calls",
        )
        self.metrics.set_build(backend=s.backend_kind)
        self.metrics.serve(s.metrics_port)
        self.health = HealthLoop(self.backend, tracker, self.store, self.metrics, self._tick)
        self.server = DraServer(
            service, driver=s.driver, registry_dir=s.registry_dir, plugin_dir=s.plugin_dir, poll_s=self._poll
        )
        self.server.start()
        self.publisher.start()
        self.health.start()
        # kubelet's httpGet probes on the metrics port: alive when both sockets kubelet dials
        # answer (as `python -m deviceplugin.dra.probe` checks them), ready when kubelet has also
        # accepted the registration.
        server = self.server
        self.metrics.set_check("/healthz", lambda: probe.check(s.driver, s.registry_dir, PROBE_TIMEOUT_S))
        self.metrics.set_check(
            "/readyz",
            lambda: (
                probe.check(s.driver, s.registry_dir, PROBE_TIMEOUT_S)
                or (None if server.state.registered else "not registered with kubelet yet")
            ),
        )

    def stop(self) -> None:
        if self.health is not None:
            self.health.stop()
        if self.server is not None:
            self.server.close()
        if self.publisher is not None:
            self.publisher.stop()
        if self.store is not None:
            self.store.close()
        self.metrics.stop()
        self.backend.close()
        jsonlog.event(log, "stopped", mode="dra", reason="shutdown requested")
