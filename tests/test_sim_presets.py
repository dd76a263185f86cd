"""The simulator's cluster presets: each has the shape docs/simulator.md claims, plans gangs
at the levels it labels, and runs through `gputopo simulate --cluster-preset`."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from gputopo.gang.planner import GangPlan, GangSpec, Member, plan_gang
from gputopo.network.cluster import parse_cluster
from gputopo.network.levels import ACCELERATOR, LEAF, SPINE
from gputopo.sim.clusters import (
    CLUSTER_PRESETS,
    MIXED_KINDS,
    NVL_TRAYS,
    default_cluster,
    preset_cluster,
    preset_snapshot,
)
from gputopo.sim.engine import RunConfig
from gputopo.sim.jobmodel import JobModel
from gputopo.sim.run import simulate
from gputopo.sim.state import SimCluster
from gputopo.sim.workload import Job

ROOT = Path(__file__).resolve().parent.parent


def kinds(cluster: SimCluster) -> list[str]:
    return [cluster.topologies[n.topology].name for n in cluster.nodes]


def by_label(cluster: SimCluster, key: str) -> dict[str, list[int]]:
    out: dict[str, list[int]] = defaultdict(list)
    for i, node in enumerate(cluster.nodes):
        if key in node.labels:
            out[node.labels[key]].append(i)
    return dict(out)


def test_the_known_presets() -> None:
    assert list(CLUSTER_PRESETS) == ["default", "mixed-leaf", "gb200-nvl", "nvl72"]


def test_default_preset_is_the_default_cluster() -> None:
    c = preset_cluster("default")
    assert c == default_cluster()
    assert Counter(kinds(c)) == {"pcie8-plx": 28, "hgx-h100": 21, "dgx1-v100": 15}
    assert len(by_label(c, SPINE)) == 2 and len(by_label(c, LEAF)) == 8
    assert all(len(members) == 8 for members in by_label(c, LEAF).values())


def test_mixed_leaf_holds_all_seven_kinds_in_every_leaf() -> None:
    c = preset_cluster("mixed-leaf")
    assert len(c.nodes) == 96 and c.capacity == 768
    assert len(MIXED_KINDS) == 7 and set(kinds(c)) == set(MIXED_KINDS)
    names = kinds(c)
    leaves = by_label(c, LEAF)
    assert len(leaves) == 12
    for members in leaves.values():
        assert len(members) == 8
        assert {names[i] for i in members} == set(MIXED_KINDS)
    # no kind always takes a leaf's first (lowest-named, tie-winning) node
    firsts = {names[min(members, key=lambda i: c.nodes[i].name)] for members in leaves.values()}
    assert firsts == set(MIXED_KINDS)
    spines = by_label(c, SPINE)
    assert len(spines) == 2 and all(len(m) == 48 for m in spines.values())
    assert Counter(names) == {k: 14 for k in MIXED_KINDS[:5]} | {k: 13 for k in MIXED_KINDS[5:]}


def test_gb200_nvl_has_nvl72_domains_of_trays_each_under_one_leaf() -> None:
    c = preset_cluster("gb200-nvl")
    names = kinds(c)
    assert Counter(names) == {"gb200-tray": 72, "hgx-h100": 24} and c.capacity == 72 * 4 + 24 * 8
    assert ACCELERATOR in c.levels and c.levels.index(ACCELERATOR) < c.levels.index(LEAF)
    domains = by_label(c, ACCELERATOR)
    assert len(domains) == 4
    for members in domains.values():
        assert len(members) == NVL_TRAYS == 18
        assert {names[i] for i in members} == {"gb200-tray"}
        assert sum(c.topologies[c.nodes[i].topology].n for i in members) == 72  # NVL72
        assert len({c.nodes[i].labels[LEAF] for i in members}) == 1
        assert len({c.nodes[i].labels[SPINE] for i in members}) == 1
    trays = {i for members in domains.values() for i in members}
    assert all(names[i] == "hgx-h100" for i in range(len(c.nodes)) if i not in trays)
    h100_leaves = {c.nodes[i].labels[LEAF] for i in range(len(c.nodes)) if i not in trays}
    assert len(h100_leaves) == 3


@pytest.mark.parametrize("name", list(CLUSTER_PRESETS))
def test_a_preset_is_a_snapshot_file_the_scheduler_reads_too(name: str) -> None:
    snap = preset_snapshot(name)
    again = parse_cluster(json.loads(json.dumps(snap.to_dict())))
    assert again.nodes == snap.nodes and again.levels == snap.levels


def test_the_gang_planner_keeps_a_tray_gang_inside_one_nvlink_domain() -> None:
    snap = preset_snapshot("gb200-nvl")
    spec = GangSpec("ns/g", tuple(Member(f"ns/p{k}", 4) for k in range(12)))  # 48 GPUs, 12 trays
    plan = plan_gang(spec, snap.node_views(), snap.levels, index=snap.index)
    assert isinstance(plan, GangPlan)
    assert plan.level == ACCELERATOR
    used = {snap.by_name[p.node].labels.get(ACCELERATOR) for p in plan.placements}
    assert len(used) == 1 and None not in used
    # more than one rack holds: the gang leaves the accelerator level for the leaf's spine
    big = GangSpec("ns/h", tuple(Member(f"ns/q{k}", 4) for k in range(20)))  # 80 GPUs > 72
    plan = plan_gang(big, snap.node_views(), snap.levels, index=snap.index)
    assert isinstance(plan, GangPlan) and plan.level != ACCELERATOR


def test_tray_gangs_run_at_nvlink_speed_in_the_simulator() -> None:
    """Four gangs of ten 4-GPU pods, one per NVL72 domain: gputopo keeps each inside its
    domain, so every job runs at the ideal time (NVLink between trays, 900 x 0.8 GB/s);
    kubelet's spreading puts the pods on the emptier 8-GPU H100 nodes and on trays of other
    racks and runs the communication-heavy encoder profile slower: a gang under both spines (no
    common domain: 4 x 400 Gb/s at 0.92, halved, 92 GB/s) all-reduces 2 x 39/40 x 1.34 GB in
    28 ms, of which the backward pass hides 16 ms of a 53 ms step: 1.24x (docs/jobtime.md)."""
    c = preset_cluster("gb200-nvl")
    config = RunConfig(comm=JobModel(mix="encoder"))
    jobs = [Job(id=i, submit=float(i), duration=100.0, pods=(4,) * 10) for i in range(4)]
    s = simulate(c, jobs, "gputopo", config)
    assert s.placed == 4 and s.gangs == 4 and s.gangs_one_leaf == 1.0
    assert s.job_time_ratio == pytest.approx(1.0)
    spread = simulate(c, jobs, "kubelet-default", config)
    assert spread.placed == 4 and spread.job_time_ratio is not None and spread.job_time_ratio > 1.1


def sim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gputopo", "simulate", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


@pytest.mark.parametrize("name", list(CLUSTER_PRESETS))
def test_a_short_simulate_run_on_each_preset(name: str) -> None:
    r = sim("--cluster-preset", name, "--pods", "400", "--policies", "gputopo,kubelet-default", "-o", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["run"]["cluster"].startswith(f"preset {name}: {len(preset_cluster(name).nodes)} nodes")
    results = {x["policy"]: x for x in doc["results"]}
    assert set(results) == {"gputopo", "kubelet-default"}
    assert all(x["placed"] == x["jobs"] > 0 for x in results.values())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--cluster-preset", "dgx-superpod"],
            "unknown preset (known: default, mixed-leaf, gb200-nvl, nvl72)",
        ),
        (["--cluster-preset", "default", "--cluster", "c.yaml"], "give one of them, not both"),
    ],
)
def test_a_bad_preset_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    r = sim(*args)
    assert r.returncode == 2 and message in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == ""


def test_the_ideal_of_a_gang_of_8_gpu_pods_is_a_leaf_not_a_tray_rack() -> None:
    """No 4-GPU tray holds an 8-GPU pod, so the ideal such a gang is measured against is one
    H100 leaf (25 GB/s), not the 450 GB/s NVLink domain: in one leaf it runs at the ideal."""
    c = preset_cluster("gb200-nvl")
    s = simulate(c, [Job(id=0, submit=0.0, duration=100.0, pods=(8, 8, 8))], "gputopo", RunConfig())
    assert s.gangs_one_leaf == 1.0 and s.job_time_ratio == pytest.approx(1.0)
