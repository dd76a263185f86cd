"""What both plugin modes' daemons do at start and stop, written once.

The device-plugin mode (`deviceplugin.kubelet.daemon`) and the DRA mode (`deviceplugin.dra.daemon`)
differ only in what they serve kubelet and what they tell the cluster. Everything else lived in
two copies that drifted (the DRA one had no clock, no `--policy` and no health gauges until the
first health change), so it lives here once and each mode fills in four steps.

Start order: discover the topology and build the node's GPU policy (a bad topology fails before
anything is served); build the mode's pieces that serve nothing yet (`_build`); set the health
gauges, then open the metrics port (the first scrape already sees every GPU); serve the mode's
sockets (`_serve`); answer kubelet's probes; start the health loop; and last reach out
(`_reach_out`: the device plugin's Register, which kubelet answers by dialling back, or the DRA
slice publication). Stop runs the other way round and leaves no socket behind; a start that
fails stops what it started and re-raises. The process around it (settings, signals, the
backend, exit codes) is deviceplugin/startup.py, also one for both modes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, ClassVar

from deviceplugin.hardware.backend import Backend
from deviceplugin.health.loop import HealthLoop
from deviceplugin.health.tracker import HealthTracker
from deviceplugin.metrics import Metrics
from deviceplugin.settings import PluginConfig
from deviceplugin.state import SnapshotStore, make_snapshot
from gputopo import jsonlog
from gputopo.node.topology import TopologyError


class ServeError(RuntimeError):
    """A socket kubelet dials cannot be served (folder not writable, path taken by a non-socket,
    …); the message says which and why. The start path prints it as one line, exit 1."""


class NodeDaemon:
    """One plugin mode on one node; `start()` / `stop()`. Subclasses fill in the steps below."""

    #: The mode's name, in the start and stop log lines.
    mode: ClassVar[str] = ""
    #: The mode's logger (its name is in every log line the daemon writes).
    log: ClassVar[logging.Logger] = logging.getLogger("deviceplugin.daemon")

    def __init__(
        self,
        config: PluginConfig,
        backend: Backend,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        health_tick_seconds: float = 1.0,
    ) -> None:
        self.config = config
        self.backend = backend
        self.metrics = metrics or Metrics()
        self._clock = clock
        self._health_tick_seconds = health_tick_seconds
        self.store: SnapshotStore | None = None
        self.health: HealthLoop | None = None

    def start(self) -> None:
        """Discover, build, serve, then reach out; on any failure undo what was started and re-raise."""
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
        self._build(self.store)
        jsonlog.event(
            self.log,
            "starting",
            mode=self.mode,
            topology=topology.name,
            gpus=topology.n,
            backend=cfg.backend_kind,
            node=cfg.node_name,
            **self._describe(),
        )
        self.metrics.set_build(backend=cfg.backend_kind)
        self.health = HealthLoop(self.backend, tracker, self.store, self.metrics, self._health_tick_seconds)
        self.health.export_gauges(self.store.current())  # before the port opens: no empty first scrape
        self.metrics.serve(cfg.metrics_port)
        self._serve()
        self.metrics.set_check("/healthz", self._live)
        self.metrics.set_check("/readyz", self._ready)
        self.health.start()
        self._reach_out()

    def stop(self) -> None:
        """Stop reaching out, then health, then the streams, then the sockets; idempotent."""
        self._withdraw()
        if self.health is not None:
            self.health.stop()
        if self.store is not None:
            self.store.close()
        self._close()
        self.metrics.stop()
        self.backend.close()
        jsonlog.event(self.log, "stopped", mode=self.mode, reason="shutdown requested")

    # -- the mode's steps ------------------------------------------------------------------

    def _build(self, store: SnapshotStore) -> None:
        """Build what serves nothing yet and subscribe it to the store (called once, at start)."""

    def _describe(self) -> dict[str, Any]:
        """The mode's own fields of the `starting` log line, `reason` among them."""
        return {"reason": "topology discovered"}

    def _serve(self) -> None:
        """Open the sockets kubelet dials; ServeError when one cannot be served."""

    def _live(self) -> str | None:
        """GET /healthz on the metrics port: None while alive, else why not (one line)."""
        return None

    def _ready(self) -> str | None:
        """GET /readyz: None while kubelet can use the node's GPUs, else why not."""
        return self._live()

    def _reach_out(self) -> None:
        """Start telling kubelet or the cluster about the node (last: everything serves by now)."""

    def _withdraw(self) -> None:
        """Stop what `_reach_out` started (first in `stop`); safe when it never started."""

    def _close(self) -> None:
        """Close the sockets `_serve` opened; safe when they never opened."""
