"""The plugin's operator metrics on its real /metrics port, after real RPCs over the plugin
socket: build info, per-GPU health, and the ring each allocation got (GB/s and share of the
node's best for that size)."""

from __future__ import annotations

import json
import platform
import shutil
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from deviceplugin.hardware.filebackend import FileBackend
from deviceplugin.kubelet.daemon import Daemon
from deviceplugin.settings import PluginConfig
from gputopo import __version__
from gputopo.node.topofile import load_preset
from gputopo_proto.deviceplugin.v1beta1 import api_pb2
from tests.kubelet_fake import eventually, fake_kubelet, plugin_channel, short_tmpdir

PRESET = "dgx1-v100"
UUIDS = [g.uuid for g in load_preset(PRESET).gpus]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.fixture
def plugin() -> Iterator[tuple[Path, Path, int]]:
    folder = short_tmpdir()
    health = folder / "health.json"
    port = free_port()
    config = PluginConfig(
        kubelet_dir=str(folder), topology=PRESET, health_file=str(health), metrics_port=port
    )
    daemon = Daemon(config, FileBackend(PRESET, str(health), poll_interval=0.05), health_tick_seconds=0.05)
    with fake_kubelet(folder) as kubelet:
        daemon.start()
        try:
            assert kubelet.wait(1, 10) is not None
            yield folder, health, port
        finally:
            daemon.stop()
            shutil.rmtree(folder, ignore_errors=True)


def test_build_info_and_per_gpu_health(plugin) -> None:
    _folder, health, port = plugin
    m = scrape(port)
    labels = (("backend", "file"), ("python", platform.python_version()), ("version", __version__))
    assert m[("gputopo_build_info", labels)] == 1.0
    for i, uuid in enumerate(UUIDS):
        assert m[("gputopo_gpu_healthy", (("gpu", str(i)), ("uuid", uuid)))] == 1.0
    tmp = health.with_suffix(".tmp")
    tmp.write_text(json.dumps({UUIDS[3]: "Unhealthy"}))
    tmp.replace(health)
    key = ("gputopo_gpu_healthy", (("gpu", "3"), ("uuid", UUIDS[3])))
    assert eventually(lambda: scrape(port)[key] == 0.0)
    assert scrape(port)[("gputopo_gpu_healthy", (("gpu", "2"), ("uuid", UUIDS[2])))] == 1.0


def test_ring_each_allocation_got_in_gbps_and_as_share_of_the_best(plugin) -> None:
    folder, _health, port = plugin
    with plugin_channel(folder / "gputopo-gpu.sock") as stub:
        # preferred: 2 of all 8 on a DGX-1 is an NV2 pair, 50 GB/s, the best a pair gets
        req = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=UUIDS, allocation_size=2)
            ]
        )
        stub.GetPreferredAllocation(req, timeout=5)
        # kubelet allocates something else: GPUs 0 and 1 are an NV1 pair, 25 GB/s = half the best;
        # a single GPU has no ring and is not observed
        stub.Allocate(
            api_pb2.AllocateRequest(
                container_requests=[
                    api_pb2.ContainerAllocateRequest(devices_ids=[UUIDS[0], UUIDS[1]]),
                    api_pb2.ContainerAllocateRequest(devices_ids=[UUIDS[7]]),
                ]
            ),
            timeout=5,
        )
    m = scrape(port)
    pref = (("rpc", "GetPreferredAllocation"),)
    alloc = (("rpc", "Allocate"),)
    assert (
        m[("gputopo_allocation_ring_gbps_count", pref)] == 1
        and m[("gputopo_allocation_ring_gbps_sum", pref)] == 50
    )
    assert (
        m[("gputopo_allocation_ring_gbps_count", alloc)] == 1
        and m[("gputopo_allocation_ring_gbps_sum", alloc)] == 25
    )
    assert m[("gputopo_allocation_ring_share_sum", pref)] == 1.0
    assert m[("gputopo_allocation_ring_share_bucket", (("le", "0.99"), *pref))] == 0
    assert m[("gputopo_allocation_ring_share_bucket", (("le", "1.0"), *pref))] == 1
    assert m[("gputopo_allocation_ring_share_sum", alloc)] == 0.5
    assert m[("gputopo_allocation_ring_share_bucket", (("le", "0.25"), *alloc))] == 0
    assert m[("gputopo_allocation_ring_share_bucket", (("le", "0.5"), *alloc))] == 1


def test_gpus_gone_from_the_topology_leave_the_health_gauge() -> None:
    from deviceplugin.metrics import Metrics

    m = Metrics()
    m.export_health([(0, "GPU-a", True), (1, "GPU-b", False)])
    m.export_health([(0, "GPU-a", False)])  # re-discovery found one GPU fewer
    assert m.registry.get_sample_value("gputopo_gpu_healthy", {"gpu": "0", "uuid": "GPU-a"}) == 0.0
    assert m.registry.get_sample_value("gputopo_gpu_healthy", {"gpu": "1", "uuid": "GPU-b"}) is None
