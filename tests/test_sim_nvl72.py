"""`simulate --jobs tree` on the nvl72 preset (issue 29 item 5; docs/simulator.md "Jobs as trees
on NVL72"): the preset's shape, the tree rule, where gputopo and the peers put a tree, the tree
figures on a hand-made case, and the CLI flag."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gputopo.network.cluster import parse_cluster
from gputopo.network.levels import ACCELERATOR, DEFAULT_LEVELS, HOSTNAME, LEAF, SPINE
from gputopo.node.allocator import AllocatorPool
from gputopo.sim.clusters import _node, from_snapshot, preset_cluster
from gputopo.sim.jobmodel import JobModel
from gputopo.sim.policies.base import Failure
from gputopo.sim.policies.trees import TREE_POLICIES, TreePolicy, build_tree_policy
from gputopo.sim.state import ClusterState, SimCluster
from gputopo.sim.trees import RackWatch, Tree, TreeRecorder, TreeTimer, as_trees, tree_shape, typical_tp
from gputopo.sim.workload import Job

ROOT = Path(__file__).resolve().parent.parent


def _domains(cluster: SimCluster, nodes: list[int], level: str) -> set[str]:
    return {cluster.domain(n, level) for n in nodes}


def test_nvl72_preset_shape() -> None:
    c = preset_cluster("nvl72")
    assert (len(c.nodes), c.capacity) == (160, 704)
    racks: dict[str, list[int]] = {}
    for i, node in enumerate(c.nodes):
        if node.labels.get(ACCELERATOR):
            racks.setdefault(node.labels[ACCELERATOR], []).append(i)
    assert len(racks) == 8 and all(len(r) == 18 for r in racks.values())
    assert all(c.topologies[c.nodes[n].topology].name == "gb200-tray" for r in racks.values() for n in r)
    rack_leaves = {c.nodes[r[0]].labels[LEAF] for r in racks.values()}
    assert len(rack_leaves) == 4  # two racks per leaf
    for r in racks.values():  # a rack sits in one leaf
        assert len(_domains(c, r, LEAF)) == 1
    assert len({n.labels[SPINE] for n in c.nodes}) == 2
    hgx = [n for n in c.nodes if not n.labels.get(ACCELERATOR)]
    assert len(hgx) == 16 and {c.topologies[n.topology].name for n in hgx} == {"hgx-h100"}
    # the existing preset is unchanged
    assert len(preset_cluster("gb200-nvl").nodes) == 96


@pytest.mark.parametrize(
    ("gpus", "shape"),
    [
        (1, None),
        (4, None),
        (6, (2, 2)),
        (8, (2, 2)),
        (16, (4, 2)),
        (64, (16, 8)),
        (144, (36, 18)),
        (160, (40, 10)),
    ],
)
def test_tree_rule(gpus: int, shape: tuple[int, int] | None) -> None:
    got = tree_shape(gpus)
    assert (None if got is None else (got.trays, got.tp)) == shape
    if got is not None:
        assert 2 <= got.tp <= 18 and got.trays % got.tp == 0


def test_as_trees_keeps_small_jobs_and_makes_tray_pods() -> None:
    jobs, trees = as_trees([Job(0, 0.0, 10.0, (1,)), Job(1, 1.0, 20.0, (8, 8))])
    assert jobs[0].pods == (1,) and 0 not in trees
    assert jobs[1].pods == (4,) * 4 and trees[1] == Tree(4, 2)
    assert typical_tp({1: Tree(4, 2), 2: Tree(36, 18)}) == 18  # the median tray's group


def _place(name: str, cluster: SimCluster, job: Job, tree: Tree) -> list[tuple[int, tuple[int, ...]]]:
    pool = AllocatorPool()
    policy = build_tree_policy(name, cluster, [pool.get(t) for t in cluster.topologies], {job.id: tree}, 0)
    got = policy.place(ClusterState(cluster), job)
    assert not isinstance(got, Failure), got
    return got


@pytest.mark.parametrize("name", ["gputopo", "kueue-slices", "kai-subgroups"])
def test_subgroup_policies_keep_every_tp_group_in_one_rack(name: str) -> None:
    c = preset_cluster("nvl72")
    tree = Tree(36, 18)  # two replicas of a whole rack each
    slots = _place(name, c, Job(7, 0.0, 100.0, (4,) * 36), tree)
    nodes = [n for n, _ in slots]
    assert len(set(nodes)) == 36
    for group in tree.groups():
        assert len(_domains(c, [nodes[i] for i in group], ACCELERATOR)) == 1
    assert len(_domains(c, nodes, LEAF)) == 1  # and the replicas share a leaf


def test_gputopo_keeps_groups_whole_where_racks_are_partly_used() -> None:
    """Every rack but two has a tray busy: only those two hold a TP group of 18 trays."""
    c = preset_cluster("nvl72")
    state = ClusterState(c)
    racks: dict[str, list[int]] = {}
    for i, node in enumerate(c.nodes):
        if node.labels.get(ACCELERATOR):
            racks.setdefault(node.labels[ACCELERATOR], []).append(i)
    busy = sorted(racks)[:6]
    for r in busy:
        state.take(racks[r][0], (0, 1, 2, 3))
    tree = Tree(36, 18)
    pool = AllocatorPool()
    policy = build_tree_policy("gputopo", c, [pool.get(t) for t in c.topologies], {1: tree}, 0)
    got = policy.place(state, Job(1, 0.0, 1.0, (4,) * 36))
    assert not isinstance(got, Failure), got
    nodes = [n for n, _ in got]
    for group in tree.groups():
        (rack,) = _domains(c, [nodes[i] for i in group], ACCELERATOR)
        assert rack.rsplit("=", 1)[-1] not in busy


def test_topology_blind_gang_splits_tp_groups() -> None:
    c = preset_cluster("nvl72")
    tree = Tree(8, 4)
    slots = _place("gang-blind", c, Job(3, 0.0, 100.0, (4,) * 8), tree)
    nodes = [n for n, _ in slots]
    split = [g for g in tree.groups() if len(_domains(c, [nodes[i] for i in g], ACCELERATOR)) > 1]
    assert split  # LeastAllocated spreads over the emptiest nodes, racks and HGX alike


def _tiny() -> SimCluster:
    """Racks A and B (3 trays each) in leaf-1, rack C (2 trays) in leaf-2, one spine."""
    nodes = [
        _node(f"{r}{t}", "gb200-tray", leaf=leaf, spine="s", nvl=f"nvl-{r}")
        for r, leaf, count in (("a", "leaf-1", 3), ("b", "leaf-1", 3), ("c", "leaf-2", 2))
        for t in range(count)
    ]
    return from_snapshot(parse_cluster({"levels": list(DEFAULT_LEVELS), "nodes": nodes}))


def test_tree_figures_on_a_hand_made_case() -> None:
    c = _tiny()
    idx = {n.name: i for i, n in enumerate(c.nodes)}
    pool = AllocatorPool()
    allocators = [pool.get(t) for t in c.topologies]
    tree = Tree(4, 2)
    job = Job(5, 0.0, 100.0, (4,) * 4)
    rec = TreeRecorder(c, allocators, JobModel(), {5: tree})
    # group 0 on a0, a1 (one rack), group 1 on a2, b0 (split across racks, inside the leaf)
    split = [(idx[n], (0, 1, 2, 3)) for n in ("a0", "a1", "a2", "b0")]
    stretch = rec.placed_job(job, split, 30.0)
    figures = rec.tree_figures()
    assert figures["tp_groups_inside_nvlink"] == 0.5
    assert figures["tree_jobs_inside_leaf"] == 1.0
    assert figures["tree_queue_delay_mean"] == 30.0
    assert stretch > 1.0  # the split group all-reduces over the NICs
    assert figures["tree_efficiency"] == pytest.approx(1 / stretch)
    # both groups inside a rack, the job in one leaf: the ideal (no rack holds 16 GPUs)
    timer = TreeTimer(c, allocators)
    whole = [(idx[n], (0, 1, 2, 3)) for n in ("a0", "a1", "b0", "b1")]
    assert timer.stretch(tree, whole) == pytest.approx(1.0)
    across = [(idx[n], (0, 1, 2, 3)) for n in ("a0", "a1", "c0", "c1")]  # replicas in two leaves
    assert timer.stretch(tree, whole) <= timer.stretch(tree, across) < stretch


def test_racks_left_fragmented() -> None:
    c = _tiny()
    idx = {n.name: i for i, n in enumerate(c.nodes)}
    state = ClusterState(c)
    watch = RackWatch(state, need=2, horizon=10.0)
    assert len(watch.racks) == 3 and watch.count() == 0
    watch.tick(0.0)
    state.take(idx["a0"], (0,))  # rack A partly used, 2 whole trays free: holds a group of 2
    assert watch.count() == 0
    state.take(idx["a1"], (0, 1, 2, 3))  # now 1 whole tray free: fragmented
    assert watch.count() == 1
    watch.tick(4.0)
    watch.before_give()
    state.give(idx["a1"], (0, 1, 2, 3))
    watch.tick(6.0)  # [4, 6) still had the fragmented rack
    watch.tick(10.0)
    assert watch.mean() == pytest.approx(6.0 / 10.0)


def _simulate(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'proto'}"}
    return subprocess.run(
        [sys.executable, "-m", "gputopo", "simulate", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
        check=False,
    )


def test_cli_tree_jobs() -> None:
    done = _simulate("--jobs", "tree", "--cluster-preset", "nvl72", "--pods", "150", "-o", "json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert [r["policy"] for r in doc["results"]] == list(TREE_POLICIES)
    ours = doc["results"][0]
    assert ours["extra"]["tp_groups_inside_nvlink"] == 1.0
    text = _simulate(
        "--jobs", "tree", "--cluster-preset", "nvl72", "--pods", "60", "--policies", "gputopo,gang-blind"
    )
    assert text.returncode == 0, text.stderr
    assert "TP groups inside one NVLink domain" in text.stdout and "gang-blind" in text.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("--jobs", "forest"),
        ("--jobs", "tree", "--policies", "kubelet-default"),
        ("--jobs", "tree", "--gpu-sharing"),
    ],
)
def test_cli_tree_refusals_are_one_line(args: tuple[str, ...]) -> None:
    done = _simulate(*args, "--pods", "10")
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_hostname_level_present() -> None:
    assert preset_cluster("nvl72").levels[0] == HOSTNAME


def _policy(name: str, cluster: SimCluster, trees: dict[int, Tree]) -> TreePolicy:
    pool = AllocatorPool()
    return build_tree_policy(name, cluster, [pool.get(t) for t in cluster.topologies], trees, 0)


def test_kube_tas_names_one_level_as_a_user_would() -> None:
    """One key for the whole PodGroup: the NVLink domain while one rack holds the job, else the
    leaf; the job then lands in the fullest domain of that key (MostAllocated placement score)."""
    c = preset_cluster("nvl72")
    policy = _policy("kube-tas", c, {})
    assert policy.smallest(Tree(18, 9)) == ACCELERATOR
    assert policy.smallest(Tree(36, 18)) == LEAF
    state = ClusterState(c)
    rack = [i for i, n in enumerate(c.nodes) if n.labels.get(ACCELERATOR) == "nvl72-5"]
    state.take(rack[0], (0, 1, 2, 3))  # rack 5 is the fullest that still holds 8 trays
    policy = _policy("kube-tas", c, {1: Tree(8, 4)})
    got = policy.place(state, Job(1, 0.0, 1.0, (4,) * 8))
    assert not isinstance(got, Failure)
    assert _domains(c, [n for n, _ in got], ACCELERATOR) == {f"{ACCELERATOR}=nvl72-5"}


def test_volcano_hard_waits_where_soft_spreads() -> None:
    """Every leaf has one busy tray: no leaf holds 36 trays; hard waits, soft goes anywhere."""
    c = preset_cluster("nvl72")
    state = ClusterState(c)
    for leaf in {n.labels[LEAF] for n in c.nodes}:
        first = min(i for i, n in enumerate(c.nodes) if n.labels[LEAF] == leaf)
        state.take(first, (0, 1, 2, 3))
    trees = {1: Tree(36, 18)}
    job = Job(1, 0.0, 1.0, (4,) * 36)
    assert isinstance(_policy("volcano-hard", c, trees).place(state, job), Failure)
    got = _policy("volcano-soft", c, trees).place(state, job)
    assert not isinstance(got, Failure) and len(_domains(c, [n for n, _ in got], LEAF)) > 1


def test_kueue_slices_keep_replicas_in_the_tightest_rack_that_holds_them() -> None:
    c = preset_cluster("nvl72")
    state = ClusterState(c)
    for rack, busy in (("nvl72-0", 6), ("nvl72-1", 2)):  # rack 0: 12 free trays, rack 1: 16
        nodes = [i for i, n in enumerate(c.nodes) if n.labels.get(ACCELERATOR) == rack]
        for i in nodes[:busy]:
            state.take(i, (0, 1, 2, 3))
    got = _policy("kueue-slices", c, {1: Tree(12, 6)}).place(state, Job(1, 0.0, 1.0, (4,) * 12))
    assert not isinstance(got, Failure)
    assert _domains(c, [n for n, _ in got], ACCELERATOR) == {f"{ACCELERATOR}=nvl72-0"}
