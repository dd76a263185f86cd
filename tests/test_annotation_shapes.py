"""The decoder's fast path for servers of a model seen before (`Shapes`): GPU entries as the plugin
writes them are checked together and their GPU objects made on first read
(`Topology.with_gpu_columns`); anything else takes the full path. The answers are the full
path's either way (tests/test_annotation_fuzz.py mutates at random; these are the chosen cases),
and one bad annotation costs only its node."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

import pytest

from gputopo.network.annotation import AnnotationError, NodeTopology, Shapes, decode, encode, make
from gputopo.node.topofile import load_preset
from gputopo.node.topology import GPU, Topology
from scheduler.live.objects import known_node, listed_nodes, node_info
from scheduler.model import NodeInfo, node_gpu_capacity, parse_quantity
from scheduler.nodeguard import NodeGuard

NOW = 1_800_000_000.0
KEY = "gputopo.io/topology"


def doc(node: str, preset: str = "dgx-a100", **kw: Any) -> dict[str, Any]:
    topo = load_preset(preset)
    gpus = tuple(replace(g, uuid=f"GPU-{node}-{g.index}") for g in topo.gpus)
    value = make(node, replace(topo, gpus=gpus), generated_at=NOW - 1, plugin_version="1", **kw)
    return json.loads(encode(value))


def both(text: str, shapes: Shapes) -> tuple[NodeTopology | str, NodeTopology | str]:
    """What the decode with the store's shapes gives, and what one without them gives."""
    out: list[NodeTopology | str] = []
    for s in (shapes, None):
        try:
            out.append(decode(text, now=NOW, max_age_s=60, shapes=s))
        except AnnotationError as e:
            out.append(str(e))
    return out[0], out[1]


def primed() -> Shapes:
    shapes = Shapes()
    decode(json.dumps(doc("first")), now=NOW, max_age_s=60, shapes=shapes)
    return shapes


def test_a_known_models_gpus_are_made_on_first_read_and_equal_the_full_paths() -> None:
    shapes = primed()
    text = encode(make("b", load_preset("dgx-a100"), generated_at=NOW, plugin_version="1", unhealthy=[2]))
    fast, full = both(text, shapes)
    assert isinstance(fast, NodeTopology) and isinstance(full, NodeTopology)
    topo = fast.topology
    assert "gpus" not in vars(topo) and topo.n == 8  # n read without making them
    assert fast == full and repr(topo) == repr(full.topology)  # (a Topology is not hashable)
    assert "gpus" in vars(topo) and topo.gpus is topo.gpus  # made once, then kept
    assert all(type(g) is GPU for g in topo.gpus) and topo.gpus == full.topology.gpus
    assert fast.unhealthy == {2} and topo.index_by_uuid == full.topology.index_by_uuid


def test_a_topology_with_unmade_gpus_copies_and_replaces_as_any() -> None:
    shapes = primed()
    fast = decode(json.dumps(doc("b")), now=NOW, max_age_s=60, shapes=shapes).topology
    other = copy.copy(fast)  # (a Topology's settings hold a mappingproxy: no deepcopy, no pickle)
    assert other == fast and other.gpus == fast.gpus
    again = decode(json.dumps(doc("b")), now=NOW, max_age_s=60, shapes=shapes).topology
    assert replace(again, description="x").gpus == fast.gpus
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        again.nope  # noqa: B018 (only `gpus` is made on demand)
    plain = load_preset("dgx-a100")
    assert isinstance(plain, Topology) and "gpus" in vars(plain)


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("index", True),  # equals 1, but a bool
        ("index", 1.0),
        ("numa", True),
        ("numa", 2.5),
        ("numa", -2),
        ("numa", 5000),
        ("numa", None),  # allowed: the full path reads it
        ("numa", -1),  # allowed: no NUMA node
        ("uuid", ""),
        ("uuid", "GPU-b-0"),  # another GPU's: duplicate
        ("uuid", 7),
        ("uuid", "u" * 257),
        ("model", None),  # the full path reads None as "None"
        ("model", "m" * 257),
        ("healthy", 1),
        ("healthy", False),
        ("pci_bus_id", "0000:07:00.0"),  # an extra key: the GPU-at-a-time path
    ],
)
def test_each_odd_gpu_field_decodes_or_fails_as_without_the_fast_path(where: str, value: Any) -> None:
    d = doc("b")
    d["gpus"][3][where] = value
    fast, full = both(json.dumps(d), primed())
    assert fast == full


@pytest.mark.parametrize("change", ["reorder", "drop", "extra", "not-a-dict"])
def test_gpu_entries_of_another_form_decode_as_without_the_fast_path(change: str) -> None:
    d = doc("b")
    g = d["gpus"][5]
    if change == "reorder":
        d["gpus"][5] = dict(reversed(list(g.items())))
    elif change == "drop":
        del g["healthy"]
    elif change == "extra":
        g["future"] = {"x": 1}
    else:
        d["gpus"][5] = [g]
    fast, full = both(json.dumps(d), primed())
    assert fast == full


def node_obj(name: str, text: str) -> dict[str, Any]:
    meta = {"name": name, "labels": {"zone": "a"}, "annotations": {KEY: text}}
    return {"metadata": meta, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}


def test_a_bad_annotation_among_a_models_good_ones_costs_its_node_only() -> None:
    bad = doc("n1")
    bad["gpus"][2]["uuid"] = bad["gpus"][1]["uuid"]  # duplicate UUIDs
    texts = [json.dumps(doc("n0")), json.dumps(bad), json.dumps(doc("n2")), json.dumps(doc("n3"))]
    guard, shapes = NodeGuard(), Shapes()

    def read(obj: dict[str, Any]) -> NodeInfo:
        return node_info(
            obj, resource="nvidia.com/gpu", annotation_key=KEY, clock=lambda: NOW, guard=guard, shapes=shapes
        )

    infos = listed_nodes([node_obj(f"n{k}", t) for k, t in enumerate(texts)], {}, read)
    assert [i.topology is not None for i in infos] == [True, False, True, True]
    assert "unique" in infos[1].topology_problem
    good = [i.topology.topology for i in infos if i.topology is not None]
    assert good[1].links is good[0].links and good[2].links is good[0].links  # the model's, shared
    assert len({g.uuid for t in good for g in t.gpus}) == 24

    # that node's plugin rewrites it well; the others' are unchanged, and keep their topologies
    rewritten = [node_obj("n1", json.dumps(doc("n1")))]
    held = {i.name: i for i in infos}
    again = listed_nodes([node_obj(f"n{k}", t) for k, t in enumerate(texts)][:1] + rewritten, held, read)
    assert again[0].topology is not None and held["n0"].topology is not None
    assert again[0].topology.topology is held["n0"].topology.topology
    assert again[1].topology is not None and again[1].topology.topology.gpus[2].uuid == "GPU-n1-2"


def test_a_known_node_is_the_dataclasss_own() -> None:
    topo = decode(json.dumps(doc("n0")), now=NOW, max_age_s=60)
    fast = known_node("n0", {"a": "b"}, 8, topo)
    slow = NodeInfo("n0", {"a": "b"}, 8, topo)
    assert fast == slow and vars(fast) == vars(slow)


@pytest.mark.parametrize(
    "raw", ["8", "08", " 8", "0", "1024", "1025", "9999", "²", "8.0", "-1", "", 8, True, None]
)
def test_the_allocatable_fast_path_reads_as_parse_quantity(raw: Any) -> None:
    try:
        want = parse_quantity(raw, "allocatable")
    except Exception:
        want = 0
    assert node_gpu_capacity({"status": {"allocatable": {"nvidia.com/gpu": raw}}}) == want
