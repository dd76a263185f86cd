"""`python -m deviceplugin` as a process: signals, exit codes, and the layered configuration."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from deviceplugin import settings
from deviceplugin.kubelet.status_client import fetch_status
from deviceplugin.settings import ConfigError, PluginConfig, load_config
from gputopo.node.topofile import load_preset
from tests.kubelet_fake import eventually, fake_kubelet, short_tmpdir

REPO = Path(__file__).resolve().parent.parent
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("GPUTOPO_") and k != "NODE_NAME"}


@pytest.fixture
def folder() -> Iterator[Path]:
    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def plugin(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "deviceplugin", *args],
        cwd=REPO,
        env={**CLEAN_ENV, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_serving_removes_socket_exits_zero(folder: Path, sig: signal.Signals) -> None:
    sock = folder / settings.SOCKET_NAME
    with fake_kubelet(folder) as kubelet:
        proc = plugin("--kubelet-dir", str(folder), "--topology", "gb200-tray", "--metrics-port", "0")
        try:
            reg = kubelet.wait(1, 20)
            assert reg is not None, kubelet.refusals
            assert eventually(lambda: fetch_status(str(sock), 2)["registration"]["registered"])
            proc.send_signal(sig)
            assert proc.wait(10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
    assert not sock.exists()


BAD_FLAGS = {
    "unknown flag": ["--bogus"],
    "flag without value": ["--topology"],
    "port not a number": ["--metrics-port", "x"],
    "port out of range": ["--metrics-port", "70000"],
    "strategy": ["--device-list-strategy", "volume"],
    "resource name": ["--resource-name", "gpu"],
    "socket name with slash": ["--socket-name", "a/b.sock"],
    "socket named like kubelet's": ["--socket-name", "kubelet.sock"],
    "xids": ["--ignored-xids", "13,abc"],
    "recovery": ["--health-recovery-seconds", "-1"],
    "log level": ["--log-level", "loud"],
    "bool": ["--fail-on-init-error", "maybe"],
    "unknown preset": ["--topology", "dgx-99"],
    "missing topology file": ["--topology", "/nonexistent/topo.json"],
    "health file without topology": ["--health-file", "/tmp/h.json"],
    "socket path too long": ["--kubelet-dir", "/tmp/" + "d" * 120],
    "kubelet folder missing": ["--kubelet-dir", "/nonexistent/device-plugins"],
    "missing config file": ["--config", "/nonexistent/plugin.yaml"],
    "publish mode": ["--publish", "maybe"],
    "publish without node name": ["--publish", "true"],
}


@pytest.mark.parametrize("case", sorted(BAD_FLAGS))
def test_bad_flags_exit_2_with_one_line(case: str, folder: Path) -> None:
    args = BAD_FLAGS[case]
    if "--kubelet-dir" not in args:
        args = ["--kubelet-dir", str(folder), *args]
    if "--topology" not in args and "--health-file" not in args:
        args = [*args, "--topology", "rtx8000-4"]
    proc = plugin(*args, "--metrics-port", "0") if "--metrics-port" not in args else plugin(*args)
    _, err = proc.communicate(timeout=20)
    lines = err.decode().splitlines()
    assert proc.returncode == 2, err.decode()
    assert len(lines) == 1 and lines[0].startswith("deviceplugin: error: "), lines
    assert "Traceback" not in err.decode()
    assert not (folder / settings.SOCKET_NAME).exists()


def test_bad_topology_file_content_exits_2(folder: Path) -> None:
    bad = folder / "topo.json"
    bad.write_text('{"gpus": [{"index": 0}], "links": [["NV2"]]}')
    proc = plugin("--kubelet-dir", str(folder), "--topology", str(bad), "--metrics-port", "0")
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 2
    assert len(err.decode().splitlines()) == 1 and "topology" in err.decode()


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"GPUTOPO_METRICS_PORT": "abc"}, "GPUTOPO_METRICS_PORT"),
        ({"GPUTOPO_DEVICE_LIST_STRATEGY": "x"}, "GPUTOPO_DEVICE_LIST_STRATEGY"),
    ],
)
def test_bad_environment_exits_2(env: dict[str, str], fragment: str, folder: Path) -> None:
    proc = plugin("--kubelet-dir", str(folder), "--topology", "rtx8000-4", env=env)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 2
    assert len(err.decode().splitlines()) == 1 and fragment in err.decode()


def test_help_exits_zero() -> None:
    proc = plugin("--help")
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0 and b"--kubelet-dir" in out
    assert b"--mode {device-plugin,dra}" in out  # the DRA driver is found from the plugin's help


def test_a_mistyped_kubelet_dir_is_refused_not_created(folder: Path) -> None:
    typo = folder / "device-plugin"  # kubelet's folder is device-plugins
    proc = plugin("--kubelet-dir", str(typo), "--topology", "rtx8000-4", "--metrics-port", "0")
    _, err = proc.communicate(timeout=20)
    lines = err.decode().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, lines
    assert lines[0] == (
        f"deviceplugin: error: --kubelet-dir {typo}: no such directory "
        "(kubelet creates it; is this kubelet's device-plugin folder?)"
    )
    assert not typo.exists()


# --- layered configuration (pure: flags, env and file are plain inputs) ---------------------------


def write_config(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_defaults() -> None:
    assert load_config([], {}) == PluginConfig()
    cfg = PluginConfig()
    assert cfg.kubelet_dir == settings.KUBELET_DIR and cfg.backend_kind == "nvml"


def test_precedence_flag_over_env_over_file_over_default(tmp_path: Path) -> None:
    cfg_file = write_config(
        tmp_path / "c.yaml",
        "version: v1\nresourceName: example.com/file\nmetricsPort: 1111\nlogLevel: debug\nignoredXids: [1, 2]\n",
    )
    env = {"GPUTOPO_RESOURCE_NAME": "example.com/env", "GPUTOPO_METRICS_PORT": "2222", "NODE_NAME": "n1"}
    cfg = load_config(["--config", cfg_file, "--metrics-port", "3333"], env)
    assert cfg.metrics_port == 3333  # flag
    assert cfg.resource_name == "example.com/env"  # env beats file
    assert cfg.log_level == "debug"  # file beats default
    assert cfg.ignored_xids == (1, 2)
    assert cfg.node_name == "n1"
    assert cfg.device_list_strategy == "envvar"  # default
    # the config file may come from the environment too
    assert load_config([], {"GPUTOPO_CONFIG": cfg_file}).metrics_port == 1111


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("resourceName: a.b/c\n", "'version' must be 'v1'"),
        ("version: v2\n", "'version' must be 'v1'"),
        ("version: v1\nmetricPort: 1\n", "unknown key 'metricPort'"),
        ("version: v1\nmetricsPort: [1]\n", "metricsPort"),
        ("- a\n- b\n", "YAML mapping"),
        ("version: v1\n  bad: [\n", "not valid YAML"),
    ],
)
def test_bad_config_files(tmp_path: Path, text: str, fragment: str) -> None:
    path = write_config(tmp_path / "c.yaml", text)
    with pytest.raises(ConfigError, match=None) as info:
        load_config(["--config", path], {})
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_boolean_flag_forms() -> None:
    assert load_config(["--fail-on-init-error"], {}).fail_on_init_error is True
    assert load_config(["--fail-on-init-error=false"], {}).fail_on_init_error is False
    assert load_config([], {"GPUTOPO_FAIL_ON_INIT_ERROR": "0"}).fail_on_init_error is False


def _nvml_loads() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


needs_no_nvml = pytest.mark.skipif(_nvml_loads(), reason="NVML works here: the plugin would start")


@needs_no_nvml
def test_nvml_init_failure_exits_1_with_one_line(folder: Path) -> None:
    proc = plugin("--kubelet-dir", str(folder), "--metrics-port", "0")
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 1
    lines = err.decode().splitlines()
    assert len(lines) == 1 and "NVML" in lines[0] and "--fail-on-init-error=false" in lines[0]
    assert not (folder / settings.SOCKET_NAME).exists()


@needs_no_nvml
def test_nvml_init_failure_keeps_retrying_when_asked(folder: Path) -> None:
    proc = plugin(
        "--kubelet-dir", str(folder), "--metrics-port", "0", env={"GPUTOPO_FAIL_ON_INIT_ERROR": "false"}
    )
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(1.5)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
        assert proc.returncode == 0
        assert b'"event":"nvml_init_failed"' in err
    finally:
        if proc.poll() is None:
            proc.kill()


def test_topology_beyond_the_allocator_exits_2(folder: Path) -> None:
    n = 17
    codes = [["X" if i == j else "NV1" for j in range(n)] for i in range(n)]
    big = folder / "big.json"
    big.write_text(json.dumps({"name": "big", "gpus": [{"index": i} for i in range(n)], "links": codes}))
    proc = plugin(
        "--kubelet-dir", str(folder), "--topology", str(big), "--metrics-port", "0", "--publish", "false"
    )
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    last = err.decode().splitlines()[-1]
    assert last.startswith("deviceplugin: error: topology:") and "16" in last
    assert "Traceback" not in err.decode()
    assert not (folder / settings.SOCKET_NAME).exists()


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"version: v1\nlogLevel: \xff\xfe\n", "not UTF-8"),
        (b"version: v1\nlogLevel: " + b"[" * 5000 + b"\n", "nested too deeply"),
        (b'version: v1\nkubeletDir: "/tmp/a\\0b"\n', "NUL"),
    ],
    ids=["not-utf8", "deep-nesting", "nul-in-path"],
)
def test_unreadable_config_file_exits_2_with_one_line(folder: Path, content: bytes, fragment: str) -> None:
    path = folder / "c.yaml"
    path.write_bytes(content)
    proc = plugin("--config", str(path), "--topology", "rtx8000-4", "--metrics-port", "0")
    _, err = proc.communicate(timeout=20)
    text = err.decode(errors="replace")
    assert proc.returncode == 2, text
    assert "Traceback" not in text
    lines = text.splitlines()
    assert len(lines) == 1 and lines[0].startswith("deviceplugin: error: config file "), lines
    assert fragment in lines[0]


def test_relative_kubelet_dir_is_served_and_registered(folder: Path) -> None:
    """`--kubelet-dir some/dir` is relative to the working directory, like every other path."""
    sock = folder / settings.SOCKET_NAME
    with fake_kubelet(folder) as kubelet:
        proc = subprocess.Popen(
            [sys.executable, "-m", "deviceplugin", "--kubelet-dir", folder.name, "--topology", "rtx8000-4",
             "--metrics-port", "0"],
            cwd=folder.parent, env=CLEAN_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            assert kubelet.wait(1, 20) is not None, kubelet.refusals
            assert fetch_status(str(sock), 2)["kubelet_dir"] == str(folder)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
            _, err = proc.communicate()
        assert "Traceback" not in err.decode()
    assert not sock.exists()


def test_topology_with_a_reserved_uuid_exits_2(folder: Path) -> None:
    """'*' means 'every GPU' in health events; a topology file naming a GPU so is a bad value."""
    doc = load_preset("rtx8000-4").to_dict()
    doc["gpus"][1]["uuid"] = "*"
    bad = folder / "topo.json"
    bad.write_text(json.dumps(doc))
    proc = plugin("--kubelet-dir", str(folder), "--topology", str(bad), "--metrics-port", "0")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2, err.decode()
    last = err.decode().splitlines()[-1]
    assert last.startswith("deviceplugin: error: topology:") and "reserved" in last
    assert not (folder / settings.SOCKET_NAME).exists()


def test_version() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "deviceplugin", "--version"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and out.stdout.strip() == "python -m deviceplugin 0.1.0"
