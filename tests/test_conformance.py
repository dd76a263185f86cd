"""The shared kubelet stand-in (../shared/conformance, outside this repo) against the real
`python -m deviceplugin` process, once per bundled preset. Skipped where ../shared is absent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gputopo.node.topofile import list_presets

REPO = Path(__file__).resolve().parent.parent
STANDIN = REPO.parent / "shared" / "conformance" / "kubelet_standin.py"

pytestmark = pytest.mark.skipif(
    not STANDIN.exists(), reason=f"{STANDIN} not present (CI puts it in ../shared)"
)


@pytest.mark.parametrize("preset", list_presets())
def test_kubelet_standin_passes(preset: str, tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    cmd = f"{sys.executable} -m deviceplugin --kubelet-dir {{dir}} --topology {preset}"
    done = subprocess.run(
        [sys.executable, str(STANDIN), "--plugin-cmd", cmd, "--json", str(summary)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=90,
    )
    failures = [line for line in done.stdout.splitlines() if line.startswith("FAIL")]
    assert done.returncode == 0, "\n".join(failures) or done.stderr[-2000:]
    doc = json.loads(summary.read_text())
    assert doc["failed"] == [] and doc["passed"] > 30
    assert doc["reregister_s"] < 1.0
