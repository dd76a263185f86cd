"""`--policy`: a node runs NVIDIA's or HAMi's in-node choice, says so in its annotation, and the
sidecar predicts that node with that choice. Over the plugin's real unix socket, the fake API
server's HTTP and the sidecar's HTTP."""

from __future__ import annotations

import logging
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from deviceplugin.publish.publisher import for_cluster
from deviceplugin.settings import ConfigError, load_config
from gputopo.network.annotation import decode
from gputopo.node.allocator import Allocator
from gputopo.node.policy import POLICY_NAMES, policy_by_name
from gputopo.node.topofile import load_preset
from gputopo_proto.deviceplugin.v1beta1 import api_pb2
from scheduler.extender import Extender
from scheduler.live.kube import KubeState
from scheduler.web.server import Server
from tests import fake_apiserver as fk
from tests.kubelet_fake import eventually, fake_kubelet, plugin_channel, running_daemon, short_tmpdir
from tests.test_plugin_publish import annotation, kubeconfig
from tests.test_scheduler_http import Client

REPO = Path(__file__).resolve().parent.parent
PRESET = "a100-pcie-nvlink-pairs"  # NV12 pairs 0-2, 1-3, 4-5, 6-7; SYS otherwise
TOPO = load_preset(PRESET)
UUIDS = [g.uuid for g in TOPO.gpus]
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("GPUTOPO_") and k != "NODE_NAME"}


@pytest.fixture
def folder() -> Iterator[Path]:
    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def prefer(stub, available, size, must=()):
    req = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=list(available), must_include_deviceIDs=list(must), allocation_size=size
            )
        ]
    )
    return list(stub.GetPreferredAllocation(req, timeout=5).container_responses[0].deviceIDs)


# ------------------------------------------------------------------ settings


def test_policy_layers_like_every_setting(tmp_path: Path) -> None:
    assert load_config([], {}).policy == "gputopo"
    file = tmp_path / "c.yaml"
    file.write_text("version: v1\npolicy: best-combo\n")
    assert load_config(["--config", str(file)], {}).policy == "best-combo"
    env = {"GPUTOPO_POLICY": "kubelet-default"}
    assert load_config(["--config", str(file)], env).policy == "kubelet-default"
    assert (
        load_config(["--config", str(file), "--policy", "best-effort-pairs"], env).policy
        == "best-effort-pairs"
    )
    with pytest.raises(ConfigError) as e:
        load_config(["--policy", "binpack"], {})
    assert "--policy" in str(e.value) and ", ".join(POLICY_NAMES) in str(e.value)


@pytest.mark.parametrize(("args", "env"), [(["--policy", "spread"], {}), ([], {"GPUTOPO_POLICY": "nvidia"})])
def test_an_unknown_policy_exits_2_with_one_line_listing_the_known_ones(
    folder: Path, args: list[str], env: dict[str, str]
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "deviceplugin", "--kubelet-dir", str(folder), "--topology", PRESET,
         "--metrics-port", "0", *args],
        cwd=REPO, env={**CLEAN_ENV, **env}, capture_output=True, timeout=30,
    )  # fmt: skip
    lines = proc.stderr.decode().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr.decode()
    assert all(name in lines[0] for name in POLICY_NAMES)


# ------------------------------------------------------------------ the plugin answers with its policy


@pytest.mark.parametrize("policy", ["best-effort-pairs", "best-combo"])
def test_the_plugin_answers_with_its_policy_over_grpc(folder: Path, policy: str) -> None:
    want = policy_by_name(policy, TOPO)
    rng = random.Random(7)
    with fake_kubelet(folder) as kubelet, running_daemon(folder, PRESET, policy=policy) as d:
        assert kubelet.wait(1, 10) is not None
        assert eventually(lambda: d.registration().registered)
        with plugin_channel(folder / "gputopo-gpu.sock") as stub:
            differs = 0
            for _ in range(60):
                free = sorted(rng.sample(range(8), rng.randint(1, 8)))
                size = rng.randint(1, len(free))
                must = sorted(rng.sample(free, rng.randint(0, min(1, size))))
                offer = [UUIDS[i] for i in free]
                rng.shuffle(offer)
                got = prefer(stub, offer, size, [UUIDS[i] for i in must])
                expected = want.choose(free, size, must).indices
                assert got == [UUIDS[i] for i in expected], (free, size, must)
                differs += expected != Allocator(TOPO).choose(free, size, must).indices
            assert differs > 0, "the test must tell the policy from gputopo's"
            # refusals are the allocator's, worded in kubelet's terms, whatever the policy
            with pytest.raises(grpc.RpcError) as e:
                prefer(stub, UUIDS[:2], 3)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
            assert "exceeds the 2 available" in e.value.details()  # type: ignore[attr-defined]


# ------------------------------------------------------------------ the sidecar predicts it


def test_the_sidecar_predicts_a_best_effort_node_with_best_effort(folder: Path, caplog) -> None:
    """Node publishes `best-effort-pairs`; what the sidecar expects the node to hand out at bind
    is what that plugin answers over gRPC for the same free GPUs (and not gputopo's choice)."""
    in_use: list[str] = []
    caplog.set_level(logging.INFO, logger="gputopo.scheduler")
    with fk.running() as (api, server, api_client), fake_kubelet(folder) as kubelet:
        api.put("nodes", fk.node("node-a", gpus=8))
        cfg = kubeconfig(folder / "kubeconfig", server.url)
        with running_daemon(folder, PRESET, policy="best-effort-pairs") as d:
            assert kubelet.wait(1, 10) is not None
            publisher = for_cluster(
                "node-a", lambda: frozenset(in_use), kubeconfig=str(cfg), min_interval_s=0.05, resync_s=0.2
            )
            d.add_listener(publisher.update)
            publisher.start()
            try:
                with plugin_channel(folder / "gputopo-gpu.sock") as stub:
                    # (GPUs in use, pod size): the first two are where go-gpuallocator and
                    # gputopo differ (available[0] vs least disruption; its partition look-ahead)
                    for i, (used, size) in enumerate([((0,), 1), ((), 2), ((2, 3, 7), 3)]):
                        in_use[:] = [UUIDS[u] for u in used]
                        publisher.poke()

                        def published(used: tuple[int, ...] = used) -> bool:
                            text = annotation(api, "node-a")
                            if text is None:
                                return False
                            value = decode(text, now=time.time(), max_age_s=60)
                            return value.allocated == frozenset(used) and value.policy == "best-effort-pairs"

                        assert eventually(published, timeout=10)
                        predicted = bind_and_read_prediction(api, api_client, caplog, f"p{i}", size, used)
                        free = [u for u in range(8) if u not in used]
                        offer = [UUIDS[u] for u in free]
                        random.Random(i).shuffle(offer)
                        answered = prefer(stub, offer, size)
                        assert [UUIDS[g] for g in predicted] == answered, (used, size)
                        if i == 0:
                            assert tuple(predicted) != Allocator(TOPO).choose(free, size).indices
                        api.delete("pods", f"ml/p{i}")
            finally:
                publisher.stop()


def bind_and_read_prediction(
    api, api_client, caplog, name: str, size: int, used: tuple[int, ...]
) -> list[int]:
    """A fresh sidecar on the fake API server binds one pod to node-a; the GPUs it expects."""
    state = KubeState(api_client, clock=time.time, watch_timeout_s=5, backoff_s=(0.05, 0.2))
    ext = Extender(state, clock=time.time)
    http = Server(ext, "127.0.0.1", 0)
    pod = fk.pod("ml", name, size)
    api.put("pods", pod)
    try:
        state.start()
        assert eventually(state.ready, timeout=10)

        def sees() -> bool:
            info = state.snapshot().nodes.get("node-a")
            return bool(
                info
                and info.topology
                and info.topology.allocated == frozenset(used)
                and "ml/" + name in state.snapshot().pods
            )

        assert eventually(sees, timeout=10)
        assert state.snapshot().nodes["node-a"].topology.policy == "best-effort-pairs"  # type: ignore[union-attr]
        http.start()
        caplog.clear()
        bind = {"PodName": name, "PodNamespace": "ml", "PodUID": pod["metadata"]["uid"], "Node": "node-a"}
        assert Client(http).post("/bind", bind) == (200, {"Error": ""})
        binds = [r for r in caplog.records if r.getMessage() == "bind" and r.fields["pod"] == f"ml/{name}"]
        assert len(binds) == 1
        return list(binds[0].fields["gpus"])
    finally:
        http.stop()
        state.stop()
