"""Device-plugin mode's daemon: the shared start path (deviceplugin/daemon.py) with a gRPC
server on kubelet's device-plugin socket, the kubelet watcher that registers it, and the
optional Node publication.

Its own steps: serve the socket, then let the watcher register (kubelet dials back inside
Register, so the socket must already answer), then start publishing the Node annotation. Stop
withdraws in the other order and leaves no socket behind.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from deviceplugin.daemon import NodeDaemon
from deviceplugin.hardware.backend import Backend
from deviceplugin.kubelet.api import RegistrationInfo
from deviceplugin.kubelet.registration import KubeletWatcher
from deviceplugin.kubelet.server import PluginServer
from deviceplugin.metrics import Metrics
from deviceplugin.publish.publisher import NodePublication
from deviceplugin.settings import DEVICE_PLUGIN, PluginConfig
from deviceplugin.state import Listener, SnapshotStore
from gputopo import jsonlog

log = logging.getLogger("deviceplugin.daemon")


class Daemon(NodeDaemon):
    """One device plugin for one resource on one node; `start()` / `stop()`."""

    mode = DEVICE_PLUGIN
    log = log

    def __init__(
        self,
        config: PluginConfig,
        backend: Backend,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        register: Callable[[], None] | None = None,
        health_tick_seconds: float = 1.0,
        publication: NodePublication | None = None,
    ) -> None:
        super().__init__(config, backend, metrics, clock, health_tick_seconds)
        self._wall = wall
        self._register = register
        self.publication = publication
        self._pending_listeners: list[Listener] = []
        self._allocate_listeners: list[Callable[[], None]] = []
        self.server: PluginServer | None = None
        self.watcher: KubeletWatcher | None = None
        if publication is not None:
            self.add_listener(publication.publisher.update)  # called at once with the first snapshot
            self.add_allocate_listener(publication.publisher.poke)

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

    # -- the shared start path's steps (deviceplugin/daemon.py) -----------------------------

    def _build(self, store: SnapshotStore) -> None:
        for listener in self._pending_listeners:
            store.add_listener(listener)

    def _describe(self) -> dict[str, Any]:
        cfg = self.config
        return {
            "resource": cfg.resource_name,
            "socket": cfg.socket_path,
            "strategy": cfg.device_list_strategy,
            "policy": cfg.policy,
            "reason": "topology discovered; allocator built once for it",
        }

    def _serve(self) -> None:
        assert self.store is not None
        self.server = PluginServer(
            self.config, self.store, self.metrics, self.registration, allocated=self._allocated
        )
        self.server.start()

    def _reach_out(self) -> None:
        assert self.server is not None
        self.watcher = KubeletWatcher(
            self.config, self.server, self.metrics, self._register, self._clock, self._wall
        )
        self.watcher.start()
        if self.publication is not None:
            self.publication.publisher.start()

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

    def _withdraw(self) -> None:
        if self.publication is not None:
            self.publication.stop()
        if self.watcher is not None:
            self.watcher.stop()

    def _close(self) -> None:
        if self.server is not None:
            self.server.close()
