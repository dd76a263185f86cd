"""Health changes reach kubelet: the file backend's health file -> a new ListAndWatch list."""

from __future__ import annotations

import json
import os
import queue
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from deviceplugin.state import Snapshot
from gputopo.node.topofile import load_preset
from gputopo_proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from tests.kubelet_fake import eventually, fake_kubelet, plugin_channel, running_daemon, short_tmpdir

TOPO = load_preset("dgx1-v100")
UUIDS = [g.uuid for g in TOPO.gpus]


@pytest.fixture
def folder() -> Iterator[Path]:
    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


class Watch:
    """A ListAndWatch stream read on its own thread, lists delivered through a queue."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.lists: queue.Queue[dict[str, str]] = queue.Queue()
        self.stream = api_pb2_grpc.DevicePluginStub(channel).ListAndWatch(api_pb2.Empty())
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for resp in self.stream:
                self.lists.put({d.ID: d.health for d in resp.devices})
        except grpc.RpcError:
            pass

    def next(self, timeout: float = 5.0) -> dict[str, str]:
        return self.lists.get(timeout=timeout)

    def until(self, check: object, timeout: float = 5.0) -> dict[str, str]:
        """The first pushed list for which check(list) holds (each health event may push one)."""
        end = time.monotonic() + timeout
        while True:
            listing = self.next(max(0.01, end - time.monotonic()))
            if check(listing):  # type: ignore[operator]
                return listing


def write_health(path: Path, doc: dict[str, object]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)


def test_health_file_changes_push_new_lists(folder: Path) -> None:
    health = folder / "health.json"
    seen: list[Snapshot] = []
    with (
        fake_kubelet(folder) as kubelet,
        running_daemon(folder, "dgx1-v100", health_file=str(health)) as daemon,
        grpc.insecure_channel(f"unix://{folder / 'gputopo-gpu.sock'}") as channel,
    ):
        daemon.add_listener(seen.append)
        assert kubelet.wait(1, 10) is not None
        allocator = daemon.store.current().allocator
        watch = Watch(channel)
        assert set(watch.next().values()) == {"Healthy"}

        write_health(health, {UUIDS[3]: "Unhealthy"})
        listing = watch.next()
        assert listing[UUIDS[3]] == "Unhealthy"
        assert [u for u, h in listing.items() if h != "Healthy"] == [UUIDS[3]]

        write_health(health, {"3": "Healthy", "5": {"xid": 79}})
        listing = watch.until(lambda lst: lst[UUIDS[5]] == "Unhealthy")
        assert [u for u, h in listing.items() if h != "Healthy"] == [UUIDS[5]]

        # an ignored (application) XID changes nothing, so no new list is sent
        write_health(health, {"5": {"xid": 79}, "6": {"xid": 13}})
        with pytest.raises(queue.Empty):
            watch.next(timeout=0.6)

        snap = daemon.store.current()
        assert snap.allocator is allocator, "same topology: the allocator is reused, not rebuilt"
        assert [s.health[UUIDS[5]] for s in seen][-1] is False, "listeners see every change"
        reg = daemon.metrics.registry
        assert reg.get_sample_value("gputopo_health_transitions_total", {"to": "unhealthy"}) == 2
        assert reg.get_sample_value("gputopo_health_transitions_total", {"to": "healthy"}) == 1
        with plugin_channel(folder / "gputopo-gpu.sock") as stub:
            # kubelet is the authority: an unhealthy GPU it offers may still be chosen
            req = api_pb2.PreferredAllocationRequest(
                container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(
                        available_deviceIDs=[UUIDS[5]], allocation_size=1
                    )
                ]
            )
            assert list(stub.GetPreferredAllocation(req, timeout=5).container_responses[0].deviceIDs) == [
                UUIDS[5]
            ]
        watch.stream.cancel()


def test_xid_recovers_after_the_quiet_period(folder: Path) -> None:
    health = folder / "health.json"
    with (
        fake_kubelet(folder) as kubelet,
        running_daemon(folder, "rtx8000-4", health_file=str(health), health_recovery_seconds=0.5),
        grpc.insecure_channel(f"unix://{folder / 'gputopo-gpu.sock'}") as channel,
    ):
        assert kubelet.wait(1, 10) is not None
        uuid = load_preset("rtx8000-4").gpus[2].uuid
        watch = Watch(channel)
        watch.next()
        write_health(health, {"2": {"xid": 48}})
        assert watch.next()[uuid] == "Unhealthy"
        t0 = time.monotonic()
        assert watch.next(timeout=5)[uuid] == "Healthy"
        assert time.monotonic() - t0 >= 0.3
        watch.stream.cancel()


def test_rediscovered_links_rebuild_the_allocator(folder: Path) -> None:
    """A health change re-probes links; a changed topology gets a new allocator and new answers."""
    doc = load_preset("rtx8000-4").to_dict()
    topo_file = folder / "node.json"
    topo_file.write_text(json.dumps(doc))
    health = folder / "health.json"
    uuids = [g["uuid"] for g in doc["gpus"]]
    with (
        fake_kubelet(folder) as kubelet,
        running_daemon(folder, str(topo_file), health_file=str(health)) as daemon,
        plugin_channel(folder / "gputopo-gpu.sock") as stub,
    ):
        assert kubelet.wait(1, 10) is not None

        def best_pair() -> list[str]:
            req = api_pb2.PreferredAllocationRequest(
                container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=uuids, allocation_size=2)
                ]
            )
            return list(stub.GetPreferredAllocation(req, timeout=5).container_responses[0].deviceIDs)

        assert best_pair() == [uuids[0], uuids[3]]  # the NV2 bridge 0-3
        before = daemon.store.current().allocator
        # the 0-3 bridge is lost and 1-2 gains links (as NVML would see it after a fault) ...
        doc["links"][0][3] = doc["links"][3][0] = "SYS"
        doc["links"][1][2] = doc["links"][2][1] = "NV4"
        topo_file.write_text(json.dumps(doc))
        # ... and a GPU turns unhealthy, which is what makes the plugin look again
        write_health(health, {"0": "Unhealthy"})
        assert eventually(lambda: daemon.store.current().allocator is not before)
        assert best_pair() == [uuids[1], uuids[2]]


@pytest.mark.parametrize(
    "bad",
    [
        '{"\u00b2": "Unhealthy"}',  # str.isdigit() is true for a superscript two, int() refuses it
        '{"%s": "Unhealthy"}' % ("9" * 5000),  # past int()'s 4300-digit limit: ValueError
        "[" * 100_000,  # nesting deep enough for json to raise RecursionError, not JSONDecodeError
    ],
    ids=["superscript-index", "huge-index", "deep-nesting"],
)
def test_a_bad_health_file_never_ends_health_watching(folder: Path, bad: str) -> None:
    """Whatever an operator writes, the next good health file is still acted on."""
    health = folder / "health.json"
    with (
        fake_kubelet(folder) as kubelet,
        running_daemon(folder, "dgx1-v100", health_file=str(health)),
        grpc.insecure_channel(f"unix://{folder / 'gputopo-gpu.sock'}") as channel,
    ):
        assert kubelet.wait(1, 10) is not None
        watch = Watch(channel)
        assert set(watch.next().values()) == {"Healthy"}
        tmp = health.with_suffix(".tmp")
        tmp.write_text(bad)
        tmp.replace(health)
        time.sleep(0.3)  # several polls of the bad file
        write_health(health, {"4": "Unhealthy"})
        assert watch.until(lambda lst: lst[UUIDS[4]] == "Unhealthy")[UUIDS[4]] == "Unhealthy"
        watch.stream.cancel()


def test_rediscovered_topology_the_allocator_refuses_keeps_the_previous_one(folder: Path) -> None:
    """A re-probe that finds a layout the allocator cannot take (here 17 GPUs) must not swallow
    the health change that caused it, nor stop the health loop: the old topology stays."""
    doc = load_preset("rtx8000-4").to_dict()
    topo_file = folder / "node.json"
    topo_file.write_text(json.dumps(doc))
    health = folder / "health.json"
    uuids = [g["uuid"] for g in doc["gpus"]]
    with (
        fake_kubelet(folder) as kubelet,
        running_daemon(
            folder, str(topo_file), health_file=str(health), health_recovery_seconds=0.5
        ) as daemon,
        grpc.insecure_channel(f"unix://{folder / 'gputopo-gpu.sock'}") as channel,
    ):
        assert kubelet.wait(1, 10) is not None
        before = daemon.store.current()
        watch = Watch(channel)
        watch.next()
        n = 17
        big = {"name": "big", "gpus": [{"index": i} for i in range(n)]}
        big["links"] = [["X" if i == j else "NV1" for j in range(n)] for i in range(n)]
        topo_file.write_text(json.dumps(big))
        write_health(health, {"1": {"xid": 48}})
        assert watch.until(lambda lst: lst.get(uuids[1]) == "Unhealthy")[uuids[1]] == "Unhealthy"
        assert watch.until(lambda lst: lst.get(uuids[1]) == "Healthy", timeout=5)[uuids[1]] == "Healthy"
        snap = daemon.store.current()
        assert snap.topology == before.topology and snap.allocator is before.allocator
        watch.stream.cancel()


def test_a_health_path_that_is_not_a_regular_file_never_blocks_watching(folder: Path) -> None:
    """Opening a FIFO blocks until someone writes to it: the watcher must not try."""
    health = folder / "health.json"
    os.mkfifo(health)
    with (
        fake_kubelet(folder) as kubelet,
        running_daemon(folder, "dgx1-v100", health_file=str(health)),
        grpc.insecure_channel(f"unix://{folder / 'gputopo-gpu.sock'}") as channel,
    ):
        assert kubelet.wait(1, 10) is not None
        watch = Watch(channel)
        assert set(watch.next().values()) == {"Healthy"}
        time.sleep(0.3)  # several polls of the FIFO
        write_health(health, {"2": "Unhealthy"})
        assert watch.until(lambda lst: lst[UUIDS[2]] == "Unhealthy")[UUIDS[2]] == "Unhealthy"
        watch.stream.cancel()
