"""The manifests' probes, run for real against the daemons they watch.

The plugin's probes are httpGet on its metrics port, asked as kubelet asks them; the sidecar's
are exec commands taken from the rendered manifests and executed the way kubelet's exec
probes run them, inside the container's environment, against the daemon started as the image's
entrypoint with the manifest's own args and env. Only what a test machine lacks is stood in for:
a topology preset for NVML, a kubelet stand-in, a fake API server, temporary folders for the
host's kubelet folders and a free port for the sidecar's. What is checked is the meaning of
each exit code: liveness passes while the daemon serves; readiness passes only once it can do
its job (plugin registered with kubelet; sidecar's cluster state loaded).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import fake_apiserver
from tests.kubelet_fake import eventually, fake_kubelet, short_tmpdir

ROOT = Path(__file__).resolve().parent.parent
HOST_KUBELET = "/var/lib/kubelet"
# Each probe is a Python process; polling slower than that leaves the daemon the CPU to start.
PROBE_POLL_S = 0.25


def deployed_container(kind: str, name: str) -> dict[str, Any]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: cannot render deploy/ offline")
    out = subprocess.run(
        [kubectl, "kustomize", str(ROOT / "deploy")], capture_output=True, text=True, timeout=60, check=True
    )
    workload = next(d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == kind)
    return next(c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def image_path() -> dict[str, str]:
    """PATH as in the images (ENV PATH=/opt/gputopo/bin:$PATH): `python` and `gputopo` are the project's."""
    return {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def container_env(c: dict[str, Any], kubelet_root: Path) -> dict[str, str]:
    """The DaemonSet's env as kubelet sets it, host kubelet paths moved under `kubelet_root`."""
    env = image_path()
    for var in c["env"]:
        value = var.get("value", "node-a")  # the one valueFrom is the downward API's spec.nodeName
        env[var["name"]] = value.replace(HOST_KUBELET, str(kubelet_root))
    return env


def probe(command: list[str], env: dict[str, str]) -> int:
    return subprocess.run(command, env=env, capture_output=True, timeout=30, check=False).returncode


@pytest.fixture
def node() -> Iterator[tuple[dict[str, Any], dict[str, str], Path]]:
    c = deployed_container("DaemonSet", "device-plugin")
    root = short_tmpdir("gtp-")
    env = container_env(c, root)
    Path(env["GPUTOPO_KUBELET_DIR"]).mkdir(parents=True)
    try:
        yield c, env, Path(env["GPUTOPO_KUBELET_DIR"])
    finally:
        shutil.rmtree(root, ignore_errors=True)


def start(module: str, args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """The image's ENTRYPOINT (`python -m <module>`) with the container's args."""
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", module, *args], env=env, stdout=out, stderr=out)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def http_probe(probe_spec: dict[str, Any], ports: dict[str, int], port_here: int) -> int:
    """An httpGet probe as kubelet runs it: GET on the pod's port, success is 200-399 (0 here,
    1 otherwise, like an exec probe's exit code). The named port is resolved from the
    container's ports and then moved to the free one this test serves on."""
    get = probe_spec["httpGet"]
    port = get["port"] if isinstance(get["port"], int) else ports[get["port"]]
    assert port in ports.values(), f"probe port {get['port']} is not a declared container port"
    url = f"{get.get('scheme', 'HTTP').lower()}://127.0.0.1:{port_here}{get['path']}"
    try:
        with urllib.request.urlopen(url, timeout=probe_spec.get("timeoutSeconds", 1)) as r:
            return 0 if 200 <= r.status < 400 else 1
    except (urllib.error.URLError, OSError):
        return 1


def test_liveness_follows_the_socket_and_readiness_follows_registration(
    node: tuple[dict[str, Any], dict[str, str], Path],
) -> None:
    c, env, kubelet_dir = node
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert "exec" not in c["livenessProbe"] and "exec" not in c["readinessProbe"], "no process per probe"
    port_here = free_port()

    def live() -> int:
        return http_probe(c["livenessProbe"], ports, port_here)

    def ready() -> int:
        return http_probe(c["readinessProbe"], ports, port_here)

    plugin_socket = kubelet_dir / "gputopo-gpu.sock"
    assert live() != 0, "nothing serves yet: liveness must fail"
    log = kubelet_dir.parent / "plugin.log"
    # A preset in place of NVML, the metrics port moved to a free one, and no API server to
    # publish to (publication end to end: tests/test_plugin_publish.py).
    assert env["GPUTOPO_METRICS_PORT"] == str(ports["metrics"])
    plugin_env = {
        **env,
        "GPUTOPO_TOPOLOGY": "dgx1-v100",
        "GPUTOPO_METRICS_PORT": str(port_here),
        "GPUTOPO_PUBLISH": "false",
    }
    plugin = start("deviceplugin", c.get("args", []), plugin_env, log)
    try:
        assert eventually(plugin_socket.exists, timeout=20), log.read_text()
        assert eventually(lambda: live() == 0, timeout=30, interval=PROBE_POLL_S), log.read_text()
        assert ready() != 0, "kubelet is not there: the plugin is not registered, so not ready"

        with fake_kubelet(kubelet_dir) as kubelet:
            assert kubelet.wait(1, timeout=20) is not None
            assert eventually(lambda: ready() == 0, timeout=30, interval=PROBE_POLL_S)
            assert live() == 0
    finally:
        stop(plugin)
    assert live() != 0, "the plugin is gone: liveness must fail"
    assert ready() != 0


# ------------------------------------------------------------------ scheduler extender sidecar


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kubeconfig(path: Path, server: str) -> Path:
    """What the in-cluster config gives the sidecar in a pod, as a file: the API server's address."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def sidecar(api_url: str, tmp: Path) -> tuple[list[str], list[str], subprocess.Popen[bytes]]:
    """The sidecar started with the Deployment's args on a free port; its two probe commands."""
    c = deployed_container("Deployment", "extender")
    listen = next(a.split("=", 1)[1] for a in c["args"] if a.startswith("--listen="))
    moved = f"127.0.0.1:{free_port()}"

    def here(cmd: list[str]) -> list[str]:
        return [part.replace(listen, moved) for part in cmd]

    args = [*here(c["args"]), f"--kubeconfig={kubeconfig(tmp / 'kubeconfig', api_url)}"]
    proc = start("scheduler", args, image_path(), tmp / "sidecar.log")
    return here(c["livenessProbe"]["exec"]["command"]), here(c["readinessProbe"]["exec"]["command"]), proc


def test_sidecar_is_live_without_the_api_server_but_not_ready(tmp_path: Path) -> None:
    env = image_path()
    live, ready, proc = sidecar(f"http://127.0.0.1:{free_port()}", tmp_path)  # nobody listens there
    try:
        assert eventually(lambda: probe(live, env) == 0, timeout=30, interval=PROBE_POLL_S), (
            tmp_path / "sidecar.log"
        ).read_text()
        assert probe(ready, env) != 0, "no cluster state: kube-scheduler must not be sent GPU pods yet"
    finally:
        stop(proc)
    assert probe(live, env) != 0, "the sidecar is gone: liveness must fail"


def test_sidecar_is_ready_once_it_has_listed_the_cluster(tmp_path: Path) -> None:
    env = image_path()
    with fake_apiserver.running() as (api, server, _):
        api.put("nodes", fake_apiserver.node("gpu-a1", {"network.topology.nvidia.com/leaf": "leaf-a"}))
        live, ready, proc = sidecar(server.url, tmp_path)
        try:
            assert eventually(lambda: probe(ready, env) == 0, timeout=30, interval=PROBE_POLL_S), (
                tmp_path / "sidecar.log"
            ).read_text()
            assert probe(live, env) == 0
        finally:
            stop(proc)
