"""The Node annotation: round trip, size limit, and strict rejection of bad data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gputopo.network import annotation
from gputopo.network.annotation import AnnotationError, decode, encode, make
from gputopo.node.topology import Topology, make_topology
from tests.strategies import topologies

PRESETS = Path(__file__).resolve().parent.parent / "gputopo" / "node" / "presets"
NOW = 1_800_000_000.0


def preset(name: str) -> Topology:
    return Topology.from_dict(json.loads((PRESETS / f"{name}.json").read_text()))


def test_round_trip_keeps_everything_the_scheduler_needs() -> None:
    topo = preset("dgx1-v100")
    value = make(
        "node-a", topo, generated_at=NOW - 5, plugin_version="0.1.0", unhealthy=[3], allocated=[0, 1]
    )
    back = decode(encode(value), now=NOW, max_age_s=60)
    assert back.node == "node-a"
    assert back.unhealthy == {3}
    assert back.allocated == {0, 1}
    assert back.free == {2, 4, 5, 6, 7}
    assert back.plugin_version == "0.1.0"
    assert back.generated_at == NOW - 5
    assert [g.uuid for g in back.topology.gpus] == [g.uuid for g in topo.gpus]
    assert [g.numa for g in back.topology.gpus] == [g.numa for g in topo.gpus]
    assert (back.topology.bandwidth_mbps == topo.bandwidth_mbps).all()
    assert back.topology.nvswitch == topo.nvswitch


def test_bandwidth_settings_travel() -> None:
    topo = preset("hgx-h100")
    from gputopo.node.links import BandwidthSettings

    topo = topo.with_settings(BandwidthSettings(nvlink_gbps_per_link=50, pcie_gbps={"SYS": 9}))
    back = decode(encode(make("n", topo, generated_at=NOW, plugin_version="x")), now=NOW, max_age_s=1)
    assert back.topology.settings.nvlink_gbps_per_link == 50
    assert back.topology.settings.pcie_gbps["SYS"] == 9
    assert (back.topology.bandwidth_mbps == topo.bandwidth_mbps).all()


def test_sixteen_gpus_stay_far_below_the_limit() -> None:
    def code(i: int, j: int) -> str:
        return "X" if i == j else ("NV18" if i // 8 == j // 8 else "SYS")

    codes = [[code(i, j) for j in range(16)] for i in range(16)]
    topo = make_topology(codes, name="gpu16", numa=[i // 8 for i in range(16)])
    text = encode(
        make(
            "node-with-a-long-name-" + "x" * 40,
            topo,
            generated_at=NOW,
            plugin_version="0.1.0",
            allocated=range(15),
        )
    )
    assert len(text.encode()) < annotation.ANNOTATION_LIMIT_BYTES // 32
    assert decode(text, now=NOW, max_age_s=1).allocated == frozenset(range(15))


def test_allocated_may_be_given_as_uuids() -> None:
    topo = preset("dgx-a100")
    doc = json.loads(encode(make("n", topo, generated_at=NOW, plugin_version="v")))
    doc["allocated"] = [topo.gpus[2].uuid, 5]
    assert decode(json.dumps(doc), now=NOW, max_age_s=1).allocated == {2, 5}


def _doc() -> dict:
    return json.loads(encode(make("n", preset("dgx-a100"), generated_at=NOW, plugin_version="v")))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("links"), "lacks links"),
        (lambda d: d.update(version=2), "version 2"),
        (lambda d: d.update(version=True), "version"),
        (lambda d: d.update(generatedAt="yesterday"), "generatedAt"),
        (lambda d: d.update(generatedAt=NOW + 3600), "future"),
        (lambda d: d.update(generatedAt=NOW - 3600), "stale"),
        (lambda d: d.update(allocated=[8]), "out of range"),
        (lambda d: d.update(allocated=["GPU-nope"]), "unknown GPU"),
        (lambda d: d.update(allocated="0,1"), "allocated must be a list"),
        (lambda d: d["links"].pop(), "links"),
        (lambda d: d["links"].__setitem__(0, d["links"][0].replace("NV12", "NV0", 1)), "NVLink count"),
        (lambda d: d["links"].__setitem__(1, d["links"][1].replace("NV12", "PIX", 1)), "asymmetric"),
        (lambda d: d.update(gpus=[]), "gpus"),
        (lambda d: d["gpus"][0].update(healthy="yes"), "healthy"),
        (lambda d: d.update(node=""), "node"),
    ],
)
def test_corrupt_annotations_are_rejected_with_a_reason(mutate, message: str) -> None:
    doc = _doc()
    mutate(doc)
    with pytest.raises(AnnotationError, match=message):
        decode(json.dumps(doc), now=NOW, max_age_s=600)


@pytest.mark.parametrize("text", [None, "", "{", "[]", "null", "x" * (annotation.ANNOTATION_LIMIT_BYTES + 1)])
def test_missing_or_garbage_text(text: str | None) -> None:
    with pytest.raises(AnnotationError):
        decode(text, now=NOW, max_age_s=600)


@settings(max_examples=60, deadline=None)
@given(topologies(max_gpus=16), st.data())
def test_round_trip_property(topo: Topology, data: st.DataObject) -> None:
    """Any valid topology, health and allocation survives encode/decode unchanged."""
    idx = st.sets(st.integers(0, topo.n - 1))
    unhealthy, allocated = data.draw(idx), data.draw(idx)
    at = data.draw(st.floats(0, 2e9, allow_nan=False))
    value = make("n", topo, generated_at=at, plugin_version="v", unhealthy=unhealthy, allocated=allocated)
    text = encode(value)
    back = decode(text, now=at, max_age_s=0)
    assert (back.unhealthy, back.allocated, back.generated_at) == (
        frozenset(unhealthy),
        frozenset(allocated),
        at,
    )
    assert [(g.uuid, g.numa) for g in back.topology.gpus] == [(g.uuid, g.numa) for g in topo.gpus]
    assert (back.topology.bandwidth_mbps == topo.bandwidth_mbps).all()
    assert encode(back) == text
