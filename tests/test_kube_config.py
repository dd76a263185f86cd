"""`gputopo_kube`: the one place both daemons load their API server configuration (in-cluster
first, then a kubeconfig), and what each daemon does when there is none."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gputopo_kube import KubeConfigError, load_configuration, user_configuration
from tests.kubelet_fake import short_tmpdir

ROOT = Path(__file__).resolve().parent.parent
GOOD = (
    "apiVersion: v1\nkind: Config\n"
    "clusters: [{name: c, cluster: {server: 'https://10.0.0.1:6443'}}]\n"
    "users: [{name: u, user: {token: t0k3n}}]\n"
    "contexts: [{name: x, context: {cluster: c, user: u}}]\n"
    "current-context: x\n"
)
#: Files the kubernetes loader trips over in different ways: a yaml error (was a traceback of
#: `python -m scheduler`), a list, wrongly typed fields, a context that is not there.
BAD = {
    "yaml": "{",
    "unclosed": "a: [1\n",
    "list": "[]",
    "ints": "contexts: 5\n",
    "no-context": "current-context: x\n",
    "typed": GOOD.replace("'https://10.0.0.1:6443'", "5"),
}


@pytest.fixture
def folder() -> Iterator[Path]:
    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_an_explicit_kubeconfig_wins(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(GOOD)
    cfg = load_configuration(str(path))
    assert cfg.host == "https://10.0.0.1:6443" and "Bearer t0k3n" in cfg.api_key.values()


def test_outside_a_cluster_the_default_kubeconfig_is_used(tmp_path: Path) -> None:
    """In-cluster fails (service env set, no ServiceAccount token): $KUBECONFIG answers."""
    path = tmp_path / "kubeconfig"
    path.write_text(GOOD)
    env = dict(
        os.environ, KUBECONFIG=str(path), KUBERNETES_SERVICE_HOST="10.0.0.9", KUBERNETES_SERVICE_PORT="443"
    )
    out = subprocess.run(
        [sys.executable, "-c", "from gputopo_kube import load_configuration; print(load_configuration().host)"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "https://10.0.0.1:6443"


@pytest.mark.parametrize("text", BAD.values(), ids=BAD.keys())
def test_a_bad_kubeconfig_is_one_line_naming_the_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(text)
    with pytest.raises(KubeConfigError) as info:
        load_configuration(str(path))
    message = str(info.value)
    assert "\n" not in message and str(path) in message


@pytest.mark.parametrize("name", ["yaml", "typed"])
def test_the_sidecar_refuses_a_bad_kubeconfig_with_one_line(tmp_path: Path, name: str) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(BAD[name])
    res = subprocess.run(
        [sys.executable, "-m", "scheduler", "--kubeconfig", str(path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot load Kubernetes configuration" in lines[0] and str(path) in lines[0]


def test_the_plugin_that_must_publish_refuses_a_bad_kubeconfig_with_one_line(folder: Path) -> None:
    path = folder / "kubeconfig"
    path.write_text(BAD["yaml"])  # a multi-line yaml error: once a multi-line message
    proc = subprocess.run(
        [sys.executable, "-m", "deviceplugin", "--kubelet-dir", str(folder), "--topology", "rtx8000-4",
         "--metrics-port", "0", "--publish", "true", "--kubeconfig", str(path)],
        cwd=ROOT, env={"NODE_NAME": "node-a", "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "node publication" in lines[0] and str(path) in lines[0], proc.stderr


# ---------------------------------------------------------------- a person's kubeconfig (kubectl gputopo)


def two_contexts(path: Path) -> Path:
    path.write_text(
        GOOD.replace(
            "contexts: [{name: x, context: {cluster: c, user: u}}]",
            "contexts: [{name: x, context: {cluster: c, user: u, namespace: ml}}, {name: y, context: {cluster: c, user: u}}]",
        )
    )
    return path


def test_user_configuration_takes_the_context_and_its_namespace(tmp_path: Path) -> None:
    path = two_contexts(tmp_path / "kubeconfig")
    cfg, namespace = user_configuration(str(path))
    assert cfg.host == "https://10.0.0.1:6443" and namespace == "ml"
    assert user_configuration(str(path), "y")[1] == "default", "a context without a namespace"
    with pytest.raises(KubeConfigError) as info:
        user_configuration(str(path), "nope")
    assert "nope" in str(info.value) and "\n" not in str(info.value)


def test_user_configuration_reads_kubeconfig_before_in_cluster(tmp_path: Path) -> None:
    """The opposite order of the daemons': in a debug pod with a kubeconfig, the kubeconfig wins;
    with neither, one line says so."""
    path = two_contexts(tmp_path / "kubeconfig")
    code = "from gputopo_kube import user_configuration as u; c, n = u(); print(c.host, n)"
    base = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KUBERNETES_SERVICE_HOST": "10.0.0.9",
            "KUBERNETES_SERVICE_PORT": "443"}  # fmt: skip
    env = dict(base, KUBECONFIG=os.pathsep.join([str(tmp_path / "missing"), str(path)]))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT, env=env
    )
    assert out.returncode == 0 and out.stdout.split() == ["https://10.0.0.1:6443", "ml"], out.stderr
    code = (
        "from gputopo_kube import KubeConfigError, user_configuration as u\n"
        "try:\n    u()\nexcept KubeConfigError as e:\n    print(e)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT, env=base
    )
    assert out.returncode == 0 and out.stdout.startswith("no kubeconfig") and out.stdout.count("\n") == 1
