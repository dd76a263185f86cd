"""FileBackend: topology from a file or preset, health events from a polled JSON file."""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deviceplugin.hardware.backend import Backend, HealthEvent
from deviceplugin.hardware.filebackend import FileBackend, HealthFileError, parse_health_entry
from gputopo.node.topofile import load_preset
from gputopo.node.topology import TopologyError

POLL = 0.01
WAIT = 5.0


class Watch:
    """Runs watch_health in a thread, collecting events in a queue."""

    def __init__(self, backend: FileBackend) -> None:
        self.events: queue.Queue[HealthEvent] = queue.Queue()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=backend.watch_health, args=(self.stop, self.events.put))
        self.thread.start()

    def take(self, count: int) -> list[HealthEvent]:
        return [self.events.get(timeout=WAIT) for _ in range(count)]

    def assert_quiet(self, seconds: float = 0.1) -> None:
        with pytest.raises(queue.Empty):
            self.events.get(timeout=seconds)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(WAIT)
        assert not self.thread.is_alive(), "watch_health did not return after stop"


@pytest.fixture
def health(tmp_path: Path) -> Path:
    return tmp_path / "health.json"


@pytest.fixture
def watch(health: Path) -> Iterator[Watch]:
    w = Watch(FileBackend("hgx-h100", str(health), poll_interval=POLL))
    yield w
    w.close()


def write(path: Path, content: str) -> None:
    """Replace atomically, as an operator's editor or a test harness would."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(content)
    os.replace(tmp, path)


UUID = load_preset("hgx-h100").gpus


def test_is_a_backend() -> None:
    backend: Backend = FileBackend("dgx1-v100")
    assert backend.discover().name == "dgx1-v100"
    backend.close()


def test_discover_rereads_the_file(tmp_path: Path) -> None:
    p = tmp_path / "node.json"
    p.write_text(json.dumps(load_preset("rtx8000-4").to_dict()))
    backend = FileBackend(str(p))
    assert backend.discover().n == 4
    p.write_text(json.dumps(load_preset("gb200-tray").to_dict()))
    assert backend.discover().nvswitch is True


def test_bad_source_fails_at_construction() -> None:
    with pytest.raises(TopologyError, match="presets:"):
        FileBackend("no-such-box")
    with pytest.raises(ValueError, match="poll_interval"):
        FileBackend("hgx-h100", poll_interval=0)


def test_health_file_events_by_uuid_and_index(watch: Watch, health: Path) -> None:
    write(health, json.dumps({UUID[2].uuid: "Unhealthy", "5": {"xid": 79}, "0": "healthy"}))
    a, b, c = watch.take(3)
    assert (a.uuid, a.healthy, a.xid) == (UUID[2].uuid, False, None)
    assert (b.uuid, b.healthy, b.xid) == (UUID[5].uuid, None, 79)
    assert (c.uuid, c.healthy) == (UUID[0].uuid, True)
    watch.assert_quiet()  # unchanged file: nothing new


def test_each_change_emits_again(watch: Watch, health: Path) -> None:
    write(health, json.dumps({"1": "Unhealthy"}))
    assert watch.take(1)[0].healthy is False
    write(health, json.dumps({"1": "Healthy", "2": "Unhealthy"}))
    assert [(e.uuid, e.healthy) for e in watch.take(2)] == [(UUID[1].uuid, True), (UUID[2].uuid, False)]


def test_bad_file_and_bad_entries_change_nothing(
    caplog: pytest.LogCaptureFixture, health: Path, watch: Watch
) -> None:
    # Every warning here follows a write made in the test phase, so caplog sees it.
    caplog.set_level(logging.WARNING, logger="deviceplugin.filebackend")
    write(health, "{not json")
    watch.assert_quiet()
    write(health, json.dumps(["0"]))
    watch.assert_quiet()
    write(
        health,
        json.dumps(
            {
                "99": "Unhealthy",
                "GPU-nope": "Unhealthy",
                "1": "Broken",
                "2": {"xid": -1},
                "3": {"xid": 79, "extra": 1},
                "4": "Unhealthy",
            }
        ),
    )
    [event] = watch.take(1)
    assert (event.uuid, event.healthy) == (UUID[4].uuid, False)
    names = [r.getMessage() for r in caplog.records]
    assert "health_file_invalid" in names and names.count("health_entry_invalid") == 5


def test_missing_file_then_created(caplog: pytest.LogCaptureFixture, health: Path) -> None:
    caplog.set_level(logging.WARNING, logger="deviceplugin.filebackend")
    watch = Watch(FileBackend("hgx-h100", str(health), poll_interval=POLL))  # started in the test phase
    try:
        watch.assert_quiet(0.1)
        assert [r.getMessage() for r in caplog.records].count("health_file_missing") == 1  # warned once
        write(health, json.dumps({"7": "Unhealthy"}))
        assert watch.take(1)[0].uuid == UUID[7].uuid
    finally:
        watch.close()


def test_emit_failure_does_not_stop_watching(health: Path) -> None:
    got: list[HealthEvent] = []

    def emit(event: HealthEvent) -> None:
        got.append(event)
        if len(got) == 1:
            raise RuntimeError("consumer bug")

    stop = threading.Event()
    backend = FileBackend("hgx-h100", str(health), poll_interval=POLL)
    t = threading.Thread(target=backend.watch_health, args=(stop, emit))
    t.start()
    write(health, json.dumps({"0": "Unhealthy", "1": "Unhealthy"}))
    for _ in range(500):
        if len(got) == 2:
            break
        stop.wait(POLL)
    stop.set()
    t.join(WAIT)
    assert [e.uuid for e in got] == [UUID[0].uuid, UUID[1].uuid]


def test_close_ends_watch_without_health_file() -> None:
    backend = FileBackend("hgx-h100", None, poll_interval=POLL)
    t = threading.Thread(target=backend.watch_health, args=(threading.Event(), lambda e: None))
    t.start()
    backend.close()
    t.join(WAIT)
    assert not t.is_alive()


def test_parse_health_entry_rules() -> None:
    topo = load_preset("gb200-tray")
    assert parse_health_entry(topo, topo.gpus[3].uuid, {"xid": 48}).xid == 48
    assert parse_health_entry(topo, "0", " UNHEALTHY ").healthy is False
    for key, value in (("4", "Unhealthy"), ("0", None), ("0", {"xid": True}), ("0", 3)):
        with pytest.raises(HealthFileError):
            parse_health_entry(topo, key, value)


@pytest.mark.parametrize("key", ["٣", "03", "+3", " 3", "3 ", "\uff13", "-0", "0x3", "²", "1" * 40])
def test_index_keys_are_canonical_ascii_only(key: str) -> None:
    """The documented index form is ASCII digits without leading zeros: "٣" (Arabic-Indic
    three) and "03" used to be taken as GPU 3."""
    topo = load_preset("hgx-h100")
    with pytest.raises(HealthFileError, match="unknown GPU"):
        parse_health_entry(topo, key, "Unhealthy")
    assert parse_health_entry(topo, "3", "Unhealthy").uuid == topo.gpus[3].uuid
    assert parse_health_entry(topo, "0", "Unhealthy").uuid == topo.gpus[0].uuid


def test_xid_numbers_are_range_checked() -> None:
    from deviceplugin.hardware.filebackend import MAX_XID

    topo = load_preset("hgx-h100")
    assert parse_health_entry(topo, "0", {"xid": MAX_XID}).xid == MAX_XID
    for xid in (MAX_XID + 1, 10**400, -1):
        with pytest.raises(HealthFileError, match=f"0..{MAX_XID}") as info:
            parse_health_entry(topo, "0", {"xid": xid})
        assert len(str(info.value)) < 200  # a 400-digit number is clipped in the message


def test_a_fifo_device_or_oversized_health_file_changes_nothing(
    caplog: pytest.LogCaptureFixture, health: Path, watch: Watch
) -> None:
    """Swapped in while the plugin runs: refused without reading (the watcher neither blocks
    on the FIFO nor reads /dev/zero), warned, GPU health unchanged, watching goes on."""
    from gputopo.userfile import MAX_HEALTH_FILE_BYTES

    caplog.set_level(logging.WARNING, logger="deviceplugin.filebackend")
    fifo = health.with_suffix(".fifo")
    os.mkfifo(fifo)
    os.replace(fifo, health)
    watch.assert_quiet(0.2)
    health.unlink()
    os.symlink("/dev/zero", health)
    watch.assert_quiet(0.2)
    health.unlink()
    big = health.with_suffix(".big")
    big.write_text(json.dumps({"1": "Unhealthy"}))
    with open(big, "a") as f:
        f.truncate(MAX_HEALTH_FILE_BYTES + 1)  # valid JSON prefix, then too big
    os.replace(big, health)
    watch.assert_quiet(0.2)
    reasons = [r.fields["reason"] for r in caplog.records if r.getMessage() == "health_file_invalid"]  # type: ignore[attr-defined]
    assert any("FIFO" in r for r in reasons) and any("character device" in r for r in reasons)
    assert any("larger than the 1 MiB allowed" in r for r in reasons)
    write(health, json.dumps({"2": "Unhealthy"}))  # and a good file is read again
    assert watch.take(1)[0].uuid == UUID[2].uuid


def test_bad_entries_are_logged_a_few_at_most(
    caplog: pytest.LogCaptureFixture, health: Path, watch: Watch
) -> None:
    from deviceplugin.hardware.filebackend import MAX_LOGGED_BAD_ENTRIES

    caplog.set_level(logging.WARNING, logger="deviceplugin.filebackend")
    write(health, json.dumps({**{f"GPU-bad-{i}": "Unhealthy" for i in range(5000)}, "5": "Unhealthy"}))
    assert watch.take(1)[0].uuid == UUID[5].uuid
    names = [r.getMessage() for r in caplog.records]
    assert names.count("health_entry_invalid") == MAX_LOGGED_BAD_ENTRIES
    assert names.count("health_entries_invalid") == 1


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=400)
@given(
    key=st.one_of(
        st.text(max_size=12), st.integers(-5, 20).map(str), st.sampled_from([g.uuid for g in UUID])
    ),
    value=st.one_of(
        _JSON,
        st.sampled_from(["Healthy", "unhealthy", " UNHEALTHY "]),
        st.integers().map(lambda x: {"xid": x}),
    ),
)
def test_parse_health_entry_is_total(key: str, value: object) -> None:
    """Any key and JSON value give a HealthEvent for a known GPU or a HealthFileError."""
    topo = load_preset("hgx-h100")
    try:
        event = parse_health_entry(topo, key, value)
    except HealthFileError as e:
        assert len(str(e)) < 400
        return
    assert event.uuid in topo.index_by_uuid
    assert event.xid is None or 0 <= event.xid <= 65535
