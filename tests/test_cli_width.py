"""Every `gputopo` command's default output fits 120 columns.

A wider line wraps in most terminals and in every code review or issue it is pasted into, and a
wrapped table cannot be read along its rows (`gputopo simulate` once printed 434-character
lines). Each subcommand runs over its real entry point (`python -m gputopo`, in a subprocess)
with representative arguments, the largest shapes included (the 16-GPU DGX-2, every simulator
policy), and no terminal: what a pipe, a CI log or a pasted snippet gets.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gputopo.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
TRACES = Path(__file__).parent / "data" / "traces"
MAX_WIDTH = 120
#: COLUMNS as a wide terminal sets it: the default output keeps to 120 all the same.
ENV = {**os.environ, "COLUMNS": "300"}

CASES: dict[str, list[list[str]]] = {
    "topo": [
        ["--topology", "dgx1-v100"],
        ["--topology", "dgx2-v100"],  # 16 GPUs: the matrix in blocks
        ["--topology", str(Path(__file__).parent / "data" / "topo_text" / "dgx1-v100-4nic.txt")],
    ],
    "prefer": [
        ["--topology", "dgx2-v100", "--size", "8"],  # was 360 characters of UUIDs
        ["--topology", "dgx1-v100", "--size", "2", "--available", "0,1,2,4,5", "--policy", "all"],
    ],
    "presets": [[]],
    "simulate": [
        ["--pods", "600"],  # every policy
        ["--trace", str(TRACES / "openb_pod_list_multigpu50_slice.csv")],  # fill mode
    ],
    "step-time": [
        ["--topology", "dgx-a100", "--gpus-per-node", "8,8", "--level", "leaf", "--profile", "llm"],
        [
            "--topology",
            "dgx2-v100",
            "--gpus-per-node",
            "16,16,16",
            "--level",
            "spine",
            "--profile",
            "encoder",
        ],
        [  # a tensor x data parallel job whose groups straddle NVLink domains
            "--topology",
            "gb200-tray",
            "--gpus-per-node",
            ",".join(["4"] * 32),
            "--level",
            "core",
            "--tp-profile",
            "llama-70b",
            "--tensor-parallel",
            "16",
        ],
    ],
    "status": [["--kubelet-dir", "{plugin}"]],
}


def gputopo(*args: str, env: dict[str, str] = ENV) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gputopo", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=180,
    )


def assert_fits(done: subprocess.CompletedProcess[str], what: str) -> None:
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines, what
    widest = max(lines, key=len)
    assert len(widest) <= MAX_WIDTH, f"{what}: {len(widest)} characters: {widest!r}"


def test_every_subcommand_has_a_case() -> None:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(sub.choices) == set(CASES)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real plugin process (no kubelet: it serves, not registered) for `gputopo status`."""
    folder = tmp_path_factory.mktemp("dp")
    proc = subprocess.Popen(
        [sys.executable, "-m", "deviceplugin", "--kubelet-dir", str(folder), "--topology", "rtx8000-4",
         "--metrics-port", "0", "--publish", "false"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not any(p.name.endswith(".sock") for p in folder.iterdir()):
            assert proc.poll() is None and time.monotonic() < deadline, "plugin never served its socket"
            time.sleep(0.1)
        yield str(folder)
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.mark.parametrize(
    ("command", "args"), [(c, a) for c, cases in CASES.items() for a in cases], ids=lambda v: str(v)[:40]
)
def test_default_output_fits_120_columns(
    command: str, args: list[str], request: pytest.FixtureRequest
) -> None:
    if "{plugin}" in args:
        folder = request.getfixturevalue("plugin")
        args = [folder if a == "{plugin}" else a for a in args]
    assert_fits(gputopo(command, *args), " ".join([command, *args]))


@pytest.mark.parametrize("command", [[], *([c] for c in CASES)])
def test_help_fits_120_columns(command: list[str]) -> None:
    # argparse wraps help to the terminal's COLUMNS, as it should; without one it keeps to 80
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    assert_fits(gputopo(*command, "--help", env=env), " ".join([*command, "--help"]))
