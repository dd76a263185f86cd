"""One ASCII-numeral rule for every parser: `gputopo.numerals.ascii_uint`, and the four places
that once spelled it their own way (CLI GPU ids, `topo -m` NUMA cells, health-file keys, the
sidecar's --listen port)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deviceplugin.filebackend import HealthFileError, parse_health_entry
from gputopo.numerals import MAX_DIGITS, ascii_uint
from gputopo.topofile import load_preset

ROOT = Path(__file__).resolve().parent.parent
#: Digits `str.isdigit` accepts that are not ASCII: superscript two, Arabic-Indic three,
#: fullwidth three, circled one. The last three `int` reads as numbers; "²" it refuses.
NOT_ASCII = ["\u00b2", "\u0663", "\uff13", "\u2460"]


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=25) | st.from_regex(r"\A[0-9]{1,25}\Z"))
def test_ascii_uint_is_exactly_plain_ascii_digits(text: str) -> None:
    got = ascii_uint(text)
    if re.fullmatch(rf"[0-9]{{1,{MAX_DIGITS}}}", text, flags=re.ASCII):
        assert got == int(text)
    else:
        assert got is None


@pytest.mark.parametrize("text", [*NOT_ASCII, "", " 1", "1 ", "+1", "-1", "1_0", "0x1", "1" * 5000])
def test_ascii_uint_refuses(text: str) -> None:
    assert ascii_uint(text) is None


def test_ascii_uint_bounds_the_length() -> None:
    assert ascii_uint("9" * MAX_DIGITS) == 10**MAX_DIGITS - 1
    assert ascii_uint("12345", max_digits=4) is None and ascii_uint("0042", max_digits=4) == 42


def gputopo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gputopo", *args], capture_output=True, text=True, timeout=60, cwd=ROOT
    )


@pytest.mark.parametrize("cell", NOT_ASCII)
def test_topo_m_numa_cell_that_is_not_an_ascii_number_is_unknown(tmp_path: Path, cell: str) -> None:
    """`gputopo topo` on such a file was a ValueError traceback ("²") or read NUMA 3 ("٣")."""
    text = (
        "        GPU0    GPU1    CPU Affinity    NUMA Affinity\n"
        f"GPU0     X      NV2     0-7             {cell}\n"
        "GPU1    NV2      X      8-15            1\n"
    )
    path = tmp_path / "topo.txt"
    path.write_text(text, encoding="utf-8")
    out = gputopo("topo", "--topology", str(path), "--json")
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    assert [g.get("numa") for g in json.loads(out.stdout)["gpus"]] == [None, 1]


@pytest.mark.parametrize("index", NOT_ASCII)
def test_cli_gpu_ids_take_ascii_indices_only(index: str) -> None:
    out = gputopo("prefer", "--topology", "dgx1-v100", "--size", "1", "--available", f"0,{index}")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        f"gputopo: error: --available: unknown GPU {index!r} (use indices 0..7 or UUIDs)"
    ]


@pytest.mark.parametrize("key", NOT_ASCII)
def test_health_file_keys_take_ascii_indices_only(key: str) -> None:
    topo = load_preset("dgx1-v100")
    assert parse_health_entry(topo, "3", "Unhealthy").uuid == topo.gpus[3].uuid
    with pytest.raises(HealthFileError, match="unknown GPU"):
        parse_health_entry(topo, key, "Unhealthy")  # "٣" once marked GPU 3 Unhealthy


@pytest.mark.parametrize("port", ["\uff18\uff10", "\u0668\u0660", "8\u00b2", "1" * 5000])
def test_sidecar_listen_port_is_ascii(port: str) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "scheduler", "--listen", f"127.0.0.1:{port}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "expected HOST:PORT" in lines[0], res.stderr
