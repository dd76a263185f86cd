"""HealthTracker: XID filtering, explicit states, all-GPU events and timed recovery."""

from __future__ import annotations

import logging

import pytest

from deviceplugin.hardware.backend import ALL_GPUS, HealthEvent
from deviceplugin.health.tracker import HealthTracker

GPUS = ("GPU-a", "GPU-b", "GPU-c")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def tracker(clock: Clock) -> HealthTracker:
    return HealthTracker(GPUS, recovery_seconds=60, clock=clock)


def xid(uuid: str, n: int) -> HealthEvent:
    return HealthEvent(uuid=uuid, reason=f"XID {n}", xid=n)


def unhealthy(t: HealthTracker) -> list[str]:
    return [u for u, ok in t.state().items() if not ok]


def test_starts_all_healthy_in_given_order(tracker: HealthTracker) -> None:
    assert tracker.state() == {"GPU-a": True, "GPU-b": True, "GPU-c": True}
    assert list(tracker.state()) == list(GPUS)


@pytest.mark.parametrize("n", [13, 31, 43, 45, 68, 109])
def test_application_xids_are_ignored(tracker: HealthTracker, n: int) -> None:
    assert tracker.observe(xid("GPU-a", n)) is False
    assert unhealthy(tracker) == []


@pytest.mark.parametrize("n", [48, 62, 79, 94, 95])
def test_critical_xid_marks_unhealthy_once(tracker: HealthTracker, n: int) -> None:
    assert tracker.observe(xid("GPU-b", n)) is True
    assert unhealthy(tracker) == ["GPU-b"]
    assert tracker.reason("GPU-b") == f"XID {n}" and tracker.reason("GPU-a") is None
    assert tracker.observe(xid("GPU-b", n)) is False  # already unhealthy: no change to report


def test_custom_ignore_list(clock: Clock) -> None:
    t = HealthTracker(GPUS, ignored_xids=(79,), clock=clock)
    assert t.observe(xid("GPU-a", 79)) is False
    assert t.observe(xid("GPU-a", 13)) is True


def test_recovers_after_quiet_period(tracker: HealthTracker, clock: Clock) -> None:
    tracker.observe(xid("GPU-a", 79))
    clock.now += 59.9
    assert tracker.tick() is False and unhealthy(tracker) == ["GPU-a"]
    clock.now += 0.1
    assert tracker.tick() is True and unhealthy(tracker) == []
    assert tracker.tick() is False


def test_repeated_xid_restarts_quiet_period(tracker: HealthTracker, clock: Clock) -> None:
    tracker.observe(xid("GPU-a", 79))
    clock.now += 50
    tracker.observe(xid("GPU-a", 79))
    clock.now += 50
    assert tracker.tick() is False and unhealthy(tracker) == ["GPU-a"]
    clock.now += 10
    assert tracker.tick() is True


def test_never_recovers_when_disabled(clock: Clock) -> None:
    t = HealthTracker(GPUS, recovery_seconds=None, clock=clock)
    t.observe(xid("GPU-c", 79))
    clock.now += 1e9
    assert t.tick() is False and unhealthy(t) == ["GPU-c"]


def test_explicit_states_are_direct_and_sticky(tracker: HealthTracker, clock: Clock) -> None:
    assert tracker.observe(HealthEvent("GPU-a", "operator", healthy=False)) is True
    clock.now += 1e6
    assert tracker.tick() is False and unhealthy(tracker) == ["GPU-a"]
    # an XID does not turn a sticky mark into a timed one
    tracker.observe(xid("GPU-a", 79))
    clock.now += 1e6
    assert tracker.tick() is False and unhealthy(tracker) == ["GPU-a"]
    assert tracker.observe(HealthEvent("GPU-a", "operator", healthy=True)) is True
    assert unhealthy(tracker) == []
    assert tracker.observe(HealthEvent("GPU-a", "operator", healthy=True)) is False


def test_explicit_healthy_clears_an_xid(tracker: HealthTracker) -> None:
    tracker.observe(xid("GPU-b", 79))
    assert tracker.observe(HealthEvent("GPU-b", "file", healthy=True)) is True
    assert unhealthy(tracker) == []


def test_all_gpus_event_marks_every_gpu_and_recovers(tracker: HealthTracker, clock: Clock) -> None:
    tracker.observe(HealthEvent("GPU-c", "operator", healthy=False))
    assert tracker.observe(HealthEvent(ALL_GPUS, "NVML wait failed: Unknown Error")) is True
    assert unhealthy(tracker) == list(GPUS)
    clock.now += 60
    assert tracker.tick() is True
    assert unhealthy(tracker) == ["GPU-c"]  # the sticky one stays


def test_all_gpus_with_ignored_xid_changes_nothing(tracker: HealthTracker) -> None:
    assert tracker.observe(HealthEvent(ALL_GPUS, "XID 13", xid=13)) is False
    assert unhealthy(tracker) == []


def test_unknown_gpu_changes_nothing_and_logs(
    tracker: HealthTracker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="deviceplugin.health")
    assert tracker.observe(xid("GPU-zzz", 79)) is False
    assert tracker.observe(HealthEvent("GPU-zzz", "file", healthy=False)) is False
    assert unhealthy(tracker) == []
    assert [r.getMessage() for r in caplog.records] == ["health_event_unknown_gpu"] * 2


def test_state_changes_are_logged_with_reason(
    tracker: HealthTracker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="deviceplugin.health")
    tracker.observe(xid("GPU-a", 79))
    [record] = [r for r in caplog.records if r.getMessage() == "gpu_health_changed"]
    assert record.fields == {"uuid": "GPU-a", "healthy": False, "xid": 79, "reason": "XID 79"}  # type: ignore[attr-defined]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="reserved"):
        HealthTracker(["GPU-a", ALL_GPUS])
    with pytest.raises(ValueError, match="recovery_seconds"):
        HealthTracker(GPUS, recovery_seconds=-1)
