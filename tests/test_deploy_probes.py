"""The DaemonSet's probes, run for real against a running plugin and a kubelet stand-in.

The probe commands are taken from the rendered manifest and executed the way kubelet's exec
probes run them: inside the container's environment (the DaemonSet's env, with the host's
kubelet folders mapped to a temporary one), against `python -m deviceplugin` started from the
same environment as the image's entrypoint. Only the GPU source differs: a topology preset
stands in for NVML. What is checked is the meaning of each probe's exit code:
liveness passes while the plugin serves its socket; readiness passes only once kubelet has
accepted the registration.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kubelet_fake import eventually, fake_kubelet, short_tmpdir

ROOT = Path(__file__).resolve().parent.parent
HOST_KUBELET = "/var/lib/kubelet"


def plugin_container() -> dict[str, Any]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: cannot render deploy/ offline")
    out = subprocess.run(
        [kubectl, "kustomize", str(ROOT / "deploy")], capture_output=True, text=True, timeout=60, check=True
    )
    ds = next(d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "DaemonSet")
    return next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "device-plugin")


def container_env(c: dict[str, Any], kubelet_root: Path) -> dict[str, str]:
    """The DaemonSet's env as kubelet sets it, host kubelet paths moved under `kubelet_root`."""
    env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for var in c["env"]:
        value = var.get("value", "node-a")  # the one valueFrom is the downward API's spec.nodeName
        env[var["name"]] = value.replace(HOST_KUBELET, str(kubelet_root))
    return env


def probe(command: list[str], env: dict[str, str]) -> int:
    return subprocess.run(command, env=env, capture_output=True, timeout=30, check=False).returncode


@pytest.fixture
def node() -> Iterator[tuple[dict[str, Any], dict[str, str], Path]]:
    c = plugin_container()
    root = short_tmpdir("gtp-")
    env = container_env(c, root)
    Path(env["GPUTOPO_KUBELET_DIR"]).mkdir(parents=True)
    try:
        yield c, env, Path(env["GPUTOPO_KUBELET_DIR"])
    finally:
        shutil.rmtree(root, ignore_errors=True)


def start_plugin(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    # The image's ENTRYPOINT, with a preset in place of NVML and no metrics port to collide on.
    plugin_env = {**env, "GPUTOPO_TOPOLOGY": "dgx1-v100", "GPUTOPO_METRICS_PORT": "0"}
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "deviceplugin"], env=plugin_env, stdout=out, stderr=out
        )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_liveness_follows_the_socket_and_readiness_follows_registration(
    node: tuple[dict[str, Any], dict[str, str], Path],
) -> None:
    c, env, kubelet_dir = node
    live = c["livenessProbe"]["exec"]["command"]
    ready = c["readinessProbe"]["exec"]["command"]
    socket = kubelet_dir / "gputopo-gpu.sock"

    assert probe(live, env) != 0, "nothing serves yet: liveness must fail"
    log = kubelet_dir.parent / "plugin.log"
    plugin = start_plugin(env, log)
    try:
        assert eventually(socket.exists, timeout=20), log.read_text()
        assert eventually(lambda: probe(live, env) == 0, timeout=20)
        assert probe(ready, env) != 0, "kubelet is not there: the plugin is not registered, so not ready"

        with fake_kubelet(kubelet_dir) as kubelet:
            assert kubelet.wait(1, timeout=20) is not None
            assert eventually(lambda: probe(ready, env) == 0, timeout=20)
            assert probe(live, env) == 0
    finally:
        stop(plugin)
    assert probe(live, env) != 0, "the plugin is gone: liveness must fail"
    assert probe(ready, env) != 0
