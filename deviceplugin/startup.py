"""Starting the hardware backend a PluginConfig names: the topology file, or NVML retried until
it starts (or, with fail-on-init-error, refused at once). Both daemons' entry points (the device
plugin's `python -m deviceplugin` and its DRA mode) start their backend here.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from types import FrameType

from deviceplugin.hardware.backend import Backend
from deviceplugin.settings import NVML_RETRY_SECONDS, PluginConfig
from gputopo import jsonlog
from gputopo.node.topology import TopologyError

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
