"""The `gputopo` CLI as a user runs it: real subprocesses, exit codes, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml


def gputopo(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gputopo", *args], capture_output=True, text=True, timeout=60, cwd=cwd
    )


def test_topo_prints_matrix_with_bandwidth_and_numa() -> None:
    out = gputopo("topo", "--topology", "dgx1-v100")
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines() if line.startswith("GPU")}
    assert rows["GPU0"][1:9] == ["X", "NV1/25", "NV1/25", "NV2/50", "NV2/50", "SYS/6", "SYS/6", "SYS/6"]
    assert rows["GPU7"][9] == "1"  # NUMA column


def test_topo_json_is_machine_readable() -> None:
    out = gputopo("topo", "--topology", "hgx-h100", "--json")
    doc = json.loads(out.stdout)
    assert doc["nvswitch"] is True
    assert doc["bandwidth_gbps"][0][7] == 450.0
    assert doc["best_ring_gbps"]["8"] == 450.0


def test_prefer_explains_choice_and_alternatives() -> None:
    out = gputopo("prefer", "--topology", "dgx1-v100", "--size", "2", "--available", "0,1,2,4,5", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["chosen"]["gpus"] == [0, 4]  # an NV2 pair, lowest indices among equals
    assert doc["chosen"]["ring_gbps"] == 50.0
    assert doc["alternatives"][0]["gpus"] == [0, 4]
    rings = [a["ring_gbps"] for a in doc["alternatives"]]
    assert rings == sorted(rings, reverse=True)


def test_prefer_accepts_uuids_and_must() -> None:
    topo = json.loads(gputopo("topo", "--topology", "a100-pcie-nvlink-pairs", "--json").stdout)
    uuid6 = topo["gpus"][6]["uuid"]
    out = gputopo("prefer", "--topology", "a100-pcie-nvlink-pairs", "--size", "2", "--must", uuid6, "--json")
    assert json.loads(out.stdout)["chosen"]["gpus"] == [6, 7]


@pytest.mark.parametrize(
    "args",
    [
        ("prefer", "--topology", "dgx1-v100", "--size", "9"),
        ("prefer", "--topology", "dgx1-v100", "--size", "0"),
        ("prefer", "--topology", "dgx1-v100", "--size", "2", "--available", "0,0,1"),
        ("prefer", "--topology", "dgx1-v100", "--size", "2", "--available", "0,1", "--must", "5"),
        ("prefer", "--topology", "dgx1-v100", "--size", "2", "--available", "GPU-nope"),
        ("prefer", "--topology", "no-such-preset", "--size", "1"),
        ("prefer", "--size", "two"),
        ("topo", "--topology", "/nonexistent/file.json"),
        # NaN passed the `<= 0` check and gave up at once ("no answer within nans", exit 1)
        ("status", "--socket", "/nonexistent/p.sock", "--timeout", "nan"),
        ("status", "--socket", "/nonexistent/p.sock", "--timeout", "inf"),
        # str.isdigit() is true for these, int() is not (was a ValueError traceback)
        ("prefer", "--topology", "dgx1-v100", "--size", "1", "--available", "\u00b2"),
        ("prefer", "--topology", "dgx1-v100", "--size", "1", "--must", "\u2460"),
        ("frobnicate",),
    ],
)
def test_bad_input_is_one_line_exit_2(args: tuple[str, ...]) -> None:
    out = gputopo(*args)
    assert out.returncode == 2
    assert out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and out.stderr.startswith("gputopo: error:")
    assert "Traceback" not in out.stderr


def test_empty_topology_is_an_error_not_nvml() -> None:
    """`--topology "$UNSET_VAR"` must not quietly read this machine's GPUs instead."""
    out = gputopo("topo", "--topology", "")
    assert out.returncode == 2 and "empty topology source" in out.stderr and "NVML" not in out.stderr


@pytest.mark.parametrize("command", [("topo",), ("topo", "--json"), ("prefer", "--size", "2")])
def test_a_node_too_large_for_the_allocator_is_exit_2(tmp_path, command: tuple[str, ...]) -> None:
    """17 GPUs is a valid topology file but more than the allocator takes (was a traceback)."""
    n = 17
    big = tmp_path / "big.json"
    codes = [["X" if i == j else "NV1" for j in range(n)] for i in range(n)]
    big.write_text(json.dumps({"gpus": [{"index": i} for i in range(n)], "links": codes}))
    out = gputopo(*command, "--topology", str(big))
    assert out.returncode == 2 and out.stdout == "", out.stderr
    assert out.stderr.startswith("gputopo: error: --topology") and "more than 16 GPUs" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_bad_topology_file_is_exit_2(tmp_path) -> None:
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps({"gpus": [{"index": 0}, {"index": 1}], "links": [["X", "NV1"], ["SYS", "X"]]}))
    out = gputopo("topo", "--topology", str(bad))
    assert out.returncode == 2 and "asymmetric" in out.stderr


def test_status_without_plugin_is_a_clear_failure(tmp_path) -> None:
    """Off a GPU node (no socket), beside a plain file, or on a socket nobody serves: exit 1 and
    one line that names the path and says which, never gRPC's own text."""
    import socket as sk

    path = tmp_path / "none.sock"
    plain = tmp_path / "file.sock"
    plain.write_text("")
    dead = tmp_path / "dead.sock"
    left = sk.socket(sk.AF_UNIX, sk.SOCK_STREAM)
    left.bind(str(dead))  # bound, never listening: what a killed plugin leaves behind
    try:
        for where, expect in (
            (path, f"gputopo: no plugin socket at {path} (not a GPU node running the gputopo device plugin?"),
            (plain, f"gputopo: {plain} is not a socket"),
            (dead, f"gputopo: no plugin answers at {dead}"),
        ):
            out = gputopo("status", "--socket", str(where), "--timeout", "0.5")
            assert out.returncode == 1 and out.stdout == ""
            lines = out.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith(expect), out.stderr
            assert "UNAVAILABLE" not in out.stderr and "FAILED_PRECONDITION" not in out.stderr
    finally:
        left.close()


def test_status_reads_the_running_plugin(tmp_path) -> None:
    """`gputopo status` against a real plugin process (no kubelet: it serves, not registered)."""
    import os
    import time

    folder = tmp_path / "dp"
    folder.mkdir()
    plugin = subprocess.Popen(
        [sys.executable, "-m", "deviceplugin", "--kubelet-dir", str(folder), "--topology", "rtx8000-4",
         "--metrics-port", "0", "--publish", "false"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not any(p.name.endswith(".sock") for p in folder.iterdir()):
            assert time.monotonic() < deadline, "plugin never served its socket"
            time.sleep(0.1)
        out = gputopo("status", "--kubelet-dir", str(folder), "--json")
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        assert [d["index"] for d in doc["devices"]] == [0, 1, 2, 3]
        assert all(d["healthy"] for d in doc["devices"])
        assert doc["registration"]["registered"] is False
        # a relative path is relative to the working directory (gRPC read `unix://dp/...`
        # as a host name and failed with C-core log lines on stderr)
        rel = gputopo("status", "--kubelet-dir", "dp", "--json", cwd=str(tmp_path))
        assert rel.returncode == 0 and rel.stderr == "" and json.loads(rel.stdout) == doc
        text = gputopo("status", "--kubelet-dir", str(folder))
        assert text.returncode == 0 and "registered: no" in text.stdout
        assert "plugin version: 0.1.0" in text.stdout and doc["version"] == "0.1.0"
        yml = gputopo("status", "--kubelet-dir", str(folder), "-o", "yaml")
        assert yml.returncode == 0 and yaml.safe_load(yml.stdout)["devices"] == doc["devices"]
        rows = [line.split() for line in text.stdout.splitlines() if line.startswith("  ") and "GPU-" in line]
        assert [r[:2] for r in rows] == [
            ["0", "Healthy"],
            ["1", "Healthy"],
            ["2", "Healthy"],
            ["3", "Healthy"],
        ]
    finally:
        plugin.terminate()
        plugin.wait(timeout=10)
    assert not os.path.exists(folder / "gputopo-gpu.sock")


def test_single_gpu_node_says_there_is_no_ring(tmp_path) -> None:
    one = tmp_path / "one.json"
    one.write_text(json.dumps({"name": "one", "gpus": [{"index": 0}], "links": [["X"]]}))
    out = gputopo("topo", "--topology", str(one))
    assert out.returncode == 0 and "a single GPU has no ring" in out.stdout
    out = gputopo("prefer", "--topology", str(one), "--size", "1")
    assert out.returncode == 0 and "one GPU: no ring" in out.stdout


def test_topology_error_names_the_file_once(tmp_path) -> None:
    bad = tmp_path / "g.json"
    bad.write_text('{"gpus": 5}')
    out = gputopo("topo", "--topology", str(bad))
    assert out.returncode == 2 and out.stderr.count(str(bad)) == 1


@pytest.mark.parametrize("command", [(), ("topo",), ("prefer",), ("presets",), ("simulate",), ("status",)])
def test_every_command_says_its_version(command: tuple[str, ...]) -> None:
    out = gputopo(*command, "--version")
    assert out.returncode == 0 and out.stdout.strip().endswith("0.1.0"), out.stderr
    assert out.stdout.startswith(" ".join(("gputopo", *command)))


def test_output_formats_agree_and_json_is_an_alias() -> None:
    as_json = json.loads(gputopo("prefer", "--topology", "dgx1-v100", "--size", "2", "-o", "json").stdout)
    alias = json.loads(gputopo("prefer", "--topology", "dgx1-v100", "--size", "2", "--json").stdout)
    as_yaml = yaml.safe_load(gputopo("prefer", "--topology", "dgx1-v100", "--size", "2", "-o", "yaml").stdout)
    assert as_json == alias == as_yaml and as_json["chosen"]["gpus"] == [0, 3]
    wide = gputopo("prefer", "--topology", "dgx1-v100", "--size", "2", "-o", "wide").stdout
    assert "GPU-dgx1-v100-0 GPU-dgx1-v100-3" in wide or "uuids" in wide
    presets = gputopo("presets", "-o", "wide").stdout
    assert any(line.startswith("gb200-tray") and "50 GB/s/link" in line for line in presets.splitlines())
    bad = gputopo("topo", "--topology", "dgx1-v100", "-o", "xml")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "invalid choice" in bad.stderr


def test_topo_keeps_the_nic_and_affinity_columns_of_topo_m_text() -> None:
    source = str(Path(__file__).parent / "data" / "topo_text" / "dgx1-v100-4nic.txt")
    out = gputopo("topo", "--topology", source)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    # one row would pass 120 columns: the per-GPU columns get a table of their own below the matrix
    assert max(len(line) for line in lines) <= 120
    header = next(k for k, line in enumerate(lines) if line.lstrip().startswith("NIC0"))
    assert (
        lines[header].split()[:5] == ["NIC0", "NIC1", "NIC2", "NIC3", "NUMA"] and "Affinity" in lines[header]
    )
    gpu4 = next(line.split() for line in lines[header:] if line.startswith("GPU4"))
    assert gpu4[1:5] == ["SYS", "SYS", "PIX", "PHB"] and gpu4[5:8] == ["1", "20-39,60-79", "1"]
    matrix = next(line.split() for line in lines if line.startswith("GPU4"))
    assert matrix[1:9] == ["NV2/50", "SYS/6", "SYS/6", "SYS/6", "X", "NV1/25", "NV1/25", "NV2/50"]
    wide = gputopo("topo", "--topology", source, "-o", "wide").stdout.splitlines()
    row = next(line.split() for line in wide if line.startswith("GPU4"))
    assert row[9:13] == ["SYS", "SYS", "PIX", "PHB"] and row[13:16] == ["1", "20-39,60-79", "1"]  # one row
    assert "NICs: NIC0=mlx5_0, NIC1=mlx5_1, NIC2=mlx5_2, NIC3=mlx5_3" in lines
    doc = json.loads(gputopo("topo", "--topology", source, "-o", "json").stdout)
    assert doc["nics"][2] == {
        "label": "NIC2",
        "device": "mlx5_2",
        "links": ["SYS"] * 4 + ["PIX", "PIX", "PHB", "PHB"],
    }
    assert doc["affinity"][7] == {"CPU Affinity": "20-39,60-79", "NUMA Affinity": "1"}
    assert "nics" not in json.loads(gputopo("topo", "--topology", "dgx1-v100", "-o", "json").stdout)


def test_status_table_stays_aligned_with_an_unhealthy_gpu() -> None:
    from deviceplugin.cli import render_status

    def gpu(i: int, healthy: bool, reason: str = "") -> dict:
        return {"uuid": f"GPU-{i}", "index": i, "healthy": healthy, "numa": 0, "health_reason": reason,
                "model": "H100", "pci_bus_id": f"0000:{i:02x}:00.0"}  # fmt: skip

    reason = "XID 79 (GPU has fallen off the bus) " + "x" * 80
    doc = {"version": "0.1.0", "registration": {"registered": True, "last_registration_unix": 820.0, "count": 1},
           "devices": [gpu(0, True), gpu(1, False, reason), gpu(10, True)]}  # fmt: skip
    text = render_status(doc, now=1000.0)
    assert "registered: yes (last 3 min ago, 1 time since start)" in text
    rows = [line for line in text.splitlines() if line.startswith("  ")]
    starts = {line.index("GPU-") for line in rows[1:]}
    assert len(starts) == 1 and rows[0].index("UUID") in starts, "the UUID column starts at one place"
    assert rows[2].endswith("…") and len(rows[2]) < len(rows[0]) + 70, "long reasons are cut, last"
    assert rows[2].split()[:2] == ["1", "Unhealthy"]
    assert reason in render_status(doc, now=1000.0, wide=True)
    assert "registered: no" in render_status({"registration": {"registered": False}}, now=0.0)


def test_prefer_names_gpus_by_index_and_uuids_only_wide() -> None:
    args = ("prefer", "--topology", "dgx2-v100", "--size", "8")
    out = gputopo(*args)
    assert out.returncode == 0, out.stderr
    chosen = next(line for line in out.stdout.splitlines() if line.startswith("chosen:"))
    assert chosen.split()[1:] == ["GPUs", "0,1,2,3,4,5,6,7"]  # was 360 characters of UUIDs
    assert "GPU-" not in out.stdout and max(len(line) for line in out.stdout.splitlines()) <= 120
    wide = gputopo(*args, "-o", "wide").stdout
    chosen = next(line for line in wide.splitlines() if line.startswith("chosen:"))
    assert chosen.count("GPU-") == 8


def test_prefer_shows_several_policies_side_by_side() -> None:
    base = ("prefer", "--topology", "dgx1-v100", "--size", "2", "--available", "0,1,2,4,5")
    out = gputopo(*base, "--policy", "all")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith("policy "))
    rows = {line.split()[0]: line.split()[1] for line in lines[start + 1 : start + 5]}
    assert rows == {
        "gputopo": "0,4",
        "kubelet-default": "4,5",
        "best-effort-pairs": "1,2",
        "best-combo": "1,2",
    }
    # repeated or comma-separated, in the order given; the JSON keeps the first as "chosen"
    doc = json.loads(
        gputopo(*base, "--policy", "best-combo", "--policy", "gputopo,best-combo", "--json").stdout
    )
    assert doc["policy"] == "best-combo" and doc["chosen"]["gpus"] == [1, 2]
    assert list(doc["by_policy"]) == ["best-combo", "gputopo"] and doc["by_policy"]["gputopo"]["gpus"] == [
        0,
        4,
    ]
    bad = gputopo(*base, "--policy", "gputopo,spread")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "spread" in bad.stderr
