"""NvmlBackend against an injected pynvml stand-in modelling whole servers.

The stand-in answers the same functions, constants and error class as pynvml (nvidia-ml-py);
the models are built from the shared presets so the expected codes are the `nvidia-smi topo -m`
codes of those servers.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from deviceplugin.hardware import nvml_probe
from deviceplugin.hardware.backend import ALL_GPUS, Backend, HealthEvent
from deviceplugin.hardware.nvml import NvmlBackend, NvmlUnavailable
from deviceplugin.health.tracker import HealthTracker
from gputopo.node.topofile import load_preset
from gputopo.node.topology import Topology

LEVEL = {
    "PIX": pynvml.NVML_TOPOLOGY_SINGLE,
    "PXB": pynvml.NVML_TOPOLOGY_MULTIPLE,
    "PHB": pynvml.NVML_TOPOLOGY_HOSTBRIDGE,
    "NODE": pynvml.NVML_TOPOLOGY_NODE,
    "SYS": pynvml.NVML_TOPOLOGY_SYSTEM,
}
E = pynvml.NVMLError


@dataclass
class FakeLink:
    state: int = pynvml.NVML_FEATURE_ENABLED
    remote_type: int = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
    remote_bus: str = ""
    version: int = pynvml.NVML_NVLINK_VERSION_2_0
    error: int | None = None  # NVML error code this link raises on every call


@dataclass
class FakeGpu:
    uuid: str
    bus_id: str
    name: str = "Fake GPU"
    numa: int | None = None  # nvmlDeviceGetNumaNodeId; None -> NOT_SUPPORTED
    memory_nodes: list[int] | None = None  # nvmlDeviceGetMemoryAffinity's nodes; None -> NOT_SUPPORTED
    cpus: list[int] | None = None  # nvmlDeviceGetCpuAffinityWithinScope's CPUs; None -> NOT_SUPPORTED
    links: list[FakeLink] = field(default_factory=list)
    events: int = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError


class FakeNvml:
    """The subset of pynvml NvmlBackend calls, over a model server."""

    NVMLError = pynvml.NVMLError

    def __init__(self, gpus: list[FakeGpu], levels: list[list[int]], nvlink_supported: bool = True) -> None:
        self.gpus = gpus
        self.levels = levels
        self.nvlink_supported = nvlink_supported
        self.init_error: int | None = None
        self.ancestor_error: set[tuple[int, int]] = set()
        self.events: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self.registered: list[tuple[int, int]] = []
        self.sets_created = 0
        self.sets_freed = 0
        self.shutdown = 0
        for name in dir(pynvml):
            if name.startswith(("NVML_", "nvmlEventType")) and not hasattr(self, name):
                setattr(self, name, getattr(pynvml, name))

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise E(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdown += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if not 0 <= i < len(self.gpus):
            raise E(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        if h >= len(self.gpus):
            raise E(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[h].uuid

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self.gpus[h].name.encode()  # older pynvml returns bytes

    def nvmlDeviceGetPciInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(busId=self.gpus[h].bus_id.encode())

    def nvmlDeviceGetNumaNodeId(self, h: int) -> int:
        if self.gpus[h].numa is None:
            raise E(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.gpus[h].numa

    @staticmethod
    def _mask(bits: list[int] | None, words: int) -> list[int]:
        """A pynvml-shaped mask: `words` 64-bit words, lowest first (pynvml returns a ctypes array)."""
        if bits is None:
            raise E(pynvml.NVML_ERROR_NOT_SUPPORTED)
        out = [0] * words
        for b in bits:
            if b < words * 64:  # what NVML cannot fit in the caller's words it leaves out
                out[b // 64] |= 1 << (b % 64)
        return out

    def nvmlDeviceGetMemoryAffinity(self, h: int, words: int, scope: int) -> list[int]:
        assert scope == pynvml.NVML_AFFINITY_SCOPE_NODE
        return self._mask(self.gpus[h].memory_nodes, words)

    def nvmlDeviceGetCpuAffinityWithinScope(self, h: int, words: int, scope: int) -> list[int]:
        assert scope == pynvml.NVML_AFFINITY_SCOPE_NODE
        return self._mask(self.gpus[h].cpus, words)

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        if (a, b) in self.ancestor_error:
            raise E(pynvml.NVML_ERROR_UNKNOWN)
        return self.levels[a][b]

    def _link(self, h: int, link: int) -> FakeLink:
        if not self.nvlink_supported:
            raise E(pynvml.NVML_ERROR_NOT_SUPPORTED)
        links = self.gpus[h].links
        if link >= len(links):
            raise E(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if links[link].error is not None:
            raise E(links[link].error)
        return links[link]

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        return self._link(h, link).state

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: int, link: int) -> int:
        return self._link(h, link).remote_type

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> SimpleNamespace:
        lk = self._link(h, link)
        if lk.remote_type == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
            return SimpleNamespace(busId="00000000:C5:00.0")  # the switch's own PCI id
        return SimpleNamespace(busId=lk.remote_bus)

    def nvmlDeviceGetNvLinkVersion(self, h: int, link: int) -> int:
        return self._link(h, link).version

    # events

    def nvmlEventSetCreate(self) -> str:
        self.sets_created += 1
        return f"set{self.sets_created}"

    def nvmlEventSetFree(self, s: str) -> None:
        self.sets_freed += 1

    def nvmlDeviceGetSupportedEventTypes(self, h: int) -> int:
        return self.gpus[h].events

    def nvmlDeviceRegisterEvents(self, h: int, mask: int, s: str) -> None:
        self.registered.append((h, mask))

    def nvmlEventSetWait(self, s: str, timeout_ms: int) -> SimpleNamespace:
        try:
            item = self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise E(pynvml.NVML_ERROR_TIMEOUT) from None
        if item[0] == "error":
            raise E(item[1])
        kind, device, data = item
        return SimpleNamespace(device=device, eventType=kind, eventData=data)


def bus(i: int) -> str:
    return f"00000000:{0x10 * (i + 1):02X}:00.0"


def model_from(topo: Topology, *, pcie: dict[tuple[int, int], str], switch: bool, version: int) -> FakeNvml:
    """A fake server whose NVLinks reproduce `topo` (direct links or NVSwitch) over the given PCIe levels."""
    n = topo.n
    gpus = [FakeGpu(uuid=g.uuid, bus_id=bus(g.index), name=g.model or "Fake", numa=g.numa) for g in topo.gpus]
    for i in range(n):
        for j in range(n):
            link = topo.links[i][j]
            if link is None or not link.nvlinks:
                continue
            if switch:
                if not gpus[i].links:
                    gpus[i].links = [
                        FakeLink(remote_type=pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH, version=version)
                        for _ in range(link.nvlinks)
                    ]
            else:
                gpus[i].links += [FakeLink(remote_bus=bus(j), version=version) for _ in range(link.nvlinks)]
    levels = [[LEVEL[pcie.get((min(i, j), max(i, j)), "SYS")] for j in range(n)] for i in range(n)]
    return FakeNvml(gpus, levels)


def codes(t: Topology) -> list[list[str]]:
    return [[t.code(i, j) for j in range(t.n)] for i in range(t.n)]


def socket_levels(n: int, split: int, inner: str) -> dict[tuple[int, int], str]:
    return {(i, j): inner if (i < split) == (j < split) else "SYS" for i in range(n) for j in range(i + 1, n)}


@pytest.fixture
def no_sysfs(tmp_path: Path) -> str:
    return str(tmp_path / "sys")


def test_hgx_h100_switch_links_give_nv18_everywhere(no_sysfs: str) -> None:
    fake = model_from(
        load_preset("hgx-h100"),
        pcie=socket_levels(8, 4, "NODE"),
        switch=True,
        version=pynvml.NVML_NVLINK_VERSION_4_0,
    )
    t = NvmlBackend(nvml=fake, sysfs_root=no_sysfs).discover()
    assert t.n == 8 and t.nvswitch is True
    assert all(t.code(i, j) == "NV18" for i in range(8) for j in range(8) if i != j)
    assert t.links[0][5].pcie == "SYS" and t.links[0][1].pcie == "NODE"  # PCIe level kept underneath
    assert t.settings.nvlink_gbps_per_link == 25.0 and t.gbps(0, 7) == 450.0
    assert [g.numa for g in t.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert t.gpus[3].uuid == load_preset("hgx-h100").gpus[3].uuid and t.gpus[3].pci_bus_id == bus(3)


def test_switch_count_is_the_smaller_side(no_sysfs: str) -> None:
    fake = model_from(load_preset("hgx-h100"), pcie={}, switch=True, version=pynvml.NVML_NVLINK_VERSION_4_0)
    fake.gpus[2].links[5].state = pynvml.NVML_FEATURE_DISABLED  # one of GPU2's 18 links is down
    t = NvmlBackend(nvml=fake, sysfs_root=no_sysfs).discover()
    assert [t.code(2, j) for j in range(8)] == ["NV17", "NV17", "X", "NV17", "NV17", "NV17", "NV17", "NV17"]
    assert t.code(0, 1) == "NV18"


def test_nvlink5_switch_is_50_gbps_per_link(no_sysfs: str) -> None:
    fake = model_from(load_preset("gb200-tray"), pcie={}, switch=True, version=pynvml.NVML_NVLINK_VERSION_5_0)
    t = NvmlBackend(nvml=fake, sysfs_root=no_sysfs).discover()
    assert t.settings.nvlink_gbps_per_link == 50.0 and t.gbps(0, 1) == 900.0


def test_dgx1_direct_links_match_the_preset(no_sysfs: str) -> None:
    preset = load_preset("dgx1-v100")
    pcie = socket_levels(8, 4, "PHB") | {(0, 1): "PIX", (2, 3): "PIX", (4, 5): "PIX", (6, 7): "PIX"}
    fake = model_from(preset, pcie=pcie, switch=False, version=pynvml.NVML_NVLINK_VERSION_2_0)
    # NVML pads the link array: unused links are disabled or raise INVALID_ARGUMENT/NOT_SUPPORTED.
    fake.gpus[0].links += [
        FakeLink(state=pynvml.NVML_FEATURE_DISABLED),
        FakeLink(error=pynvml.NVML_ERROR_NOT_SUPPORTED),
    ]
    t = NvmlBackend(nvml=fake, sysfs_root=no_sysfs).discover()
    assert codes(t) == codes(preset)
    assert t.nvswitch is False
    assert t.links[0][1].pcie == "PIX" and t.links[0][3].pcie == "PHB"
    assert [g.numa for g in t.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_pcie_box_without_nvlink_matches_the_preset(no_sysfs: str) -> None:
    preset = load_preset("pcie8-plx")
    pcie = {(i, j): preset.code(i, j) for i in range(8) for j in range(i + 1, 8)}
    fake = model_from(preset, pcie=pcie, switch=False, version=0)
    fake.nvlink_supported = False
    t = NvmlBackend(nvml=fake, sysfs_root=no_sysfs).discover()
    assert codes(t) == codes(preset)
    assert t.settings.nvlink_gbps_per_link == 25.0  # nothing reported: default kept


def test_internal_level_and_probe_failures(no_sysfs: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="deviceplugin.nvml")
    gpus = [FakeGpu(uuid=f"GPU-{i}", bus_id=bus(i)) for i in range(3)]
    gpus[0].links = [FakeLink(remote_bus=bus(1)), FakeLink(error=pynvml.NVML_ERROR_UNKNOWN)]
    gpus[1].links = [FakeLink(remote_bus=bus(0).replace("00000000:", "0000:"))]  # legacy bus id spelling
    levels = [[0, pynvml.NVML_TOPOLOGY_INTERNAL, 77], [0, 0, 50], [77, 50, 0]]
    fake = FakeNvml(gpus, levels)
    fake.ancestor_error.add((1, 2))
    t = NvmlBackend(nvml=fake, sysfs_root=no_sysfs).discover()
    assert codes(t) == [["X", "NV1", "SYS"], ["NV1", "X", "SYS"], ["SYS", "SYS", "X"]]
    assert t.links[0][1].pcie == "PIX"  # dual-GPU board (INTERNAL) prints as PIX
    events = [r.getMessage() for r in caplog.records]
    assert events.count("pcie_level_unknown") == 2 and events.count("nvlink_probe_failed") == 1


def test_asymmetric_direct_counts_use_the_smaller(no_sysfs: str, caplog: pytest.LogCaptureFixture) -> None:
    gpus = [
        FakeGpu(uuid="GPU-0", bus_id=bus(0), links=[FakeLink(remote_bus=bus(1))] * 2),
        FakeGpu(uuid="GPU-1", bus_id=bus(1), links=[FakeLink(remote_bus=bus(0))]),
    ]
    t = NvmlBackend(nvml=FakeNvml(gpus, [[0, 50], [50, 0]]), sysfs_root=no_sysfs).discover()
    assert t.code(0, 1) == "NV1"
    assert "nvlink_count_asymmetric" in [r.getMessage() for r in caplog.records]


def test_numa_from_sysfs_first_then_nvml(tmp_path: Path) -> None:
    gpus = [FakeGpu(uuid=f"GPU-{i}", bus_id=bus(i), numa=9) for i in range(3)]
    for i, value in ((0, "1\n"), (1, "-1\n")):
        d = tmp_path / "bus" / "pci" / "devices" / f"0000:{0x10 * (i + 1):02x}:00.0"
        d.mkdir(parents=True)
        (d / "numa_node").write_text(value)
    t = NvmlBackend(nvml=FakeNvml(gpus, [[0, 50, 50]] * 3), sysfs_root=str(tmp_path)).discover()
    # sysfs says 1; sysfs says -1 (unknown) and no sysfs entry: NVML's answer.
    assert [g.numa for g in t.gpus] == [1, 9, 9]


def test_numa_falls_back_to_nvml_affinity(tmp_path: Path) -> None:
    """Where sysfs says -1 and nvmlDeviceGetNumaNodeId is unknown (an H200 VM on driver 580),
    the NUMA node is the one NVML's affinity names, as nvidia-smi topo -m's NUMA Affinity column:
    memory affinity first, else the node of the CPUs of the CPU affinity; several nodes or none:
    unknown."""
    nodes = tmp_path / "devices" / "system" / "node"
    for n, cpus in ((0, "0-3,8-11"), (1, "4-7,12-15"), (300, "70")):
        (nodes / f"node{n}").mkdir(parents=True)
        (nodes / f"node{n}" / "cpulist").write_text(cpus + "\n")
    cases = [
        FakeGpu("GPU-0", bus(0), memory_nodes=[0], cpus=[4]),  # memory affinity wins
        FakeGpu("GPU-1", bus(1), memory_nodes=[1]),
        FakeGpu("GPU-2", bus(2), cpus=[12, 13]),  # no memory affinity: the CPUs' node
        FakeGpu("GPU-3", bus(3), memory_nodes=[0, 1]),  # spans both: unknown
        FakeGpu("GPU-4", bus(4), cpus=[2, 5]),  # CPUs of both nodes: unknown
        FakeGpu("GPU-5", bus(5)),  # nothing answers
        FakeGpu("GPU-6", bus(6), cpus=[99]),  # a CPU of no node
        FakeGpu("GPU-7", bus(7), memory_nodes=[200]),  # a high node: the mask's 4th word
        FakeGpu("GPU-8", bus(8), numa=3, memory_nodes=[1]),  # nvmlDeviceGetNumaNodeId first
    ]
    for i in range(len(cases)):
        d = tmp_path / "bus" / "pci" / "devices" / f"0000:{0x10 * (i + 1):02x}:00.0"
        d.mkdir(parents=True)
        (d / "numa_node").write_text("-1\n")
    t = NvmlBackend(nvml=FakeNvml(cases, [[0] + [50] * 8] * 9), sysfs_root=str(tmp_path)).discover()
    assert [g.numa for g in t.gpus] == [0, 1, 1, None, None, None, None, 200, 3]


def test_numa_of_the_h200_vm_measured(tmp_path: Path) -> None:
    """The answers an H200 VM gave (driver 580.159.04): numa_node -1, nvmlDeviceGetNumaNodeId
    NOT_SUPPORTED, memory affinity 0x1, CPU affinity 0-15 = node0's cpulist; topo -m: 0."""
    (tmp_path / "devices" / "system" / "node" / "node0").mkdir(parents=True)
    (tmp_path / "devices" / "system" / "node" / "node0" / "cpulist").write_text("0-15\n")
    d = tmp_path / "bus" / "pci" / "devices" / "0000:10:00.0"
    d.mkdir(parents=True)
    (d / "numa_node").write_text("-1\n")
    gpu = FakeGpu("GPU-h200", bus(0), numa=None, memory_nodes=[0], cpus=list(range(16)))
    assert NvmlBackend(nvml=FakeNvml([gpu], [[0]]), sysfs_root=str(tmp_path)).discover().gpus[0].numa == 0
    gpu.memory_nodes = None  # the CPU affinity alone says the same
    assert NvmlBackend(nvml=FakeNvml([gpu], [[0]]), sysfs_root=str(tmp_path)).discover().gpus[0].numa == 0


def test_overrides_beat_nvml(no_sysfs: str) -> None:
    fake = model_from(load_preset("hgx-h100"), pcie={}, switch=True, version=pynvml.NVML_NVLINK_VERSION_4_0)
    t = NvmlBackend(nvml=fake, sysfs_root=no_sysfs, nvlink_gbps_per_link=50, pcie_gbps={"SYS": 8}).discover()
    assert t.settings.nvlink_gbps_per_link == 50 and t.settings.pcie_gbps["SYS"] == 8


def test_bad_override_fails_at_construction() -> None:
    with pytest.raises(ValueError, match="pcie_gbps"):
        NvmlBackend(nvml=FakeNvml([], []), pcie_gbps={"FAST": 1})
    with pytest.raises(ValueError, match="nvlink_gbps_per_link"):
        NvmlBackend(nvml=FakeNvml([], []), nvlink_gbps_per_link=0)


def test_init_failure_is_nvml_unavailable() -> None:
    fake = FakeNvml([], [])
    fake.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    with pytest.raises(NvmlUnavailable, match="NVML init failed: Driver Not Loaded"):
        NvmlBackend(nvml=fake)


def test_real_pynvml_without_gpu_is_nvml_unavailable() -> None:
    try:
        backend = NvmlBackend()
    except NvmlUnavailable as e:
        assert "NVML init failed" in str(e)
    else:  # pragma: no cover - only on a GPU machine
        assert backend.discover().n >= 1
        backend.close()


def test_probe_failures_are_nvml_unavailable(h100: FakeNvml) -> None:
    backend = NvmlBackend(nvml=h100)
    original = h100.nvmlDeviceGetPciInfo

    def lost(h: int) -> SimpleNamespace:
        if h == 4:
            raise E(pynvml.NVML_ERROR_GPU_IS_LOST)
        return original(h)

    h100.nvmlDeviceGetPciInfo = lost  # type: ignore[method-assign]
    with pytest.raises(NvmlUnavailable, match="NVML probe failed: GPU is lost"):
        backend.discover()
    with pytest.raises(NvmlUnavailable, match="no GPUs"):
        NvmlBackend(nvml=FakeNvml([], [])).discover()


def test_close_shuts_nvml_down_once() -> None:
    fake = FakeNvml([], [])
    backend: Backend = NvmlBackend(nvml=fake)
    backend.close()
    backend.close()
    assert fake.shutdown == 1


# --- health events ---


class Watcher:
    def __init__(self, fake: FakeNvml) -> None:
        self.backend = NvmlBackend(nvml=fake, event_timeout_ms=10, error_backoff_s=0.01, max_backoff_s=0.02)
        self.events: queue.Queue[HealthEvent] = queue.Queue()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.backend.watch_health, args=(self.stop, self.events.put))
        self.thread.start()

    def take(self) -> HealthEvent:
        return self.events.get(timeout=5)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        assert not self.thread.is_alive()


@pytest.fixture
def h100() -> FakeNvml:
    return model_from(load_preset("hgx-h100"), pcie={}, switch=True, version=pynvml.NVML_NVLINK_VERSION_4_0)


@pytest.fixture
def watcher(h100: FakeNvml) -> Iterator[Watcher]:
    w = Watcher(h100)
    yield w
    w.close()


XID = pynvml.nvmlEventTypeXidCriticalError


def test_xid_events_flow_to_the_tracker(h100: FakeNvml, watcher: Watcher) -> None:
    uuids = [g.uuid for g in h100.gpus]
    tracker = HealthTracker(uuids, clock=lambda: 0.0)
    h100.events.put((XID, 3, 13))  # application XID: ignored by the tracker
    h100.events.put((XID, 5, 79))  # fell off the bus: critical
    h100.events.put((pynvml.nvmlEventTypeDoubleBitEccError, 6, 0))
    got = [watcher.take() for _ in range(3)]
    assert [(e.uuid, e.xid) for e in got] == [(uuids[3], 13), (uuids[5], 79), (uuids[6], 48)]
    assert [tracker.observe(e) for e in got] == [False, True, True]
    assert [u for u, ok in tracker.state().items() if not ok] == [uuids[5], uuids[6]]
    assert {h for h, _ in h100.registered} == set(range(8))
    assert all(mask == XID | pynvml.nvmlEventTypeDoubleBitEccError for _, mask in h100.registered)


def test_wait_error_marks_all_gpus_backs_off_and_recovers(h100: FakeNvml, watcher: Watcher) -> None:
    h100.events.put(("error", pynvml.NVML_ERROR_UNKNOWN))
    event = watcher.take()
    assert event.uuid == ALL_GPUS and "Unknown Error" in event.reason and event.xid is None
    h100.events.put((XID, 1, 79))  # after back-off the watcher re-registers and keeps going
    assert watcher.take().uuid == h100.gpus[1].uuid
    assert h100.sets_created == 2 and h100.sets_freed >= 1


def test_event_from_unidentified_device_is_for_all_gpus(h100: FakeNvml, watcher: Watcher) -> None:
    h100.events.put((XID, 99, 79))
    event = watcher.take()
    assert (event.uuid, event.xid) == (ALL_GPUS, 79) and "unidentified GPU" in event.reason


def test_gpu_without_event_support_is_skipped(h100: FakeNvml, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="deviceplugin.nvml")
    h100.gpus[2].events = pynvml.nvmlEventTypePState
    w = Watcher(h100)
    try:
        h100.events.put((XID, 0, 79))
        assert w.take().xid == 79
    finally:
        w.close()
    assert {h for h, _ in h100.registered} == set(range(8)) - {2}
    assert "health_events_unsupported" in [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("where", ["create", "devices"])
def test_no_event_support_leaves_health_unwatched(
    h100: FakeNvml, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    caplog.set_level(logging.WARNING, logger="deviceplugin.nvml")
    if where == "create":

        def unsupported() -> str:
            raise E(pynvml.NVML_ERROR_NOT_SUPPORTED)

        h100.nvmlEventSetCreate = unsupported  # type: ignore[method-assign]
    else:
        for g in h100.gpus:
            g.events = 0
    w = Watcher(h100)
    h100.events.put(("error", pynvml.NVML_ERROR_UNKNOWN))  # never waited on
    with pytest.raises(queue.Empty):
        w.events.get(timeout=0.2)
    w.close()  # returns promptly on stop
    assert "health_watch_disabled" in [r.getMessage() for r in caplog.records]
    assert h100.sets_freed == h100.sets_created


def test_registration_error_frees_the_set_and_retries(h100: FakeNvml) -> None:
    calls = {"n": 0}
    original = h100.nvmlDeviceRegisterEvents

    def flaky(h: int, mask: int, s: str) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise E(pynvml.NVML_ERROR_UNKNOWN)
        original(h, mask, s)

    h100.nvmlDeviceRegisterEvents = flaky  # type: ignore[method-assign]
    w = Watcher(h100)
    try:
        first = w.take()
        assert first.uuid == ALL_GPUS and "Unknown Error" in first.reason
        h100.events.put((XID, 2, 79))
        assert w.take().uuid == h100.gpus[2].uuid
    finally:
        w.close()
    assert h100.sets_created == 2 and h100.sets_freed == 2


def test_emit_failure_does_not_stop_watching(h100: FakeNvml) -> None:
    got: list[HealthEvent] = []

    def emit(e: HealthEvent) -> None:
        got.append(e)
        if len(got) == 1:
            raise RuntimeError("consumer bug")

    backend = NvmlBackend(nvml=h100, event_timeout_ms=10, error_backoff_s=0.01)
    stop = threading.Event()
    t = threading.Thread(target=backend.watch_health, args=(stop, emit))
    t.start()
    h100.events.put((XID, 0, 79))
    h100.events.put((XID, 1, 79))
    for _ in range(500):
        if len(got) == 2:
            break
        stop.wait(0.01)
    stop.set()
    t.join(5)
    assert [e.uuid for e in got] == [h100.gpus[0].uuid, h100.gpus[1].uuid]


def test_stop_frees_the_event_set(h100: FakeNvml) -> None:
    w = Watcher(h100)
    w.close()
    assert h100.sets_created == h100.sets_freed == 1


# --- probe script ---


def test_probe_prints_topology_and_timing(h100: FakeNvml, capsys: pytest.CaptureFixture[str]) -> None:
    assert nvml_probe.main([], nvml=h100) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["topology"]["links"][0][1] == "NV18" and out["topology"]["nvswitch"] is True
    assert out["probe_seconds"] >= 0 and out["gpus"] == 8


def test_probe_without_nvml_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeNvml([], [])
    fake.init_error = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    assert nvml_probe.main([], nvml=fake) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("nvml_probe: NVML init failed")


def test_minor_numbers_come_from_nvml_when_it_has_them(no_sysfs: str) -> None:
    """Device specs name /dev/nvidia<minor>; the driver's minor need not equal NVML's index."""
    fake = model_from(load_preset("rtx8000-4"), pcie={}, switch=False, version=pynvml.NVML_NVLINK_VERSION_2_0)
    t = NvmlBackend(nvml=fake, sysfs_root=no_sysfs).discover()
    assert [g.minor for g in t.gpus] == [None] * 4  # an NVML without the call: the index is used

    minors = {0: 3, 1: 2, 2: 1, 3: 7}
    fake.nvmlDeviceGetMinorNumber = lambda h: minors[h]  # type: ignore[attr-defined]
    t = NvmlBackend(nvml=fake, sysfs_root=no_sysfs).discover()
    assert [g.minor for g in t.gpus] == [3, 2, 1, 7]

    def broken(h: int) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    fake.nvmlDeviceGetMinorNumber = broken  # type: ignore[attr-defined]
    assert [g.minor for g in NvmlBackend(nvml=fake, sysfs_root=no_sysfs).discover().gpus] == [None] * 4


def test_the_old_probe_command_still_runs_the_probe() -> None:
    """`python -m deviceplugin.nvml_probe` (the command the docs named before the package was
    grouped by role) still answers: without NVML on this machine, one line and exit 1."""
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "deviceplugin.nvml_probe"], capture_output=True, text=True, timeout=60
    )
    new = subprocess.run(
        [sys.executable, "-m", "deviceplugin.hardware.nvml_probe"], capture_output=True, text=True, timeout=60
    )
    assert (r.returncode, r.stdout) == (new.returncode, new.stdout)
    assert "Traceback" not in r.stderr
