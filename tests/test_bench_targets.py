"""bench/bench_targets.py: the verdict rule, and the whole matrix as a user runs it (on the
trace slices of tests/data/traces laid out as the shared traces folder)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gputopo.sim.clusters import TARGET_PRESETS
from gputopo.sim.metrics import Summary
from gputopo.sim.policies.catalog import POLICIES

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "bench_targets.py"
SLICES = Path(__file__).parent / "data" / "traces"


def load_harness() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_targets", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


harness = load_harness()


def summary(policy: str, **figures: Any) -> Summary:
    base: dict[str, Any] = {f.name: None for f in fields(Summary) if f.name != "extra"}
    base.update(policy=policy, jobs=10, placed=10, rejected=0, never_started=0, multi_gpu_pods=5)
    base.update(gangs=2, fragmented_jobs=0.0, admission_failures=0, pods=10, seconds=1.0)
    return replace(Summary(**base), **figures)


def test_the_verdict_leaves_out_the_ablation_and_allows_5_percent_on_queueing() -> None:
    results = [
        summary(
            "gputopo",
            throughput_vs_baseline=1.1,
            best_ring_share=0.9,
            gangs_one_leaf=0.8,
            queue_delay_mean=104.0,
        ),
        summary(
            "kubelet-default",
            throughput_vs_baseline=1.0,
            best_ring_share=0.95,
            gangs_one_leaf=0.1,
            queue_delay_mean=100.0,
        ),
        # gang-only beats gputopo on every figure but is its own ablation, not a peer
        summary(
            "gang-only",
            throughput_vs_baseline=2.0,
            best_ring_share=1.0,
            gangs_one_leaf=1.0,
            queue_delay_mean=1.0,
        ),
    ]
    v = harness.verdict(results)
    assert v["throughput"]["met"] is True and v["throughput"]["peer"] == "kubelet-default"
    assert v["ring"]["met"] is False and v["ring"]["best_peer"] == 0.95
    assert v["leaf"]["met"] is True
    assert v["queueing"]["met"] is True  # 104 <= 100 * 1.05
    slower = [replace(results[0], queue_delay_mean=106.0), *results[1:]]
    assert harness.verdict(slower)["queueing"]["met"] is False


def test_the_verdict_says_n_a_where_a_figure_is_undefined() -> None:
    results = [
        summary("gputopo", throughput_vs_baseline=1.0, best_ring_share=1.0),  # fill: no queue, no gangs
        summary("kubelet-default", throughput_vs_baseline=1.0, best_ring_share=1.0),
    ]
    v = harness.verdict(results)
    assert v["throughput"]["met"] is True and v["ring"]["met"] is True  # a tie is "at least"
    assert v["leaf"]["met"] is None and v["queueing"]["met"] is None
    assert harness.verdict(results[:1]) == {}  # no peer, no verdict


@pytest.fixture
def traces(tmp_path: Path) -> Path:
    """The slices under the names and folders bench_targets expects of ../shared/traces."""
    for workload, slice_name in (
        ("helios", "helios_jobs_slice.csv"),
        ("philly", "philly_jobs_slice.csv"),
        ("openb-fill", "openb_pod_list_multigpu50_slice.csv"),
    ):
        target = tmp_path / harness.TRACES[workload]
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SLICES / slice_name, target)
    return tmp_path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, timeout=300
    )


def test_the_whole_matrix_runs_every_policy_on_every_workload_and_preset(
    traces: Path, tmp_path: Path
) -> None:
    out = tmp_path / "targets.json"
    r = run("--traces", str(traces), "--pods", "300", "--json", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    cells = {(x["workload"], x["cluster"]) for x in doc["runs"]}
    assert cells == {(w, c) for w in harness.TRACES for c in TARGET_PRESETS}
    for x in doc["runs"]:
        assert [p["policy"] for p in x["results"]] == list(POLICIES)  # POLICIES as it is now
        assert set(x["verdict"]) == {"throughput", "ring", "leaf", "queueing"}
        assert f"== {x['workload']} on {x['cluster']}: preset {x['cluster']}:" in r.stdout
    assert r.stdout.count("gputopo vs best peer: throughput ") == len(cells)
    assert "judged targets" in r.stdout.splitlines()[-1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--clusters", "huge"], "--clusters: unknown 'huge' (known: default, mixed-leaf, gb200-nvl)"),
        (["--workloads", "mlperf"], "--workloads: unknown 'mlperf'"),
        (["--policies", "gputopo,slurm", "--workloads", "generator"], "--policies: unknown 'slurm'"),
        (["--workloads", "helios", "--traces", "/nonexistent"], "helios trace"),
        (["--json", "/nonexistent/out.json"], "--json /nonexistent/out.json: folder"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    r = run(*args)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_the_profile_mix_reaches_every_cell(tmp_path: Path) -> None:
    """--profile-mix llm (the comm-heavy mix): every cell's jobs all run the llm profile."""
    out = tmp_path / "targets.json"
    r = run(
        "--workloads", "generator", "--clusters", "default", "--policies", "gputopo,kubelet-default",
        "--pods", "300", "--profile-mix", "llm", "--json", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    (cell,) = json.loads(out.read_text())["runs"]
    assert "profile mix llm" in cell["run"]["job-time model"]
    for result in cell["results"]:
        assert set(result["job_time_ratio_by_profile"]) == {"llm"}
    bad = run("--profile-mix", "resnet")
    assert bad.returncode == 2 and "--profile-mix" in bad.stderr


def test_the_load_and_the_opt_in_wait_reach_the_cells(tmp_path: Path) -> None:
    """--load sets the generator's offered load, --gang-spill-after the gang lifecycle's wait."""
    out = tmp_path / "targets.json"
    r = run(
        "--workloads", "generator", "--clusters", "default", "--policies", "gputopo,kubelet-default",
        "--pods", "300", "--load", "0.2", "--gang-spill-after", "3600", "--json", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    (cell,) = json.loads(out.read_text())["runs"]
    assert "load 0.2" in cell["run"]["workload"]
    assert "3600" in cell["run"]["gang lifecycle"]
    bad = run("--load", "zero")
    assert bad.returncode == 2 and "--load" in bad.stderr
