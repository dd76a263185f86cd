"""The plugin's /healthz and /readyz on its metrics port, over real HTTP.

Kubelet's httpGet probes call these instead of exec'ing `gputopo status` (and Python) in the
container every period. What is checked: the status code kubelet acts on (200 healthy, 503
not), the JSON reason beside it, that a check that raises is an unhealthy answer and not a
broken server, that /metrics is still served on the same port, and that the real daemon's
checks follow its socket and its registration with kubelet.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from deviceplugin.metrics import Metrics
from tests.kubelet_fake import eventually, fake_kubelet, short_tmpdir


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(port: int, path: str) -> tuple[int, dict[str, object] | str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            body = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        body, status = e.read().decode(), e.code
    if path in ("/healthz", "/readyz"):
        return status, json.loads(body)
    return status, body


@pytest.fixture
def served() -> Iterator[tuple[Metrics, int]]:
    m = Metrics()
    port = free_port()
    assert m.serve(port, addr="127.0.0.1")
    try:
        yield m, port
    finally:
        m.stop()


def test_unset_checks_answer_503_so_a_starting_daemon_is_not_ready(served: tuple[Metrics, int]) -> None:
    _, port = served
    for path in ("/healthz", "/readyz"):
        status, body = get(port, path)
        assert status == 503 and isinstance(body, dict) and body["ok"] is False
        assert "starting" in str(body["reason"])


def test_checks_decide_the_status_and_say_why(served: tuple[Metrics, int]) -> None:
    m, port = served
    state = {"live": None, "ready": "not registered with kubelet yet"}
    m.set_check("/healthz", lambda: state["live"])
    m.set_check("/readyz", lambda: state["ready"])
    assert get(port, "/healthz") == (200, {"ok": True})
    assert get(port, "/readyz") == (503, {"ok": False, "reason": "not registered with kubelet yet"})
    state["ready"] = None
    assert get(port, "/readyz") == (200, {"ok": True})
    state["live"] = "socket gone"
    assert get(port, "/healthz") == (503, {"ok": False, "reason": "socket gone"})


def test_a_check_that_raises_is_unhealthy_and_the_server_keeps_serving(served: tuple[Metrics, int]) -> None:
    m, port = served

    def broken() -> str | None:
        raise OSError("disk on fire")

    m.set_check("/healthz", broken)
    status, body = get(port, "/healthz")
    assert status == 503 and isinstance(body, dict) and "OSError: disk on fire" in str(body["reason"])
    m.set_check("/healthz", lambda: None)
    assert get(port, "/healthz") == (200, {"ok": True})


def test_metrics_are_still_served_on_the_same_port(served: tuple[Metrics, int]) -> None:
    m, port = served
    m.devices.labels("Healthy").set(8)
    status, text = get(port, "/metrics")
    assert status == 200 and 'gputopo_devices{health="Healthy"} 8.0' in str(text)


def test_only_the_two_probe_paths_take_checks() -> None:
    with pytest.raises(ValueError, match="health path"):
        Metrics().set_check("/live", lambda: None)


def test_the_daemons_checks_follow_its_socket_and_kubelet_registration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The real daemon on a preset topology: not ready until kubelet (a stand-in) accepts its
    registration, live while its socket answers, neither once stopped."""
    from deviceplugin import settings as plugin_config
    from deviceplugin.kubelet.daemon import Daemon
    from deviceplugin.startup import file_backend

    root = short_tmpdir("gth-")
    kubelet_dir = root / "device-plugins"
    kubelet_dir.mkdir()
    port = free_port()
    env = {
        "GPUTOPO_KUBELET_DIR": str(kubelet_dir),
        "GPUTOPO_TOPOLOGY": "dgx1-v100",
        "GPUTOPO_METRICS_PORT": str(port),
        "GPUTOPO_PUBLISH": "false",
        "GPUTOPO_POD_RESOURCES_SOCKET": str(root / "pod-resources" / "kubelet.sock"),
    }
    cfg = plugin_config.load_config([], env)
    daemon = Daemon(cfg, file_backend(cfg))
    daemon.start()
    try:
        assert eventually(lambda: get(port, "/healthz")[0] == 200, timeout=20)
        status, body = get(port, "/readyz")
        assert status == 503 and "not registered" in str(body)
        with fake_kubelet(Path(kubelet_dir)) as kubelet:
            assert kubelet.wait(1, timeout=20) is not None
            assert eventually(lambda: get(port, "/readyz")[0] == 200, timeout=20)
        # kubelet gone (its sockets removed, as a restart removes them): not ready any more.
        assert eventually(lambda: get(port, "/readyz")[0] == 503, timeout=20)
    finally:
        daemon.stop()
    with pytest.raises(urllib.error.URLError):
        get(port, "/healthz")
