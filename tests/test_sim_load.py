"""The simulator's offered load: counted at the cluster's own speed, and replays paced to a load.

Before issue 18 was closed the generator's `--load` counted each job's work at its ideal (the
cluster's best server), so on a cluster of mostly PCIe boxes with one NIC "load 0.5" offered
2.5 clusters' worth of encoder and LLM work and queues grew for the whole run under every
policy. These tests hold the new definition against an independent oracle (`gputopo
step-time`, the operator's CLI over the same core model) and the CLI's new flags to their word.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from gputopo.node.allocator import AllocatorPool
from gputopo.sim import cli
from gputopo.sim.clusters import load_cluster_file
from gputopo.sim.jobmodel import JobModel, JobTimer
from gputopo.sim.workload import Job, at_cluster_speed, offered_load

ROOT = Path(__file__).resolve().parent.parent
TRACES = Path(__file__).parent / "data" / "traces"


def _jobs() -> list[Job]:
    return [
        Job(id=0, submit=0.0, duration=100.0, pods=(1,)),
        Job(id=1, submit=10.0, duration=50.0, pods=(8,)),
        Job(id=2, submit=30.0, duration=20.0, pods=(8, 8)),
    ]


def test_at_cluster_speed_stretches_every_gap_by_the_work_weighted_stretch() -> None:
    jobs = _jobs()
    stretch = {0: 1.0, 1: 3.0, 2: 2.0}
    paced, factor = at_cluster_speed(jobs, lambda j: stretch[j.id])
    ideal = 1 * 100 + 8 * 50 + 16 * 20
    assert factor == pytest.approx((1 * 100 * 1 + 8 * 50 * 3 + 16 * 20 * 2) / ideal)
    assert [j.submit for j in paced] == pytest.approx([0.0, 10.0 * factor, 30.0 * factor])
    # only the arrival times move: sizes, durations and ids are the seed's
    assert [(j.id, j.duration, j.pods) for j in paced] == [(j.id, j.duration, j.pods) for j in jobs]
    same, one = at_cluster_speed(jobs, lambda j: 1.0)
    assert one == 1.0 and same == jobs


def test_at_cluster_speed_refuses_a_nonsense_stretch() -> None:
    with pytest.raises(ValueError, match="positive and finite"):
        at_cluster_speed(_jobs(), lambda j: math.nan)


def test_offered_load_is_work_at_speed_per_second_of_span_over_capacity() -> None:
    jobs = _jobs()
    work = 1 * 100 + 8 * 50 * 2 + 16 * 20 * 2
    assert offered_load(jobs, 16, lambda j: 1.0 if j.gpus == 1 else 2.0) == pytest.approx(work / (30 * 16))
    at_once = [Job(id=i, submit=5.0, duration=10.0, pods=(1,)) for i in range(3)]
    assert offered_load(at_once, 8, lambda j: 1.0) == math.inf
    assert offered_load([], 8, lambda j: 1.0) == 0.0


def _step_s(topology: str, gpus_per_node: str, profile: str) -> float:
    argv = ["step-time", "--topology", topology, "--gpus-per-node", gpus_per_node, "--profile", profile]
    r = subprocess.run(
        [sys.executable, "-m", "gputopo", *argv, "-o", "json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return float(json.loads(r.stdout)["step_s"])


def _timer(tmp_path: Path, nodes: str, mix: str) -> JobTimer:
    f = tmp_path / "c.yaml"
    f.write_text("nodes:\n" + nodes)
    cluster = load_cluster_file(str(f))
    pool = AllocatorPool()
    return JobTimer(JobModel(mix=mix), cluster, [pool.get(t) for t in cluster.topologies])


def test_typical_stretch_is_the_gpu_weighted_mean_of_each_servers_stretch(tmp_path: Path) -> None:
    """One HGX H100 and three PCIe boxes: an 8-GPU LLM pod runs at its ideal on a quarter of
    the GPUs and at the PCIe box's step on the rest; the oracle is `gputopo step-time`."""
    nodes = "".join(
        f"  - {{name: {n}, gpus: {kind}}}\n"
        for n, kind in (("h", "hgx-h100"), ("p1", "pcie8-plx"), ("p2", "pcie8-plx"), ("p3", "pcie8-plx"))
    )
    timer = _timer(tmp_path, nodes, "llm")
    on_pcie = _step_s("pcie8-plx", "8", "llm") / _step_s("hgx-h100", "8", "llm")
    assert on_pcie > 1.5  # the case the definition is for: a PCIe box is much slower for an LLM
    assert timer.typical_stretch(1, (8,)) == pytest.approx((8 * 1.0 + 24 * on_pcie) / 32, rel=1e-6)
    assert timer.typical_stretch(2, (1,)) == 1.0  # one GPU: nothing to reduce


def test_typical_stretch_on_identical_servers_is_one(tmp_path: Path) -> None:
    timer = _timer(tmp_path, "  - {name: a, gpus: hgx-h100}\n  - {name: b, gpus: hgx-h100}\n", "llm")
    assert timer.typical_stretch(1, (8,)) == pytest.approx(1.0)
    assert timer.typical_stretch(2, (8, 8)) == pytest.approx(1.0)


def _prepared(*argv: str) -> tuple[list[Job], dict[str, object]]:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    _, jobs, header, _, _ = cli.prepare(parser.parse_args(list(argv)))
    return jobs, header


def test_the_generator_paces_arrivals_by_the_clusters_speed_and_says_so() -> None:
    base = ("--cluster-preset", "default", "--profile-mix", "llm", "--pods", "400", "--policies", "gputopo")
    ideal, h_ideal = _prepared(*base, "--load-basis", "ideal")
    paced, h_paced = _prepared(*base)
    assert "at ideal placement" in str(h_ideal["workload"])
    assert "at this cluster's speed" in str(h_paced["workload"])
    assert [(j.id, j.duration, j.pods) for j in paced] == [(j.id, j.duration, j.pods) for j in ideal]
    ratios = {round(p.submit / i.submit, 9) for p, i in zip(paced, ideal, strict=True) if i.submit > 0}
    assert len(ratios) == 1
    (k,) = ratios
    assert k > 2  # LLM work on 28 PCIe boxes of 64 servers: far slower than its ideal
    assert f"work {k:.2f}x its ideal" in str(h_paced["workload"])


def test_a_comm_light_mix_is_not_paced() -> None:
    base = ("--cluster-preset", "default", "--profile-mix", "cnn", "--pods", "400", "--policies", "gputopo")
    ideal, _ = _prepared(*base, "--load-basis", "ideal")
    paced, _ = _prepared(*base)
    assert [j.submit for j in paced] == pytest.approx([j.submit for j in ideal], rel=0.02)


def test_the_queue_drains_at_load_half_once_load_counts_the_clusters_speed() -> None:
    """The symptom itself: kubelet's default placement, LLM jobs, the default preset."""
    args = ["--cluster-preset", "default", "--profile-mix", "llm", "--pods", "1500", "--json"]
    args += ["--policies", "kubelet-default"]
    waits = {}
    for basis in ("ideal", "cluster"):
        r = subprocess.run(
            [sys.executable, "-m", "gputopo.sim", *args, "--load-basis", basis],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr
        waits[basis] = json.loads(r.stdout)["results"][0]["queue_delay_mean"]
    assert waits["cluster"] < waits["ideal"] / 5


def test_replay_load_paces_a_trace_to_the_load_asked() -> None:
    trace = str(TRACES / "helios_jobs_slice.csv")
    own, h_own = _prepared("--trace", trace, "--cluster-preset", "default")
    assert h_own["mode"] == "replay" and str(h_own["offered load"]).endswith(" at this cluster's speed")
    paced, h = _prepared("--trace", trace, "--cluster-preset", "default", "--replay-load", "0.3")
    assert h["offered load"] == "0.30 at this cluster's speed"
    scale = paced[-1].submit / own[-1].submit
    assert [j.submit for j in paced] == pytest.approx([j.submit * scale for j in own])
    assert [(j.id, j.duration, j.pods) for j in paced] == [(j.id, j.duration, j.pods) for j in own]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--replay-load", "0.5"],
            "--replay-load applies to replaying a timed --trace, not to the generator",
        ),
        (["--trace", str(TRACES / "helios_jobs_slice.csv"), "--replay-load", "0"], "must be a positive"),
        (
            ["--trace", str(TRACES / "helios_jobs_slice.csv"), "--replay-load", "1", "--time-scale", "2"],
            "give one of them, not both",
        ),
        (["--trace", str(TRACES / "openb_pod_list_multigpu50_slice.csv"), "--replay-load", "1"], "not fill"),
        (["--load-basis", "best"], "argument --load-basis: invalid choice"),
    ],
)
def test_bad_load_flags_exit_2_with_one_line(args: list[str], message: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "gputopo.sim", *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
