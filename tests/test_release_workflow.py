"""The release workflow (.github/workflows/release.yaml), checked as far as it can be without
GitHub: it parses, runs on version tags only, builds both images for amd64 and arm64 under the
names the manifests pull, pushes the chart as an OCI artifact, and its version check
(tools/release-versions.sh) passes for the project's version and refuses any other."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.manifests import DEPLOY, kustomize_dir

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "release.yaml"
SCRIPT = ROOT / "tools" / "release-versions.sh"


def workflow() -> dict[Any, Any]:
    doc = yaml.safe_load(WORKFLOW.read_text())
    # YAML 1.1 reads the key `on` as True.
    doc["on"] = doc.pop(True, doc.get("on"))
    return doc


def version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def run_check(tag: str, owner: str = "gputopo") -> subprocess.CompletedProcess[str]:
    sh = shutil.which("sh")
    if sh is None:
        pytest.skip("no sh")
    return subprocess.run(
        [sh, str(SCRIPT), tag, owner], capture_output=True, text=True, timeout=30, check=False
    )


def test_runs_on_version_tags_only_with_least_privilege() -> None:
    doc = workflow()
    assert set(doc["on"]) == {"push"} and set(doc["on"]["push"]) == {"tags"}
    assert all(t.startswith("v") for t in doc["on"]["push"]["tags"])
    assert doc["permissions"] == {"contents": "read"}
    for name, job in doc["jobs"].items():
        writes = {k for k, v in job.get("permissions", {}).items() if v == "write"}
        assert writes <= {"packages"}, name


def test_builds_both_images_multi_arch_under_the_names_the_manifests_pull() -> None:
    job = workflow()["jobs"]["images"]
    matrix = job["strategy"]["matrix"]["include"]
    assert {(m["image"], m["dockerfile"]) for m in matrix} == {
        ("gputopo-device-plugin", "Dockerfile.plugin"),
        ("gputopo-scheduler-extender", "Dockerfile.scheduler"),
    }
    (build,) = [s for s in job["steps"] if str(s.get("uses", "")).startswith("docker/build-push-action")]
    w = build["with"]
    assert set(w["platforms"].split(",")) >= {"linux/amd64", "linux/arm64"}
    assert w["push"] is True and w["file"] == "${{ matrix.dockerfile }}"
    assert w["build-args"] == "VERSION=${{ needs.versions.outputs.version }}"
    # With the owner gputopo, the tag is the image deploy/ pulls at this version.
    tag = (
        w["tags"]
        .replace("${{ needs.versions.outputs.owner }}", "gputopo")
        .replace("${{ needs.versions.outputs.version }}", version())
    )
    pulled = {
        c["image"]
        for d in kustomize_dir(DEPLOY)
        if d["kind"] in ("DaemonSet", "Deployment")
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    for m in matrix:
        assert tag.replace("${{ matrix.image }}", m["image"]) in pulled
    uses = {str(s.get("uses", "")).split("@")[0] for s in job["steps"]}
    assert {"docker/setup-qemu-action", "docker/setup-buildx-action", "docker/login-action"} <= uses


def test_pushes_the_linted_chart_as_an_oci_artifact_after_the_images() -> None:
    job = workflow()["jobs"]["chart"]
    assert set(job["needs"]) == {"versions", "images"}
    script = "\n".join(s.get("run", "") for s in job["steps"])
    assert "helm lint --strict charts/gputopo" in script
    assert "helm package charts/gputopo" in script
    assert 'helm push "dist/gputopo-${VERSION}.tgz" "oci://ghcr.io/${OWNER}/charts"' in script
    chart = yaml.safe_load((ROOT / "charts" / "gputopo" / "Chart.yaml").read_text())
    assert chart["name"] == "gputopo" and chart["version"] == version(), "helm package names the file by them"


def test_every_action_is_pinned_to_a_major_version() -> None:
    for name, job in workflow()["jobs"].items():
        for step in job["steps"]:
            if "uses" in step:
                ref = step["uses"].split("@")
                assert len(ref) == 2 and ref[1].startswith("v"), f"{name}: {step['uses']}"


def test_the_version_check_passes_for_the_projects_version_and_lowercases_the_owner() -> None:
    out = run_check(f"v{version()}", "GpuTopo")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"version={version()}", "owner=gputopo"]


def test_the_version_check_refuses_a_tag_that_is_not_the_version_everywhere() -> None:
    out = run_check("v99.0.0")
    assert out.returncode == 1 and not out.stdout
    for where in (
        "pyproject.toml",
        "Chart.yaml version",
        "Chart.yaml appVersion",
        "Dockerfile.plugin",
        "Dockerfile.scheduler",
    ):
        assert where in out.stderr, where
    assert "deploy/base/kustomization.yaml gputopo-device-plugin" in out.stderr
