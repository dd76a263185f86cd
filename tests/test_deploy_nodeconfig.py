"""deploy/: the per-node ConfigMap is mounted where the plugin looks, and every config in the
example is one the plugin accepts (so labelling a node with any of its names cannot crash-loop)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from deviceplugin.nodeconfig import resolve
from deviceplugin.settings import load_config, read_config_file
from tests.test_deploy_manifests import K8S_VERSIONS, container, one, render
from tests.test_plugin_nodeconfig import mounted

kv = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is not installed (pip install .[dev])"
)

EXAMPLE = Path(__file__).resolve().parent.parent / "deploy" / "examples" / "node-configs.yaml"


def example() -> dict:
    (doc,) = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    return doc


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_example_configmap_is_valid_kubernetes(version: str) -> None:
    kv.validate(example(), version, strict=True)


def test_the_daemonset_mounts_the_configmap_at_the_plugins_config_dir() -> None:
    ds = one(render(""), "DaemonSet", "gputopo-device-plugin")
    spec = ds["spec"]["template"]["spec"]
    plugin = container(spec, "device-plugin")
    env = {e["name"]: e.get("value") for e in plugin["env"]}
    config_dir = load_config(
        [], {**{k: v for k, v in env.items() if v is not None}, "NODE_NAME": "n"}
    ).config_dir
    mount = next(m for m in plugin["volumeMounts"] if m["mountPath"] == config_dir)
    assert mount.get("readOnly") is True
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    cm = example()
    assert volume["configMap"]["name"] == cm["metadata"]["name"]
    assert cm["metadata"]["namespace"] == ds["metadata"]["namespace"]
    assert volume["configMap"]["optional"] is True, "without the ConfigMap the plugin runs on flags and env"


def test_every_example_config_is_accepted_and_selectable(tmp_path: Path) -> None:
    configs = example()["data"]
    assert "default" in configs
    root = mounted(tmp_path, configs)
    for name in configs:
        read_config_file(str(root / name))  # raises ConfigError on anything the plugin refuses
        first = load_config([], {"GPUTOPO_CONFIG_DIR": str(root), "NODE_NAME": "n"})
        args, chosen, _ = resolve([], {}, first, lambda node, label, kc, name=name: name)
        assert chosen == name
        load_config(args, {"GPUTOPO_CONFIG_DIR": str(root)})
