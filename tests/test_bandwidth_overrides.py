"""Per-node bandwidth figures (design.md §1): flag > env > file, applied to the topology."""

from __future__ import annotations

import subprocess
import sys

import pytest

from deviceplugin.hardware.filebackend import FileBackend
from deviceplugin.settings import ConfigError, load_config
from gputopo.node.allocator import Allocator


def test_flags_env_and_file_layer(tmp_path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("version: v1\nnvlinkGbpsPerLink: 40\npcieGbps: {PIX: 30, sys: 8}\n")
    c = load_config(["--config", str(cfg)], {})
    assert c.bandwidth is not None
    assert c.bandwidth.nvlink_gbps_per_link == 40 and c.bandwidth.pcie_gbps == {"PIX": 30.0, "SYS": 8.0}
    c = load_config(["--config", str(cfg), "--pcie-gbps", "NODE=10"], {"GPUTOPO_NVLINK_GBPS_PER_LINK": "50"})
    assert c.bandwidth.nvlink_gbps_per_link == 50 and c.bandwidth.pcie_gbps == {"NODE": 10.0}
    assert load_config([], {}).bandwidth is None


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["--pcie-gbps", "PIX=x"], "PIX: must be a positive number"),
        (["--pcie-gbps", "QPI=3"], "unknown PCIe level"),
        (["--pcie-gbps", "PIX"], "must look like"),
        (["--nvlink-gbps-per-link", "0"], "positive number"),
    ],
)
def test_bad_values_are_config_errors(argv: list[str], why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        load_config(argv, {})


def test_file_backend_applies_overrides_and_changes_decisions() -> None:
    # a100 NVLink-bridged pairs: 12 links x 1 GB/s = 12 GB/s is slower than PIX at 24
    plain = FileBackend("a100-pcie-nvlink-pairs").discover()
    config = load_config(["--nvlink-gbps-per-link", "1", "--pcie-gbps", "SYS=30"], {})
    slow = FileBackend("a100-pcie-nvlink-pairs", settings=config.bandwidth).discover()
    assert slow.gbps(0, 2) == 12.0 and plain.gbps(0, 2) == 300.0
    assert slow.gbps(0, 1) == 30.0 and slow.settings.pcie_gbps["PIX"] == 24.0
    assert Allocator(plain).choose(range(8), 2).indices == (0, 2)
    assert Allocator(slow).choose(range(8), 2).indices != (0, 2)


def test_bad_override_flag_exits_2_with_one_line() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "deviceplugin", "--topology", "dgx1-v100", "--pcie-gbps", "PIX=-1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "--pcie-gbps" in out.stderr
