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

from deviceplugin.hardware.filebackend import HealthFileError, parse_health_entry
from gputopo.node.topofile import load_preset
from gputopo.numerals import MAX_DIGITS, ascii_uint, duration_s

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


# --------------------------------------------------------------------------- durations

_PART = re.compile(r"([0-9]{0,18})(?:\.([0-9]{0,18}))?([hms])", flags=re.ASCII)
_UNIT_S = {"h": 3600, "m": 60, "s": 1}
_WAIT_MAX = 30 * 86_400.0


def _oracle(text: str) -> float | None:
    """Durations by a regular expression, independently of the parser's loop."""
    if not 0 < len(text) <= 32:
        return None
    if re.fullmatch(r"[0-9]{1,18}", text, flags=re.ASCII):
        return float(text) if float(text) <= _WAIT_MAX else None
    if not re.fullmatch(r"(?:[0-9]{0,18}(?:\.[0-9]{0,18})?[hms])+", text, flags=re.ASCII):
        return None
    total = 0.0
    for whole, frac, unit in _PART.findall(text):
        if not whole and not frac:
            return None
        total += float(f"{whole or 0}.{frac or 0}") * _UNIT_S[unit]
    return total if total <= _WAIT_MAX else None


@given(
    st.text(alphabet="0123456789.hmsd-+ e", max_size=34)
    | st.text(alphabet=st.characters(codec="utf-8"), max_size=12)
    | st.from_regex(r"\A([0-9]{1,4}(\.[0-9]{1,3})?[hms]){1,4}\Z")
)
def test_duration_is_total_and_matches_an_independent_reading(text: str) -> None:
    got = duration_s(text, max_s=_WAIT_MAX)
    want = _oracle(text)
    if want is None:
        assert got is None
    else:
        assert got == pytest.approx(want)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("300s", 300), ("5m", 300), ("1h30m", 5400), ("1.5h", 5400), ("0", 0), ("0s", 0), ("90", 90)],
)
def test_duration_reads_what_kubernetes_objects_write(text: str, seconds: float) -> None:
    assert duration_s(text, max_s=_WAIT_MAX) == seconds


@pytest.mark.parametrize("text", ["", "-5s", "+5s", "5ms", "1d", "1e3s", "1..5s", "h", "5 m", "721h", "٣s"])
def test_duration_refuses(text: str) -> None:
    assert duration_s(text, max_s=_WAIT_MAX) is None
