"""NVIDIA's device list strategies and device specs, each on the Allocate response as kubelet
receives it over the plugin's unix socket."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deviceplugin.config import ConfigError, load_config
from deviceplugin.strategies import STRATEGIES, parse_strategies
from gputopo.node.topofile import load_preset
from gputopo_proto.deviceplugin.v1beta1 import api_pb2
from tests.kubelet_fake import fake_kubelet, plugin_channel, running_daemon, short_tmpdir

PRESET = "rtx8000-4"
IDS = [g.uuid for g in load_preset(PRESET).gpus]
# CDI AnnotationKey: prefix, then plugin name + "_" + ID, at most 63 characters, alphanumeric
# at both ends, only [-_.] and alphanumerics inside
ANNOTATION_KEY = re.compile(
    r"^cdi\.k8s\.io/(?=.{1,63}$)gputopo-device-plugin_[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}$"
)


@contextmanager
def allocate(
    containers: list[list[str]], **settings: object
) -> Iterator[list[api_pb2.ContainerAllocateResponse]]:
    folder = short_tmpdir()
    try:
        with fake_kubelet(folder) as kubelet, running_daemon(folder, PRESET, **settings):
            assert kubelet.wait(1) is not None, kubelet.refusals
            with plugin_channel(folder / "gputopo-gpu.sock") as stub:
                req = api_pb2.AllocateRequest(
                    container_requests=[
                        api_pb2.ContainerAllocateRequest(devices_ids=ids) for ids in containers
                    ]
                )
                yield list(stub.Allocate(req, timeout=5).container_responses)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_envvar_is_the_default() -> None:
    with allocate([[IDS[2], IDS[1]]]) as [c]:
        assert dict(c.envs) == {"NVIDIA_VISIBLE_DEVICES": f"{IDS[1]},{IDS[2]}"}
        assert not c.mounts and not c.cdi_devices and not c.annotations and not c.devices


def test_volume_mounts_pass_one_dev_null_mount_per_gpu() -> None:
    with allocate([[IDS[3], IDS[0]]], device_list_strategy="volume-mounts") as [c]:
        assert dict(c.envs) == {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}
        assert [(m.container_path, m.host_path, m.read_only) for m in c.mounts] == [
            (f"/var/run/nvidia-container-devices/{IDS[0]}", "/dev/null", True),
            (f"/var/run/nvidia-container-devices/{IDS[3]}", "/dev/null", True),
        ]
        assert not c.cdi_devices and not c.annotations


def test_cdi_annotations_use_the_cdi_annotation_key_format() -> None:
    with allocate([[IDS[1], IDS[2]], [IDS[0]]], device_list_strategy="cdi-annotations") as [a, b]:
        [(key_a, value_a)] = a.annotations.items()
        [(key_b, value_b)] = b.annotations.items()
        assert ANNOTATION_KEY.match(key_a) and ANNOTATION_KEY.match(key_b), (key_a, key_b)
        assert key_a != key_b  # unique per allocation, as CDI requires
        assert value_a == f"nvidia.com/gpu={IDS[1]},nvidia.com/gpu={IDS[2]}"
        assert value_b == f"nvidia.com/gpu={IDS[0]}"
        assert not a.envs and not a.cdi_devices


def test_cdi_annotation_prefix_is_configurable() -> None:
    with allocate(
        [[IDS[0]]], device_list_strategy="cdi-annotations", cdi_annotation_prefix="cdi.example.org/"
    ) as [c]:
        [key] = c.annotations
        assert key.startswith("cdi.example.org/gputopo-device-plugin_")


@pytest.mark.parametrize("name", ["cdi-cri", "cdi"])
def test_cdi_cri_names_cdi_devices(name: str) -> None:
    with allocate([[IDS[2], IDS[1]]], device_list_strategy=name) as [c]:
        assert [d.name for d in c.cdi_devices] == [f"nvidia.com/gpu={IDS[1]}", f"nvidia.com/gpu={IDS[2]}"]
        assert not c.envs and not c.annotations


def test_strategies_combine() -> None:
    with allocate([[IDS[3]]], device_list_strategy="cdi-cri,envvar,cdi-annotations") as [c]:
        assert c.envs["NVIDIA_VISIBLE_DEVICES"] == IDS[3]
        assert [d.name for d in c.cdi_devices] == [f"nvidia.com/gpu={IDS[3]}"]
        assert list(c.annotations.values()) == [f"nvidia.com/gpu={IDS[3]}"]


def test_device_specs_list_the_cards_and_the_control_devices_present(tmp_path: Path) -> None:
    """As NVIDIA's --pass-device-specs: each GPU's /dev/nvidia<minor> and the control devices
    that exist under the driver root (here nvidiactl and nvidia-uvm, not uvm-tools/modeset)."""
    root = tmp_path / "driver"
    (root / "dev").mkdir(parents=True)
    for name in ("nvidiactl", "nvidia-uvm"):
        (root / "dev" / name).touch()
    with allocate(
        [[IDS[2], IDS[1]]],
        pass_device_specs=True,
        nvidia_driver_root=str(root),
        device_list_strategy="envvar",
    ) as [c]:
        specs = [(d.container_path, d.host_path, d.permissions) for d in c.devices]
        assert specs == [
            ("/dev/nvidia1", f"{root}/dev/nvidia1", "rw"),
            ("/dev/nvidia2", f"{root}/dev/nvidia2", "rw"),
            ("/dev/nvidiactl", f"{root}/dev/nvidiactl", "rw"),
            ("/dev/nvidia-uvm", f"{root}/dev/nvidia-uvm", "rw"),
        ]
        assert c.envs["NVIDIA_VISIBLE_DEVICES"] == f"{IDS[1]},{IDS[2]}"


def test_settings_from_flags_env_and_file(tmp_path: Path) -> None:
    cfg = load_config(["--device-list-strategy", "cdi-cri, envvar", "--pass-device-specs"], {})
    assert cfg.device_list_strategy == "envvar,cdi-cri" and cfg.pass_device_specs is True
    cfg = load_config(
        [], {"GPUTOPO_DEVICE_LIST_STRATEGY": "cdi", "GPUTOPO_NVIDIA_DRIVER_ROOT": "/run/nvidia/driver"}
    )
    assert cfg.device_list_strategy == "cdi-cri" and cfg.nvidia_driver_root == "/run/nvidia/driver"
    f = tmp_path / "plugin.yaml"
    f.write_text("version: v1\ndeviceListStrategy: [volume-mounts, cdi-annotations]\npassDeviceSpecs: true\n")
    cfg = load_config(["--config", str(f)], {})
    assert cfg.device_list_strategy == "volume-mounts,cdi-annotations" and cfg.pass_device_specs


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("volume", "unknown strategy 'volume'"),
        ("", "at least one"),
        (" , ", "at least one"),
        ("envvar,volume-mounts", "choose one"),
        ("envvar,x" + "y" * 500, "unknown strategy"),
    ],
)
def test_bad_strategies_are_config_errors(value: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason) as info:
        load_config(["--device-list-strategy", value], {})
    assert len(str(info.value)) < 200
    with pytest.raises(ValueError, match=reason):
        parse_strategies(value)


def test_bad_annotation_prefix_is_a_config_error() -> None:
    for bad in ("cdi.k8s.io", "/", "UPPER/", "a b/"):
        with pytest.raises(ConfigError, match="cdi-annotation-prefix"):
            load_config(["--cdi-annotation-prefix", bad], {})


@settings(max_examples=300)
@given(
    value=st.one_of(
        st.text(max_size=60),
        st.lists(st.sampled_from([*STRATEGIES, "cdi", "x", "", " envvar "]), max_size=6).map(",".join),
        st.lists(st.text(max_size=12), max_size=5),
        st.integers(),
        st.none(),
    )
)
def test_parse_strategies_is_total(value: object) -> None:
    """Any value gives a canonical, non-empty, duplicate-free tuple or a ValueError."""
    try:
        out = parse_strategies(value)
    except ValueError as e:
        assert len(str(e)) < 300
        return
    assert out and len(set(out)) == len(out) and set(out) <= set(STRATEGIES)
    assert list(out) == sorted(out, key=STRATEGIES.index)
    assert not {"envvar", "volume-mounts"} <= set(out)
