"""Every DevicePlugin RPC and the status service, over the plugin's real unix socket."""

from __future__ import annotations

import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from deviceplugin.kubelet.status_client import StatusUnavailable, fetch_status
from gputopo.node.topofile import load_preset
from gputopo_proto.deviceplugin.v1beta1 import api_pb2
from tests.kubelet_fake import (
    FakeKubelet,
    eventually,
    fake_kubelet,
    plugin_channel,
    running_daemon,
    short_tmpdir,
)
from tests.oracle import brute_force_choose

PRESET = "dgx1-v100"
TOPO = load_preset(PRESET)
UUIDS = [g.uuid for g in TOPO.gpus]


@pytest.fixture(scope="module")
def folder() -> Iterator[Path]:
    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def kubelet(folder: Path) -> Iterator[FakeKubelet]:
    with fake_kubelet(folder) as k:
        yield k


@pytest.fixture(scope="module")
def daemon(folder: Path, kubelet: FakeKubelet) -> Iterator[object]:
    with running_daemon(folder, PRESET) as d:
        assert kubelet.wait(1, 10) is not None, f"never registered: {kubelet.refusals}"
        assert eventually(lambda: d.registration().registered)
        yield d


@pytest.fixture(scope="module")
def stub(daemon: object, folder: Path) -> Iterator[object]:
    with plugin_channel(folder / "gputopo-gpu.sock") as s:
        yield s


def prefer(stub, available, size, must=()):
    req = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=list(available), must_include_deviceIDs=list(must), allocation_size=size
            )
        ]
    )
    return list(stub.GetPreferredAllocation(req, timeout=5).container_responses[0].deviceIDs)


def rpc_error(fn) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        fn()
    return info.value


def test_registration_matches_options(kubelet: FakeKubelet, daemon: object) -> None:
    reg = kubelet.wait(1)
    assert reg is not None
    assert reg.request.version == "v1beta1"
    assert reg.request.resource_name == "nvidia.com/gpu"
    assert reg.request.endpoint == "gputopo-gpu.sock"
    assert reg.request.options.get_preferred_allocation_available
    assert reg.options == reg.request.options, "Register and GetDevicePluginOptions must agree"
    assert not reg.options.pre_start_required


def test_list_and_watch_sends_full_list_with_numa(stub) -> None:
    stream = stub.ListAndWatch(api_pb2.Empty())
    first = next(iter(stream))
    stream.cancel()
    assert [d.ID for d in first.devices] == UUIDS
    assert {d.health for d in first.devices} == {"Healthy"}
    assert [[n.ID for n in d.topology.nodes] for d in first.devices] == [[g.numa] for g in TOPO.gpus]


def test_preferred_is_the_objectives_best_set_whatever_the_offer_order(stub) -> None:
    rng = random.Random(11)
    for _ in range(40):
        free = sorted(rng.sample(range(TOPO.n), rng.randint(1, TOPO.n)))
        size = rng.randint(1, len(free))
        must = sorted(rng.sample(free, rng.randint(0, min(2, size))))
        expected = brute_force_choose(TOPO, tuple(free), size, tuple(must))
        offer = [UUIDS[i] for i in free]
        for _ in range(2):
            rng.shuffle(offer)
            got = prefer(stub, offer, size, [UUIDS[i] for i in must])
            assert got == [UUIDS[i] for i in expected], (free, size, must)


def test_preferred_answers_each_container(stub) -> None:
    req = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=UUIDS, allocation_size=1),
            api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=UUIDS[:4], allocation_size=3),
        ]
    )
    resp = stub.GetPreferredAllocation(req, timeout=5)
    assert [len(c.deviceIDs) for c in resp.container_responses] == [1, 3]
    assert set(resp.container_responses[1].deviceIDs) <= set(UUIDS[:4])


def test_unknown_offered_ids_are_dropped_before_choosing(stub) -> None:
    offer = ["GPU-gone", *UUIDS[:3], "GPU-also-gone"]
    got = prefer(stub, offer, 2)
    assert got == [UUIDS[i] for i in brute_force_choose(TOPO, (0, 1, 2), 2)]
    err = rpc_error(lambda: prefer(stub, ["GPU-gone", "GPU-also-gone", UUIDS[0]], 2))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "known available" in err.details()


BAD = {
    "size zero": (UUIDS, 0, [], "allocation_size must be positive"),
    "size negative": (UUIDS, -3, [], "allocation_size must be positive"),
    "size over available": (UUIDS[:1], 2, [], "exceeds the 1 available"),
    "must not offered": (UUIDS[:2], 1, [UUIDS[5]], "not among available"),
    "must over size": (UUIDS, 1, UUIDS[:2], "exceed allocation_size"),
    "duplicate offered": (UUIDS[:1] * 3, 2, [], "more than once"),
    "duplicate must": (UUIDS, 3, [UUIDS[0], UUIDS[0]], "more than once"),
    "unknown must": ([*UUIDS, "GPU-x"], 2, ["GPU-x"], "unknown to this plugin"),
    "empty offer": ([], 1, [], "exceeds the 0 available"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_preferred_requests_are_invalid_argument(stub, case: str) -> None:
    available, size, must, reason = BAD[case]
    err = rpc_error(lambda: prefer(stub, available, size, must))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason in err.details()
    assert len(prefer(stub, UUIDS, 2)) == 2, "the plugin must keep serving after bad input"


def test_allocate_envvar_lists_devices_in_index_order(stub) -> None:
    req = api_pb2.AllocateRequest(
        container_requests=[
            api_pb2.ContainerAllocateRequest(devices_ids=[UUIDS[3], UUIDS[0]]),
            api_pb2.ContainerAllocateRequest(devices_ids=[UUIDS[7]]),
        ]
    )
    resp = stub.Allocate(req, timeout=5)
    assert [dict(c.envs) for c in resp.container_responses] == [
        {"NVIDIA_VISIBLE_DEVICES": f"{UUIDS[0]},{UUIDS[3]}"},
        {"NVIDIA_VISIBLE_DEVICES": UUIDS[7]},
    ]
    assert not resp.container_responses[0].cdi_devices


@pytest.mark.parametrize(
    ("ids", "reason"),
    [(["GPU-nope"], "unknown device"), ([], "empty"), ([UUIDS[1], UUIDS[1]], "more than once")],
)
def test_allocate_rejects_bad_ids(stub, ids: list[str], reason: str) -> None:
    req = api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)])
    err = rpc_error(lambda: stub.Allocate(req, timeout=5))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason in err.details()


def test_prestart_is_a_noop(stub) -> None:
    resp = stub.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=UUIDS[:2]), timeout=5)
    assert resp == api_pb2.PreStartContainerResponse()


def test_status_service_on_the_plugin_socket(daemon, folder: Path) -> None:
    doc = fetch_status(str(folder / "gputopo-gpu.sock"), timeout=5)
    assert doc["resource_name"] == "nvidia.com/gpu"
    assert doc["kubelet_dir"] == str(folder)
    assert doc["topology_name"] == PRESET
    assert doc["backend"] == "file"
    assert doc["device_list_strategy"] == "envvar"
    reg = doc["registration"]
    assert reg["registered"] is True and reg["count"] == 1 and reg["last_error"] == ""
    assert reg["last_registration_unix"] > 1.6e9
    assert [(d["uuid"], d["index"], d["healthy"], d.get("numa")) for d in doc["devices"]] == [
        (g.uuid, g.index, True, g.numa) for g in TOPO.gpus
    ]


def test_status_client_reports_an_absent_plugin(tmp_path: Path) -> None:
    with pytest.raises(StatusUnavailable):
        fetch_status(str(tmp_path / "none.sock"), timeout=0.5)


def test_metrics_count_decisions(daemon, stub) -> None:
    reg = daemon.metrics.registry

    def value(name: str, labels: dict[str, str]) -> float:
        return reg.get_sample_value(name, labels) or 0.0

    ok = value("gputopo_allocations_total", {"rpc": "GetPreferredAllocation", "result": "ok"})
    bad = value("gputopo_allocations_total", {"rpc": "GetPreferredAllocation", "result": "invalid"})
    seen = value("gputopo_preferred_allocation_seconds_count", {})
    prefer(stub, UUIDS, 2)
    rpc_error(lambda: prefer(stub, UUIDS, 0))
    assert value("gputopo_allocations_total", {"rpc": "GetPreferredAllocation", "result": "ok"}) == ok + 1
    assert (
        value("gputopo_allocations_total", {"rpc": "GetPreferredAllocation", "result": "invalid"}) == bad + 1
    )
    assert value("gputopo_preferred_allocation_seconds_count", {}) == seen + 1
    assert value("gputopo_registrations_total", {"result": "ok"}) == 1
    assert value("gputopo_devices", {"health": "healthy"}) == TOPO.n


def test_cdi_strategy_names_cdi_devices() -> None:
    folder = short_tmpdir()
    try:
        with fake_kubelet(folder) as kubelet, running_daemon(folder, "rtx8000-4", device_list_strategy="cdi"):
            assert kubelet.wait(1) is not None
            topo = load_preset("rtx8000-4")
            ids = [g.uuid for g in topo.gpus]
            with plugin_channel(folder / "gputopo-gpu.sock") as stub:
                req = api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[ids[2], ids[1]])]
                )
                c = stub.Allocate(req, timeout=5).container_responses[0]
            assert [d.name for d in c.cdi_devices] == [f"nvidia.com/gpu={ids[1]}", f"nvidia.com/gpu={ids[2]}"]
            assert "NVIDIA_VISIBLE_DEVICES" not in c.envs
    finally:
        shutil.rmtree(folder, ignore_errors=True)


ID_POOL = [*UUIDS, "GPU-gone-1", "GPU-gone-2", ""]


@st.composite
def requests(draw: st.DrawFn) -> tuple[list[str], list[str], int]:
    """Mostly well-formed requests (unique offers, must drawn from them, size in range), with
    every kind of defect mixed in: duplicates, foreign or empty IDs, sizes out of range."""
    ids = st.sampled_from(ID_POOL)
    available = draw(st.lists(ids, max_size=11, unique=draw(st.booleans()) or draw(st.booleans())))
    pool = st.sampled_from(available) if available and draw(st.integers(0, 4)) else ids
    must = draw(st.lists(pool, max_size=3, unique=draw(st.integers(0, 4)) > 0))
    size = draw(
        st.integers(-1, 12)
        if not draw(st.integers(0, 3))
        else st.integers(len(must), max(len(must), len(available)))
    )
    return available, must, size


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=requests())
def test_any_request_gets_the_best_valid_answer_or_invalid_argument(stub, request) -> None:
    available, must, size = request
    known = [a for a in available if a in UUIDS]
    valid = (
        size > 0
        and len(set(available)) == len(available)
        and len(set(must)) == len(must)
        and set(must) <= set(available)
        and len(must) <= size <= len(available)
        and all(m in UUIDS for m in must)
        and size <= len(known)
    )
    event("valid" if valid else "invalid")
    try:
        got = prefer(stub, available, size, must)
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e.details()
        assert not valid, e.details()
        return
    assert valid
    free = tuple(sorted(UUIDS.index(a) for a in known))
    expected = brute_force_choose(TOPO, free, size, tuple(sorted(UUIDS.index(m) for m in must)))
    assert got == [UUIDS[i] for i in expected]


def test_many_list_and_watch_streams_cannot_starve_allocate() -> None:
    """Each stream holds a server thread; a client opening many must not leave none for Allocate
    (kubelet calls Allocate without a deadline, so a starved Allocate hangs pod admission)."""
    folder = short_tmpdir()
    try:
        with (
            fake_kubelet(folder) as kubelet,
            running_daemon(folder, PRESET),
            plugin_channel(folder / "gputopo-gpu.sock") as stub,
        ):
            assert kubelet.wait(1) is not None
            streams = [stub.ListAndWatch(api_pb2.Empty(), timeout=30) for _ in range(20)]
            codes = []
            for s in streams:
                try:
                    next(s)
                    codes.append(grpc.StatusCode.OK)
                except grpc.RpcError as e:
                    codes.append(e.code())
            assert codes.count(grpc.StatusCode.OK) >= 2, "kubelet may hold an old and a new stream"
            refused = [s for s, c in zip(streams, codes, strict=True) if c != grpc.StatusCode.OK]
            assert refused and all(s.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for s in refused)
            assert "ListAndWatch streams" in refused[0].details()
            req = api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[UUIDS[0]])]
            )
            assert (
                stub.Allocate(req, timeout=3).container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"]
                == UUIDS[0]
            )
            assert len(prefer(stub, UUIDS, 2)) == 2
            for s in streams:
                s.cancel()

            # streams that ended free their slots (within a poll): a new one is served again
            def served() -> bool:
                try:
                    return next(stub.ListAndWatch(api_pb2.Empty(), timeout=5)) is not None
                except grpc.RpcError:
                    return False

            assert eventually(served)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_rejected_multi_container_request_counts_nothing_as_ok(daemon, stub) -> None:
    """kubelet reads a rejected RPC as 'nothing allocated': the metrics must say the same,
    even when the bad container request comes after a good one."""
    reg = daemon.metrics.registry

    def value(name: str, labels: dict[str, str] | None = None) -> float:
        return reg.get_sample_value(name, labels or {}) or 0.0

    def ok(rpc: str) -> float:
        return value("gputopo_allocations_total", {"rpc": rpc, "result": "ok"})

    before = (
        ok("Allocate"),
        ok("GetPreferredAllocation"),
        value("gputopo_preferred_allocation_seconds_count"),
    )
    alloc = api_pb2.AllocateRequest(
        container_requests=[
            api_pb2.ContainerAllocateRequest(devices_ids=[UUIDS[0]]),
            api_pb2.ContainerAllocateRequest(devices_ids=["GPU-nope"]),
        ]
    )
    err = rpc_error(lambda: stub.Allocate(alloc, timeout=5))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "container_requests[1]" in err.details()
    shared = api_pb2.AllocateRequest(
        container_requests=[
            api_pb2.ContainerAllocateRequest(devices_ids=[UUIDS[0], UUIDS[1]]),
            api_pb2.ContainerAllocateRequest(devices_ids=[UUIDS[2], UUIDS[1]]),
        ]
    )
    err = rpc_error(lambda: stub.Allocate(shared, timeout=5))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"container_requests[1]: {UUIDS[1]} is also in container_requests[0]" in err.details()
    pref = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=UUIDS, allocation_size=2),
            api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=UUIDS, allocation_size=0),
        ]
    )
    err = rpc_error(lambda: stub.GetPreferredAllocation(pref, timeout=5))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "container_requests[1]" in err.details()
    after = (
        ok("Allocate"),
        ok("GetPreferredAllocation"),
        value("gputopo_preferred_allocation_seconds_count"),
    )
    assert after == before


def test_a_huge_device_id_gets_a_short_invalid_argument(stub) -> None:
    """The reason travels in gRPC trailers (8 KiB by default on the client): quoting a 10,000-char
    ID whole turned INVALID_ARGUMENT into an unreadable RESOURCE_EXHAUSTED 'Stream removed'."""
    huge = "GPU-" + "f" * 10_000
    alloc = api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[huge])])
    err = rpc_error(lambda: stub.Allocate(alloc, timeout=5))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert "unknown device IDs GPU-fff" in err.details() and len(err.details()) < 300
    err = rpc_error(lambda: prefer(stub, UUIDS, 2, must=[huge]))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert "not among available_deviceIDs" in err.details() and len(err.details()) < 300


@pytest.mark.parametrize(
    ("method", "raw"),
    [
        ("/v1beta1.DevicePlugin/Allocate", b"\x0a\x03\x0a\x01\xff"),  # devices_ids = b"\xff": not UTF-8
        ("/v1beta1.DevicePlugin/GetPreferredAllocation", b"\x0a\x03\x0a\x01\xff"),
        ("/v1beta1.DevicePlugin/ListAndWatch", b"\xff\xff\xff"),  # not protobuf at all
        ("/gputopo.status.v1.Status/GetStatus", b"\xff\xff\xff"),
    ],
)
def test_undecodable_requests_are_invalid_argument(folder: Path, stub, method: str, raw: bytes) -> None:
    """Protobuf refuses a string field that is not UTF-8; gRPC's own answer to that is INTERNAL
    'Exception deserializing request!' with a traceback in our log."""
    with grpc.insecure_channel(f"unix://{folder / 'gputopo-gpu.sock'}") as channel:
        call = (
            channel.unary_stream(method) if method.endswith("ListAndWatch") else channel.unary_unary(method)
        )
        err = rpc_error(
            lambda: list(call(raw, timeout=5)) if method.endswith("ListAndWatch") else call(raw, timeout=5)
        )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert "not a valid" in err.details()
    assert len(prefer(stub, UUIDS, 2)) == 2
