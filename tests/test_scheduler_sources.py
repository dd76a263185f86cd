"""Gang sources and level annotations (scheduler/sources.py): precedence, each API's fields,
and totality — any JSON is either a value or a clear refusal, never a traceback."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gputopo.gang import sources as gangsources
from gputopo.network.levels import HOSTNAME, RECOGNISED_LEVELS, validate_levels
from scheduler import sources
from scheduler.model import BadInput, parse_pod
from tests import fake_apiserver as fk

REQ, PREF = "gputopo.io/required-topology", "gputopo.io/preferred-topology"
K_REQ, K_PREF = "kueue.x-k8s.io/podset-required-topology", "kueue.x-k8s.io/podset-preferred-topology"
KAI_REQ = "kai.scheduler/topology-required-placement"
KAI_PREF = "kai.scheduler/topology-preferred-placement"


def gang_of(labels=None, annotations=None, spec=None):
    pod = fk.pod("ml", "p", 1, labels=labels, annotations=annotations)
    pod["spec"].update(spec or {})
    return parse_pod(pod).gang


def test_each_source_names_its_gang() -> None:
    assert gang_of(spec={"schedulingGroup": {"podGroupName": "a"}}).key == "ml/podgroup:a"
    ref = {"name": "w", "podGroup": "pg"}
    assert gang_of(spec={"workloadRef": ref}).key == "ml/workload:w/pg"
    assert gang_of(spec={"workloadRef": {**ref, "podGroupReplicaKey": "r3"}}).key == "ml/workload:w/pg/r3"
    assert gang_of(labels={"scheduling.x-k8s.io/pod-group": "g"}).key == "ml/g"
    light = gang_of(labels={gangsources.LIGHT_GROUP_LABEL: "g", gangsources.LIGHT_MIN_LABEL: "3"})
    assert (light.key, light.min_member) == ("ml/g", 3)
    assert gang_of(annotations={"scheduling.k8s.io/group-name": "v"}).key == "ml/volcano:v"
    assert gang_of(annotations={"scheduling.volcano.sh/group-name": "v"}).key == "ml/volcano:v"
    kq = gang_of(
        labels={gangsources.KUEUE_GROUP_LABEL: "k"}, annotations={gangsources.KUEUE_TOTAL_ANNOTATION: "4"}
    )
    assert (kq.key, kq.min_member) == ("ml/kueue:k", 4)
    kai = gang_of(annotations={gangsources.KAI_GROUP_ANNOTATION: "kj"})
    assert (kai.key, kai.min_member, kai.source) == ("ml/kai:kj", None, "scheduling.run.ai PodGroup")
    assert gang_of() is None


def test_gang_precedence_is_one_order() -> None:
    """schedulingGroup > workloadRef > scheduler-plugins > light labels > Volcano > Kueue > KAI."""
    labels = {
        "scheduling.x-k8s.io/pod-group": "sp",
        gangsources.LIGHT_GROUP_LABEL: "light",
        gangsources.LIGHT_MIN_LABEL: "2",
        gangsources.KUEUE_GROUP_LABEL: "kq",
    }
    annotations = {
        "scheduling.k8s.io/group-name": "vc",
        gangsources.KUEUE_TOTAL_ANNOTATION: "2",
        gangsources.KAI_GROUP_ANNOTATION: "kj",
    }
    spec = {"schedulingGroup": {"podGroupName": "pg"}, "workloadRef": {"name": "w", "podGroup": "x"}}
    order = [
        "ml/podgroup:pg",
        "ml/workload:w/x",
        "ml/sp",
        "ml/light",
        "ml/volcano:vc",
        "ml/kueue:kq",
        "ml/kai:kj",
    ]
    for expected in order:
        assert gang_of(labels, annotations, spec).key == expected
        # drop the winner: the next one takes over
        spec.pop("schedulingGroup", None) if "podgroup:" in expected else None
        spec.pop("workloadRef", None) if "workload:" in expected else None
        if expected == "ml/sp":
            labels.pop("scheduling.x-k8s.io/pod-group")
        if expected == "ml/light":
            labels.pop(gangsources.LIGHT_GROUP_LABEL)
        if expected == "ml/volcano:vc":
            annotations.pop("scheduling.k8s.io/group-name")
        if expected == "ml/kueue:kq":
            labels.pop(gangsources.KUEUE_GROUP_LABEL)


def test_level_precedence_takes_one_family_whole() -> None:
    """gputopo > Kueue > KAI; the first family that sets either key gives both values."""
    anns = {PREF: "a/x", K_REQ: "k/r", K_PREF: "k/p", KAI_REQ: "kai/r", KAI_PREF: "kai/p"}
    assert sources.pod_levels(anns) == (None, "a/x", "gputopo")
    del anns[PREF]
    assert sources.pod_levels(anns) == ("k/r", "k/p", "kueue")
    del anns[K_REQ], anns[K_PREF]
    assert sources.pod_levels(anns) == ("kai/r", "kai/p", "kai")
    assert sources.pod_levels({KAI_PREF: "kai/p"}) == (None, "kai/p", "kai")
    assert sources.pod_levels({}) == (None, None, "")


@pytest.mark.parametrize(
    ("labels", "annotations", "spec", "why"),
    [
        ({}, {}, {"schedulingGroup": {"podGroupName": ""}}, "schedulingGroup.podGroupName"),
        ({}, {}, {"schedulingGroup": {"podGroupName": 7}}, "schedulingGroup.podGroupName"),
        ({}, {}, {"workloadRef": {"name": "w"}}, "workloadRef"),
        ({}, {}, {"workloadRef": {"name": "w", "podGroup": "a/b"}}, "workloadRef"),
        ({gangsources.LIGHT_GROUP_LABEL: "g", gangsources.LIGHT_MIN_LABEL: "0"}, {}, {}, "min-available"),
        ({gangsources.KUEUE_GROUP_LABEL: "k"}, {}, {}, "pod-group-total-count"),
        ({}, {gangsources.KAI_GROUP_ANNOTATION: "a/b"}, {}, "pod-group-name must be an object name"),
        (
            {gangsources.KUEUE_GROUP_LABEL: "k"},
            {gangsources.KUEUE_TOTAL_ANNOTATION: "²"},
            {},
            "pod-group-total-count",
        ),
    ],
)
def test_a_named_but_malformed_source_is_a_clear_refusal(labels, annotations, spec, why) -> None:
    with pytest.raises(BadInput, match=why):
        gang_of(labels, annotations, spec)


def test_topology_wait_is_a_bounded_duration_or_a_refusal() -> None:
    """gputopo.io/topology-wait, on any pod (a gang's level wait, a multi-GPU pod's ring
    wait): a duration or seconds; a typo is refused, never read as the sidecar's default."""

    def wait_of(annotations: dict[str, str]) -> float | None:
        return parse_pod(fk.pod("ml", "p", 2, annotations=annotations)).topology_wait_s

    assert wait_of({}) is None
    for text, seconds in (("300s", 300.0), ("1h30m", 5400.0), ("0", 0.0), ("720h", 30 * 86_400.0)):
        assert wait_of({sources.LEVEL_WAIT_ANNOTATION: text}) == seconds
    for bad in ("", "soon", "-5m", "721h", "5 m"):
        with pytest.raises(BadInput, match="topology-wait must be a duration"):
            wait_of({sources.LEVEL_WAIT_ANNOTATION: bad})


def test_group_objects_of_each_kind() -> None:
    meta = {"namespace": "ml", "name": "g", "uid": "u1"}
    (k8s,) = gangsources.groups_k8s_podgroup(
        {
            "metadata": meta,
            "spec": {
                "schedulingPolicy": {"gang": {"minCount": 3}},
                "schedulingConstraints": {"topology": [{"key": "topology.kubernetes.io/rack"}]},
            },
        },
        "scheduling.k8s.io/v1alpha2",
    )
    assert (k8s.key, k8s.min_member, k8s.required_level) == (
        "ml/podgroup:g",
        3,
        "topology.kubernetes.io/rack",
    )
    assert k8s.ref == {
        "apiVersion": "scheduling.k8s.io/v1alpha2",
        "kind": "PodGroup",
        "namespace": "ml",
        "name": "g",
        "uid": "u1",
    }
    basic = {"metadata": meta, "spec": {"schedulingPolicy": {"basic": {}}}}
    assert gangsources.groups_k8s_podgroup(basic, "v") == [], "basic policy: no gang"
    wl = {
        "metadata": meta,
        "spec": {
            "podGroups": [
                {"name": "a", "policy": {"gang": {"minCount": 2}}},
                {"name": "b", "policy": {"basic": {}}},
            ]
        },
    }
    assert [(g.key, g.min_member) for g in gangsources.groups_k8s_workload(wl, "v")] == [
        ("ml/workload:g/a", 2)
    ]
    (vc,) = gangsources.groups_volcano({"metadata": meta, "spec": {"minMember": 5}}, "v")
    assert (vc.key, vc.min_member) == ("ml/volcano:g", 5)
    kai_spec = {
        "minMember": 4,
        "queue": "team-a",
        "topologyConstraint": {
            "topology": "cluster",
            "requiredTopologyLevel": "x.io/rack",
            "preferredTopologyLevel": "nvidia.com/gpu.clique",
        },
    }
    (kai,) = gangsources.groups_kai({"metadata": meta, "spec": kai_spec}, "scheduling.run.ai/v2alpha2")
    assert (kai.key, kai.min_member, kai.required_level, kai.preferred_level) == (
        "ml/kai:g",
        4,
        "x.io/rack",
        "nvidia.com/gpu.clique",
    )
    assert kai.ref is not None and kai.ref["apiVersion"] == "scheduling.run.ai/v2alpha2"
    bad_levels = {**kai_spec, "topologyConstraint": {"requiredTopologyLevel": "not a key!"}}
    (loose,) = gangsources.groups_kai({"metadata": meta, "spec": bad_levels}, "v")
    assert (loose.required_level, loose.preferred_level) == (None, None), "a bad key is no level"
    by_subgroups = {
        "metadata": meta,
        "spec": {"minSubGroup": 2, "subGroups": [{"name": "a", "minMember": 1}]},
    }
    (counted,) = gangsources.groups_kai(by_subgroups, "v")
    assert counted.min_member == 1, "minSubGroup 2 of one sub-group: what can be derived (its 1 pod)"
    assert [s.name for s in counted.subgroups] == ["a"]
    assert gangsources.workload_key("ml/workload:g/a/r1") == "ml/workload:g/a"
    assert gangsources.workload_key("ml/workload:g/a") == "ml/workload:g/a"
    assert gangsources.workload_key("ml/g") == "ml/g"


def test_topology_levels_are_reversed_and_merged_before_the_defaults() -> None:
    topo = {
        "spec": {"levels": [{"nodeLabel": "x.io/block"}, {"nodeLabel": "x.io/rack"}, {"nodeLabel": HOSTNAME}]}
    }
    assert sources.topology_levels(topo) == (HOSTNAME, "x.io/rack", "x.io/block")
    merged = sources.merge_levels([("x.io/rack", "x.io/block"), ("y.io/a",)], RECOGNISED_LEVELS)
    assert merged[:4] == (HOSTNAME, "x.io/rack", "x.io/block", "y.io/a")
    assert merged[4:] == RECOGNISED_LEVELS[1:]
    assert validate_levels(merged) == merged
    for bad in ({"spec": {"levels": []}}, {"spec": {"levels": [{"nodeLabel": "a"}, {"nodeLabel": "a"}]}}):
        assert sources.topology_levels(bad) is None
    assert sources.topology_levels({"spec": {"levels": [{"nodeLabel": "not a key!"}]}}) is None


def test_recognised_levels_keep_design_defaults_in_order() -> None:
    """The design.md §5 defaults stay recognised, in their order, among Topograph's families."""
    from gputopo.network.levels import DEFAULT_LEVELS

    positions = [RECOGNISED_LEVELS.index(lv) for lv in DEFAULT_LEVELS]
    assert positions == sorted(positions)
    assert validate_levels(RECOGNISED_LEVELS) == RECOGNISED_LEVELS
    tiers = [lv for lv in RECOGNISED_LEVELS if lv.startswith("fabric.topograph.run/tier-")]
    assert tiers == [f"fabric.topograph.run/tier-{n}" for n in range(len(tiers))], "tier 0 nearest the node"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**7) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
KEYS = st.sampled_from(
    [
        "schedulingGroup",
        "workloadRef",
        "podGroupName",
        "name",
        "podGroup",
        "podGroupReplicaKey",
        "spec",
        "metadata",
        "minMember",
        "topologyConstraint",
        "requiredTopologyLevel",
        "schedulingPolicy",
        "gang",
        "minCount",
        "podGroups",
        "policy",
        "levels",
        "nodeLabel",
        "schedulingConstraints",
        "topology",
        "key",
        "namespace",
        "uid",
    ]
)
OBJ = st.recursive(
    st.none() | st.integers(-2, 4) | st.text(max_size=6) | st.just("kubernetes.io/hostname"),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=5),
    max_leaves=20,
)


@given(
    spec=st.dictionaries(KEYS, OBJ, max_size=3),
    labels=st.dictionaries(st.text(max_size=40), st.text(max_size=8)),
)
def test_pod_gang_is_total(spec, labels) -> None:
    try:
        g = sources.pod_gang("ns", labels, labels, spec)
    except sources.SourceError:
        return
    assert g is None or g.key.startswith("ns/")


@given(obj=OBJ)
def test_object_parsers_are_total(obj) -> None:
    if not isinstance(obj, dict):
        obj = {"spec": obj}
    for parse in (
        gangsources.groups_k8s_podgroup,
        gangsources.groups_k8s_workload,
        gangsources.groups_volcano,
        gangsources.groups_kai,
        gangsources.groups_scheduler_plugins,
    ):
        for g in parse(obj, "g/v"):
            assert 1 <= g.min_member <= gangsources.MAX_MEMBERS
    levels = sources.topology_levels(obj)
    assert levels is None or validate_levels(levels) == levels
