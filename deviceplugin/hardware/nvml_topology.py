"""NVML topology discovery: GPUs and every pair's link, as `nvidia-smi topo -m` shows them.

Discovery builds the same Topology a topology file would, with the codes `nvidia-smi topo -m`
prints, so what an operator reads on the node is what the allocator decides on:

* PCIe level of a pair: `nvmlDeviceGetTopologyCommonAncestor`, mapped as nvidia-smi does:
  INTERNAL (two GPUs on one board) and SINGLE -> PIX, MULTIPLE -> PXB, HOSTBRIDGE -> PHB,
  NODE (= CPU) -> NODE, SYSTEM -> SYS. A pair whose level NVML cannot give is taken as SYS, the
  most pessimistic level, and logged.
* NVLink count of a pair: every link 0..NVML_NVLINK_MAX_LINKS-1 of each GPU whose state is
  enabled; links whose remote end is an NVSwitch (`nvmlDeviceGetNvLinkRemoteDeviceType`) are
  switch links, the others count for the peer GPU whose PCI bus id equals the link's remote bus
  id. A pair's count is its direct links plus, when both GPUs reach NVSwitches, the smaller of
  the two switch-link counts: what nvidia-smi prints (NV18 on every H100 pair) and what a ring
  between them can use. NOT_SUPPORTED / INVALID_ARGUMENT on a link means "no such link"; other
  per-link errors skip the link with a warning. `nvswitch` is set when any GPU has switch links.
  (go-gpuallocator counts only direct links and so sees no NVLink at all on NVSwitch systems.)
* NUMA node: `/sys/bus/pci/devices/<bus id>/numa_node` first (the host node kubelet's Topology
  Manager and NVIDIA's plugin use), then `nvmlDeviceGetNumaNodeId`, each negative or unknown
  passing to the next, then NVML's affinity as `nvidia-smi topo -m` reads it for its NUMA
  Affinity column: `nvmlDeviceGetMemoryAffinity` (scope NODE), else the NUMA nodes of the CPUs
  `nvmlDeviceGetCpuAffinityWithinScope` (scope NODE) names (sysfs `devices/system/node`); one
  node, or None when the affinity spans several or nothing answers. (An H200 VM on driver 580:
  numa_node -1, nvmlDeviceGetNumaNodeId unknown, topo -m NUMA Affinity 0.) The order is
  deliberate: on Grace systems nvmlDeviceGetNumaNodeId is the NUMA node of the GPU's own memory
  (`GPU NUMA ID` in topo -m), not the host affinity the allocator and kubelet mean.
* Bandwidth: NVML reports the NVLink version per link as an `nvmlNvlinkVersion_t` enum (not the
  marketing generation: A100 reports 5 = "3.1"). One direction per link: 1.0 -> 20 GB/s (P100),
  2.0 / 2.2 / 3.0 / 3.1 / 4.0 -> 25 GB/s (V100, A100, H100), 5.0 -> 50 GB/s (B200, GB200); any
  other value keeps the default. PCIe figures stay at design.md defaults: NVML gives link
  generation and width, but peer-to-peer throughput over PCIe is set by switches, ACS and the
  IOMMU far more than by the link rate, so a figure derived from it would be false precision.
  Explicit constructor overrides beat both.

`discover()` runs when asked (at start and on an explicit re-probe), never inside an RPC. The
XID health watch is the other half of the NVML backend, as NVIDIA's plugin keeps device
discovery and `health.go` apart; `deviceplugin.hardware.nvml` holds it, owns NVML's init and shutdown and
joins the two. How the pynvml binding answers (the error codes both halves tell apart, text that
comes back as bytes or str depending on the nvidia-ml-py version, `NvmlUnavailable`) is at the
top of this module, the one both halves import.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gputopo import jsonlog
from gputopo.node.links import BandwidthSettings, Link
from gputopo.node.topology import GPU, Topology

log = logging.getLogger("deviceplugin.nvml")

# How the pynvml binding answers, for both halves of the NVML backend.

NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this node (no library, no driver, no permission)."""


def text(value: Any) -> str:
    """pynvml returns bytes from some versions and str from others."""
    return value.decode("ascii", "replace").strip("\x00 ") if isinstance(value, bytes) else str(value).strip()


def error_code(error: Exception) -> int | None:
    """The NVML return code an NVMLError carries, if any."""
    value = getattr(error, "value", None)
    return value if isinstance(value, int) else None


# Discovery.

#: nvmlGpuTopologyLevel_t value -> nvidia-smi code.
TOPOLOGY_LEVEL_CODES: Mapping[int, str] = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
#: nvmlNvlinkVersion_t value -> one-direction GB/s of one link.
NVLINK_VERSION_GBPS: Mapping[int, float] = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 25.0, 6: 25.0, 7: 50.0}

#: 64-bit words of the node and CPU masks asked of NVML: 256 NUMA nodes, 4,096 CPUs.
_NODE_WORDS = 4
_CPU_WORDS = 64
_NVML_FEATURE_ENABLED = 1
_NVML_SWITCH = 0x02


@dataclass(frozen=True, slots=True)
class _Links:
    """What one GPU's NVLink scan found."""

    direct: Mapping[str, int]  # normalised peer bus id -> link count
    switch: int
    versions: frozenset[int]


class TopologyProbe:
    """Builds the node's Topology from NVML; see the module docstring for every rule it applies.

    `nvml` is an initialised pynvml module (or a stand-in); the owner initialises and shuts it
    down."""

    def __init__(
        self,
        nvml: Any,
        *,
        nvlink_gbps_per_link: float | None = None,
        pcie_gbps: Mapping[str, float] | None = None,
        name: str = "nvml",
        sysfs_root: str = "/sys",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._nvml = nvml
        self._overrides = (nvlink_gbps_per_link, dict(pcie_gbps) if pcie_gbps else None)
        # Validate overrides now, not at the first probe.
        BandwidthSettings(
            BandwidthSettings().nvlink_gbps_per_link
            if nvlink_gbps_per_link is None
            else nvlink_gbps_per_link,
            dict(pcie_gbps or {}),
        )
        self.name = name
        self.sysfs_root = sysfs_root
        self._clock = clock
        self.last_probe_seconds: float | None = None

    def discover(self) -> Topology:
        """Probe every GPU and pair; O(n * links + n^2) NVML calls, milliseconds on a real node.

        Raises NvmlUnavailable when NVML fails for a whole GPU (lost, reset) or sees none: the
        caller keeps its previous topology or reports why it cannot start."""
        try:
            return self._discover()
        except self._nvml.NVMLError as e:
            raise NvmlUnavailable(f"NVML probe failed: {e}") from None

    def _discover(self) -> Topology:
        nvml = self._nvml
        start = self._clock()
        count = nvml.nvmlDeviceGetCount()
        if count < 1:
            raise NvmlUnavailable("NVML reports no GPUs on this node")
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        gpus = tuple(self._gpu(i, h) for i, h in enumerate(handles))
        bus = [_bus_key(g.pci_bus_id) for g in gpus]
        scans = [self._scan_nvlinks(g.uuid, h) for g, h in zip(gpus, handles, strict=True)]
        links: list[list[Link | None]] = [[None] * count for _ in range(count)]
        for i in range(count):
            for j in range(i + 1, count):
                pcie = self._pcie_code(handles[i], handles[j], gpus[i], gpus[j])
                nv = self._pair_nvlinks(scans[i], scans[j], bus[i], bus[j], gpus[i], gpus[j])
                links[i][j] = links[j][i] = Link(nvlinks=nv, pcie=pcie)
        nvswitch = any(s.switch > 0 for s in scans)
        settings = self._settings(scans)
        elapsed = self._clock() - start
        self.last_probe_seconds = elapsed
        topology = Topology(
            name=self.name,
            gpus=gpus,
            links=tuple(tuple(row) for row in links),
            nvswitch=nvswitch,
            settings=settings,
            description=f"discovered by NVML ({gpus[0].model})",
        )
        jsonlog.event(
            log,
            "discover",
            gpus=count,
            nvswitch=nvswitch,
            nvlink_gbps_per_link=settings.nvlink_gbps_per_link,
            seconds=round(elapsed, 4),
            reason="NVML probe",
        )
        return topology

    def _gpu(self, index: int, handle: Any) -> GPU:
        nvml = self._nvml
        bus_id = text(nvml.nvmlDeviceGetPciInfo(handle).busId)
        return GPU(
            index=index,
            uuid=text(nvml.nvmlDeviceGetUUID(handle)),
            model=text(nvml.nvmlDeviceGetName(handle)),
            pci_bus_id=bus_id,
            numa=self._numa(handle, bus_id),
            minor=self._minor(handle),
        )

    def _minor(self, handle: Any) -> int | None:
        """/dev/nvidia<minor> of the card (device specs); None when NVML cannot say."""
        get = getattr(self._nvml, "nvmlDeviceGetMinorNumber", None)
        try:
            minor = get(handle) if get is not None else None
        except Exception:
            return None
        return minor if isinstance(minor, int) and 0 <= minor < 1 << 20 else None

    def _numa(self, handle: Any, bus_id: str) -> int | None:
        """sysfs numa_node, then nvmlDeviceGetNumaNodeId, then NVML's affinity (module docstring);
        a negative answer of the first two is "unknown" and the next source is asked."""
        path = os.path.join(self.sysfs_root, "bus", "pci", "devices", _bus_key(bus_id), "numa_node")
        try:
            with open(path, encoding="ascii") as f:
                node = int(f.read().strip())
            if node >= 0:
                return node
        except (OSError, ValueError):
            pass
        getter = getattr(self._nvml, "nvmlDeviceGetNumaNodeId", None)
        if getter is not None:
            try:
                node = int(getter(handle))
                if node >= 0:
                    return node
            except self._nvml.NVMLError:
                pass
        return self._affinity_numa(handle, bus_id)

    def _affinity_numa(self, handle: Any, bus_id: str) -> int | None:
        """The one NUMA node NVML's affinity names, as `nvidia-smi topo -m` fills its NUMA
        Affinity column where sysfs and nvmlDeviceGetNumaNodeId say nothing (a VM's passthrough
        GPU, whose numa_node is -1): nvmlDeviceGetMemoryAffinity (scope NODE), else the nodes of
        the CPUs nvmlDeviceGetCpuAffinityWithinScope (scope NODE) names. An affinity spanning
        several nodes names none (the GPU is no closer to one): None."""
        nvml = self._nvml
        scope = int(getattr(nvml, "NVML_AFFINITY_SCOPE_NODE", 0))
        nodes: set[int] | None = None
        source = ""
        memory = getattr(nvml, "nvmlDeviceGetMemoryAffinity", None)
        if memory is not None:
            try:
                nodes = _bits(memory(handle, _NODE_WORDS, scope)) or None
                source = "nvmlDeviceGetMemoryAffinity"
            except nvml.NVMLError:
                nodes = None
        cpu = getattr(nvml, "nvmlDeviceGetCpuAffinityWithinScope", None)
        if nodes is None and cpu is not None:
            try:
                cpus = _bits(cpu(handle, _CPU_WORDS, scope))
            except nvml.NVMLError:
                cpus = set()
            node_of = _cpu_nodes(self.sysfs_root) if cpus else {}
            nodes = {node_of[c] for c in cpus if c in node_of} or None
            source = "nvmlDeviceGetCpuAffinityWithinScope"
        if nodes is None:
            return None
        if len(nodes) != 1:
            jsonlog.event(
                log,
                "numa_affinity_spans_nodes",
                logging.DEBUG,
                gpu=bus_id,
                nodes=sorted(nodes)[:16],
                source=source,
                reason="no single NUMA node is closer: NUMA unknown",
            )
            return None
        (node,) = nodes
        jsonlog.event(log, "numa_from_affinity", logging.DEBUG, gpu=bus_id, numa=node, source=source)
        return node

    def _scan_nvlinks(self, uuid: str, handle: Any) -> _Links:
        nvml = self._nvml
        max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 36))
        direct: dict[str, int] = {}
        switch = 0
        versions: set[int] = set()
        for link in range(max_links):
            try:
                if nvml.nvmlDeviceGetNvLinkState(handle, link) != _NVML_FEATURE_ENABLED:
                    continue
                if self._remote_is_switch(handle, link):
                    switch += 1
                else:
                    remote = _bus_key(text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
                    direct[remote] = direct.get(remote, 0) + 1
                version = self._link_version(handle, link)
                if version is not None:
                    versions.add(version)
            except nvml.NVMLError as e:
                if error_code(e) not in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_INVALID_ARGUMENT):
                    jsonlog.event(
                        log,
                        "nvlink_probe_failed",
                        logging.WARNING,
                        uuid=uuid,
                        link=link,
                        reason=f"NVML error {e}; link skipped",
                    )
        return _Links(direct=direct, switch=switch, versions=frozenset(versions))

    def _remote_is_switch(self, handle: Any, link: int) -> bool:
        nvml = self._nvml
        getter = getattr(nvml, "nvmlDeviceGetNvLinkRemoteDeviceType", None)
        if getter is None:
            return False
        try:
            return bool(getter(handle, link) == _NVML_SWITCH)
        except nvml.NVMLError as e:
            if error_code(e) in (
                NVML_ERROR_NOT_SUPPORTED,
                getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13),
            ):
                return False  # older driver: fall back to the remote PCI bus id
            raise

    def _link_version(self, handle: Any, link: int) -> int | None:
        try:
            return int(self._nvml.nvmlDeviceGetNvLinkVersion(handle, link))
        except self._nvml.NVMLError:
            return None

    def _pcie_code(self, a: Any, b: Any, ga: GPU, gb: GPU) -> str:
        try:
            level = int(self._nvml.nvmlDeviceGetTopologyCommonAncestor(a, b))
        except self._nvml.NVMLError as e:
            jsonlog.event(
                log,
                "pcie_level_unknown",
                logging.WARNING,
                gpus=[ga.index, gb.index],
                reason=f"nvmlDeviceGetTopologyCommonAncestor failed ({e}); assuming SYS",
            )
            return "SYS"
        code = TOPOLOGY_LEVEL_CODES.get(level)
        if code is None:
            jsonlog.event(
                log,
                "pcie_level_unknown",
                logging.WARNING,
                gpus=[ga.index, gb.index],
                nvml_level=level,
                reason="unknown nvmlGpuTopologyLevel_t value; assuming SYS",
            )
            return "SYS"
        return code

    def _pair_nvlinks(self, a: _Links, b: _Links, bus_a: str, bus_b: str, ga: GPU, gb: GPU) -> int:
        ab = a.direct.get(bus_b, 0)
        ba = b.direct.get(bus_a, 0)
        if ab != ba:
            jsonlog.event(
                log,
                "nvlink_count_asymmetric",
                logging.WARNING,
                gpus=[ga.index, gb.index],
                counts=[ab, ba],
                reason="the two GPUs report different direct link counts; using the smaller",
            )
        return min(ab, ba) + min(a.switch, b.switch)

    def _settings(self, scans: list[_Links]) -> BandwidthSettings:
        nvlink_override, pcie_override = self._overrides
        nvlink = nvlink_override
        if nvlink is None:
            versions = set().union(*(s.versions for s in scans)) if scans else set()
            known = {NVLINK_VERSION_GBPS[v] for v in versions if v in NVLINK_VERSION_GBPS}
            if versions and not known:
                jsonlog.event(
                    log,
                    "nvlink_version_unknown",
                    logging.WARNING,
                    versions=sorted(versions),
                    reason="no per-link figure for this NVLink version; using the default",
                )
            # Mixed generations in one node do not exist in practice; the slowest is the safe figure.
            nvlink = min(known) if known else BandwidthSettings().nvlink_gbps_per_link
        return BandwidthSettings(nvlink_gbps_per_link=nvlink, pcie_gbps=pcie_override or {})


def _bits(words: Any) -> set[int]:
    """The set bits of an NVML mask (a sequence of 64-bit words, lowest first)."""
    out: set[int] = set()
    for i, word in enumerate(words):
        value = int(word)
        bit = 0
        while value:
            if value & 1:
                out.add(i * 64 + bit)
            value >>= 1
            bit += 1
    return out


def _cpu_nodes(sysfs_root: str) -> dict[int, int]:
    """CPU -> NUMA node, from `devices/system/node/node<N>/cpulist` ("0-15,32-47"); {} unreadable."""
    base = os.path.join(sysfs_root, "devices", "system", "node")
    out: dict[int, int] = {}
    try:
        names = os.listdir(base)
    except OSError:
        return out
    for name in names:
        if not (name.startswith("node") and name[4:].isascii() and name[4:].isdigit()):
            continue
        try:
            with open(os.path.join(base, name, "cpulist"), encoding="ascii") as f:
                text = f.read().strip()
            for part in filter(None, text.split(",")):
                lo, _, hi = part.partition("-")
                first, last = int(lo), int(hi or lo)
                if last - first > _CPU_WORDS * 64:  # not a kernel's cpulist
                    continue
                for cpu in range(first, last + 1):
                    out[cpu] = int(name[4:])
        except (OSError, ValueError):
            continue
    return out


def _bus_key(bus_id: str) -> str:
    """The sysfs spelling `dddd:bb:dd.f`, so NVML's `00000000:07:00.0`, the legacy `0000:07:00.0`
    and a bare `07:00.0` all compare equal (and name the /sys/bus/pci/devices entry)."""
    text = bus_id.strip().lower()
    parts = text.split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) == 3:
        try:
            return f"{int(parts[0], 16):04x}:{parts[1][-2:]}:{parts[2]}"
        except ValueError:
            pass
    return text
