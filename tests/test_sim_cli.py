"""`gputopo simulate` as a user runs it: real processes, exit codes, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TRACES = Path(__file__).parent / "data" / "traces"


def sim(*args: str, module: tuple[str, ...] = ("gputopo.sim",)) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *module, *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pods", "0"], "--pods must be positive"),
        (["--pods", "two"], "argument --pods: invalid int value"),  # was usage + message
        (["--policies", "gputopo,fifo"], "unknown policy 'fifo'"),
        (["--policies", "gputopo,gputopo"], "listed twice"),
        (["--load", "-1"], "--load must be a positive number"),
        (["--trace", "/nonexistent/trace.csv"], "cannot read trace"),
        (["--trace", str(TRACES / "openb_pod_list_multigpu50_slice.csv"), "--mode", "replay"], "no times"),
        (["--cluster", "/nonexistent/cluster.yaml"], "--cluster"),
        (["--plot", "/nonexistent/dir/out.png"], "does not exist"),
        (["--plot", ""], "--plot: give a PNG file name"),
        (["--compute-s", "nan"], "--compute-s must be a positive number"),
        (["--mode", "fill"], "applies to pod lists"),
        (["--seed", "-1"], "--seed must be a non-negative integer"),
        (["--queue-order", "shortest"], "argument --queue-order: invalid choice"),
        (
            ["--trace", str(TRACES / "openb_pod_list_multigpu50_slice.csv"), "--queue-order", "smallest"],
            "a fill places jobs in list order and has no queue",
        ),
        (["--gang-spill-after", "-5"], "--gang-spill-after must be between 0 and"),
        (["--gang-spill-after", "inf"], "--gang-spill-after must be between 0 and"),
        (["--pods", "999999999"], "--pods must be at most"),
        (["--trace", str(TRACES)], "cannot read trace"),
        (["--trace", str(TRACES / "helios_jobs_slice.csv"), "--limit", "0"], "--limit must be positive"),
        # --time-scale only rescales a replayed trace's times; elsewhere it was silently ignored
        (["--time-scale", "0.5"], "--time-scale applies to replaying"),
        (["--trace", str(TRACES / "openb_pod_list_multigpu50_slice.csv"), "--time-scale", "2"], "not fill"),
        (
            ["--trace", str(TRACES / "helios_jobs_slice.csv"), "--mode", "arrivals", "--time-scale", "2"],
            "not arrivals",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str], message: str) -> None:
    r = sim(*args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert r.stdout == ""


def test_bad_trace_content_and_bad_cluster_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("job_id,submit_time,duration,num_gpu,num_nodes\n0,0,10,many,1\n")
    r = sim("--trace", str(bad))
    assert r.returncode == 2 and "bad.csv:2: column num_gpu" in r.stderr and "Traceback" not in r.stderr
    cl = tmp_path / "c.yaml"
    cl.write_text("nodes:\n  - {name: a, gpus: 8}\n")  # GPU count only: no topology to simulate
    r = sim("--cluster", str(cl))
    assert r.returncode == 2 and "needs a topology" in r.stderr and "Traceback" not in r.stderr


def test_json_on_a_trace_slice_with_a_cluster_file(tmp_path: Path) -> None:
    cl = tmp_path / "c.yaml"
    cl.write_text(
        "nodes:\n"
        + "".join(
            f"  - {{name: n{i}, gpus: hgx-h100, labels: {{network.topology.nvidia.com/leaf: l{i % 2}}}}}\n"
            for i in range(6)
        )
    )
    r = sim("--trace", str(TRACES / "helios_jobs_slice.csv"), "--cluster", str(cl), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [x["policy"] for x in doc["results"]] == [
        "gputopo",
        "kubelet-default",
        "best-effort-pairs",
        "best-combo",
        "gang-only",
        "fgd",
        "kueue-tas",
        "dra-first-fit",
        "dra-gputopo-sets",
    ]
    assert doc["run"]["mode"] == "replay"
    model = doc["job_time_model"]
    assert model["profile_mix"] == "default" and set(model["profiles"]) == {"cnn", "encoder", "llm"}
    assert model["profiles"]["llm"]["grad_bytes"] >= 3e9
    for res in doc["results"]:
        assert set(res["job_time_ratio_by_profile"]) <= {"cnn", "encoder", "llm"}
    for res in doc["results"]:
        # the 160-GPU job can never fit 48 GPUs; everything else runs
        assert res["jobs"] == 17 and res["placed"] == 16 and res["never_started"] == 1
    assert doc["results"][1]["throughput_vs_baseline"] == 1.0


def test_table_and_plot_through_the_gputopo_command(tmp_path: Path) -> None:
    png = tmp_path / "out.png"
    r = sim(
        "simulate",
        "--trace",
        str(TRACES / "openb_pod_list_multigpu50_slice.csv"),
        "--plot",
        str(png),
        "--policies",
        "gputopo,kubelet-default",
        module=("gputopo",),
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any(line.startswith("mode: fill") for line in lines)
    header = next(line for line in lines if line.startswith("metric"))
    assert header.split() == ["metric", "better", "gputopo", "kubelet-default"]
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    # IHDR: a 16:9 picture for a slide (1600 x 900)
    assert (int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")) == (1600, 900)
    assert r.stderr == ""  # no progress bar when stderr is not a terminal


def test_untimed_list_with_poisson_arrivals() -> None:
    r = sim(
        "--trace",
        str(TRACES / "openb_pod_list_multigpu50_slice.csv"),
        "--mode",
        "arrivals",
        "--load",
        "0.9",
        "--json",
        "--policies",
        "gputopo,best-effort-pairs",
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["run"]["mode"].startswith("arrivals")
    for res in doc["results"]:
        assert res["placed"] == 24 and res["rejected"] == 0 and res["queue_delay_mean"] is not None


def test_progress_bar_on_request_goes_to_stderr() -> None:
    r = sim("--pods", "600", "--progress", "--policies", "kubelet-default", "--json")
    assert r.returncode == 0, r.stderr
    assert "kubelet-default" in r.stderr and "100%" in r.stderr
    assert json.loads(r.stdout)["results"][0]["pods"] >= 600  # stdout stays clean JSON


def test_an_unwritable_plot_path_is_one_line_not_a_traceback() -> None:
    """/proc exists, so the up-front check passes; saving the PNG fails after the run."""
    r = sim(
        "--trace", str(TRACES / "helios_jobs_slice.csv"), "--policies", "gputopo", "--plot", "/proc/x.png"
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert (
        r.stderr.strip()
        == "gputopo simulate: error: --plot /proc/x.png: cannot write: No such file or directory"
    )


def test_the_generator_sizes_jobs_and_load_by_the_free_gpus_of_a_cluster_file(tmp_path: Path) -> None:
    """GPUs a snapshot lists as allocated stay taken for the whole run: the generator used to
    count them, drawing 8- and 16-GPU jobs for nodes with 7 free (a third never started) and
    offering its load against GPUs nobody could use."""
    cl = tmp_path / "c.yaml"
    cl.write_text(
        "nodes:\n  - {name: a, gpus: hgx-h100, allocated: [0]}\n  - {name: b, gpus: hgx-h100, allocated: [0]}\n"
    )
    r = sim("--cluster", str(cl), "--pods", "300", "--policies", "gputopo", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert "14 free" in doc["run"]["cluster"]
    res = doc["results"][0]
    assert res["never_started"] == 0 and res["placed"] == res["jobs"]
    full = tmp_path / "full.yaml"
    full.write_text("nodes:\n  - {name: a, gpus: hgx-h100, allocated: [0, 1, 2, 3, 4, 5, 6, 7]}\n")
    for args in ((), ("--trace", str(TRACES / "helios_jobs_slice.csv"))):
        r = sim("--cluster", str(full), *args)
        assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
        assert "every GPU of the cluster is allocated" in r.stderr


def test_yaml_output_is_the_json_document() -> None:
    import yaml

    args = ("--pods", "200", "--policies", "gputopo,kubelet-default")
    as_json = json.loads(sim(*args, "-o", "json").stdout)
    as_yaml = yaml.safe_load(sim(*args, "-o", "yaml").stdout)
    for doc in (as_json, as_yaml):
        for result in doc["results"]:
            result.pop("seconds")  # wall time of the run itself
    assert as_yaml == as_json and [r["policy"] for r in as_json["results"]] == ["gputopo", "kubelet-default"]
    wide = sim(*args, "-o", "wide")
    assert wide.returncode == 0 and "job-time model (docs/jobtime.md): cnn:" in wide.stdout
    lines = wide.stdout.splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith("job-time model (docs/jobtime.md)"))
    model = " ".join(line.strip() for line in lines[start:])  # wrapped to the terminal's width
    assert "spine 1:1" in model and "core 2:1" in model
    assert max(len(line) for line in lines) <= 120  # no terminal: wide keeps to 120 too


def test_profile_mix_flag_and_custom_profile() -> None:
    """--profile-mix picks the profiles jobs get; --allreduce-gb/--compute-s make one custom
    profile; mixing them, or half a custom profile, is one line and exit 2."""
    args = ("--pods", "300", "--policies", "kubelet-default", "-o", "json")
    llm = json.loads(sim(*args, "--profile-mix", "llm").stdout)
    assert llm["job_time_model"]["profile_mix"] == "llm"
    assert set(llm["results"][0]["job_time_ratio_by_profile"]) == {"llm"}
    cnn = json.loads(sim(*args, "--profile-mix", "cnn").stdout)
    assert set(cnn["results"][0]["job_time_ratio_by_profile"]) == {"cnn"}
    # the same placements: a comm-heavy workload loses at least as much time as a light one
    assert llm["results"][0]["job_time_ratio"] >= cnn["results"][0]["job_time_ratio"]
    over = json.loads(sim(*args, "--profile-mix", "llm", "--oversubscription", "spine=4,leaf=2").stdout)
    table = over["job_time_model"]["oversubscription"]
    assert table["network.topology.nvidia.com/spine"] == 4 and table["network.topology.nvidia.com/leaf"] == 2
    assert table["network.topology.nvidia.com/core"] == 2  # the default, untouched
    custom = json.loads(sim(*args, "--allreduce-gb", "2", "--compute-s", "0.1", "--overlap", "0.5").stdout)
    assert custom["job_time_model"]["profiles"]["custom"] == {
        "name": "custom",
        "grad_bytes": 2e9,
        "compute_s": 0.1,
        "overlap": 0.5,
    }
    for bad, message in (
        (["--profile-mix", "llm", "--allreduce-gb", "1", "--compute-s", "1"], "give one of them"),
        (["--allreduce-gb", "1"], "go together"),
        (["--allreduce-gb", "1", "--compute-s", "1", "--overlap", "1.5"], "--overlap must be between"),
        (["--profile-mix", "nope"], "invalid choice"),
        (["--oversubscription", "spine"], "is not LEVEL=RATIO"),
        (["--oversubscription", "rack=2"], "is not LEVEL=RATIO"),
        (["--oversubscription", "spine=0.5"], "between 1 and 1000"),
        (["--oversubscription", "core=nan"], "between 1 and 1000"),
    ):
        r = sim("--pods", "50", *bad)
        assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_queue_order_is_named_in_the_run_and_reaches_the_engine() -> None:
    """The same jobs under both queue orders (an overloaded generator run): the header says
    which order ran, every job is placed either way, and the waits differ (who waits first is
    what the order decides; tests/test_sim_engine.py checks which way by hand)."""
    runs = {}
    for order in ("arrival", "smallest"):
        args = ["--pods", "1500", "--load", "5", "--json", "--policies", "kubelet-default"]
        r = sim(*args, "--queue-order", order)
        assert r.returncode == 0, r.stderr
        runs[order] = json.loads(r.stdout)
    assert "queue order" not in runs["arrival"]["run"]
    assert runs["smallest"]["run"]["queue order"].startswith("smallest first")
    (a,), (b,) = runs["arrival"]["results"], runs["smallest"]["results"]
    assert a["placed"] == b["placed"] == a["jobs"]
    assert a["queue_delay_mean"] != b["queue_delay_mean"]


def test_gangs_start_now_by_default_and_wait_only_when_asked() -> None:
    """Issue 18: the run says which gang wait it applied, the default places gangs now (no
    wait), and --gang-spill-after opts into waiting for the own level, which changes where
    gangs go (more of them inside one leaf) on an overloaded run."""
    runs = {}
    for wait in ("0", "86400"):
        args = ["--pods", "1500", "--load", "5", "--json", "--policies", "gputopo"]
        r = sim(*args, *(["--gang-spill-after", wait] if wait != "0" else []))
        assert r.returncode == 0, r.stderr
        runs[wait] = json.loads(r.stdout)
    assert runs["0"]["run"]["gang lifecycle"].endswith(
        "placed now in the smallest level that holds it (no wait)"
    )
    assert runs["86400"]["run"]["gang lifecycle"].endswith("waits for its own level up to 86400 s")
    (now,), (waited,) = runs["0"]["results"], runs["86400"]["results"]
    assert now["placed"] == waited["placed"] == now["jobs"]
    assert waited["gangs_one_leaf"] > now["gangs_one_leaf"]


def test_default_table_fits_120_columns_and_the_pod_counts_agree() -> None:
    import os

    env = {**os.environ, "COLUMNS": "300"}  # a wide terminal: the default table still keeps to 120
    r = subprocess.run(
        [sys.executable, "-m", "gputopo", "simulate", "--pods", "2000"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(len(line) for line in lines) <= 120
    columns = next(line for line in lines if line.startswith("metric")).split()
    assert columns[:3] == ["metric", "better", "gputopo"] and columns[-1] == "kubelet-default"
    assert len(columns) == 5  # gputopo, the best peer, kubelet-default
    # the generator rounds --pods up to whole jobs; the header says so and the counts agree
    pods = next(line for line in lines if line.startswith("pods: ")).split()[1]
    workload = next(line for line in lines if line.startswith("workload: "))
    assert f"{pods} pods (--pods 2,000 rounded up to whole jobs)" in workload
    assert not any(line.startswith("simulated pods/s") for line in lines)
    narrow = subprocess.run(
        [
            sys.executable,
            "-m",
            "gputopo",
            "simulate",
            "--pods",
            "300",
            "--policies",
            "gputopo,kubelet-default",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert narrow.returncode == 0 and max(len(line) for line in narrow.stdout.splitlines()) <= 80


def test_help_speaks_of_the_flags_not_of_the_projects_history() -> None:
    r = sim("simulate", "--help", module=("gputopo",))
    assert r.returncode == 0
    assert "issue" not in r.stdout.lower() and "rounds before" not in r.stdout
