"""Every file flag of every command, given a FIFO, /dev/zero or an oversized file: exit 2 with
one line naming the flag's file and the reason, no traceback, no hang, nothing read.

A FIFO used to hang `--trace`, `--config`, `--cluster` and `--kubeconfig` (open() waits for a
writer); `/dev/zero` ended `--cluster` and `--trace` in a MemoryError traceback. The gputopo
CLI runs in this process (its `main` returns the exit code); the two daemons run as processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gputopo import cli
from gputopo import userfile as uf

REPO = Path(__file__).resolve().parent.parent
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("GPUTOPO_") and k != "NODE_NAME"}
KINDS = ("fifo", "dev-zero", "oversize")
REASON = {
    "fifo": "is a FIFO, not a regular file",
    "dev-zero": "is a character device, not a regular file",
    "oversize": "allowed",
}


def bad_file(folder: Path, kind: str, cap: int) -> str:
    """A FIFO, a link to /dev/zero (named like a real file), or a sparse file one byte over `cap`."""
    path = folder / f"{kind}.yaml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    else:
        with open(path, "wb") as f:
            f.truncate(cap + 1)
    return str(path)


# (command, flag) -> (how to run it with the bad path, the cap that applies)
Runner = Callable[[str, Path], tuple[int, str]]


def gputopo(*args: str) -> Runner:
    def run(path: str, folder: Path, capsys: pytest.CaptureFixture[str] | None = None) -> tuple[int, str]:
        code = cli.main([a.format(path=path, folder=folder) for a in args])
        assert capsys is not None
        return code, capsys.readouterr().err

    return run  # type: ignore[return-value]


def process(module: str, *args: str, env: dict[str, str] | None = None) -> Runner:
    def run(path: str, folder: Path, capsys: object = None) -> tuple[int, str]:
        proc = subprocess.run(
            [sys.executable, "-m", module, *(a.format(path=path, folder=folder) for a in args)],
            cwd=REPO,
            env={**CLEAN_ENV, **{k: v.format(path=path) for k, v in (env or {}).items()}},
            capture_output=True,
            text=True,
            timeout=30,  # a hang fails here, not at the suite's timeout
        )
        return proc.returncode, proc.stderr

    return run  # type: ignore[return-value]


def cluster_naming(folder: Path, path: str) -> str:
    """A valid snapshot whose one node's topology is the bad file."""
    snap = folder / "cluster-with-bad-topology.yaml"
    snap.write_text(f"nodes:\n  - {{name: n1, gpus: {path}}}\n")
    return str(snap)


PLUGIN = ("--kubelet-dir", "{folder}", "--metrics-port", "0")
FLAGS: dict[str, tuple[Runner, int]] = {
    "gputopo topo --topology": (gputopo("topo", "--topology", "{path}"), uf.MAX_TOPOLOGY_BYTES),
    "gputopo prefer --topology": (
        gputopo("prefer", "--size", "2", "--topology", "{path}"),
        uf.MAX_TOPOLOGY_BYTES,
    ),
    "gputopo simulate --trace": (gputopo("simulate", "--trace", "{path}"), uf.MAX_TRACE_BYTES),
    "gputopo simulate --cluster": (gputopo("simulate", "--cluster", "{path}"), uf.MAX_CLUSTER_BYTES),
    "scheduler --cluster": (
        process("scheduler", "--cluster", "{path}", "--listen", "127.0.0.1:0"),
        uf.MAX_CLUSTER_BYTES,
    ),
    "scheduler --kubeconfig": (
        process("scheduler", "--kubeconfig", "{path}", "--listen", "127.0.0.1:0"),
        uf.MAX_KUBECONFIG_BYTES,
    ),
    "deviceplugin --config": (process("deviceplugin", *PLUGIN, "--config", "{path}"), uf.MAX_CONFIG_BYTES),
    "deviceplugin GPUTOPO_CONFIG": (
        process("deviceplugin", *PLUGIN, env={"GPUTOPO_CONFIG": "{path}"}),
        uf.MAX_CONFIG_BYTES,
    ),
    "deviceplugin --topology": (
        process("deviceplugin", *PLUGIN, "--topology", "{path}"),
        uf.MAX_TOPOLOGY_BYTES,
    ),
    "deviceplugin --health-file": (
        process("deviceplugin", *PLUGIN, "--topology", "rtx8000-4", "--health-file", "{path}"),
        uf.MAX_HEALTH_FILE_BYTES,
    ),
    "deviceplugin --kubeconfig": (
        process("deviceplugin", *PLUGIN, "--topology", "rtx8000-4", "--kubeconfig", "{path}"),
        uf.MAX_KUBECONFIG_BYTES,
    ),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("flag", sorted(FLAGS))
def test_file_flag_refuses_non_regular_and_oversized_files(
    flag: str, kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run, cap = FLAGS[flag]
    path = bad_file(tmp_path, kind, cap)
    code, err = run(path, tmp_path, capsys)  # type: ignore[call-arg]
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert path in lines[0] and REASON[kind] in lines[0], lines[0]


@pytest.mark.parametrize("kind", KINDS)
def test_a_topology_named_inside_a_cluster_snapshot_is_read_the_same_way(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = bad_file(tmp_path, kind, uf.MAX_TOPOLOGY_BYTES)
    code = cli.main(["simulate", "--cluster", cluster_naming(tmp_path, path)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert REASON[kind] in err and "nodes[0].gpus" in err, err


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_plot_output_must_not_be_a_fifo_or_device(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    path = bad_file(tmp_path, kind, 0)
    code = cli.main(["simulate", "--pods", "10", "--plot", path])
    err = capsys.readouterr().err
    assert code == 2 and "not a regular file" in err and len(err.strip().splitlines()) == 1, err
