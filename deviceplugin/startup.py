"""The one start path of the node daemon's process, for both plugin modes (issue 30 made it one).

`python -m deviceplugin` (kubelet's device-plugin API) and `python -m deviceplugin --mode dra`
(a DRA driver) start the same way, here: settings from the one table (deviceplugin/settings.py)
and the node's named config; SIGTERM and SIGINT handled before anything starts, so a signal
that comes as soon as a port answers still stops the process with 0; the hardware backend (the
topology file, or NVML retried until it starts); the mode's daemon, whose start is also shared
(deviceplugin/daemon.py); then wait for a signal and stop. A mode adds only a `Mode`: what it
checks before starting and how it builds its daemon.

Exit codes, the same in both modes: 0 after a signal (sockets removed), 2 for any bad flag,
environment value, config file, per-node config name or topology given (one line on stderr,
nothing started), 1 when the node cannot be served (NVML will not start with
--fail-on-init-error, no API server configuration, a socket folder not writable, the Node's
config label cannot be read).
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING

from deviceplugin.hardware.backend import Backend
from deviceplugin.settings import DEVICE_PLUGIN, NVML_RETRY_SECONDS, ConfigError, PluginConfig, load_config
from gputopo import jsonlog
from gputopo.node.topology import TopologyError

if TYPE_CHECKING:
    from deviceplugin.daemon import NodeDaemon

log = logging.getLogger("deviceplugin")


class InitError(RuntimeError):
    """The hardware backend cannot start; the message says why."""


def file_backend(config: PluginConfig) -> Backend:
    from deviceplugin.hardware.filebackend import FileBackend

    assert config.topology is not None
    return FileBackend(config.topology, config.health_file, settings=config.bandwidth)


def nvml_backend(config: PluginConfig, stop: threading.Event) -> Backend | None:
    """NVML, retried every NVML_RETRY_SECONDS unless fail-on-init-error; None if stopped first."""
    while True:
        backend: Backend | None = None
        try:
            from deviceplugin.hardware.nvml import NvmlBackend

            overrides = config.bandwidth
            backend = NvmlBackend(
                nvlink_gbps_per_link=overrides.nvlink_gbps_per_link if overrides else None,
                pcie_gbps=overrides.pcie_gbps if overrides else None,
            )
            backend.discover()  # a node whose GPUs cannot be probed is not initialised either
            return backend
        except Exception as e:
            if backend is not None:
                backend.close()
            reason = f"NVML could not start: {type(e).__name__}: {e}"
            if config.fail_on_init_error:
                raise InitError(reason + " (run with --fail-on-init-error=false to keep retrying)") from None
            jsonlog.event(
                log, "nvml_init_failed", logging.ERROR, retry_in_s=NVML_RETRY_SECONDS, reason=reason
            )
            if stop.wait(NVML_RETRY_SECONDS):
                return None


def stop_on_signals() -> threading.Event:
    """An event SIGTERM and SIGINT set (logged): the daemon's main loop waits on it."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        jsonlog.event(log, "signal", signal=signal.Signals(signum).name, reason="shutting down")
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop


def backend_or_exit(config: PluginConfig, stop: threading.Event, prog: str) -> Backend | int:
    """The backend the config names, or the process's exit code after one line on stderr: 2 for
    a bad topology, 1 when NVML will not start (fail-on-init-error), 0 when stopped first."""
    try:
        backend = file_backend(config) if config.topology else nvml_backend(config, stop)
    except (TopologyError, ValueError) as e:
        print(f"{prog}: error: topology: {e}", file=sys.stderr)
        return 2
    except InitError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    return 0 if backend is None else backend


@dataclass(frozen=True)
class Mode:
    """What one plugin mode adds to the start path; everything else is `run`'s.

    `check(config)`: why this node cannot run the mode with these settings (a bad value: exit 2),
    asked before anything starts. `daemon(config, backend)`: the mode's daemon, not started yet;
    InitError when what it needs from outside cannot be had (exit 1). Both import what they
    need when called, so a bad flag fails before grpc or numpy load."""

    name: str
    check: Callable[[PluginConfig], str | None]
    daemon: Callable[[PluginConfig, Backend], NodeDaemon]

    @property
    def prog(self) -> str:
        """The prefix of the mode's error lines."""
        return "deviceplugin" if self.name == DEVICE_PLUGIN else f"deviceplugin --mode {self.name}"


def run(mode: Mode, argv: Sequence[str], environ: Mapping[str, str]) -> int:
    """Run `mode` until SIGTERM/SIGINT; the process's exit code (module docstring)."""
    from deviceplugin.nodeconfig import NodeConfigUnavailable, resolve

    args = list(argv)
    prog = mode.prog
    try:
        config = load_config(args, environ, mode.name)
        # --config-dir: the node's named config takes --config's place, then the usual layering
        args, node_config, chosen_by = resolve(args, environ, config)
        config = load_config(args, environ, mode.name) if node_config is not None else config
        problem = mode.check(config)
    except ConfigError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except NodeConfigUnavailable as e:
        print(f"{prog}: error: per-node config: {e}", file=sys.stderr)
        return 1
    if problem is not None:
        print(f"{prog}: error: {problem}", file=sys.stderr)
        return 2
    jsonlog.setup(config.log_level)
    if config.config_dir:
        jsonlog.event(
            log, "node_config", config=node_config, dir=config.config_dir, reason=f"chosen by {chosen_by}"
        )
    stop = stop_on_signals()  # before anything starts: a port that answers may be signalled at once
    backend = backend_or_exit(config, stop, prog)
    if isinstance(backend, int):
        return backend
    # Heavy imports (grpc, numpy) only once the flags are known good: bad flags fail fast.
    from deviceplugin.daemon import ServeError
    from gputopo.node.allocator import AllocationError

    try:
        daemon = mode.daemon(config, backend)
    except InitError as e:
        backend.close()
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    try:
        daemon.start()
    except (TopologyError, AllocationError) as e:
        # a topology we were handed is a bad value (2); one NVML found is the node's fact (1)
        print(f"{prog}: error: topology: {e}", file=sys.stderr)
        return 2 if config.topology else 1
    except (ServeError, OSError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # the backend failed its first probe: say why in one line, no traceback
        print(f"{prog}: error: cannot start: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    # Everything built so far (allocator tables, stubs, modules) lives as long as the process:
    # keep it out of the collector's way so a full collection never lands inside an RPC.
    gc.freeze()
    while not stop.wait(0.5):
        pass
    daemon.stop()
    _abandon_stragglers(SHUTDOWN_JOIN_SECONDS)
    return 0


# After a signal the sockets are gone and the servers stopped; an RPC handler still running then
# (gRPC cannot interrupt Python code) would hold interpreter exit, which joins every worker
# thread. It gets this long, then the process exits without it: kubelet retries a call whose
# connection dropped, and nothing of ours is left half-written (the socket is already removed).
SHUTDOWN_JOIN_SECONDS = 0.5


def _abandon_stragglers(seconds: float) -> None:
    """Give non-daemon threads `seconds` in all to end; if some still run, flush and _exit(0)."""
    deadline = time.monotonic() + seconds
    me = threading.current_thread()
    for t in threading.enumerate():
        if t is not me and not t.daemon:
            t.join(max(0.0, deadline - time.monotonic()))
    left = sorted(t.name for t in threading.enumerate() if t is not me and not t.daemon and t.is_alive())
    if not left:
        return
    jsonlog.event(
        log,
        "shutdown_abandoned_threads",
        logging.WARNING,
        threads=left[:10],
        count=len(left),
        reason=f"still running {seconds} s after the server stopped (an RPC in flight); exiting anyway",
    )
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
