"""Per-node settings from one ConfigMap keyed by a node label (`--config-dir`), as NVIDIA's
config manager does: which config is chosen, how it layers, and how bad names fail."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from deviceplugin.config import ConfigError, load_config
from deviceplugin.nodeconfig import api_label, config_names, resolve
from gputopo.network.annotation import decode
from gputopo_proto.podresources.v1 import api_pb2_grpc as pr_grpc
from tests import fake_apiserver as fk
from tests.kubelet_fake import eventually, fake_kubelet, short_tmpdir
from tests.test_plugin_publish import PodResources, annotation, kubeconfig

REPO = Path(__file__).resolve().parent.parent
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("GPUTOPO_") and k != "NODE_NAME"}
CONFIGS = {
    "default": "version: v1\nlogLevel: warning\n",
    "h100-nvl": "version: v1\nnvlinkGbpsPerLink: 50\npolicy: best-effort-pairs\nlogLevel: debug\n",
    "pcie-gen4": "version: v1\npcieGbps: {PIX: 24, SYS: 10}\npolicy: best-combo\n",
}


def mounted(folder: Path, configs: dict[str, str]) -> Path:
    """A folder laid out as kubelet mounts a ConfigMap: files behind ..data symlinks."""
    root = folder / "configs"
    data = root / "..2026_12_01_00_00_00.000000001"
    data.mkdir(parents=True)
    for name, text in configs.items():
        (data / name).write_text(text)
    (root / "..data").symlink_to(data.name)
    for name in configs:
        (root / name).symlink_to(f"..data/{name}")
    return root


def settle(argv: list[str], env: dict[str, str], labels: dict[str, str]):
    """What the plugin would run with: first pass, node config, second pass (main()'s steps)."""
    calls: list[tuple[str, str]] = []

    def lookup(node: str, label: str, kubeconfig: str | None) -> str | None:
        calls.append((node, label))
        return labels.get(label)

    first = load_config(argv, env)
    args, name, how = resolve(argv, env, first, lookup)
    return (load_config(args, env) if name else first), name, how, calls


def test_the_node_label_picks_the_named_config(tmp_path: Path) -> None:
    root = mounted(tmp_path, CONFIGS)
    assert config_names(str(root)) == sorted(CONFIGS)
    cfg, name, how, calls = settle(
        ["--config-dir", str(root)], {"NODE_NAME": "gpu-7"}, {"gputopo.io/config": "h100-nvl"}
    )
    assert (name, calls) == ("h100-nvl", [("gpu-7", "gputopo.io/config")])
    assert "label gputopo.io/config of node gpu-7" in how
    assert cfg.policy == "best-effort-pairs" and cfg.nvlink_gbps_per_link == 50 and cfg.log_level == "debug"
    # another label key, as a flag
    cfg, name, _, _ = settle(
        ["--config-dir", str(root), "--node-config-label", "example.com/gpu-profile"],
        {"NODE_NAME": "gpu-7"},
        {"example.com/gpu-profile": "pcie-gen4", "gputopo.io/config": "h100-nvl"},
    )
    assert (
        name == "pcie-gen4" and cfg.policy == "best-combo" and cfg.pcie_gbps == (("PIX", 24.0), ("SYS", 10.0))
    )


def test_flags_and_env_beat_the_selected_config(tmp_path: Path) -> None:
    root = mounted(tmp_path, CONFIGS)
    env = {"NODE_NAME": "gpu-7", "GPUTOPO_CONFIG_DIR": str(root), "GPUTOPO_LOG_LEVEL": "error"}
    cfg, name, _, _ = settle(["--policy", "gputopo"], env, {"gputopo.io/config": "h100-nvl"})
    assert name == "h100-nvl"
    assert cfg.policy == "gputopo"  # flag
    assert cfg.log_level == "error"  # env
    assert cfg.nvlink_gbps_per_link == 50  # the node's config


def test_an_explicit_name_needs_no_api_call(tmp_path: Path) -> None:
    root = mounted(tmp_path, CONFIGS)
    cfg, name, how, calls = settle(
        ["--config-dir", str(root)], {"NODE_NAME": "gpu-7", "GPUTOPO_NODE_CONFIG": "pcie-gen4"}, {}
    )
    assert (name, how, calls, cfg.policy) == ("pcie-gen4", "--node-config", [], "best-combo")


@pytest.mark.parametrize(
    ("configs", "env", "labels", "want"),
    [
        (CONFIGS, {"NODE_NAME": "n"}, {}, "default"),  # unlabelled node: `default`
        (CONFIGS, {}, {}, "default"),  # no node name: no lookup, `default`
        ({"only": CONFIGS["h100-nvl"]}, {"NODE_NAME": "n"}, {}, "only"),  # NVIDIA's `single` fallback
        ({"a": CONFIGS["default"], "b": CONFIGS["default"]}, {"NODE_NAME": "n"}, {}, None),  # none applies
        ({}, {"NODE_NAME": "n"}, {"gputopo.io/config": "x"}, None),  # empty ConfigMap: nothing to pick
    ],
)
def test_fallbacks(tmp_path: Path, configs, env, labels, want) -> None:
    root = mounted(tmp_path, configs)
    cfg, name, _, calls = settle(["--config-dir", str(root)], env, labels)
    assert name == want
    if not configs or "NODE_NAME" not in env:
        assert calls == []
    if want is None:
        assert cfg.policy == "gputopo" and cfg.log_level == "info"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.one_of(st.text(max_size=300), st.sampled_from([*CONFIGS, "..data", ".", "../x", "default/"])))
@example(value="\x00" * 300)  # escapes to four characters each: the message stays bounded
@example(value="\U0001f600" * 300)  # ten each
def test_any_label_value_picks_a_config_or_is_a_config_error(tmp_path: Path, value: str) -> None:
    """The label is another party's input: it selects a listed config or fails in one line."""
    root = tmp_path / "cm"
    if not root.exists():
        mounted(tmp_path / "cm-src", CONFIGS).rename(root)
    try:
        _, name, _, _ = settle(["--config-dir", str(root)], {"NODE_NAME": "n"}, {"gputopo.io/config": value})
    except ConfigError as e:
        assert "\n" not in str(e) and len(str(e)) < 400 and value not in CONFIGS
        return
    assert name in CONFIGS and (name == value or not value)


def test_a_missing_config_dir_is_no_config(tmp_path: Path) -> None:
    _, name, how, calls = settle(["--config-dir", str(tmp_path / "absent")], {"NODE_NAME": "n"}, {})
    assert (name, calls) == (None, []) and "holds no config" in how


@pytest.mark.parametrize(
    ("argv", "env", "labels", "fragment"),
    [
        ([], {"NODE_NAME": "n"}, {"gputopo.io/config": "a100"}, "node config 'a100'"),
        ([], {"GPUTOPO_NODE_CONFIG": "nope"}, {}, "known: default, h100-nvl, pcie-gen4"),
        (["--config", "FILE"], {}, {}, "exclude each other"),
        ([], {"GPUTOPO_CONFIG": "FILE"}, {}, "exclude each other"),
    ],
)
def test_bad_names_are_one_line_config_errors(tmp_path: Path, argv, env, labels, fragment) -> None:
    root = mounted(tmp_path, CONFIGS)
    file = tmp_path / "c.yaml"
    file.write_text("version: v1\n")
    argv = [str(file) if a == "FILE" else a for a in argv]
    env = {k: str(file) if v == "FILE" else v for k, v in env.items()}
    with pytest.raises(ConfigError) as e:
        settle(["--config-dir", str(root), *argv], env, labels)
    assert fragment in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("version: v1\nnodeConfig: other\n", "node_config cannot be set inside a node config"),
        ("version: v1\npolicy: spread\n", "policy"),
        ("version: v2\n", "'version' must be 'v1'"),
        ("version: v1\nmetricPort: 1\n", "unknown key"),
    ],
)
def test_a_bad_selected_config_is_a_config_error(tmp_path: Path, text: str, fragment: str) -> None:
    root = mounted(tmp_path, {"default": text})
    with pytest.raises(ConfigError) as e:
        settle(["--config-dir", str(root)], {}, {})
    assert fragment in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--node-config-label", "not a label"), ("--node-config-label", "a/b/c"), ("--node-config", "../etc")],
)
def test_bad_selection_settings(flag: str, value: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        load_config([flag, value], {})


def test_the_label_is_read_through_the_api_server(tmp_path: Path) -> None:
    with fk.running() as (api, server, _):
        api.put("nodes", fk.node("gpu-7", {"gputopo.io/config": "h100-nvl"}))
        cfg = str(kubeconfig(tmp_path / "kubeconfig", server.url))
        assert api_label("gpu-7", "gputopo.io/config", cfg) == "h100-nvl"
        assert api_label("gpu-7", "example.com/other", cfg) is None
        assert ("get:nodes", "gpu-7") in api.requests
        from deviceplugin.nodeconfig import NodeConfigUnavailable

        with pytest.raises(NodeConfigUnavailable, match="cannot read node gpu-8's labels"):
            api_label("gpu-8", "gputopo.io/config", cfg)


# ------------------------------------------------------------------ the process


@pytest.fixture
def folder() -> Iterator[Path]:
    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def plugin(folder: Path, *args: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "deviceplugin", "--kubelet-dir", str(folder), "--topology", "dgx1-v100",
         "--metrics-port", "0", *args],
        cwd=REPO, env={**CLEAN_ENV, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip


def test_the_plugin_runs_its_nodes_config_and_publishes_it(folder: Path) -> None:
    """Label -> named config -> policy and NVLink speed -> the node's annotation."""
    root = mounted(folder, CONFIGS)
    pods = PodResources()
    pr_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pr_grpc.add_PodResourcesListerServicer_to_server(pods, pr_server)
    pr_server.add_insecure_port(f"unix://{folder / 'pr.sock'}")
    pr_server.start()
    try:
        with fk.running() as (api, server, _), fake_kubelet(folder) as kubelet:
            api.put("nodes", fk.node("gpu-7", {"gputopo.io/config": "h100-nvl"}))
            cfg = kubeconfig(folder / "kubeconfig", server.url)
            proc = plugin(
                folder, "--publish", "true", "--kubeconfig", str(cfg), "--pod-resources-socket",
                str(folder / "pr.sock"), env={"NODE_NAME": "gpu-7", "GPUTOPO_CONFIG_DIR": str(root)},
            )  # fmt: skip
            try:
                assert kubelet.wait(1, 20) is not None
                assert eventually(lambda: annotation(api, "gpu-7") is not None, timeout=15)
                value = decode(annotation(api, "gpu-7"), now=time.time(), max_age_s=3600)
                assert value.policy == "best-effort-pairs"
                assert value.topology.settings.nvlink_gbps_per_link == 50
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(10) == 0
            finally:
                if proc.poll() is None:
                    proc.kill()
                proc.communicate()
    finally:
        pr_server.stop(0)


def test_an_unknown_node_config_exits_2_and_an_unreachable_api_exits_1(folder: Path) -> None:
    root = mounted(folder, CONFIGS)
    with fk.running() as (api, server, _):
        api.put("nodes", fk.node("gpu-7", {"gputopo.io/config": "a100-old"}))
        cfg = kubeconfig(folder / "kubeconfig", server.url)
        proc = plugin(
            folder, "--kubeconfig", str(cfg), env={"NODE_NAME": "gpu-7", "GPUTOPO_CONFIG_DIR": str(root)}
        )
        _, err = proc.communicate(timeout=30)
        lines = err.decode().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, err.decode()
        assert "node config 'a100-old'" in lines[0] and "known: default, h100-nvl, pcie-gen4" in lines[0]
    proc = plugin(
        folder,
        "--kubeconfig",
        str(folder / "missing"),
        env={"NODE_NAME": "gpu-7", "GPUTOPO_CONFIG_DIR": str(root)},
    )
    _, err = proc.communicate(timeout=30)
    lines = err.decode().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, err.decode()
    assert "per-node config: cannot read node gpu-7's labels" in lines[0]
    assert not (folder / "gputopo-gpu.sock").exists()
