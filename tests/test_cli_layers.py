"""The layers as a user meets them: `gputopo` gets its node-side commands from entry points,
the core runs with every daemon, gRPC, NVML and Kubernetes library out of reach, and the import
contracts (`lint-imports`, also run by `make test`) hold."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: What the core must never need (the contracts' forbidden list, plus the other first-party
#: packages): a finder in the child process makes each of them an ImportError.
FORBIDDEN = (
    "deviceplugin",
    "scheduler",
    "gputopo_kube",
    "kubectl_gputopo",
    "gputopo_proto",
    "grpc",
    "google.protobuf",
    "pynvml",
    "kubernetes",
    "prometheus_client",
    "http.server",
    "socketserver",
)

BLOCK = textwrap.dedent(
    f"""
    import importlib.abc, sys
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if any(name == f or name.startswith(f + ".") for f in {FORBIDDEN!r}):
                raise ImportError(f"No module named {{name!r}} (blocked by the test)")
            return None
    sys.meta_path.insert(0, Block())
    """
)


def python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env
    )


def one_error_line(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 2, out.stderr
    assert out.stdout == "" and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gputopo: error: "), out.stderr
    return lines[0]


def test_the_core_runs_with_every_daemon_and_node_library_out_of_reach() -> None:
    out = python(
        BLOCK
        + textwrap.dedent(
            """
            import importlib, pkgutil, gputopo
            names = [m.name for m in pkgutil.walk_packages(gputopo.__path__, "gputopo.")
                     if not m.name.endswith(".__main__")]
            for name in names:
                importlib.import_module(name)
            from gputopo.cli import main
            print(len(names), "modules")
            sys.exit(main(["prefer", "--topology", "dgx1-v100", "--size", "2", "--json"]))
            """
        )
    )
    assert out.returncode == 0, out.stderr
    assert "modules" in out.stdout and '"chosen"' in out.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["status", "--socket", "/nonexistent.sock", "--json"], "'status' needs deviceplugin.cli"),
        (["topo"], "no --topology given and NVML support is missing"),
    ],
)
def test_node_commands_without_the_plugin_package_are_one_line_exit_2(args: list[str], says: str) -> None:
    """The entry points are declared (this checkout is installed) but the package is gone."""
    out = python(BLOCK + f"from gputopo.cli import main\nsys.exit(main({args!r}))")
    assert says in one_error_line(out)


def test_with_the_core_installed_alone_node_commands_do_not_exist() -> None:
    """No distribution declares them: argparse knows no `status`, `topo` knows no local source."""
    no_entry_points = "import importlib.metadata as m\nm.entry_points = lambda **kw: ()\n"
    out = python(BLOCK + no_entry_points + "from gputopo.cli import main\nsys.exit(main(['status']))")
    assert "invalid choice: 'status'" in one_error_line(out)
    out = python(BLOCK + no_entry_points + "from gputopo.cli import main\nsys.exit(main(['topo']))")
    assert "no local topology source is installed" in one_error_line(out)


@pytest.fixture
def third_party(tmp_path: Path) -> dict[str, str]:
    """A distribution that adds commands to `gputopo`, as another package would."""
    (tmp_path / "hello_cmd.py").write_text(
        textwrap.dedent(
            """
            class Hello:
                help = "say hello"
                def add_arguments(self, parser):
                    parser.add_argument("--to", default="world")
                def run(self, args):
                    print("hello", args.to)
                    return 0
            HELLO = Hello()
            NOT_A_COMMAND = 42
            """
        )
    )
    info = tmp_path / "hello_cmd-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hello-cmd\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[gputopo.commands]\n"
        "hello = hello_cmd:HELLO\n"
        "broken = no_such_module_here:THING\n"
        "odd = hello_cmd:NOT_A_COMMAND\n"
        "topo = hello_cmd:HELLO\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    return env


def gputopo(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gputopo", *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_a_third_party_command_joins_gputopo(third_party: dict[str, str]) -> None:
    out = gputopo("hello", "--to", "nodes", env=third_party)
    assert out.returncode == 0 and out.stdout == "hello nodes\n", out.stderr
    assert "say hello" in gputopo("--help", env=third_party).stdout
    # the core's own command wins over an entry point of the same name
    topo = gputopo("topo", "--topology", "dgx1-v100", env=third_party)
    assert topo.returncode == 0 and "GPU0" in topo.stdout
    # and the plugin package's status is still there beside it
    status = gputopo("status", "--socket", "/nonexistent.sock", "--timeout", "0.2", env=third_party)
    assert status.returncode == 1 and "no plugin socket at /nonexistent.sock" in status.stderr


@pytest.mark.parametrize(
    ("name", "says"),
    [("broken", "'broken' needs no_such_module_here"), ("odd", "is not a gputopo command")],
)
def test_a_declared_command_that_cannot_load_is_one_line_exit_2(
    third_party: dict[str, str], name: str, says: str
) -> None:
    assert says in one_error_line(gputopo(name, "--any", "flags", env=third_party))


def lint_imports(cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    lint = Path(sys.executable).parent / "lint-imports"
    return subprocess.run(
        [str(lint), "--config", str(cwd / "pyproject.toml"), "--no-cache"],
        capture_output=True, text=True, timeout=300, cwd=cwd, env=env, check=False,
    )  # fmt: skip


def test_import_contracts_hold() -> None:
    """Layers, the core's own layers, the node daemon's and the sidecar's own layers, daemon
    independence and the core's forbidden externals (pyproject.toml)."""
    out = lint_imports(ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "Contracts: 6 kept, 0 broken." in out.stdout, out.stdout


def test_import_contracts_catch_what_they_should(tmp_path: Path) -> None:
    """Guards the test above: a copy of the tree with a lazy gRPC import in the core and a
    daemon importing the other, the node importing the gang planner, and the hardware seam and
    the DRA mode importing the device-plugin mode, and the sidecar's picture importing its HTTP
    face break all six contracts, each naming the offending line."""
    for name in ("gputopo", "deviceplugin", "scheduler", "gputopo_kube", "kubectl_gputopo", "proto"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "presets"))
    shutil.copy2(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with (tmp_path / "gputopo" / "numerals.py").open("a") as f:
        f.write("\n\ndef _status():\n    import deviceplugin.kubelet.status_client\n")
    with (tmp_path / "gputopo" / "node" / "links.py").open("a") as f:
        f.write("\n\ndef _plan():\n    from gputopo.gang import planner\n")
    with (tmp_path / "deviceplugin" / "settings.py").open("a") as f:
        f.write("\n\ndef _levels():\n    from scheduler import defaults\n")
    with (tmp_path / "kubectl_gputopo" / "views.py").open("a") as f:
        f.write("\n\ndef _status():\n    import deviceplugin.kubelet.status_client\n")
    with (tmp_path / "deviceplugin" / "hardware" / "backend.py").open("a") as f:
        f.write("\n\ndef _mode():\n    from deviceplugin.kubelet import daemon\n")
    with (tmp_path / "deviceplugin" / "dra" / "pcie.py").open("a") as f:
        f.write("\n\ndef _api():\n    from deviceplugin.kubelet import api\n")
    with (tmp_path / "scheduler" / "picture" / "cache.py").open("a") as f:
        f.write("\n\ndef _serve():\n    from scheduler.web import server\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(tmp_path / "proto")]))
    out = lint_imports(tmp_path, env)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-2000:]
    assert "Contracts: 0 kept, 6 broken." in out.stdout, out.stdout
    assert "scheduler.picture.cache -> scheduler.web.server" in out.stdout
    assert "deviceplugin.hardware.backend -> deviceplugin.kubelet.daemon" in out.stdout
    assert "deviceplugin.dra.pcie -> deviceplugin.kubelet.api" in out.stdout
    assert "gputopo.node.links -> gputopo.gang.planner" in out.stdout
    assert "gputopo.numerals -> deviceplugin.kubelet.status_client" in out.stdout
    assert "deviceplugin.settings -> scheduler" in out.stdout
    assert "kubectl_gputopo.views -> deviceplugin.kubelet.status_client" in out.stdout
    assert "gputopo is not allowed to import grpc" in out.stdout
