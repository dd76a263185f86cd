"""The node daemon: wires backend, snapshot store, gRPC server, kubelet watcher and health loop.

Start order matters: discover the topology and build the allocator first (a bad topology must
fail before anything is served), then serve, and only then let the watcher register, because
kubelet dials back inside Register. Stop runs the other way round and leaves no socket behind.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from deviceplugin.hardware.backend import Backend
from deviceplugin.health.loop import HealthLoop
from deviceplugin.health.tracker import HealthTracker
from deviceplugin.kubelet.api import RegistrationInfo
from deviceplugin.kubelet.registration import KubeletWatcher
from deviceplugin.kubelet.server import PluginServer
from deviceplugin.metrics import Metrics
from deviceplugin.settings import PluginConfig
from deviceplugin.state import Listener, SnapshotStore, make_snapshot
from gputopo import jsonlog
from gputopo.node.topology import TopologyError

log = logging.getLogger("deviceplugin.daemon")


class Daemon:
    """One device plugin for one resource on one node; `start()` / `stop()`."""

    def __init__(
        self,
        config: PluginConfig,
        backend: Backend,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        register: Callable[[], None] | None = None,
        health_tick_seconds: float = 1.0,
    ) -> None:
        self.config = config
        self.backend = backend
        self.metrics = metrics or Metrics()
        self._clock = clock
        self._wall = wall
        self._register = register
        self._health_tick_seconds = health_tick_seconds
        self._pending_listeners: list[Listener] = []
        self._allocate_listeners: list[Callable[[], None]] = []
        self.store: SnapshotStore | None = None
        self.server: PluginServer | None = None
        self.watcher: KubeletWatcher | None = None
        self.health: HealthLoop | None = None

    def add_listener(self, listener: Listener) -> None:
        """Hook for the Node publisher: called with every snapshot (topology + health)."""
        if self.store is None:
            self._pending_listeners.append(listener)
        else:
            self.store.add_listener(listener)

    def add_allocate_listener(self, listener: Callable[[], None]) -> None:
        """Called after each successful Allocate (kubelet's in-use set just changed), e.g. the
        publisher's `poke`. Runs on the RPC thread: it must only signal, never block."""
        self._allocate_listeners.append(listener)

    def _allocated(self) -> None:
        for listener in self._allocate_listeners:
            try:
                listener()
            except Exception as e:
                jsonlog.event(
                    log, "allocate_listener_failed", logging.ERROR, reason=f"{type(e).__name__}: {e}"
                )

    def registration(self) -> RegistrationInfo:
        return self.watcher.info() if self.watcher is not None else RegistrationInfo()

    def start(self) -> None:
        """Discover, serve, then register; on any failure undo what was started and re-raise."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        cfg = self.config
        topology = self.backend.discover()
        recovery = cfg.health_recovery_seconds or None
        try:
            tracker = HealthTracker([g.uuid for g in topology.gpus], cfg.ignored_xids, recovery, self._clock)
        except ValueError as e:  # a GPU named like the tracker's all-GPUs marker: the topology is bad
            raise TopologyError(f"{topology.name}: {e}") from None
        self.store = SnapshotStore(make_snapshot(1, topology, tracker.state(), policy=cfg.policy))
        for listener in self._pending_listeners:
            self.store.add_listener(listener)
        jsonlog.event(
            log,
            "starting",
            topology=topology.name,
            gpus=topology.n,
            backend=cfg.backend_kind,
            resource=cfg.resource_name,
            socket=cfg.socket_path,
            strategy=cfg.device_list_strategy,
            node=cfg.node_name,
            policy=cfg.policy,
            reason="topology discovered; allocator built once for it",
        )
        self.metrics.set_build(backend=cfg.backend_kind)
        self.metrics.serve(cfg.metrics_port)
        self.health = HealthLoop(self.backend, tracker, self.store, self.metrics, self._health_tick_seconds)
        self.health.export_gauges(self.store.current())
        self.server = PluginServer(
            cfg, self.store, self.metrics, self.registration, allocated=self._allocated
        )
        self.server.start()
        self.metrics.set_check("/healthz", self._live)
        self.metrics.set_check("/readyz", self._ready)
        self.health.start()
        self.watcher = KubeletWatcher(cfg, self.server, self.metrics, self._register, self._clock, self._wall)
        self.watcher.start()

    def _live(self) -> str | None:
        """Liveness (GET /healthz on the metrics port): the plugin answers a gRPC call on the
        socket kubelet dials, as `gputopo status` checks it, from inside the daemon."""
        from deviceplugin.kubelet.status_client import StatusUnavailable, fetch_status

        server = self.server
        if server is None:
            return "the gRPC server is not running"
        if not server.socket_intact():
            return f"socket {server.path} is gone or replaced (kubelet restarted?); being re-created"
        try:
            fetch_status(server.path, timeout=3.0)
        except StatusUnavailable as e:
            return f"socket {server.path} does not answer: {e}"
        return None

    def _ready(self) -> str | None:
        """Readiness (GET /readyz): alive, and kubelet accepted the registration, so the node's
        GPUs are advertised."""
        reason = self._live()
        if reason is not None:
            return reason
        if not self.registration().registered:
            return "not registered with kubelet yet"
        return None

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()
        if self.health is not None:
            self.health.stop()
        if self.store is not None:
            self.store.close()
        if self.server is not None:
            self.server.close()
        self.metrics.stop()
        self.backend.close()
        jsonlog.event(log, "stopped", socket=self.config.socket_path, reason="shutdown requested")
