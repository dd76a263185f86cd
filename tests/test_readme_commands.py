"""The README's commands work on a fresh clone: nothing points outside the repository, every
file a command names is in it, and the trace commands run as written (on the shipped samples)."""

from __future__ import annotations

import csv
import shlex
from pathlib import Path

import pytest

from gputopo.cli import main as gputopo_main

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def shell_blocks(text: str) -> list[str]:
    """The fenced blocks marked sh/bash/console (or unmarked), fences paired line by line."""
    blocks: list[str] = []
    lang: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith("```"):
            if lang is None:
                lang, lines = line[3:].strip(), []
            else:
                if lang in ("", "sh", "bash", "console"):
                    blocks.append("\n".join(lines))
                lang = None
        elif lang is not None:
            lines.append(line)
    return blocks


SHELL_BLOCKS = shell_blocks(README)
COMMANDS = [
    line.split("  #", 1)[0].strip()
    for block in SHELL_BLOCKS
    for line in block.splitlines()
    if line.strip() and not line.lstrip().startswith("#")
]
TRACE_COMMANDS = [c for c in COMMANDS if c.startswith("gputopo simulate --trace")]


def test_no_command_reaches_outside_the_repository() -> None:
    assert COMMANDS, "no shell blocks found in the README"
    outside = [c for c in COMMANDS if "../" in c]
    assert not outside, outside


def test_every_trace_the_readme_names_is_shipped_with_its_license() -> None:
    assert len(TRACE_COMMANDS) >= 2
    for command in TRACE_COMMANDS:
        args = shlex.split(command)
        path = ROOT / args[args.index("--trace") + 1]
        assert path.is_file(), command
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
        assert 100 <= len(rows) <= 1000, "a sample, not the whole trace"
        assert {"submit_time", "duration", "num_gpu"} <= rows[0].keys()
    notes = (ROOT / "data" / "traces" / "README.md").read_text()
    assert "CC BY 4.0" in notes and "Helios" in notes and "Philly" in notes


@pytest.mark.parametrize("command", TRACE_COMMANDS)
def test_trace_commands_run_as_written(command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = shlex.split(command)[1:]
    if "--plot" in args:
        pytest.importorskip("matplotlib")
        args[args.index("--plot") + 1] = str(tmp_path / "out.png")
    monkeypatch.chdir(ROOT)
    assert gputopo_main(args) in (0, None)
    if "--plot" in args:
        assert (tmp_path / "out.png").stat().st_size > 0
