"""The hardware-free backend: GPUs from a topology file or preset, health from a JSON file.

This is what CI, the kind demo and every test of the daemon run on, so it must behave like the
NVML backend at the seam (same Topology, same HealthEvent stream) while being driven by files
a test can write.

Topology source: anything `gputopo.node.topofile.load_topology` accepts (a preset name, a design.md
§3 JSON file, or `nvidia-smi topo -m` text). `discover()` reads it again on every call, so a
test can swap the layout and ask the daemon to re-probe.

Health file (optional, at most 1 MiB, a regular file): one JSON object, keys are GPU UUIDs or
GPU indices written in ASCII digits without leading zeros (`"3"`, never `"03"` or `"٣"`), values
say what happened to that GPU::

    {"GPU-1234...": "Unhealthy", "3": {"xid": 79}, "0": "Healthy"}

* `"Unhealthy"` / `"Healthy"` (any case) state the health directly (HealthEvent.healthy);
* `{"xid": N}` reports an XID error as NVML would (HealthEvent.xid), N an integer 0..65535; the
  health tracker decides whether that XID matters, exactly as for real hardware.

The file is polled every `poll_interval` seconds; whenever its (mtime, size, inode) changes,
every entry is emitted again, in file order. A missing, unreadable or malformed file (or one
bad entry) logs a warning and emits nothing for it: a typo in a test fixture or an operator's
edit must never take the plugin down.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Callable
from typing import Any

from deviceplugin.hardware.backend import BandwidthOverrides, HealthEvent
from gputopo import jsonlog
from gputopo.node.topofile import load_topology
from gputopo.node.topology import Topology
from gputopo.userfile import MAX_HEALTH_FILE_BYTES, read_text

log = logging.getLogger("deviceplugin.filebackend")

_Signature = tuple[int, int, int]
_INDEX_RE = re.compile(r"0|[1-9][0-9]{0,8}")
# XIDs NVIDIA documents run below 200 today; the cap leaves room for new ones and keeps a stray
# 400-digit number out of the tracker, the logs and the metrics.
MAX_XID = 65535
MAX_LOGGED_BAD_ENTRIES = 8
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
            # gputopo.userfile: a FIFO (which would block the watcher), a device or a file over
            # MAX_HEALTH_FILE_BYTES is refused before anything is read
            data = json.loads(read_text(self.health_file, MAX_HEALTH_FILE_BYTES))
        except (ValueError, RecursionError) as e:  # UserFileError, bad JSON
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
        bad = 0
        for key, value in data.items():
            try:
                events.append(parse_health_entry(self._topology, str(key), value))
            except HealthFileError as e:
                bad += 1
                if bad > MAX_LOGGED_BAD_ENTRIES:  # one log line per bad entry, a few at most
                    continue
                jsonlog.event(
                    log,
                    "health_entry_invalid",
                    logging.WARNING,
                    path=self.health_file,
                    key=_clip(key),
                    reason=f"{e}; entry ignored",
                )
        if bad > MAX_LOGGED_BAD_ENTRIES:
            jsonlog.event(
                log,
                "health_entries_invalid",
                logging.WARNING,
                path=self.health_file,
                count=bad,
                reason=f"{bad} invalid entries ignored; the first {MAX_LOGGED_BAD_ENTRIES} were logged",
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
        raise HealthFileError(f"GPU {_clip(key)}: {_STATES}, got {_clip(value)}")
    if isinstance(value, dict) and set(value) == {"xid"}:
        xid = value["xid"]
        if isinstance(xid, int) and not isinstance(xid, bool) and 0 <= xid <= MAX_XID:
            return HealthEvent(uuid=uuid, reason=f"XID {xid} (health file)", xid=xid)
        raise HealthFileError(f"GPU {_clip(key)}: xid must be an integer 0..{MAX_XID}, got {_clip(xid)}")
    raise HealthFileError(f"GPU {_clip(key)}: {_STATES}, got {_clip(value)}")


def _resolve_gpu(topology: Topology, key: str) -> str:
    if key in topology.index_by_uuid:
        return key
    # The documented index form only: ASCII digits in canonical form. str.isdecimal alone would
    # take "٣" (Arabic-Indic three) as GPU 3, and int() takes "01" as GPU 1: a key that is not
    # exactly an index's name is a typo, not a GPU. Short, so int() never sees 4300 digits.
    if _INDEX_RE.fullmatch(key) and int(key) < topology.n:
        return topology.gpus[int(key)].uuid
    raise HealthFileError(
        f"unknown GPU {_clip(key)}: not a UUID or index (0..{topology.n - 1}) of {topology.name}"
    )


def _clip(value: Any, width: int = 80) -> str:
    """repr of a value from the file, cut so one bad entry cannot make a huge log line."""
    text = repr(value)
    return text if len(text) <= width else f"{text[:width]}... ({len(text)} chars)"


def _signature(path: str) -> _Signature | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)
