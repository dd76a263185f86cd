"""One request cannot wedge the plugin: ID lists are bounded, handling is linear, a SIGTERM
ends the process promptly even with requests in flight, and the decision log stays small.

Everything goes over the plugin's real unix socket; the shutdown test runs `python -m
deviceplugin` as its own process, as kubelet's node runs it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from deviceplugin import settings
from deviceplugin.kubelet.status_client import fetch_status
from gputopo.node.allocator import MAX_GPUS
from gputopo.node.topofile import load_preset
from gputopo_proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from tests.kubelet_fake import eventually, fake_kubelet, plugin_channel, running_daemon, short_tmpdir

PRESET = "dgx1-v100"
UUIDS = [g.uuid for g in load_preset(PRESET).gpus]
LIMIT = settings.MAX_REQUEST_IDS
REPO = Path(__file__).resolve().parent.parent
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("GPUTOPO_") and k != "NODE_NAME"}


@pytest.fixture(scope="module")
def folder() -> Iterator[Path]:
    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def stub(folder: Path) -> Iterator[api_pb2_grpc.DevicePluginStub]:
    with fake_kubelet(folder) as kubelet, running_daemon(folder, PRESET):
        assert kubelet.wait(1, 10) is not None, kubelet.refusals
        with plugin_channel(folder / settings.SOCKET_NAME) as s:
            yield s


def _prefer_req(
    available: list[str], size: int, must: list[str] | None = None, containers: int = 1
) -> object:
    one = api_pb2.ContainerPreferredAllocationRequest(
        available_deviceIDs=available, must_include_deviceIDs=must or [], allocation_size=size
    )
    return api_pb2.PreferredAllocationRequest(container_requests=[one] * containers)


def _alloc_req(ids: list[str], containers: int = 1) -> object:
    return api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)] * containers
    )


def _unknown(n: int) -> list[str]:
    return [f"GPU-unknown-{i:08d}" for i in range(n)]


def _refused(call: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()  # type: ignore[operator]
    return info.value


def test_limit_has_margin_over_the_largest_node() -> None:
    assert LIMIT == 4 * MAX_GPUS


@pytest.mark.parametrize("n", [LIMIT + 1, 16_000, 100_000])
def test_long_lists_are_refused_naming_the_limit(stub: api_pb2_grpc.DevicePluginStub, n: int) -> None:
    ids = _unknown(n)
    cases = {
        "available_deviceIDs": lambda: stub.GetPreferredAllocation(_prefer_req(ids, 1), timeout=10),
        "must_include_deviceIDs": lambda: stub.GetPreferredAllocation(
            _prefer_req(UUIDS, 1, must=ids), timeout=10
        ),
        "devices_ids": lambda: stub.Allocate(_alloc_req(ids), timeout=10),
    }
    for field, call in cases.items():
        err = _refused(call)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
        assert field in err.details() and f"at most {LIMIT}" in err.details(), err.details()
        assert len(err.details()) < 300


def test_duplicates_in_a_long_list_are_refused(stub: api_pb2_grpc.DevicePluginStub) -> None:
    err = _refused(lambda: stub.Allocate(_alloc_req([UUIDS[0]] * (LIMIT + 1)), timeout=10))
    assert f"at most {LIMIT}" in err.details()
    err = _refused(lambda: stub.Allocate(_alloc_req([UUIDS[0]] * LIMIT), timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "more than once" in err.details()


def test_too_many_container_requests_are_refused(stub: api_pb2_grpc.DevicePluginStub) -> None:
    err = _refused(lambda: stub.Allocate(_alloc_req([UUIDS[0]], containers=LIMIT + 1), timeout=10))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and f"at most {LIMIT}" in err.details()
    err = _refused(
        lambda: stub.GetPreferredAllocation(_prefer_req(UUIDS, 1, containers=LIMIT + 1), timeout=10)
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and f"at most {LIMIT}" in err.details()


def test_a_full_length_list_with_unknown_ids_is_still_answered(stub: api_pb2_grpc.DevicePluginStub) -> None:
    """At the limit the request is served: unknown IDs are dropped, the answer uses real ones."""
    offered = UUIDS + _unknown(LIMIT - len(UUIDS))
    resp = stub.GetPreferredAllocation(_prefer_req(offered, 4), timeout=10)
    chosen = list(resp.container_responses[0].deviceIDs)
    assert len(chosen) == 4 and set(chosen) <= set(UUIDS)
    resp = stub.Allocate(_alloc_req(UUIDS), timeout=10)
    assert resp.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"].count("GPU-") == len(UUIDS)


def _plugin(folder: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "deviceplugin", "--kubelet-dir", str(folder), "--topology", PRESET],
        cwd=REPO,
        env={**CLEAN_ENV, "GPUTOPO_METRICS_PORT": "0"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _hammer(sock: Path, stop: threading.Event, sent: list[int]) -> None:
    """Keep 100,000-ID requests in flight (the ones that took minutes when handling was quadratic)."""
    big_prefer = _prefer_req(_unknown(100_000), 1)
    big_alloc = _alloc_req([UUIDS[0]] * 100_000)
    with grpc.insecure_channel(f"unix://{sock}") as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        while not stop.is_set():
            futures = [stub.GetPreferredAllocation.future(big_prefer), stub.Allocate.future(big_alloc)]
            sent[0] += 2
            for f in futures:
                try:
                    f.result(timeout=30)
                except grpc.RpcError:
                    pass  # refused, or cut off by the shutdown: both fine


def test_sigterm_with_large_requests_in_flight_exits_promptly() -> None:
    """A hang check, not a benchmark: the bound is generous (10 s), the design target is 2 s."""
    folder = short_tmpdir()
    sock = folder / settings.SOCKET_NAME
    try:
        with fake_kubelet(folder) as kubelet:
            proc = _plugin(folder)
            stop, sent = threading.Event(), [0]
            workers = [
                threading.Thread(target=_hammer, args=(sock, stop, sent), daemon=True) for _ in range(4)
            ]
            try:
                assert kubelet.wait(1, 20) is not None, kubelet.refusals
                assert eventually(lambda: fetch_status(str(sock), 2)["registration"]["registered"], 10)
                for w in workers:
                    w.start()
                assert eventually(lambda: sent[0] >= 8, 10)
                start = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                code = proc.wait(10)
                took = time.monotonic() - start
            finally:
                stop.set()
                if proc.poll() is None:
                    proc.kill()
                _, err = proc.communicate()
        assert code == 0, err.decode()[-2000:]
        assert took < 10
        assert not sock.exists()
        lines = err.decode().splitlines()
        assert any(json.loads(line).get("event") == "stopped" for line in lines if line.startswith("{"))
        # the decision log of each refused 100,000-ID request is one short line, not megabytes
        assert max(len(line) for line in lines) < 8192
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_handler_still_running_after_stop_does_not_hold_exit(tmp_path: Path) -> None:
    """What the daemon does once the server is stopped: a straggler (any non-daemon thread still
    running) gets a short join, then the process exits 0 without it."""
    script = (
        "import threading, time, sys\n"
        "from gputopo import jsonlog\n"
        "from deviceplugin.startup import _abandon_stragglers\n"
        "jsonlog.setup()\n"
        "threading.Thread(target=time.sleep, args=(120,), name='stuck-rpc').start()\n"
        "_abandon_stragglers(0.2)\n"
        "sys.exit(3)\n"  # not reached: the straggler makes it _exit(0)
    )
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=CLEAN_ENV, capture_output=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert time.monotonic() - start < 10
    assert b"stuck-rpc" in proc.stderr  # logged by name

    # with nothing left running it returns and the caller exits normally
    script = "from deviceplugin.startup import _abandon_stragglers\n_abandon_stragglers(0.2)\nraise SystemExit(3)\n"
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=CLEAN_ENV, capture_output=True, timeout=30
    )
    assert proc.returncode == 3


def _reconnects(sock: Path, times: int) -> int:
    """Open ListAndWatch, take the first list, drop the stream, open the next at once; the
    number refused with RESOURCE_EXHAUSTED (the per-server stream cap)."""
    refused = 0
    with grpc.insecure_channel(f"unix://{sock}") as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        for _ in range(times):
            stream = stub.ListAndWatch(api_pb2.Empty(), timeout=10)
            try:
                first = next(stream)
                assert len(first.devices) == len(UUIDS)
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.details()
                refused += 1
            finally:
                stream.cancel()
    return refused


def test_a_dropped_list_and_watch_frees_its_slot_at_once(
    folder: Path, stub: api_pb2_grpc.DevicePluginStub
) -> None:
    """kubelet reconnecting 100 times in a row is never refused: each dropped stream's slot is
    free before the next stream arrives (it used to wait for the stream's next 0.25 s poll)."""
    assert _reconnects(folder / settings.SOCKET_NAME, 100) == 0
    # and the slots really are released: the cap still admits a full set of streams afterwards
    with grpc.insecure_channel(f"unix://{folder / settings.SOCKET_NAME}") as channel:
        s = api_pb2_grpc.DevicePluginStub(channel)
        streams = [s.ListAndWatch(api_pb2.Empty(), timeout=10) for _ in range(8)]
        try:
            assert all(len(next(st).devices) == len(UUIDS) for st in streams)
            extra = s.ListAndWatch(api_pb2.Empty(), timeout=10)
            err = _refused(lambda: next(extra))
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        finally:
            for st in streams:
                st.cancel()
