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
    for line in block.replace("\\\n", " ").splitlines()  # a line ending in \ goes on on the next
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


OUTPUT_FLAGS = {"--plot", "--json", "-o"}


def test_every_file_a_command_reads_is_in_the_repository() -> None:
    missing = []
    for command in COMMANDS:
        args = shlex.split(command)
        for i, arg in enumerate(args):
            value = arg.split("=", 1)[1] if arg.startswith("--") and "=" in arg else arg
            if i and args[i - 1] in OUTPUT_FLAGS:
                continue
            if value.startswith("-") or value.startswith("/") or "/" not in value:
                continue
            if value.endswith((".yaml", ".yml", ".csv", ".json")) and not (ROOT / value).is_file():
                missing.append(f"{command}: {value}")
    assert not missing, missing


def test_the_sidecar_serves_the_shipped_cluster_file(tmp_path: Path) -> None:
    """`python -m scheduler --cluster data/clusters/two-leaves.yaml`, as the README runs it, on
    a free port: ready, and it filters a GPU pod to the nodes with room."""
    import json
    import socket
    import subprocess
    import sys
    import urllib.request

    from tests.kubelet_fake import eventually

    (command,) = [c for c in COMMANDS if c.startswith("python -m scheduler --cluster")]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [*shlex.split(command)[1:], f"--listen=127.0.0.1:{port}"]
    log = (tmp_path / "sidecar.log").open("wb")
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=log, stderr=log)

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        assert eventually(ready, timeout=30), (tmp_path / "sidecar.log").read_text()
        pod = {
            "metadata": {"name": "p", "namespace": "default", "uid": "u1"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
        }
        body = json.dumps({"Pod": pod, "NodeNames": ["a1", "a2", "b1", "b2"]}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/filter", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            answer = json.loads(r.read())
        assert sorted(answer["NodeNames"]) == ["a2", "b1", "b2"], answer  # a1 has 6 of 8 free
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
