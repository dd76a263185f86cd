"""The plugin under kubelet's real device manager (k8s.io/kubernetes v1.37, `kubelet-devicemanager`
built by realk8s/build.sh): `python -m deviceplugin` as a DaemonSet runs it, registering with that
kubelet over its real socket, which dials back, keeps ListAndWatch open and admits pods through
the real topology manager (GetPreferredAllocation, then Allocate). `make test-real` runs it;
without the built binaries it skips with one line.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gputopo.node.allocator import Allocator
from gputopo.node.topofile import load_preset
from tests import realk8s as rk

pytestmark = pytest.mark.real

PRESET = "dgx1-v100"  # 8 GPUs, 4 per NUMA node, hybrid cube-mesh NVLink


class Node:
    """One node's kubelet device manager and our plugin, in a folder of their own."""

    def __init__(self, procs: rk.Procs, bindir: Path, folder: Path) -> None:
        self.procs = procs
        self.bindir = bindir
        self.folder = folder
        self.dir = folder / "device-plugins"
        self.dir.mkdir()
        self.kubelet: rk.DeviceManager | None = None
        self.plugin: rk.Proc | None = None

    def start_kubelet(self, **kw: object) -> rk.DeviceManager:
        self.kubelet = rk.DeviceManager(self.procs, self.bindir, self.dir, **kw)  # type: ignore[arg-type]
        return self.kubelet

    def start_plugin(self, *extra: str, preset: str = PRESET) -> rk.Proc:
        argv = [sys.executable, "-m", "deviceplugin", "--kubelet-dir", str(self.dir), "--topology", preset]
        self.plugin = self.procs.start("plugin", [*argv, "--metrics-port", "0", *extra])
        return self.plugin

    def ask(self, command: dict) -> dict:
        assert self.kubelet is not None
        return self.kubelet.ask(command, timeout=float(command.get("timeout", 10)) + 10)

    def wait_healthy(self, n: int, timeout: float) -> dict:
        return self.ask({"op": "wait", "healthy": n, "timeout": timeout})


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    bindir = rk.binaries(rk.DEVICE_MANAGER)
    procs = rk.Procs(tmp_path)
    try:
        yield Node(procs, bindir, tmp_path)
    finally:
        procs.close()


def uuids(preset: str = PRESET) -> list[str]:
    return [g.uuid for g in load_preset(preset).gpus]


@pytest.mark.parametrize("preset", ["dgx1-v100", "hgx-h100", "dgx2-v100", "pcie8-plx"])
def test_every_admitted_pod_gets_the_allocators_best_set(node: Node, preset: str) -> None:
    """On four kinds of server (hybrid cube-mesh, NVSwitch of 8 and of 16, PCIe switches), a
    sequence of admissions and ends: each pod kubelet admits gets exactly the set our allocator
    prefers among the GPUs free at that moment (kubelet asks GetPreferredAllocation, then
    Allocate with what it got), never a GPU another running pod holds."""
    topo = load_preset(preset)
    ids = uuids(preset)
    numa = max(1, len({g.numa for g in topo.gpus}))
    node.start_kubelet(numa=numa)
    node.start_plugin(preset=preset)
    total = len(ids)
    assert node.wait_healthy(total, timeout=30)["ok"]
    alloc = Allocator(topo)
    free = set(range(total))
    held: dict[str, set[int]] = {}
    steps = [
        ("a", 2),
        ("b", 1),
        ("c", 4),
        ("-b", 0),
        ("d", 2),
        ("e", 1),
        ("-a", 0),
        ("f", 4),
        ("-c", 0),
        ("g", 8),
    ]
    for pod, n in steps:
        if pod.startswith("-"):
            assert node.ask({"op": "free", "pod": pod[1:]})["ok"]
            free |= held.pop(pod[1:])
            continue
        if n > len(free):
            continue
        want = set(alloc.choose(sorted(free), n).indices)
        out = node.ask({"op": "alloc", "pod": pod, "n": n})
        assert out["ok"] and out["admit"], out
        got = {ids.index(u) for u in out["devices"]}
        assert got == want, (
            f"{preset} {pod}: kubelet gave {sorted(got)}, the allocator prefers {sorted(want)}"
        )
        assert not got - free, "a GPU another pod holds"
        held[pod] = got
        free -= got


def test_the_plugin_registers_and_kubelet_allocates_its_preferred_gpus(node: Node) -> None:
    """Register, ListAndWatch (8 healthy devices, with their NUMA nodes), and an admitted 2-GPU
    and 4-GPU pod get the sets our allocator prefers, in the container's env."""
    node.start_kubelet()
    node.start_plugin()
    state = node.wait_healthy(8, timeout=20)
    assert state["ok"] and state["registered"] and state["capacity"] == 8, state
    ids = uuids()
    topo = load_preset(PRESET)
    assert state["numa"] == {g.uuid: [g.numa] for g in topo.gpus}
    alloc = Allocator(topo)
    free = set(range(8))
    for pod, n in (("p1", 2), ("p2", 4)):
        out = node.ask({"op": "alloc", "pod": pod, "n": n})
        assert out["ok"] and out["admit"], out
        want = {ids[i] for i in alloc.choose(sorted(free), n).indices}
        assert set(out["devices"]) == want
        assert set(out["env"]["NVIDIA_VISIBLE_DEVICES"].split(",")) == want
        free -= {ids.index(u) for u in want}


def test_issue12_two_kubelet_starts_in_a_row_do_not_stall_registration(node: Node) -> None:
    """Issue 9 item 12: kubelet starts, and starts again right after the plugin served a fresh
    socket (the second start deletes it while the plugin's Register is in flight and kubelet
    dials back to a file that is gone). The plugin must notice and register again at once, not
    after Register's 10 s timeout: kubelet admits GPU pods again within a few seconds."""
    km = node.start_kubelet()
    node.start_plugin()
    assert node.wait_healthy(8, timeout=20)["ok"]
    out = km.ask({"op": "restart", "socket": "gputopo-gpu.sock", "again": True}, timeout=20)
    assert out["ok"], out
    back = node.wait_healthy(8, timeout=5)
    assert back["ok"] and back["registered"], f"devices not healthy 5 s after the second start: {back}"
    assert node.ask({"op": "alloc", "pod": "after", "n": 2})["admit"]


def test_single_numa_node_policy_admits_what_one_numa_node_holds(node: Node) -> None:
    """Topology manager single-numa-node: 4 GPUs come from one NUMA node (the plugin's preferred
    set agrees with kubelet's hint), 6 GPUs are refused at admission."""
    node.start_kubelet(policy="single-numa-node", numa=2)
    node.start_plugin()
    state = node.wait_healthy(8, timeout=20)
    numa = {u: n[0] for u, n in state["numa"].items()}
    out = node.ask({"op": "alloc", "pod": "four", "n": 4})
    assert out["admit"], out
    assert len({numa[u] for u in out["devices"]}) == 1, out["devices"]
    refused = node.ask({"op": "alloc", "pod": "six", "n": 6})
    assert not refused["admit"] and "TopologyAffinity" in refused["reason"], refused
    rest = node.ask({"op": "alloc", "pod": "other-four", "n": 4})
    assert rest["admit"] and not set(rest["devices"]) & set(out["devices"])


@pytest.mark.parametrize(("policy", "admits_split"), [("best-effort", True), ("restricted", False)])
def test_the_other_topology_policies_decide_a_pod_its_numa_node_cannot_hold(
    node: Node, policy: str, admits_split: bool
) -> None:
    """Two 3-GPU pods take three GPUs of each NUMA node (each inside one, the plugin's set
    agreeing with kubelet's hint). A 2-GPU pod then fits only across both NUMA nodes, which is
    not a preferred hint (one NUMA node could hold two GPUs): best-effort admits it anyway,
    restricted refuses it (TopologyAffinityError). Six GPUs, by contrast, are preferred across
    both nodes, as no single one holds them."""
    node.start_kubelet(policy=policy, numa=2)
    node.start_plugin()
    state = node.wait_healthy(8, timeout=20)
    numa = {u: n[0] for u, n in state["numa"].items()}
    used: set[int] = set()
    for pod in ("a", "b"):
        out = node.ask({"op": "alloc", "pod": pod, "n": 3})
        assert out["admit"], out
        nodes = {numa[u] for u in out["devices"]}
        assert len(nodes) == 1 and not nodes & used, out
        used |= nodes
    split = node.ask({"op": "alloc", "pod": "c", "n": 2})
    assert split["admit"] is admits_split, split
    if admits_split:
        assert {numa[u] for u in split["devices"]} == {0, 1}
    else:
        assert "TopologyAffinity" in split["reason"], split
    for pod in ("a", "b", "c"):
        node.ask({"op": "free", "pod": pod})
    assert node.ask({"op": "alloc", "pod": "six", "n": 6})["admit"]


def test_a_gpu_marked_unhealthy_in_the_health_file_leaves_kubelets_healthy_set(node: Node) -> None:
    health = node.folder / "health.json"
    health.write_text("{}")
    node.start_kubelet()
    node.start_plugin("--health-file", str(health), "--health-recovery-seconds", "0")
    assert node.wait_healthy(8, timeout=20)["ok"]
    sick = uuids()[5]
    health.write_text(json.dumps({sick: "Unhealthy"}))
    state = node.wait_healthy(7, timeout=10)
    assert state["ok"] and sick not in state["healthy"], state
    assert not node.ask({"op": "alloc", "pod": "all", "n": 8})["admit"]
    out = node.ask({"op": "alloc", "pod": "seven", "n": 7})
    assert out["admit"] and sick not in out["devices"], out
    health.write_text(json.dumps({sick: "Healthy"}))
    assert node.wait_healthy(8, timeout=10)["ok"]


def test_plugin_and_kubelet_restarts_keep_each_pods_devices(node: Node) -> None:
    """The plugin restarted (SIGTERM, start): kubelet takes its devices as healthy again, and new
    pods get only GPUs no running pod holds. kubelet restarted: its checkpoint and the pods it
    adopts keep their devices; a freed pod's GPUs go to the next one."""
    km = node.start_kubelet()
    plugin = node.start_plugin()
    assert node.wait_healthy(8, timeout=20)["ok"]
    first = set(node.ask({"op": "alloc", "pod": "p1", "n": 4})["devices"])
    node.procs.kill(plugin, signal.SIGTERM)
    assert plugin.popen.returncode == 0, plugin.tail()
    assert node.wait_healthy(0, timeout=10)["ok"], "kubelet noticed the plugin is gone"
    node.start_plugin()
    assert node.wait_healthy(8, timeout=10)["ok"]
    second = set(node.ask({"op": "alloc", "pod": "p2", "n": 4})["devices"])
    assert len(second) == 4 and not first & second
    assert km.ask({"op": "restart"}, timeout=20)["ok"]
    state = km.ask({"op": "adopt", "pods": ["p1", "p2"]})
    assert {k: set(v) for k, v in state["pods"].items()} == {"p1": first, "p2": second}
    assert node.wait_healthy(8, timeout=10)["ok"]
    assert not node.ask({"op": "alloc", "pod": "p3", "n": 1})["admit"], "every GPU is held"
    assert node.ask({"op": "free", "pod": "p1"})["ok"]
    assert set(node.ask({"op": "alloc", "pod": "p3", "n": 4})["devices"]) == first


def test_the_cdi_strategy_reaches_the_container_as_cdi_devices(node: Node) -> None:
    """--device-list-strategy cdi: kubelet passes the pod's GPUs on as CDI device names (the
    container runtime resolves them), and no NVIDIA_VISIBLE_DEVICES."""
    node.start_kubelet()
    node.start_plugin("--device-list-strategy", "cdi")
    assert node.wait_healthy(8, timeout=20)["ok"]
    out = node.ask({"op": "alloc", "pod": "p1", "n": 2})
    assert out["admit"], out
    assert sorted(out["cdi"]) == sorted(f"nvidia.com/gpu={u}" for u in out["devices"])
    assert "NVIDIA_VISIBLE_DEVICES" not in (out["env"] or {})
