"""`python -m deviceplugin --publish`: the process keeps its Node's topology annotation current.

Everything is real except the servers it talks to: the fake API server (official client over
HTTP), our kubelet stand-in, and a PodResources server built from proto/ on a unix socket.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from gputopo.network.annotation import decode
from gputopo.node.topofile import load_preset
from gputopo_proto.deviceplugin.v1beta1 import api_pb2
from gputopo_proto.podresources.v1 import api_pb2 as pr_pb2
from gputopo_proto.podresources.v1 import api_pb2_grpc as pr_grpc
from tests import fake_apiserver as fk
from tests.kubelet_fake import eventually, fake_kubelet, plugin_channel, short_tmpdir

REPO = Path(__file__).resolve().parent.parent
TOPO = load_preset("rtx8000-4")
UUIDS = [g.uuid for g in TOPO.gpus]
ANNOTATION = "gputopo.io/topology"


class PodResources(pr_grpc.PodResourcesListerServicer):
    """kubelet's PodResources List: GPUs in use are whatever the test says."""

    def __init__(self) -> None:
        self.in_use: list[str] = []

    def List(self, request: pr_pb2.ListPodResourcesRequest, context: grpc.ServicerContext) -> object:
        container = pr_pb2.ContainerResources(
            name="c",
            devices=[pr_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=self.in_use)],
        )
        return pr_pb2.ListPodResourcesResponse(
            pod_resources=[pr_pb2.PodResources(name="p", namespace="ns", containers=[container])]
        )


@pytest.fixture
def folder() -> Iterator[Path]:
    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def kubeconfig(path: Path, url: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: c, cluster: {{server: '{url}'}}}}]\n"
        "users: [{name: u, user: {}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    return path


def annotation(api: fk.FakeAPI, node: str) -> str | None:
    with api.cond:
        return (api.objects["nodes"][node]["metadata"].get("annotations") or {}).get(ANNOTATION)


@pytest.mark.parametrize("recorded", ["before Allocate", "after Allocate returns"])
def test_publishes_the_node_annotation_and_follows_allocations(folder: Path, recorded: str) -> None:
    """Real kubelet records the devices (what PodResources serves) only after Allocate returns."""
    pods = PodResources()
    pr_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pr_grpc.add_PodResourcesListerServicer_to_server(pods, pr_server)
    pr_server.add_insecure_port(f"unix://{folder / 'pr.sock'}")
    pr_server.start()
    try:
        with fk.running() as (api, server, _), fake_kubelet(folder) as kubelet:
            api.put("nodes", fk.node("node-a", gpus=4))
            cfg = kubeconfig(folder / "kubeconfig", server.url)
            proc = subprocess.Popen(
                [sys.executable, "-m", "deviceplugin", "--kubelet-dir", str(folder), "--topology", "rtx8000-4",
                 "--metrics-port", "0", "--publish", "true", "--kubeconfig", str(cfg),
                 "--pod-resources-socket", str(folder / "pr.sock")],
                cwd=REPO, env={"NODE_NAME": "node-a", "PATH": "/usr/bin:/bin"},
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            )  # fmt: skip
            try:
                assert kubelet.wait(1, 20) is not None
                assert eventually(lambda: annotation(api, "node-a") is not None, timeout=15)
                first = decode(annotation(api, "node-a"), now=time.time(), max_age_s=3600)
                assert first.node == "node-a" and first.topology.n == 4 and first.allocated == frozenset()

                # kubelet allocates GPU 2 to a container: PodResources says so, Allocate pokes the publisher
                if recorded == "before Allocate":
                    pods.in_use = [UUIDS[2]]
                with plugin_channel(folder / "gputopo-gpu.sock") as stub:
                    stub.Allocate(
                        api_pb2.AllocateRequest(
                            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[UUIDS[2]])]
                        ),
                        timeout=5,
                    )
                if recorded == "after Allocate returns":
                    time.sleep(0.3)  # the poke's first look has happened by now
                    pods.in_use = [UUIDS[2]]

                def allocated() -> frozenset[int]:
                    return decode(annotation(api, "node-a"), now=time.time(), max_age_s=3600).allocated

                assert eventually(lambda: allocated() == frozenset({2}), timeout=15)
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(10) == 0
            finally:
                if proc.poll() is None:
                    proc.kill()
                proc.communicate()
    finally:
        pr_server.stop(0)


def test_publish_true_without_api_server_exits_1(folder: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "deviceplugin", "--kubelet-dir", str(folder), "--topology", "rtx8000-4",
         "--metrics-port", "0", "--publish", "true", "--kubeconfig", str(folder / "missing")],
        cwd=REPO, env={"NODE_NAME": "node-a", "PATH": "/usr/bin:/bin"}, capture_output=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 1
    lines = proc.stderr.decode().splitlines()
    assert len(lines) == 1 and "node publication" in lines[0]
