"""DRA mode end to end, as processes: `python -m deviceplugin --mode dra` against the shared API
server stand-in (../shared/realk8s, which models resource.k8s.io/v1 ResourceSlices and
ResourceClaims, written independently of this project), registered and called by the kubelet
stand-in over unix sockets; SIGTERM ends it with exit 0 and no socket left behind.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gputopo.node import draslices
from gputopo.node.allocator import Allocator
from gputopo.node.topofile import load_preset
from tests import realk8s as rk
from tests.dra_standins import KubeletDra, allocated_claim

if not (rk.REALK8S / "apiserver_standin.py").exists():
    pytest.skip(f"the shared API server stand-in is not present ({rk.REALK8S})", allow_module_level=True)

NODE = "dgx1-a"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


@pytest.fixture
def world() -> Iterator[tuple[rk.Procs, rk.Api, Path, Path]]:
    folder = Path(tempfile.mkdtemp(prefix="drak", dir="/tmp"))  # short: unix socket paths
    procs = rk.Procs(folder)
    try:
        kubeconfig = folder / "kubeconfig.json"
        proc = procs.start(
            "apiserver",
            [
                sys.executable,
                str(rk.REALK8S / "apiserver_standin.py"),
                "--port",
                "0",
                "--kubeconfig",
                str(kubeconfig),
            ],
        )
        port = int(rk._wait_line(proc, r"fake apiserver on 127\.0\.0\.1:(\d+)", 30).group(1))
        yield procs, rk.Api(f"http://127.0.0.1:{port}"), folder, kubeconfig
    finally:
        procs.close()
        shutil.rmtree(folder, ignore_errors=True)


def _slices(api: rk.Api) -> list[dict[str, Any]]:
    items = api.get(f"{SLICES}?fieldSelector=spec.nodeName%3D{NODE}")["items"]
    gens = {s["spec"]["pool"]["generation"] for s in items}
    if len(gens) != 1 or len(items) != items[0]["spec"]["pool"]["resourceSliceCount"]:
        return []
    order = ["counters", "gpus", "set2", "set4", "set8", "set16"]
    return sorted(
        items, key=lambda s: (order.index(s["metadata"]["labels"]["gputopo.io/part"]), s["metadata"]["name"])
    )


def test_daemon_process_publishes_prepares_and_stops_cleanly(
    world: tuple[rk.Procs, rk.Api, Path, Path],
) -> None:
    procs, api, folder, kubeconfig = world
    daemon = rk.dra_daemon(procs, kubeconfig, NODE, "dgx1-v100", folder)
    first = rk.wait_for(lambda: _slices(api), 60, "the node's ResourceSlices")
    assert draslices.check_limits(first) == []
    kubelet = KubeletDra(folder / "registry")
    try:
        assert kubelet.register().name == "gputopo.io"
        # kube-scheduler's first fit on the published slices, GPU 0 held by another pod
        device, gpus = draslices.first_fit(first, 4, used=[0]) or ("", ())
        assert gpus == (4, 5, 6, 7)
        claim = allocated_claim(
            "ml", "c1", "", [{"request": "gpus", "driver": "gputopo.io", "pool": NODE, "device": device}]
        )
        status = claim.pop("status")
        del claim["metadata"]["uid"]  # the API server gives it
        created = api.create("/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims", claim)
        uid = created["metadata"]["uid"]
        api.call(
            "PUT",
            "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/c1/status",
            {**created, "status": status},
        )
        resp = kubelet.prepare(("ml", "c1", uid))
        topo = load_preset("dgx1-v100")
        assert resp.claims[uid].error == ""
        assert list(resp.claims[uid].devices[0].cdi_device_ids) == [
            f"nvidia.com/gpu={topo.gpus[i].uuid}" for i in gpus
        ]
        gen = first[0]["spec"]["pool"]["generation"]
        after = rk.wait_for(
            lambda: (s := _slices(api)) and s[0]["spec"]["pool"]["generation"] > gen and s,
            60,
            "a republication",
        )
        free = [0, 1, 2, 3]
        got = draslices.first_fit(after, 2, used=[4, 5, 6, 7])
        assert got is not None and got[1] == Allocator(topo).choose(free, 2).indices
    finally:
        kubelet.close()
    os.killpg(daemon.popen.pid, signal.SIGTERM)
    assert daemon.popen.wait(timeout=30) == 0, daemon.tail()
    assert not list((folder / "registry").glob("*.sock"))
    assert not (folder / "plugins" / "gputopo.io" / "dra.sock").exists()
