"""Parsing topology files, `nvidia-smi topo -m` text and presets (gputopo.node.topofile)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gputopo.node.topofile import (
    format_topo_text,
    list_presets,
    load_preset,
    load_topology,
    parse_topo_text,
    parse_topo_text_detail,
    parse_topology,
    parse_topology_json,
)
from gputopo.node.topology import Topology, TopologyError
from tests.strategies import topologies

DATA = Path(__file__).parent / "data" / "topo_text"


def codes(t: Topology) -> list[list[str]]:
    return [[t.code(i, j) for j in range(t.n)] for i in range(t.n)]


# --- the four public text layouts (tests/data/topo_text/README expectations) ---


def test_hgx_h100_with_ten_nics() -> None:
    t = load_topology(str(DATA / "hgx-h100-10nic.txt"))
    assert t.n == 8, "NIC rows must not count as GPUs"
    assert all(t.code(i, j) == "NV18" for i in range(8) for j in range(8) if i != j)
    assert [g.numa for g in t.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert "NIC9=mlx5_9" in t.description


def test_pcie_2017_raw_nic_name_numa_from_cpu_affinity() -> None:
    t = load_topology(str(DATA / "pcie8-2017-mlx4.txt"))
    assert t.n == 8
    pix = {(i, j) for i in range(8) for j in range(i + 1, 8) if t.code(i, j) == "PIX"}
    assert pix == {(0, 1), (2, 3), (4, 5), (6, 7)}
    assert t.code(0, 2) == "PHB" and t.code(5, 7) == "PHB"
    assert all(t.code(i, j) == "SYS" for i in range(4) for j in range(4, 8))
    # No NUMA Affinity column: grouped by distinct CPU Affinity strings, in order of appearance.
    assert [g.numa for g in t.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert "mlx4_0" in t.description


def test_tab_separated_with_empty_cells() -> None:
    t = load_topology(str(DATA / "ws2-tabs.txt"))
    assert codes(t) == [["X", "PHB"], ["PHB", "X"]]
    assert [g.numa for g in t.gpus] == [0, 0]


def test_dgx1_text_matches_dgx1_preset() -> None:
    t = load_topology(str(DATA / "dgx1-v100-4nic.txt"))
    assert codes(t) == codes(load_preset("dgx1-v100"))
    assert [g.numa for g in t.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_text_uuids_are_stable_and_synthetic() -> None:
    text = (DATA / "ws2-tabs.txt").read_text()
    a, b = parse_topo_text(text, name="ws2"), parse_topo_text(text, name="ws2")
    assert [g.uuid for g in a.gpus] == ["GPU-ws2-0", "GPU-ws2-1"] == [g.uuid for g in b.gpus]


@settings(max_examples=60, deadline=None)
@given(
    topologies(min_gpus=1, max_gpus=12),
    st.sampled_from(["    ", "\t", "\t\t"]),
    st.lists(st.sampled_from(["mlx5_0", "mlx5_1", "ib0"]), max_size=3),
)
def test_printed_text_parses_back(t: Topology, sep: str, nics: list[str]) -> None:
    back = parse_topo_text(format_topo_text(t, sep=sep, nics=nics), name="rt")
    assert codes(back) == codes(t)
    assert [g.numa for g in back.gpus] == [g.numa for g in t.gpus]


@settings(max_examples=40, deadline=None)
@given(
    topologies(min_gpus=1, max_gpus=8),
    st.sampled_from(["    ", "\t"]),
    st.lists(st.sampled_from(["mlx5_0", "mlx5_1", "ib0"]), max_size=3),
)
def test_the_nic_and_affinity_columns_are_kept(t: Topology, sep: str, nics: list[str]) -> None:
    """What `gputopo topo` shows beyond the GPU matrix: every NIC with its legend name, each
    GPU's code to it (format_topo_text prints SYS), and the affinity cells as printed."""
    from gputopo.cli import render_topo

    back, host = parse_topo_text_detail(format_topo_text(t, sep=sep, nics=nics), name="rt")
    assert codes(back) == codes(t)
    assert host.nics == tuple((f"NIC{k}", nic) for k, nic in enumerate(nics))
    assert host.gpu_nic == tuple(("SYS",) * len(nics) for _ in range(t.n))
    assert host.affinity_columns == ("CPU Affinity", "NUMA Affinity")
    assert [row[1] for row in host.affinity] == ["N/A" if g.numa is None else str(g.numa) for g in t.gpus]
    text = render_topo(back, host)
    assert all(label in text for label, _ in host.nics) and "CPU Affinity" in text


def test_printed_text_of_presets_parses_back() -> None:
    for name in list_presets():
        t = load_preset(name)
        assert codes(parse_topo_text(format_topo_text(t))) == codes(t), name


# --- hand-made text edge cases ---

SMALL = """\
        GPU0    GPU1    GPU2    CPU Affinity    NUMA Affinity
GPU0     X      NV2     SYS     0-7             0
GPU1    NV2      X      SOC     0-7             0
GPU2    SYS     SYS      X      8-15            1
"""


def test_space_aligned_small_and_soc_alias() -> None:
    t = parse_topo_text(SMALL, name="small")
    assert codes(t) == [["X", "NV2", "SYS"], ["NV2", "X", "SYS"], ["SYS", "SYS", "X"]]
    assert [g.numa for g in t.gpus] == [0, 0, 1]


def test_leading_shell_prompt_and_trailing_legend_are_ignored() -> None:
    text = "$ nvidia-smi topo -m\n" + SMALL + "\nLegend:\n\n  X    = Self\n  NV#  = bonded NVLinks\n"
    assert parse_topo_text(text).n == 3


def test_title_lines_tabs_and_colour_codes() -> None:
    text = (
        "GPU Topology Matrix:\n--------------------\n"
        "\tGPU0\tGPU1\tmlx5_0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
        "GPU0\t \x1b[1mX\x1b[0m \t\x1b[32mNV12\x1b[0m\tNODE\t0-31\t0\t\tN/A\n"
        "GPU1\tNV12\t X \tSYS\t32-63\t1\t\tN/A\n"
        "mlx5_0\tNODE\tSYS\t X \n"
    )
    t = parse_topo_text(text)
    assert codes(t) == [["X", "NV12"], ["NV12", "X"]]
    assert [g.numa for g in t.gpus] == [0, 1]


def test_numa_unknown_without_affinity_columns() -> None:
    t = parse_topo_text("\tGPU0\tGPU1\nGPU0\tX\tPIX\nGPU1\tPIX\tX\n")
    assert [g.numa for g in t.gpus] == [None, None]


def test_numa_affinity_na_or_range_is_unknown() -> None:
    text = SMALL.replace("0-7             0\nGPU1", "0-7             N/A\nGPU1").replace(
        "8-15            1", "8-15            0-1"
    )
    assert [g.numa for g in parse_topo_text(text).gpus] == [None, 0, None]


def test_single_gpu() -> None:
    t = parse_topo_text("        GPU0    CPU Affinity    NUMA Affinity\nGPU0     X      0-15    0\n")
    assert t.n == 1 and t.gpus[0].numa == 0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (SMALL.replace("NV2      X      SOC", "NV2      X      FOO"), "GPU1/GPU2: unknown link code 'FOO'"),
        (SMALL.replace("NV2      X      SOC", "NV2      X      PIX"), "asymmetric link"),
        (SMALL.replace("GPU1    NV2      X ", "GPU1    NV2     PIX"), "GPU1/GPU1 must be X"),
        (SMALL.replace("GPU0     X      NV2", "GPU0     X       X "), "X off the diagonal"),
        (SMALL.replace("GPU2    SYS     SYS      X      8-15            1\n", ""), "no row for GPU2"),
        (
            SMALL.replace("GPU2    SYS     SYS      X ", "GPU2    SYS     SYS"),
            "GPU2/GPU2 must be X (self), got '8-15'",
        ),
        ("  GPU0  GPU1  NIC0\nGPU0 X PIX\nGPU1 PIX X PIX\nNIC0 PIX PIX X\n", "row GPU0 has 2 cells"),
        (SMALL.replace("CPU Affinity", "Bogus Column"), "unknown header column 'Bogus'"),
        ("hello\nworld\n", "no `nvidia-smi topo -m` header"),
        ("", "no `nvidia-smi topo -m` header"),
        ("  GPU0  GPU2\nGPU0 X PIX\nGPU2 PIX X\n", "GPU columns must be GPU0..GPU1"),
    ],
)
def test_bad_text_raises_clear_error(text: str, message: str) -> None:
    with pytest.raises(TopologyError, match=re.escape(message)):
        parse_topo_text(text, name="bad")


# --- JSON ---


def test_json_text_dict_and_bytes_agree() -> None:
    d = {
        "name": "two",
        "gpus": [{"index": 0, "uuid": "a"}, {"index": 1, "uuid": "b"}],
        "links": [["X", "NV4"], ["NV4", "X"]],
        "nvlink_gbps_per_link": 50,
    }
    for src in (d, json.dumps(d), json.dumps(d).encode()):
        t = parse_topology_json(src)
        assert t.name == "two" and t.gbps(0, 1) == 200.0


_PAIR = '{"gpus": [{"index": 0}, {"index": 1}], "links": [["X", "NV1"], ["NV1", "X"]]'


@pytest.mark.parametrize(
    ("src", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"gpus": [{"index": 0}, {"index": 1}], "links": [["X", "NV1"], ["PIX", "X"]]}', "asymmetric"),
        ('{"gpus": [{"index": 0}], "links": [["X", "X"]]}', "1 entries|links\\[0\\] must have"),
        # JSON reads 1e400 as infinity, and 1e300 overflows integer MB/s: both were tracebacks
        (_PAIR + ', "nvlink_gbps_per_link": 1e400}', "nvlink_gbps_per_link must be"),
        (_PAIR + ', "nvlink_gbps_per_link": 1e300}', "nvlink_gbps_per_link must be"),
        (_PAIR + ', "pcie_gbps": {"SYS": 1e400}}', "pcie_gbps\\['SYS'\\] must be"),
    ],
)
def test_bad_json_raises_with_name(src: str, message: str) -> None:
    with pytest.raises(TopologyError, match=f"^j: .*({message})"):
        parse_topology_json(src, name="j")


def test_parse_topology_sniffs_format() -> None:
    assert parse_topology(SMALL).n == 3
    assert parse_topology("  \n" + json.dumps(load_preset("rtx8000-4").to_dict())).n == 4


def test_a_byte_order_mark_is_read_past(tmp_path: Path) -> None:
    """Files saved by Windows editors start with a BOM; it hid the `{` and the GPU0 header."""
    bom = "\ufeff"
    as_json = json.dumps(load_preset("rtx8000-4").to_dict())
    as_text = format_topo_text(load_preset("rtx8000-4"))
    for name, text in (("j.json", as_json), ("t.txt", as_text), ("crlf.txt", as_text.replace("\n", "\r\n"))):
        path = tmp_path / name
        path.write_bytes((bom + text).encode())
        got, want = load_topology(str(path)), parse_topology(text, name=path.stem)
        assert codes(got) == codes(want) == codes(load_preset("rtx8000-4"))
        assert parse_topology(bom + text, name=path.stem).to_dict() == want.to_dict()


# --- presets and load_topology ---


def test_every_preset_loads_with_its_name() -> None:
    names = list_presets()
    for required in (
        "dgx1-v100",
        "dgx-a100",
        "hgx-h100",
        "dgx2-v100",
        "gb200-tray",
        "pcie8-plx",
        "a100-pcie-nvlink-pairs",
    ):
        assert required in names
    for name in names:
        t = load_preset(name)
        assert t.name == name
        assert load_topology(name).to_dict() == t.to_dict()


def nv_pairs(t: Topology) -> int:
    return sum(1 for i in range(t.n) for j in range(i + 1, t.n) if t.links[i][j].nvlinks)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("name", "n", "nvswitch", "nv_pair_count", "numa"),
    [
        ("dgx1-v100", 8, False, 16, [0, 0, 0, 0, 1, 1, 1, 1]),  # hybrid cube-mesh: 4 peers each
        ("dgx-a100", 8, True, 28, [3, 3, 1, 1, 7, 7, 5, 5]),  # NPS4 host
        ("hgx-h100", 8, True, 28, [0, 0, 0, 0, 1, 1, 1, 1]),
        ("dgx2-v100", 16, True, 120, [0] * 8 + [1] * 8),
        ("gb200-tray", 4, True, 6, [0, 0, 1, 1]),
        ("pcie8-plx", 8, False, 0, [0, 0, 0, 0, 1, 1, 1, 1]),
        ("a100-pcie-nvlink-pairs", 8, False, 4, [0, 0, 0, 0, 1, 1, 1, 1]),
    ],
)
def test_preset_facts(name: str, n: int, nvswitch: bool, nv_pair_count: int, numa: list[int]) -> None:
    t = load_preset(name)
    assert (t.n, t.nvswitch, nv_pairs(t)) == (n, nvswitch, nv_pair_count)
    assert [g.numa for g in t.gpus] == numa


def test_preset_link_codes() -> None:
    assert load_preset("hgx-h100").code(0, 7) == "NV18"
    assert load_preset("dgx-a100").code(2, 5) == "NV12"
    assert load_preset("dgx2-v100").code(0, 15) == "NV6"
    assert load_preset("dgx1-v100").code(0, 3) == "NV2" and load_preset("dgx1-v100").code(0, 5) == "SYS"
    plx = load_preset("pcie8-plx")
    assert plx.code(0, 1) == "PIX" and plx.code(0, 2) == "PXB" and plx.code(0, 4) == "SYS"
    pairs = load_preset("a100-pcie-nvlink-pairs")
    assert {(i, j) for i in range(8) for j in range(i + 1, 8) if pairs.code(i, j) == "NV12"} == {
        (0, 2),
        (1, 3),
        (4, 5),
        (6, 7),
    }


def test_unknown_preset_lists_presets() -> None:
    with pytest.raises(TopologyError, match=r"unknown preset 'dgx-9'; presets: .*hgx-h100"):
        load_preset("dgx-9")
    with pytest.raises(TopologyError, match=r"neither a preset nor a readable file; presets: .*dgx-a100"):
        load_topology("dgx-9")


def test_load_topology_files(tmp_path: Path) -> None:
    j = tmp_path / "mine.json"
    j.write_text(json.dumps(load_preset("gb200-tray").to_dict()))
    assert load_topology(str(j)).nvswitch is True
    t = tmp_path / "box.dat"  # content decides the format, not the extension
    t.write_text(SMALL)
    assert load_topology(str(t)).name == "box"
    assert load_topology(str(t)).gpus[0].uuid == "GPU-box-0"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"gpus": []}', "gpus' must be a non-empty list"),
        (b"\xff\xfe garbage", "cannot read topology file"),
        (b"GPU0 X\n", "no `nvidia-smi topo -m` header|must be X"),
    ],
)
def test_load_topology_bad_content(tmp_path: Path, content: bytes, message: str) -> None:
    p = tmp_path / "bad.json"
    p.write_bytes(content)
    with pytest.raises(TopologyError, match=message):
        load_topology(str(p))


def test_load_topology_missing_file_and_empty(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="neither a preset nor a readable file"):
        load_topology(str(tmp_path / "nope.json"))
    with pytest.raises(TopologyError, match="empty topology source"):
        load_topology(" ")
    with pytest.raises(TopologyError, match="is a directory, not a regular file"):
        load_topology(str(tmp_path))


SHARED_TOPOLOGIES = Path(__file__).resolve().parents[2] / "shared" / "topologies"


@pytest.mark.skipif(not SHARED_TOPOLOGIES.is_dir(), reason="the shared fixtures sit beside the checkout")
def test_every_preset_equals_its_shared_fixture() -> None:
    for name in list_presets():
        fixture = SHARED_TOPOLOGIES / f"{name}.json"
        if fixture.is_file():
            shared = parse_topology_json(fixture.read_text(encoding="utf-8"), name=name)
            assert load_preset(name).to_dict() == shared.to_dict(), name


def test_gb200_tray_runs_nvlink5_at_50_gbps_per_link() -> None:
    t = load_preset("gb200-tray")
    assert t.settings.nvlink_gbps_per_link == 50.0
    assert t.gbps(0, 3) == 900.0  # NV18 x 50 GB/s: 900 GB/s per GPU, one direction
