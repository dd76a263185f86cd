"""bench/bench_gang_grid.py: the verdict against gang-only and every peer within the measured
noise, and a small grid as a user runs it (on the trace slices of tests/data/traces)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from gputopo.sim.policies.catalog import POLICIES

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "bench_gang_grid.py"
SLICES = Path(__file__).parent / "data" / "traces"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_gang_grid", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


grid = load()


def row(cell: str, gputopo: tuple, others: dict, noise: tuple) -> dict:
    return {"cell": cell, "policies": {"gputopo": gputopo, **others}, "noise": noise}


def test_the_verdict_counts_gang_only_and_uses_the_grids_own_noise() -> None:
    rows = [
        # noise 2 % on throughput, 10 % on queueing: the tolerances of this grid (90th pct of 2)
        row("a", (2.0, 1000.0), {"gang-only": (2.03, 950.0), "fgd": (1.2, 5000.0)}, (1.96, 1100.0)),
        row("b", (2.0, 1000.0), {"gang-only": (2.2, 800.0)}, (2.04, 900.0)),
        row("c", (1.0, None), {"gang-only": (None, None)}, (1.0, None)),
    ]
    t_tol, q_tol = grid.verdicts(rows)
    assert abs(t_tol - 0.02) < 1e-9 and abs(q_tol - 0.1) < 1e-9
    a, b, c = rows
    # within the noise of the best other (gang-only counts, unlike bench_targets' peers)
    assert a["throughput_met"] is True and a["queue_met"] is True
    assert a["best_throughput"] == (2.03, "gang-only")
    assert b["throughput_met"] is False and b["queue_met"] is False
    assert c["queue_met"] is None
    text = grid.render(rows, t_tol, q_tol)
    assert "met: throughput 2/3, queueing 2/3" in text


def test_a_small_grid_runs_every_policy_and_writes_its_cells(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    for name, slice_name in (("helios", "helios_jobs_slice.csv"), ("philly", "philly_jobs_slice.csv")):
        target = traces / grid.TRACES[name]
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SLICES / slice_name, target)
    out = tmp_path / "grid.json"
    argv = ["--pods", "200", "--seeds", "0", "--clusters", "default", "--mixes", "default,llm"]
    argv += ["--replay-loads", "0.3", "--limit", "150", "--traces", str(traces), "--json", str(out)]
    r = subprocess.run(
        [sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    cells = [x["cell"] for x in doc["rows"]]
    assert cells == [
        "generator/200/default/default/s0",
        "generator/200/default/llm/s0",
        "helios/0.3/default",
        "philly/0.3/default",
    ]
    for x in doc["rows"]:
        assert list(x["policies"]) == list(POLICIES)
    assert "met: throughput" in r.stdout and "tolerance" in r.stdout
