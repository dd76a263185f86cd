"""The DRA mode of the node daemon, over real sockets and HTTP (issue 21 items 1, 2, 5).

kubelet is the stand-in of tests/dra_standins.py (plugin-watcher registration and the v1 DRA
calls, dialled by their wire paths); the API server is its `resource.k8s.io` stand-in, reached
through the official client. The daemon runs on the file backend (a preset and a health file).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from deviceplugin.dra.daemon import DraDaemon
from deviceplugin.dra.kubeapi import KubeDraApi
from deviceplugin.hardware.filebackend import FileBackend
from deviceplugin.settings import PluginConfig
from gputopo.node import draslices
from gputopo.node.allocator import Allocator
from gputopo.node.topofile import load_preset
from tests.dra_standins import KubeletDra, ResourceApi, allocated_claim, resource_api

NODE = "node-a"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def folder() -> Iterator[Path]:
    # unix socket paths are short (108 bytes): not pytest's long tmp_path
    path = Path(tempfile.mkdtemp(prefix="dra", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def running(
    folder: Path,
    preset: str = "dgx1-v100",
    health: Path | None = None,
    api: ResourceApi | None = None,
    metrics_port: int = 0,
) -> Iterator[tuple[DraDaemon, ResourceApi, KubeletDra]]:
    with resource_api() as (stand_in, api_client):
        settings = PluginConfig(
            node_name=NODE,
            topology=preset,
            registry_dir=str(folder / "registry"),
            plugins_dir=str(folder / "plugins"),
            sysfs=str(folder / "sys"),
            metrics_port=metrics_port,
        )
        backend = FileBackend(preset, str(health) if health else None, poll_interval=0.05)
        daemon = DraDaemon(
            settings,
            backend,
            KubeDraApi(api_client),
            health_tick_seconds=0.05,
            publisher_min_interval_s=0.0,
            registrar_poll_s=0.05,
        )
        daemon.start()
        kubelet = KubeletDra(folder / "registry")
        try:
            yield daemon, stand_in, kubelet
        finally:
            kubelet.close()
            daemon.stop()


def _generation(api: ResourceApi) -> int:
    """The pool's generation once all its slices are written, else 0. Called on every write
    while waiting: it reads the store in place (a copy of a DGX-2's 236 slices per write made
    the wait quadratic)."""
    with api.lock:
        slices = [s for s in api.slices.values() if s["spec"].get("nodeName") == NODE]
    gens = {s["spec"]["pool"]["generation"] for s in slices}
    return (
        gens.pop() if len(gens) == 1 and len(slices) == slices[0]["spec"]["pool"]["resourceSliceCount"] else 0
    )


def _ordered(api: ResourceApi) -> list[dict[str, Any]]:
    """The node's slices in our part order (counters, gpus, set2, set4, ...), a size's slices
    in name order (set4, set4-001, ...: the order kube-scheduler walks them in)."""
    order = ["counters", "gpus", "set2", "set4", "set8", "set16"]
    return sorted(
        api.node_slices(NODE),
        key=lambda s: (order.index(s["metadata"]["labels"]["gputopo.io/part"]), s["metadata"]["name"]),
    )


def _published_after(api: ResourceApi, generation: int) -> list[dict[str, Any]]:
    api.wait(lambda a: _generation(a) > generation)
    return _ordered(api)


def test_registration_through_the_plugin_watcher(folder: Path) -> None:
    with running(folder) as (daemon, _api, kubelet):
        info = kubelet.register()
        assert info.type == "DRAPlugin"
        assert info.name == "gputopo.io"
        assert list(info.supported_versions) == ["v1.DRAPlugin"]
        assert info.endpoint == str(folder / "plugins" / "gputopo.io" / "dra.sock")
        assert daemon.server is not None and daemon.server.state.registered
        assert (folder / "registry" / "gputopo.io-reg.sock").is_socket()


def test_a_refused_registration_is_recorded(folder: Path) -> None:
    with running(folder) as (daemon, _api, kubelet):
        kubelet.register(accept=False, error="version skew")
        assert daemon.server is not None
        assert not daemon.server.state.registered and daemon.server.state.error == "version skew"


def test_slices_published_within_limits(folder: Path) -> None:
    with running(folder) as (_daemon, api, _kubelet):
        slices = _published_after(api, 0)
        assert draslices.check_limits(slices) == []
        summary = draslices.summary(slices)
        assert summary["per_part"] == {"counters": 0, "gpus": 8, "set2": 28, "set4": 70, "set8": 1}
        assert all(s["spec"]["driver"] == "gputopo.io" and s["spec"]["nodeName"] == NODE for s in slices)
        # kube-scheduler's first fit for a 4-GPU claim with GPU 0 taken: the 25 GB/s ring
        assert draslices.first_fit(slices, 4, used=[0]) == ("set-4-5-6-7", (4, 5, 6, 7))


def test_prepare_expands_a_set_and_republishes_in_the_new_order(folder: Path) -> None:
    topo = load_preset("dgx1-v100")
    alloc = Allocator(topo)
    with running(folder) as (daemon, api, kubelet):
        kubelet.register()
        first = _published_after(api, 0)
        gen = _generation(api)
        device, gpus = draslices.first_fit(first, 4) or ("", ())
        api.put_claim(
            allocated_claim(
                "ns",
                "c1",
                "uid-1",
                [{"request": "gpus", "driver": "gputopo.io", "pool": NODE, "device": device}],
            )
        )
        resp = kubelet.prepare(("ns", "c1", "uid-1"))
        entry = resp.claims["uid-1"]
        assert entry.error == ""
        assert [(d.pool_name, d.device_name, list(d.request_names)) for d in entry.devices] == [
            (NODE, device, ["gpus"])
        ]
        assert list(entry.devices[0].cdi_device_ids) == [f"nvidia.com/gpu={topo.gpus[i].uuid}" for i in gpus]
        # use changed the order: the new slices put the allocator's choice for what is left first
        after = _published_after(api, gen)
        free = sorted(set(range(8)) - set(gpus))
        for k in (2, 4):
            got = draslices.first_fit(after, k, used=gpus)
            assert got is not None and got[1] == alloc.choose(free, k).indices
        # preparing again answers the same, without another read of the claim
        api.inject("GET_CLAIM", 500)
        again = kubelet.prepare(("ns", "c1", "uid-1"))
        assert again.claims["uid-1"] == entry
        gen = _generation(api)
        assert kubelet.unprepare(("ns", "c1", "uid-1")).claims["uid-1"].error == ""
        back = _published_after(api, gen)
        assert draslices.first_fit(back, 4) == draslices.first_fit(first, 4)
        assert daemon.claims is not None and daemon.claims.in_use() == frozenset()


def _results(device: str, pool: str = NODE, driver: str = "gputopo.io") -> list[dict[str, str]]:
    return [{"request": "gpus", "driver": driver, "pool": pool, "device": device}]


@pytest.mark.parametrize(
    ("claim", "reason"),
    [
        (None, "cannot read ResourceClaim ns/bad: HTTP 404"),
        (allocated_claim("ns", "bad", "other-uid", _results("gpu-1")), "has UID 'other-uid'"),
        (allocated_claim("ns", "bad", "u", _results("gpu-1", pool="node-b")), "from pool 'node-b'"),
        (allocated_claim("ns", "bad", "u", _results("set-7-3")), "sorted distinct GPUs"),
        (allocated_claim("ns", "bad", "u", _results("mig-1g-10gb-0")), "not a gputopo device name"),
        (allocated_claim("ns", "bad", "u", _results("gpu-8")), "outside 0..7"),
        (
            allocated_claim("ns", "bad", "u", _results("gpu-1", driver="gpu.nvidia.com")),
            "no device of driver",
        ),
        ({"metadata": {"namespace": "ns", "name": "bad", "uid": "u"}, "status": {}}, "not allocated"),
        (
            {
                "metadata": {"namespace": "ns", "name": "bad", "uid": "u"},
                "status": {"allocation": {"devices": {"results": "x"}}},
            },
            "not allocated",
        ),
    ],
)
def test_a_bad_claim_fails_alone(folder: Path, claim: dict[str, Any] | None, reason: str) -> None:
    with running(folder) as (_daemon, api, kubelet):
        kubelet.register()
        if claim is not None:
            api.put_claim(claim)
        api.put_claim(allocated_claim("ns", "good", "g", _results("set-0-1")))
        resp = kubelet.prepare(("ns", "bad", "u"), ("ns", "good", "g"))
        assert reason in resp.claims["u"].error
        assert not resp.claims["u"].devices
        assert resp.claims["g"].error == "" and len(resp.claims["g"].devices[0].cdi_device_ids) == 2


def test_two_claims_for_one_gpu_are_refused(folder: Path) -> None:
    with running(folder) as (_daemon, api, kubelet):
        kubelet.register()
        api.put_claim(allocated_claim("ns", "a", "a", _results("set-0-1")))
        api.put_claim(allocated_claim("ns", "b", "b", _results("gpu-1")))
        assert kubelet.prepare(("ns", "a", "a")).claims["a"].error == ""
        assert "held by another prepared claim" in kubelet.prepare(("ns", "b", "b")).claims["b"].error


@pytest.mark.parametrize(
    "claims",
    [
        [("ns", "x", "")],
        [("", "x", "u")],
        [("ns", "x", f"u{i}") for i in range(65)],
        [("ns", "x", "u" * 200)],
    ],
)
def test_malformed_requests_are_invalid_argument(folder: Path, claims: list[tuple[str, str, str]]) -> None:
    with running(folder) as (_daemon, _api, kubelet):
        kubelet.register()
        with pytest.raises(grpc.RpcError) as err:
            kubelet.prepare(*claims)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as err:
            kubelet.unprepare(*claims)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_an_xid_makes_the_gpu_and_its_sets_unselectable_and_recovery_brings_them_back(folder: Path) -> None:
    health = folder / "health.json"
    health.write_text("{}")
    with running(folder, health=health) as (_daemon, api, kubelet):
        kubelet.register()
        _published_after(api, 0)
        gen = _generation(api)
        health.write_text(json.dumps({"5": {"xid": 79}}))
        sick = _published_after(api, gen)
        devices = {d["name"]: d for s in sick for d in s["spec"].get("devices") or []}
        # still published (a claim holding them keeps its counters), no longer selectable
        assert {n for n, d in devices.items() if not d["attributes"]["healthy"]["bool"]} == {
            n for n in devices if 5 in draslices.expand(n, 8)
        }
        assert draslices.first_fit(sick, 8) is None
        assert draslices.check_limits(sick) == []
        # a claim allocated on the sick GPU before the republication fails alone
        api.put_claim(allocated_claim("ns", "late", "late", _results("set-4-5-6-7")))
        assert "unhealthy" in kubelet.prepare(("ns", "late", "late")).claims["late"].error
        gen = _generation(api)
        health.write_text(json.dumps({"5": "Healthy"}))
        well = _published_after(api, gen)
        assert all(d["attributes"]["healthy"]["bool"] for s in well for d in s["spec"].get("devices") or [])
        assert draslices.first_fit(well, 8) is not None


def test_api_errors_are_retried(folder: Path) -> None:
    with resource_api() as (api, api_client):
        api.inject("POST", 500, 500)
        api.inject("GET_SLICES", 503)
        from deviceplugin.dra.slicepub import SlicePublisher
        from deviceplugin.state import make_snapshot

        topo = load_preset("hgx-h100")
        pub = SlicePublisher(NODE, KubeDraApi(api_client), min_interval_s=0.0, backoff_s=(0.01, 0.05))
        pub.update(make_snapshot(1, topo, {}))
        now = 0.0
        for _ in range(20):
            now += pub.sync(now)
            if _generation(api):
                break
        # a write that failed half-way left slices of an older generation: the retry supersedes
        # them with one complete pool of a newer one
        assert _generation(api) >= 1
        assert draslices.check_limits(_ordered(api)) == []
        assert pub._failures == 0


def test_a_restart_keeps_prepared_claims_and_does_not_rewrite_equal_slices(folder: Path) -> None:
    with running(folder) as (_daemon, api, kubelet):
        kubelet.register()
        _published_after(api, 0)
        api.put_claim(allocated_claim("ns", "c", "c", _results("set-0-3")))
        gen = _generation(api)
        assert kubelet.prepare(("ns", "c", "c")).claims["c"].error == ""
        before = _published_after(api, gen)
        writes = len(api.writes)
        slices_before = {s["metadata"]["name"]: s["spec"] for s in before}
    # a new daemon on the same folders and the same API content
    with resource_api() as (api2, api_client):
        for s in before:
            s["metadata"].pop("resourceVersion", None)
            api2.slices[s["metadata"]["name"]] = {
                **s,
                "metadata": {**s["metadata"], "resourceVersion": "1", "uid": "x"},
            }
        settings = PluginConfig(
            node_name=NODE,
            topology="dgx1-v100",
            registry_dir=str(folder / "registry"),
            plugins_dir=str(folder / "plugins"),
            metrics_port=0,
        )
        daemon = DraDaemon(
            settings, FileBackend("dgx1-v100"), KubeDraApi(api_client), publisher_min_interval_s=0.0
        )
        daemon.start()
        try:
            assert daemon.claims is not None and daemon.claims.in_use() == frozenset({0, 3})
            assert daemon.publisher is not None
            api2.wait(lambda a: daemon.publisher is not None and daemon.publisher.generation > 0)
            assert api2.writes == [], "equal slices are adopted, not written again"
            assert {n: s["spec"] for n, s in api2.slices.items()} == slices_before
        finally:
            daemon.stop()
    assert writes > 0


def test_sixteen_gpu_node_publishes_split_slices(folder: Path) -> None:
    with running(folder, preset="dgx2-v100") as (_daemon, api, _kubelet):
        slices = api.wait(lambda a: _generation(a) and _ordered(a), timeout=120)
        assert draslices.check_limits(slices) == []
        assert draslices.summary(slices)["per_part"] == {
            "counters": 0,
            "gpus": 16,
            "set2": 120,
            "set4": 1820,
            "set8": 12870,
            "set16": 1,
        }
        assert len(slices) == 236  # every set, 64 a slice (issue 30)


def test_pcie_roots_come_from_sysfs(folder: Path) -> None:
    topo = load_preset("dgx1-v100")
    devices = folder / "sys" / "bus" / "pci" / "devices"
    devices.mkdir(parents=True)
    for g in topo.gpus[:4]:
        bdf = draslices.pci_bus_id(g.pci_bus_id)
        assert bdf is not None
        real = (
            folder
            / "sys"
            / "devices"
            / ("pci0000:00" if g.index < 2 else "pci0000:80")
            / "0000:00:01.0"
            / bdf
        )
        real.mkdir(parents=True)
        (devices / bdf).symlink_to(real)
    with running(folder) as (_daemon, api, _kubelet):
        slices = _published_after(api, 0)
        gpus = {d["name"]: d["attributes"] for d in slices[1]["spec"]["devices"]}
        roots = {n: a.get("resource.kubernetes.io/pcieRoot", {}).get("string") for n, a in gpus.items()}
        assert roots == {
            "gpu-0": "pci0000:00",
            "gpu-1": "pci0000:00",
            "gpu-2": "pci0000:80",
            "gpu-3": "pci0000:80",
            **{f"gpu-{i}": None for i in range(4, 8)},
        }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mode", "dra", "--topology", "dgx1-v100"], "needs the node name"),
        (["--mode", "dra", "--node-name", "n", "--set-sizes", "1,4"], "--set-sizes"),
        (["--mode", "dra", "--node-name", "n", "--max-sets", "16385"], "--max-sets"),
        (["--mode", "dra", "--node-name", "n", "--driver-name", "Not_A_Name"], "--driver-name"),
        (["--mode", "dra", "--node-name", "n", "--no-such-flag"], "no-such-flag"),
        (["--mode", "sideways"], "--mode must be"),
    ],
)
def test_bad_flags_exit_2_with_one_line(args: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "deviceplugin", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{REPO}:{REPO / 'proto'}"},
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr


def test_a_checkpoint_from_other_hardware_or_a_corrupt_one_costs_only_its_claims(folder: Path) -> None:
    plugin_dir = folder / "plugins" / "gputopo.io"
    plugin_dir.mkdir(parents=True)
    (plugin_dir / "prepared.json").write_text(
        json.dumps(
            {
                "claims": {
                    "old": {"namespace": "ns", "name": "old", "devices": [[NODE, "set-8-9", "gpus", [8, 9]]]}
                }
            }
        )
    )
    with running(folder) as (daemon, api, kubelet):
        kubelet.register()
        resp = kubelet.prepare(("ns", "old", "old"))
        assert "no longer has" in resp.claims["old"].error
        assert daemon.claims is not None and daemon.claims.in_use() == frozenset()
        api.put_claim(allocated_claim("ns", "old", "old", _results("set-0-3")))
        assert kubelet.prepare(("ns", "old", "old")).claims["old"].error == ""
    (plugin_dir / "prepared.json").write_text("{not json")
    with running(folder) as (daemon, _api, kubelet):
        kubelet.register()
        assert daemon.claims is not None and daemon.claims.in_use() == frozenset()


def test_the_probe_asks_both_sockets_kubelet_dials(folder: Path) -> None:
    from deviceplugin.dra.probe import main as probe

    args = ["--registry-dir", str(folder / "registry"), "--timeout", "2"]
    with running(folder) as (_daemon, _api, _kubelet):
        assert probe(args, {}) == 0
        assert probe([*args, "--driver-name", "other.example.com"], {}) == 1
        # the DRA socket gone (the registration one still answers): not alive
        (folder / "plugins" / "gputopo.io" / "dra.sock").unlink()
        assert probe(args, {}) == 1
    assert probe(args, {}) == 1
    assert probe(["--timeout", "x"], {}) == 2


def _get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_kubelets_http_probes_ask_the_daemon_on_its_metrics_port(folder: Path) -> None:
    """DRA mode answers kubelet's httpGet probes itself (no process per probe): alive while both
    sockets kubelet dials answer, ready once kubelet has also accepted the registration."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with running(folder, metrics_port=port) as (daemon, _api, kubelet):
        assert _get(port, "/healthz") == (200, {"ok": True})
        code, body = _get(port, "/readyz")
        assert code == 503 and body["reason"] == "not registered with kubelet yet"
        kubelet.register()
        assert _get(port, "/readyz") == (200, {"ok": True})
        assert daemon.server is not None
        daemon.server.close()  # the gRPC servers gone (a removed socket is served again)
        code, body = _get(port, "/healthz")
        assert code == 503 and "no answer from the plugin" in body["reason"]
        assert _get(port, "/readyz")[0] == 503
