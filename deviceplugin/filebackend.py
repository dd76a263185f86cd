"""The hardware-free backend: GPUs from a topology file or preset, health from a JSON file.

This is what CI, the kind demo and every test of the daemon run on, so it must behave like the
NVML backend at the seam (same Topology, same HealthEvent stream) while being driven by files
a test can write.

Topology source: anything `gputopo.topofile.load_topology` accepts (a preset name, a design.md
§3 JSON file, or `nvidia-smi topo -m` text). `discover()` reads it again on every call, so a
test can swap the layout and ask the daemon to re-probe.

Health file (optional): one JSON object, keys are GPU UUIDs or GPU indices (as strings),
values say what happened to that GPU::

    {"GPU-1234...": "Unhealthy", "3": {"xid": 79}, "0": "Healthy"}

* `"Unhealthy"` / `"Healthy"` (any case) state the health directly (HealthEvent.healthy);
* `{"xid": N}` reports an XID error as NVML would (HealthEvent.xid); the health tracker decides
  whether that XID matters, exactly as for real hardware.

The file is polled every `poll_interval` seconds; whenever its (mtime, size, inode) changes,
every entry is emitted again, in file order. A missing, unreadable or malformed file (or one
bad entry) logs a warning and emits nothing for it: a typo in a test fixture or an operator's
edit must never take the plugin down.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
from collections.abc import Callable
from typing import Any

from deviceplugin.backend import BandwidthOverrides, HealthEvent
from gputopo import jsonlog
from gputopo.numerals import ascii_uint
from gputopo.topofile import load_topology
from gputopo.topology import Topology

log = logging.getLogger("deviceplugin.filebackend")

_Signature = tuple[int, int, int]
_STATES = "state must be 'Healthy', 'Unhealthy' or {\"xid\": N}"


class HealthFileError(ValueError):
    """A health file (or one of its entries) that cannot be understood."""


class FileBackend:
    """Backend Protocol over files; see the module docstring for the formats."""

    def __init__(
        self,
        topology_source: str,
        health_file: str | None = None,
        poll_interval: float = 0.2,
        settings: BandwidthOverrides | None = None,
    ) -> None:
        if not poll_interval > 0:
            raise ValueError(f"poll_interval must be > 0, got {poll_interval!r}")
        self.topology_source = topology_source
        self.health_file = health_file
        self.poll_interval = poll_interval
        self.settings = settings
        self._closed = threading.Event()
        # Fail at start, not at the first re-probe, when the source is wrong.
        self._topology = self._load()

    def _load(self) -> Topology:
        topology = load_topology(self.topology_source)
        return self.settings.apply(topology) if self.settings else topology

    def discover(self) -> Topology:
        """Re-read the topology source; raises TopologyError (the daemon keeps the old one)."""
        self._topology = self._load()
        jsonlog.event(
            log,
            "discover",
            source=self.topology_source,
            topology=self._topology.name,
            gpus=self._topology.n,
            reason="topology file read",
        )
        return self._topology

    def watch_health(self, stop: threading.Event, emit: Callable[[HealthEvent], None]) -> None:
        """Poll the health file until `stop` is set (or the backend is closed)."""
        if self.health_file is None:
            jsonlog.event(log, "health_watch_disabled", reason="no health file configured")
            while not (stop.wait(self.poll_interval) or self._closed.is_set()):
                pass
            return
        last: _Signature | None = None
        warned_missing = False
        while not (stop.is_set() or self._closed.is_set()):
            sig = _signature(self.health_file)
            if sig is None:
                if not warned_missing:
                    jsonlog.event(
                        log,
                        "health_file_missing",
                        logging.WARNING,
                        path=self.health_file,
                        reason="health file absent; GPU health unchanged",
                    )
                    warned_missing = True
                last = None
            elif sig != last:
                last = sig
                warned_missing = False
                for event in self._read_events():
                    try:
                        emit(event)
                    except Exception as e:  # a consumer bug must not stop health watching
                        jsonlog.event(
                            log,
                            "health_emit_failed",
                            logging.ERROR,
                            uuid=event.uuid,
                            reason=f"{type(e).__name__}: {e}",
                        )
            stop.wait(self.poll_interval)

    def close(self) -> None:
        self._closed.set()

    def _read_events(self) -> list[HealthEvent]:
        assert self.health_file is not None
        try:
            # O_NONBLOCK: opening a FIFO would otherwise wait for a writer, and watching with it
            fd = os.open(self.health_file, os.O_RDONLY | os.O_NONBLOCK)
            with open(fd, encoding="utf-8") as f:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise OSError(f"{self.health_file} is not a regular file")
                data = json.load(f)
        except (OSError, ValueError, RecursionError) as e:  # ValueError: bad UTF-8 or JSON
            jsonlog.event(
                log,
                "health_file_invalid",
                logging.WARNING,
                path=self.health_file,
                reason=f"cannot read health file, GPU health unchanged: {e}",
            )
            return []
        if not isinstance(data, dict):
            jsonlog.event(
                log,
                "health_file_invalid",
                logging.WARNING,
                path=self.health_file,
                reason="health file must be a JSON object of GPU -> state; GPU health unchanged",
            )
            return []
        events: list[HealthEvent] = []
        for key, value in data.items():
            try:
                events.append(parse_health_entry(self._topology, str(key), value))
            except HealthFileError as e:
                jsonlog.event(
                    log,
                    "health_entry_invalid",
                    logging.WARNING,
                    path=self.health_file,
                    key=key,
                    reason=f"{e}; entry ignored",
                )
        return events


def parse_health_entry(topology: Topology, key: str, value: Any) -> HealthEvent:
    """One `"<uuid or index>": state` entry of the health file as the event it stands for."""
    uuid = _resolve_gpu(topology, key)
    if isinstance(value, str):
        state = value.strip().lower()
        if state in ("healthy", "unhealthy"):
            reason = f"health file says {value.strip()}"
            return HealthEvent(uuid=uuid, reason=reason, healthy=state == "healthy")
        raise HealthFileError(f"GPU {key!r}: {_STATES}, got {value!r}")
    if isinstance(value, dict) and set(value) == {"xid"}:
        xid = value["xid"]
        if isinstance(xid, int) and not isinstance(xid, bool) and xid >= 0:
            return HealthEvent(uuid=uuid, reason=f"XID {xid} (health file)", xid=xid)
        raise HealthFileError(f"GPU {key!r}: xid must be a non-negative integer, got {xid!r}")
    raise HealthFileError(f"GPU {key!r}: {_STATES}, got {value!r}")


def _resolve_gpu(topology: Topology, key: str) -> str:
    if key in topology.index_by_uuid:
        return key
    # plain ASCII digits, short enough for int(): a bad key must be a bad entry, never the end
    # of watching ("²" is a digit int() refuses, "٣" one it reads as 3)
    index = ascii_uint(key, max_digits=9)
    if index is not None and index < topology.n:
        return topology.gpus[index].uuid
    raise HealthFileError(
        f"unknown GPU {key!r}: not a UUID or index (0..{topology.n - 1}) of {topology.name}"
    )


def _signature(path: str) -> _Signature | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)
