"""Serving and registering across kubelet's comings and goings, over real unix sockets."""

from __future__ import annotations

import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from deviceplugin.kubelet.server import ServerError
from deviceplugin.kubelet.status_client import fetch_status
from gputopo_proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from tests.kubelet_fake import eventually, fake_kubelet, plugin_channel, running_daemon, short_tmpdir


@pytest.fixture
def folder() -> Iterator[Path]:
    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def first_list(sock: Path) -> list[str]:
    with plugin_channel(sock) as stub:
        stream = stub.ListAndWatch(api_pb2.Empty())
        ids = [d.ID for d in next(iter(stream)).devices]
        stream.cancel()
        return ids


def test_registers_once_kubelet_appears(folder: Path) -> None:
    with fake_kubelet(folder, start=False) as kubelet, running_daemon(folder, "rtx8000-4") as daemon:
        time.sleep(0.6)
        assert daemon.registration().registered is False
        assert (folder / "gputopo-gpu.sock").exists(), "the plugin serves before kubelet is there"
        t0 = time.monotonic()
        kubelet.start()
        reg = kubelet.wait(1, 5)
        assert reg is not None, kubelet.refusals
        assert reg.at - t0 < 1.0
        assert eventually(lambda: daemon.registration().registered)
        assert daemon.registration().count == 1


def test_retries_with_backoff_while_kubelet_refuses(folder: Path) -> None:
    with fake_kubelet(folder) as kubelet:
        kubelet.refuse_next = 3
        t0 = time.monotonic()
        with running_daemon(folder, "rtx8000-4") as daemon:
            reg = kubelet.wait(1, 10)
            assert reg is not None
            # back-off 0.2 + 0.4 + 0.8 s between the three refusals and the success
            assert reg.at - t0 >= 1.3
            assert len(kubelet.refusals) == 3
            assert eventually(lambda: daemon.registration().registered)
            info = daemon.registration()
            assert info.registered and info.count == 1 and info.last_error == ""
            assert (
                daemon.metrics.registry.get_sample_value("gputopo_registrations_total", {"result": "error"})
                == 3
            )


def test_kubelet_restart_reserves_and_reregisters_within_a_second(folder: Path) -> None:
    sock = folder / "gputopo-gpu.sock"
    with fake_kubelet(folder) as kubelet, running_daemon(folder, "dgx1-v100") as daemon:
        assert kubelet.wait(1, 10) is not None
        before = first_list(sock)
        for round_ in (2, 3):
            back = kubelet.restart(delete_sockets=True)
            reg = kubelet.wait(round_, 5)
            assert reg is not None, f"never re-registered: {kubelet.refusals}"
            assert reg.at - back < 1.0
            assert first_list(sock) == before
        assert eventually(lambda: daemon.registration().count == 3)
        assert fetch_status(str(sock), 5)["registration"]["count"] == 3


def test_new_kubelet_socket_alone_triggers_registration(folder: Path) -> None:
    with fake_kubelet(folder) as kubelet, running_daemon(folder, "rtx8000-4"):
        assert kubelet.wait(1, 10) is not None
        back = kubelet.restart(delete_sockets=False)
        reg = kubelet.wait(2, 5)
        assert reg is not None and reg.at - back < 1.0


def test_stale_socket_is_replaced(folder: Path) -> None:
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(folder / "gputopo-gpu.sock"))
    stale.close()  # leaves the file behind, like a crashed plugin
    with fake_kubelet(folder) as kubelet, running_daemon(folder, "rtx8000-4"):
        assert kubelet.wait(1, 10) is not None
        assert len(first_list(folder / "gputopo-gpu.sock")) == 4


def test_refuses_to_delete_a_non_socket(folder: Path) -> None:
    (folder / "gputopo-gpu.sock").write_text("not a socket")
    with pytest.raises(ServerError, match="not a socket"), running_daemon(folder, "rtx8000-4"):
        pass
    assert (folder / "gputopo-gpu.sock").read_text() == "not a socket"


def test_stop_ends_streams_and_removes_socket(folder: Path) -> None:
    sock = folder / "gputopo-gpu.sock"
    with fake_kubelet(folder) as kubelet, grpc.insecure_channel(f"unix://{sock}") as channel:
        with running_daemon(folder, "rtx8000-4"):
            assert kubelet.wait(1, 10) is not None
            stream = api_pb2_grpc.DevicePluginStub(channel).ListAndWatch(api_pb2.Empty())
            it = iter(stream)
            assert len(next(it).devices) == 4
        # leaving the block stopped the daemon: the stream ended cleanly (status OK) and the socket is gone
        assert list(it) == []
        assert stream.code() == grpc.StatusCode.OK
        assert not sock.exists()


def test_recovers_once_a_blocking_file_is_gone(folder: Path) -> None:
    sock = folder / "gputopo-gpu.sock"
    with fake_kubelet(folder) as kubelet, running_daemon(folder, "rtx8000-4") as daemon:
        assert kubelet.wait(1, 10) is not None
        kubelet.stop(delete_sockets=True)
        sock.write_text("someone else's file")
        kubelet.start()
        time.sleep(0.8)
        assert sock.read_text() == "someone else's file", "never delete what is not our socket"
        assert len(kubelet.registrations) == 1 and not daemon.registration().registered
        sock.unlink()
        reg = kubelet.wait(2, 5)
        assert reg is not None, kubelet.refusals
        assert len(first_list(sock)) == 4


def test_a_restart_racing_shutdown_never_serves_again(folder: Path) -> None:
    """The folder watcher may be re-serving (kubelet just deleted our socket) when shutdown stops
    the server; a restart that lands after the final stop must not leave a socket behind."""
    sock = folder / "gputopo-gpu.sock"
    done = threading.Event()
    with fake_kubelet(folder) as kubelet:
        with running_daemon(folder, "rtx8000-4") as daemon:
            assert kubelet.wait(1, 10) is not None
            server = daemon.server

            def keep_restarting() -> None:  # what KubeletWatcher.step does when the socket is gone
                while not done.is_set():
                    try:
                        server.restart()
                    except ServerError:
                        pass

            racer = threading.Thread(target=keep_restarting, daemon=True)
            racer.start()
            time.sleep(0.2)
        time.sleep(0.3)  # the daemon has stopped; the racer keeps trying
        done.set()
        racer.join(5)
        assert not sock.exists(), "a server was started after the final stop"
        with pytest.raises(ServerError, match="stopped"):
            server.start()


def test_a_second_kubelet_start_during_register_does_not_wait_out_the_dial_back(folder: Path) -> None:
    """Issue 9 item 12: kubelet A restarts and the plugin's Register to it hangs in A's dial
    back; then kubelet B starts (new kubelet.sock, our socket deleted) while A never answers.
    The plugin must give up on A and register with B at once, not after the 10 s timeout."""
    sock = folder / "gputopo-gpu.sock"
    with fake_kubelet(folder) as a, running_daemon(folder, "dgx1-v100") as daemon:
        assert a.wait(1, 10) is not None
        a.hold = threading.Event()
        try:
            a.restart(delete_sockets=True)
            assert a.held.wait(5), "the plugin registered again with the restarted kubelet"
            with fake_kubelet(folder, start=False) as b:
                sock.unlink()  # B's start: every socket in the folder goes, kubelet.sock is B's
                b.start()
                started = time.monotonic()
                reg = b.wait(1, 5)
                assert reg is not None, f"never registered with the second kubelet: {b.refusals}"
                assert reg.at - started < 2.0
                assert eventually(lambda: daemon.registration().registered)
        finally:
            a.hold.set()
