"""`annotation.decode` is total: any bytes give a valid, in-range annotation or AnnotationError.

Every node's annotation is untrusted input that the one sidecar reads for the whole cluster, so
the reported cases come first (each raised something else, or decoded into numbers that broke
the allocator later), then random mutations of real annotations: byte flips, truncation,
number inflation, type swaps, deletions and huge values at random places.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gputopo.network.annotation import AnnotationError, NodeTopology, Shapes, decode, encode, make
from gputopo.node.allocator import MAX_GPUS, Allocator
from gputopo.node.links import MAX_GBPS
from gputopo.node.topofile import load_preset
from gputopo.node.topology import GPU, gpu

NOW = 1_800_000_000.0
HUGE = int("9" * 400)
SMALL_PRESETS = ("dgx-a100", "dgx1-v100", "pcie8-plx", "rtx8000-4")


def valid_doc(preset: str = "dgx-a100") -> dict[str, Any]:
    topo = load_preset(preset)
    value = make(
        "node-a",
        topo,
        generated_at=NOW - 10,
        plugin_version="0.1.0",
        unhealthy=[topo.n - 1],
        allocated=[0, 1],
        pods={"ml/p": [0, 1]},
    )
    return json.loads(encode(value))


def _decode(doc: Any) -> NodeTopology:
    return decode(json.dumps(doc), now=NOW, max_age_s=3600)


def _check_usable(value: NodeTopology) -> None:
    """What the sidecar does with a decoded annotation must not raise either."""
    topo = value.topology
    assert 1 <= topo.n <= 64
    assert 0 <= value.generated_at <= NOW + 300
    assert 0 < topo.settings.nvlink_gbps_per_link <= MAX_GBPS
    matrix = topo.bandwidth_mbps  # int64: must not overflow
    assert int(matrix.max()) <= 64 * MAX_GBPS * 1000
    assert value.allocated <= frozenset(range(topo.n)) and value.unhealthy <= frozenset(range(topo.n))
    for gpus in (value.pods or {}).values():
        assert gpus <= value.allocated
    if topo.n <= 8:
        alloc = Allocator(topo)
        free = sorted(value.free)
        if free:
            alloc.choose(free, min(2, len(free)))


# ---------------------------------------------------------------------- the reported cases


def test_reported_400_digit_generated_at_is_an_annotation_error() -> None:
    doc = valid_doc()
    doc["generatedAt"] = HUGE  # was: OverflowError from math.isfinite
    with pytest.raises(AnnotationError, match="generatedAt"):
        _decode(doc)


def test_reported_nv_plus_400_digits_in_a_links_row_is_an_annotation_error() -> None:
    doc = valid_doc()
    code = "NV" + "9" * 400
    rows = [r.split() for r in doc["links"]]
    rows[0][1] = rows[1][0] = code  # symmetric, so only the count itself is wrong
    doc["links"] = [" ".join(r) for r in rows]
    with pytest.raises(AnnotationError):  # was: decoded, then OverflowError in every /filter
        _decode(doc)


def test_nvlink_count_beyond_any_real_gpu_is_refused_even_when_short() -> None:
    doc = valid_doc()
    rows = [r.split() for r in doc["links"]]
    rows[0][1] = rows[1][0] = "NV999999"
    doc["links"] = [" ".join(r) for r in rows]
    with pytest.raises(AnnotationError, match=r"NVLink count must be 1\.\.64"):
        _decode(doc)


def test_reported_400_digit_nvlink_gbps_is_an_annotation_error() -> None:
    doc = valid_doc()
    doc["nvlinkGbpsPerLink"] = HUGE  # was: OverflowError from float()
    with pytest.raises(AnnotationError, match="nvlinkGbpsPerLink"):
        _decode(doc)


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("generatedAt", -HUGE, "generatedAt"),
        ("generatedAt", float("nan"), "generatedAt"),
        ("generatedAt", -1, "generatedAt"),
        ("nvlinkGbpsPerLink", float("inf"), "nvlinkGbpsPerLink"),
        ("nvlinkGbpsPerLink", 0, "nvlinkGbpsPerLink"),
        ("nvlinkGbpsPerLink", True, "nvlinkGbpsPerLink"),
        ("pcieGbps", {"SYS": HUGE}, "pcieGbps"),
        ("pcieGbps", {"SYS": -1}, "pcieGbps"),
        ("pcieGbps", {"X" * 1000: 1}, "pcieGbps"),
        ("node", "n" * 300, "node"),
        ("pluginVersion", "v" * 300, "pluginVersion"),
        ("name", ["x"], "name"),
        ("allocated", list(range(1000)), "allocated"),
        ("allocated", [HUGE], "allocated"),
        ("pods", {"ml/p": [5]}, "not in allocated"),
        ("pods", {"no-slash": [0]}, "namespace/name"),
        ("pods", {f"ns/p{i}": [] for i in range(300)}, "pods"),
        ("pods", {"ml/p": [0] * 100}, "pods"),
        ("version", HUGE, "version"),
    ],
    ids=lambda v: str(v)[:24],
)
def test_every_number_and_length_is_range_checked(key: str, value: Any, reason: str) -> None:
    doc = valid_doc()
    doc[key] = value
    with pytest.raises(AnnotationError, match=reason):
        _decode(doc)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("index", HUGE),
        ("index", -1),
        ("numa", HUGE),
        ("uuid", "u" * 1000),
        ("model", {"nested": "object"}),
        ("healthy", "yes"),
    ],
    ids=lambda v: str(v)[:24],
)
def test_gpu_entries_are_range_checked(field: str, value: Any) -> None:
    doc = valid_doc()
    doc["gpus"][0][field] = value
    with pytest.raises(AnnotationError, match=r"gpus\[0\]"):
        _decode(doc)


def test_too_many_gpus_is_refused_before_building_anything() -> None:
    doc = valid_doc()
    doc["gpus"] = [{"index": i, "uuid": f"GPU-{i}"} for i in range(65)]
    with pytest.raises(AnnotationError, match="more than 64"):
        _decode(doc)


def test_bytes_are_accepted_and_non_utf8_is_an_annotation_error() -> None:
    text = json.dumps(valid_doc()).encode()
    assert decode(text, now=NOW, max_age_s=3600).node == "node-a"
    with pytest.raises(AnnotationError, match="UTF-8"):
        decode(b"\xff\xfe" + text, now=NOW, max_age_s=3600)


def test_old_annotations_without_a_pod_map_still_decode() -> None:
    doc = valid_doc()
    del doc["pods"]
    value = _decode(doc)
    assert value.pods is None and value.allocated == {0, 1}


def test_pod_map_round_trips() -> None:
    value = _decode(valid_doc())
    assert value.pods == {"ml/p": frozenset({0, 1})}


# ---------------------------------------------------------------------- random mutations

_nasty_numbers = st.one_of(
    st.integers(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.sampled_from([HUGE, -HUGE, 2**63, 2**64 + 1, -(2**63) - 1, 10**308, 0, -1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -1e308, 5e-324, float("nan"), float("inf")]),
)
_nasty_strings = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        ["NV" + "9" * 400, "NV0", "NV-1", "NV65", "X", "", " ", "SOC", "nv12", "PIX PIX", "\ud800", "9" * 400]
    ),
    st.integers(1, 3000).map(lambda k: "a" * k),
)
_leaf = st.one_of(st.none(), st.booleans(), _nasty_numbers, _nasty_strings)
_nasty = st.recursive(
    _leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _get(doc: Any, path: tuple) -> Any:
    for p in path:
        doc = doc[p]
    return doc


def _inflate(value: Any, k: int) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    return value * 10**k if isinstance(value, int) else value * float(10 ** min(k, 300))


@st.composite
def mutated(draw: st.DrawFn) -> str | bytes:
    doc = valid_doc(draw(st.sampled_from(SMALL_PRESETS)))
    # a longer pods map and some UUIDs in allocated, so those paths get mutated too
    doc["allocated"] = [0, doc["gpus"][1]["uuid"]]
    for _ in range(draw(st.integers(1, 4))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        how = draw(st.sampled_from(["replace", "delete", "inflate", "swap", "row-code"]))
        if not path:
            if how == "replace":
                doc = draw(_nasty)
            continue
        parent = _get(doc, path[:-1])
        last = path[-1]
        if how == "replace":
            parent[last] = draw(_nasty)
        elif how == "delete":
            del parent[last]
        elif how == "inflate":
            parent[last] = _inflate(parent[last], draw(st.integers(1, 400)))
        elif how == "swap":
            value = parent[last]
            parent[last] = draw(st.sampled_from([str(value), [value], {"v": value}, None, not value]))
        elif isinstance(parent[last], str) and parent[last].split() and " " in parent[last]:
            codes = parent[last].split()  # one code of a links row
            codes[draw(st.integers(0, len(codes) - 1))] = draw(_nasty_strings)
            parent[last] = " ".join(codes)
        if not isinstance(doc, (dict, list)):
            break
    try:
        text = json.dumps(doc, allow_nan=True)
    except (ValueError, TypeError):
        text = "{}"
    if draw(st.booleans()):
        return text
    raw = bytearray(text.encode("utf-8", "surrogatepass"))
    for _ in range(draw(st.integers(0, 3))):
        if raw:
            raw[draw(st.integers(0, len(raw) - 1))] ^= draw(st.integers(1, 255))
    if draw(st.booleans()):
        raw = raw[: draw(st.integers(0, len(raw)))]
    return bytes(raw)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_random_mutations_never_raise_anything_but_annotation_error(text: str | bytes) -> None:
    try:
        value = decode(text, now=NOW, max_age_s=3600)
    except AnnotationError as e:
        assert str(e) and len(str(e)) < 1000, "a reason, and a short one"
        return
    _check_usable(value)


def _primed() -> Shapes:
    """A store's known models: every small preset's valid annotation decoded once."""
    shapes = Shapes()
    for name in SMALL_PRESETS:
        decode(json.dumps(valid_doc(name)), now=NOW, max_age_s=3600, shapes=shapes)
    assert len(shapes) == len(SMALL_PRESETS)
    return shapes


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(), st.booleans())
def test_a_known_model_decodes_as_a_new_one(text: str | bytes, other_uuids: bool) -> None:
    """With the store's `Shapes` (a model seen before: its links shared, only the GPUs checked)
    every annotation decodes to what a decode without it gives, or fails as that one does."""
    if other_uuids and isinstance(text, str):  # another server of the model: its own UUIDs
        text = text.replace('"uuid":"GPU-', '"uuid":"GPU-other-')
    try:
        want: NodeTopology | str = decode(text, now=NOW, max_age_s=3600)
    except AnnotationError as e:
        want = str(e)
    try:
        got: NodeTopology | str = decode(text, now=NOW, max_age_s=3600, shapes=_primed())
    except AnnotationError as e:
        got = str(e)
    assert got == want
    if isinstance(got, NodeTopology):
        assert isinstance(want, NodeTopology)
        assert got.topology.gpus == want.topology.gpus and got.topology.n == want.topology.n
        assert (got.topology.bandwidth_mbps == want.topology.bandwidth_mbps).all()
        _check_usable(got)


def test_a_known_models_fast_gpus_are_plain_gpus() -> None:
    assert gpu(3, "GPU-x", "A100", "", 1) == GPU(3, "GPU-x", "A100", "", 1)
    shapes = Shapes()
    first = decode(json.dumps(valid_doc("dgx1-v100")), now=NOW, max_age_s=3600, shapes=shapes)
    text = encode(make("node-b", load_preset("dgx1-v100"), generated_at=NOW, plugin_version="1"))
    fast = decode(text, now=NOW, max_age_s=3600, shapes=shapes)
    assert fast == decode(text, now=NOW, max_age_s=3600)
    assert fast.topology.links is first.topology.links  # the model's, shared
    assert fast.topology.bandwidth_mbps is first.topology.bandwidth_mbps


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2000))
def test_arbitrary_bytes_never_raise_anything_but_annotation_error(raw: bytes) -> None:
    try:
        _check_usable(decode(raw, now=NOW, max_age_s=3600))
    except AnnotationError:
        pass


def test_mutations_reach_deep_places() -> None:
    """The mutation strategy really visits the nested fields (not only top-level keys)."""
    paths = _paths(valid_doc())
    assert ("gpus", 0, "uuid") in paths and ("pods", "ml/p", 0) in paths and ("links", 3) in paths
    assert MAX_GPUS == 16 and copy.deepcopy(valid_doc()) == valid_doc()


# ---------------------------------------------------------------------- the sidecar's per-node steps


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(), st.integers(0, 20))
def test_a_mutated_annotation_never_breaks_the_sidecars_per_node_steps(
    text: str | bytes, allocatable: int
) -> None:
    """Read the Node (decode + allocatable check), build its view, score and plan beside a
    healthy node: whatever the annotation holds, nothing raises and the healthy node is planned."""
    from kubernetes import client

    from gputopo.gang.planner import GangSpec, Member, plan_gang
    from gputopo.pod.placement import node_scores
    from scheduler.live.kube import KubeState
    from scheduler.model import Snapshot
    from scheduler.picture.views import ViewBuilder
    from tests import fake_apiserver as fk

    value = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    state = KubeState(client.ApiClient(), clock=lambda: NOW)
    bad = state._node_info(fk.node("node-a", gpus=allocatable, annotations={"gputopo.io/topology": value}))
    good = state._node_info(
        fk.node(
            "good",
            annotations={
                "gputopo.io/topology": encode(
                    make("good", load_preset("dgx-a100"), generated_at=NOW, plugin_version="x")
                )
            },
        )
    )
    assert good.topology is not None and bad.name == "node-a"
    if bad.topology is not None:
        assert len(bad.topology.healthy) <= allocatable
    views = ViewBuilder().build(Snapshot({"node-a": bad, "good": good}, {}, {}), {}, 0, {}, 0)
    scores = node_scores(2, list(views.values()))
    assert scores["good"] >= 1
    plan = plan_gang(
        GangSpec("ml/g", (Member("ml/a", 8), Member("ml/b", 8))),
        list(views.values()),
        ("kubernetes.io/hostname",),
    )
    assert plan is not None
