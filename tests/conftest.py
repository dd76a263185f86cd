"""Fixtures more than one test module uses."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gputopo.network.levels import HOSTNAME, LEAF, SPINE
from scheduler.extender import Extender
from scheduler.picture.feed import FileState
from scheduler.web.server import Server
from tests.kube_scheduler_standin import StandIn

STANDIN_LEVELS = (HOSTNAME, LEAF, SPINE)


@pytest.fixture
def running() -> Iterator[Any]:
    """`running(state, clock, **extender_kwargs)`: a sidecar over `state` on a real HTTP port, with
    the kube-scheduler stand-in pointed at it; both stopped after the test."""
    started: list[tuple[Server, StandIn]] = []

    def start(state: FileState, clock: list[float], **kw: Any) -> tuple[Extender, StandIn]:
        ext = Extender(state, STANDIN_LEVELS, clock=lambda: clock[0], **kw)
        server = Server(ext, "127.0.0.1", 0)
        server.start()
        standin = StandIn(*server.address, sorted(state.snapshot().nodes))
        started.append((server, standin))
        return ext, standin

    yield start
    for server, standin in started:
        standin.close()
        server.stop()
