"""Every flag of each daemon says what it does in --help: an operator reading
`python -m scheduler --help` on a node has no other documentation at hand."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _undescribed(parser: argparse.ArgumentParser) -> list[str]:
    """The option strings of every flag whose help is missing, empty or suppressed."""
    return [
        "/".join(action.option_strings)
        for action in parser._actions
        if action.option_strings and (not action.help or action.help == argparse.SUPPRESS)
    ]


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from deviceplugin.settings import build_parser as plugin_parser
    from scheduler.__main__ import parser as scheduler_parser

    return {"scheduler": scheduler_parser(), "deviceplugin": plugin_parser(), "dra": plugin_parser("dra")}


@pytest.mark.parametrize("daemon", ["scheduler", "deviceplugin", "dra"])
def test_every_flag_has_a_description(daemon: str) -> None:
    parser = _parsers()[daemon]
    flags = [a for a in parser._actions if a.option_strings]
    assert len(flags) > 5, "the parser under test is the daemon's"
    assert _undescribed(parser) == []


@pytest.mark.parametrize(
    ("command", "flags"),
    [
        (["scheduler"], ["--reservation-ttl", "--annotation-max-age", "--log-level"]),
        (["deviceplugin"], ["--mode", "--kubelet-dir", "--log-level"]),
        (["deviceplugin", "--mode", "dra"], ["--set-sizes", "--driver-name", "--node-name", "--log-level"]),
        (["deviceplugin.dra"], ["--registry-dir", "--max-sets", "--metrics-port"]),
    ],
)
def test_help_through_the_real_entry_point(command: list[str], flags: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", *command, "--help"], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert done.returncode == 0, done.stderr
    options = done.stdout.split("options:", 1)[1]
    for flag in flags:
        # the flag's own line, then its description on that line or the next
        at = options.index(f"  {flag}")
        entry = options[at:].split("\n  -", 1)[0]
        words = entry.replace(flag, "").split()
        assert len([w for w in words if w.isalpha()]) >= 3, entry


@pytest.mark.parametrize(("mode", "other"), [("device-plugin", "dra"), ("dra", "device-plugin")])
def test_each_modes_help_lists_its_own_options_before_the_others(mode: str, other: str) -> None:
    """Both modes' flags come from the one table (deviceplugin/settings.py): each mode's --help
    has the shared ones, then its own, then the other mode's, marked as not used there."""
    from deviceplugin.settings import OPTIONS, build_parser

    text = build_parser(mode).format_help()
    own, foreign = (
        text.index(f"{mode} mode only:"),
        text.index(f"{other} mode only (accepted, not used here):"),
    )
    assert own < foreign
    for opt in OPTIONS:
        at = text.index(f"  {opt.flag} ")
        if set(opt.modes) == {mode, other}:
            assert at < own, opt.flag
        else:
            assert (own < at < foreign) == (opt.modes == (mode,)), opt.flag
