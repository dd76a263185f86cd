"""Cluster snapshot files: the design.md §4 example, every way to give GPUs, errors with places."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gputopo.gang.planner import GangPlan, GangSpec, Member, plan_gang
from gputopo.network.cluster import ClusterError, generate_cluster, load_cluster, parse_cluster
from gputopo.network.levels import DEFAULT_LEVELS, HOSTNAME, LEAF, SPINE
from gputopo.node.topofile import load_preset

DESIGN_EXAMPLE = """\
levels: [kubernetes.io/hostname, network.topology.nvidia.com/leaf, network.topology.nvidia.com/spine, topology.kubernetes.io/zone]
nodes:
  - name: a1
    labels: {network.topology.nvidia.com/leaf: leaf-1, network.topology.nvidia.com/spine: spine-1}
    gpus: dgx-a100
    allocated: [0, 1]          # GPU indices (or UUIDs) already in use
podgroups:                     # optional: PodGroup objects, for gangs labelled scheduling.x-k8s.io/pod-group
  - {namespace: ml, name: llama-70b, minMember: 16}
"""


def write(tmp_path: Path, text: str, name: str = "cluster.yaml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_design_example(tmp_path: Path) -> None:
    snap = load_cluster(write(tmp_path, DESIGN_EXAMPLE))
    assert snap.levels == (HOSTNAME, LEAF, SPINE, "topology.kubernetes.io/zone")
    (a1,) = snap.nodes
    assert (a1.name, a1.gpu_count, a1.allocated) == ("a1", 8, frozenset({0, 1}))
    assert a1.topology is not None and a1.topology.name == "dgx-a100"
    assert dict(a1.labels) == {LEAF: "leaf-1", SPINE: "spine-1"}
    assert [(g.key, g.min_member) for g in snap.podgroups] == [("ml/llama-70b", 16)]
    (view,) = snap.node_views()
    assert view.free == frozenset(range(2, 8)) and view.allocator is not None


def test_every_way_to_give_gpus(tmp_path: Path) -> None:
    (tmp_path / "topos").mkdir()
    (tmp_path / "topos" / "box.json").write_text(json.dumps(load_preset("dgx1-v100").to_dict()))
    inline = load_preset("rtx8000-4").to_dict()
    uuid = inline["gpus"][2]["uuid"]
    data = {
        "nodes": [
            {"name": "p", "gpus": "dgx-a100"},
            {"name": "f", "gpus": "topos/box.json", "allocated": [7]},
            {"name": "i", "gpus": inline, "allocated": [uuid, 0]},
            {"name": "u", "gpus": 4, "allocated": [3]},
            {"name": "q", "gpus": "dgx-a100", "allocated": []},
        ]
    }
    snap = load_cluster(write(tmp_path, json.dumps(data), "c.json"))
    assert snap.levels == DEFAULT_LEVELS
    by = snap.by_name
    assert by["f"].topology is not None and by["f"].topology.n == 8 and by["f"].allocated == {7}
    assert by["i"].allocated == {0, 2}
    assert by["u"].topology is None and by["u"].gpu_count == 4
    views = {v.name: v for v in snap.node_views(used={"p": [0, 1]})}
    assert views["p"].free == frozenset(range(2, 8))
    assert views["u"].free == {0, 1, 2} and views["u"].allocator is None
    # One Allocator per distinct bandwidth matrix: p and q share theirs.
    assert views["p"].allocator is views["q"].allocator
    assert views["p"].allocator is not views["f"].allocator


def test_round_trip_through_to_dict(tmp_path: Path) -> None:
    snap = generate_cluster(2, 2, 3, ["dgx-a100", "pcie8-plx"], seed=3, busy_fraction=0.5)
    again = parse_cluster(json.loads(json.dumps(snap.to_dict())))
    assert again == snap
    pods = {
        "nodes": [{"name": "a", "gpus": 8}],
        "pods": [
            {
                "namespace": "ml",
                "name": "w-0",
                "gpus": 2,
                "node": "a",
                "labels": {"scheduling.x-k8s.io/pod-group": "g"},
                "annotations": {"gputopo.io/required-topology": LEAF},
                "uid": "u-1",
            },
            {"name": "idle"},
        ],
    }
    snap = parse_cluster(pods)
    assert [p.key for p in snap.pods] == ["ml/w-0", "default/idle"]
    assert snap.pods[0].node == "a" and snap.pods[1].node == "" and snap.pods[1].gpus == 0
    assert parse_cluster(snap.to_dict()) == snap


def _node(**kw: Any) -> dict[str, Any]:
    return {"name": "a1", "gpus": "dgx-a100", **kw}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "must be a mapping with 'nodes'"),
        ({"nodes": []}, "nodes: must be a non-empty list"),
        ({"nodes": [_node()], "extra": 1}, "snapshot: unknown key 'extra'"),
        (
            {"levels": ["bad key"], "nodes": [_node()]},
            r"levels\[0\]: 'bad key' is not a valid node-label key",
        ),
        (
            {"nodes": [_node(), _node(name="b", gpus="dgx-9")]},
            r"nodes\[1\]\.gpus: topology 'dgx-9' is neither a preset",
        ),
        ({"nodes": [_node(gpus="nope/x.json")]}, r"nodes\[0\]\.gpus: topology '.*nope/x.json' is neither"),
        ({"nodes": [_node(gpus=True)]}, r"nodes\[0\]\.gpus: give a preset name"),
        ({"nodes": [_node(gpus=-1)]}, r"nodes\[0\]\.gpus: a GPU count must be 0..1024"),
        ({"nodes": [_node(gpus=[1])]}, r"nodes\[0\]\.gpus: must be a preset name"),
        ({"nodes": [_node(gpus={"gpus": []})]}, r"nodes\[0\]\.gpus: 'gpus' must be a non-empty list"),
        ({"nodes": [_node(name="A_1")]}, r"nodes\[0\]\.name: 'A_1' is not a valid node name"),
        ({"nodes": [_node(), _node()]}, r"nodes\[1\]\.name: node 'a1' is listed twice"),
        ({"nodes": [_node(labels={LEAF: 3})]}, r"nodes\[0\]\.labels\..*leaf: 3 is not a valid label value"),
        (
            {"nodes": [_node(labels={"bad key": "x"})]},
            r"nodes\[0\]\.labels: 'bad key' is not a valid label key",
        ),
        ({"nodes": [_node(allocated=[8])]}, r"nodes\[0\]\.allocated\[0\]: GPU index 8 is not in 0..7"),
        ({"nodes": [_node(allocated=["GPU-x"])]}, r"nodes\[0\]\.allocated\[0\]: no GPU with UUID 'GPU-x'"),
        (
            {"nodes": [_node(gpus=2, allocated=["GPU-x"])]},
            r"allocated\[0\]: 'GPU-x' is not a GPU index \(topology",
        ),
        ({"nodes": [_node(allocated=5)]}, r"nodes\[0\]\.allocated: must be a list"),
        ({"nodes": [_node(topology="x")]}, r"nodes\[0\]: unknown key 'topology'"),
        ({"nodes": ["a1"]}, r"nodes\[0\]: must be a mapping"),
        ({"nodes": [_node()], "podgroups": [{"name": "g", "minMember": 0}]}, r"podgroups\[0\]\.minMember"),
        (
            {"nodes": [_node()], "podgroups": [{"name": "g", "minMember": 1}, {"name": "g", "minMember": 2}]},
            r"podgroups\[1\]: podgroup default/g is listed twice",
        ),
        ({"nodes": [_node()], "pods": [{"name": "p", "node": "zz"}]}, r"pods\[0\]\.node: 'zz' is not a node"),
        ({"nodes": [_node()], "pods": [{"name": "p", "gpus": "2"}]}, r"pods\[0\]\.gpus: must be an integer"),
        ({"nodes": [_node()], "pods": [{"name": "p", "annotations": {"a": 1}}]}, r"pods\[0\]\.annotations"),
    ],
)
def test_errors_name_the_place(data: Any, message: str) -> None:
    with pytest.raises(ClusterError, match=message):
        parse_cluster(data, base_dir="/nonexistent")


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="cannot read"):
        load_cluster(str(tmp_path / "missing.yaml"))
    with pytest.raises(ClusterError, match="not valid YAML or JSON"):
        load_cluster(write(tmp_path, "nodes: [a, b"))
    with pytest.raises(ClusterError, match=r"nodes\[0\]\.gpus: .*broken.json: .*not valid JSON"):
        (tmp_path / "broken.json").write_text("{")
        load_cluster(write(tmp_path, "nodes: [{name: a, gpus: broken.json}]"))


def test_generated_clusters() -> None:
    snap = generate_cluster(3, 4, 5, {"dgx-a100": 2, "rtx8000-4": 1}, seed=11, busy_fraction=0.4)
    assert len(snap.nodes) == 60
    assert snap == generate_cluster(3, 4, 5, {"dgx-a100": 2, "rtx8000-4": 1}, seed=11, busy_fraction=0.4)
    assert snap != generate_cluster(3, 4, 5, {"dgx-a100": 2, "rtx8000-4": 1}, seed=12, busy_fraction=0.4)
    leaves = {n.labels[LEAF] for n in snap.nodes}
    spines = {n.labels[SPINE] for n in snap.nodes}
    assert len(leaves) == 12 and len(spines) == 3
    assert all(n.labels[LEAF].startswith(n.labels[SPINE].replace("spine", "leaf")) for n in snap.nodes)
    busy = sum(1 for n in snap.nodes if n.allocated)
    assert 10 <= busy <= 40
    assert {n.gpu_count for n in snap.nodes} == {8, 4}
    assert len({id(a) for a in snap.allocators.values()}) == 2
    empty = generate_cluster(1, 1, 2)
    assert all(not n.allocated and n.topology and n.topology.name == "dgx-a100" for n in empty.nodes)
    for bad in ({"spines": 0}, {"busy_fraction": 2.0}, {"presets": {}}, {"presets": {"dgx-a100": -1}}):
        args: dict[str, Any] = {"spines": 1, "leaves_per_spine": 1, "nodes_per_leaf": 1, **bad}
        with pytest.raises(ValueError):
            generate_cluster(**args)


def test_a_gang_on_a_generated_cluster_stays_in_one_leaf() -> None:
    snap = generate_cluster(2, 3, 6, seed=5, busy_fraction=0.3)
    spec = GangSpec("ml/g", tuple(Member(f"ml/w{i}", 8) for i in range(4)))
    out = plan_gang(spec, snap.node_views(), snap.levels, index=snap.index)
    assert isinstance(out, GangPlan) and out.level == LEAF
    assert {snap.by_name[p.node].labels[LEAF] for p in out.placements} == {out.domain}


def test_json_and_yaml_snapshots_read_alike(tmp_path: Path) -> None:
    """JSON is read by a JSON parser (fast), YAML by the YAML loader; both give one snapshot,
    also with a byte order mark, and a JSON-looking text that only YAML accepts still loads."""
    import yaml

    doc = generate_cluster(2, 2, 3, ("dgx1-v100", "hgx-h100"), seed=3, busy_fraction=0.5).to_dict()
    doc["nodes"][0]["gpus"] = load_preset("dgx1-v100").to_dict()  # an inline topology too
    as_json = tmp_path / "c.json"
    as_json.write_text(json.dumps(doc), encoding="utf-8")
    as_yaml = tmp_path / "c.yaml"
    as_yaml.write_text(yaml.safe_dump(doc), encoding="utf-8")
    with_bom = tmp_path / "bom.json"
    with_bom.write_text("\ufeff" + json.dumps(doc, indent=1), encoding="utf-8")
    yaml_only = tmp_path / "flow.yaml"  # a trailing comma: not JSON, but a YAML flow mapping
    yaml_only.write_text(json.dumps(doc)[:-1] + ",}", encoding="utf-8")
    want = load_cluster(str(as_yaml)).to_dict()
    for path in (as_json, with_bom, yaml_only):
        assert load_cluster(str(path)).to_dict() == want, path.name
    broken = tmp_path / "broken.json"
    broken.write_text('{"nodes": [', encoding="utf-8")
    with pytest.raises(ClusterError, match="not valid YAML or JSON"):
        load_cluster(str(broken))
