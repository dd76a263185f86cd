"""The PodResources client against a fake kubelet PodResources server on a real unix socket."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from deviceplugin.publish.podresources import PodResourcesClient, PodResourcesError, ids_to_uuids
from gputopo_proto.podresources.v1 import api_pb2, api_pb2_grpc
from tests.kubelet_fake import short_tmpdir


class FakeLister(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self) -> None:
        self.pods: list[api_pb2.PodResources] = []
        self.fail: grpc.StatusCode | None = None
        self.calls = 0

    def List(self, request, context):
        self.calls += 1
        if self.fail is not None:
            context.abort(self.fail, "injected")
        return api_pb2.ListPodResourcesResponse(pod_resources=self.pods)


def pod(name: str, *containers: dict[str, list[str]]) -> api_pb2.PodResources:
    return api_pb2.PodResources(
        name=name,
        namespace="ml",
        containers=[
            api_pb2.ContainerResources(
                name=f"c{i}",
                devices=[api_pb2.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in c.items()],
            )
            for i, c in enumerate(containers)
        ],
    )


@pytest.fixture
def kubelet() -> Iterator[tuple[FakeLister, str]]:
    folder = short_tmpdir()
    path = str(folder / "kubelet.sock")
    lister = FakeLister()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(lister, server)
    server.add_insecure_port(f"unix://{path}")
    server.start()
    try:
        yield lister, path
    finally:
        server.stop(0).wait()  # gRPC removes its socket as it stops: wait for that, then tidy up
        pathlib.Path(path).unlink(missing_ok=True)
        folder.rmdir()


def test_lists_our_devices_across_pods_and_containers(kubelet) -> None:
    lister, path = kubelet
    lister.pods = [
        pod(
            "a",
            {"nvidia.com/gpu": ["GPU-1", "GPU-2"]},
            {"nvidia.com/gpu": ["GPU-3"], "example.com/nic": ["nic0"]},
        ),
        pod("b", {"example.com/fpga": ["f0"]}),
        pod("c", {"nvidia.com/gpu": ["GPU-7"]}),
    ]
    client = PodResourcesClient(path, "nvidia.com/gpu", timeout_s=2)
    try:
        assert client.in_use() == {"GPU-1", "GPU-2", "GPU-3", "GPU-7"}
        lister.pods = lister.pods[1:]
        assert client.in_use() == {"GPU-7"}, "re-read each time: pods that ended free their GPUs"
        lister.pods = []
        assert client.in_use() == frozenset()
    finally:
        client.close()


def test_errors_are_reported_not_raised_raw(kubelet) -> None:
    lister, path = kubelet
    lister.fail = grpc.StatusCode.UNAVAILABLE
    client = PodResourcesClient(path, timeout_s=2)
    try:
        with pytest.raises(PodResourcesError, match="UNAVAILABLE"):
            client.in_use()
    finally:
        client.close()


def test_missing_socket_is_an_error_with_the_path() -> None:
    client = PodResourcesClient("/tmp/gt-no-such-dir/kubelet.sock", timeout_s=0.5)
    try:
        with pytest.raises(PodResourcesError, match="gt-no-such-dir"):
            client.in_use()
    finally:
        client.close()


def test_replica_ids_map_back_to_uuids() -> None:
    assert ids_to_uuids(["GPU-1::0", "GPU-1::1", "GPU-2"]) == {"GPU-1", "GPU-2"}


def test_assignments_give_each_pods_devices_for_the_annotation_pod_map(kubelet) -> None:
    lister, path = kubelet
    lister.pods = [
        pod("a", {"nvidia.com/gpu": ["GPU-1"]}, {"nvidia.com/gpu": ["GPU-2"], "example.com/nic": ["n0"]}),
        pod("b", {"example.com/fpga": ["f0"]}),
        pod("c", {"nvidia.com/gpu": ["GPU-7::1"]}),
    ]
    client = PodResourcesClient(path, "nvidia.com/gpu", timeout_s=2)
    try:
        assert client.assignments() == {"ml/a": {"GPU-1", "GPU-2"}, "ml/c": {"GPU-7::1"}}
        lister.pods = []
        assert client.assignments() == {}
    finally:
        client.close()
