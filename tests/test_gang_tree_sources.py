"""Gang trees from every API that expresses them, end to end over the API stand-in (fake API
server <- official client <- KubeState <- Extender): each pod's gang key, sub-group and levels in
the snapshot, and the SubGroup tree of the GangAsk the extender builds. Objects are shaped as
upstream's types (the file checked is named on each test); the parsers are then fed garbage.

Upstream files checked (December 2026 snapshots, docs/scheduler.md "Gangs as trees"):
- kubernetes/api `scheduling/v1alpha3/types.go` (CompositePodGroupSpec: parentCompositePodGroupName,
  workloadRef, schedulingPolicy.gang.minGroupCount | basic, schedulingConstraints.topology[] at
  most one; WorkloadMaxTreeDepth = 4) and `scheduling/v1beta1/types.go` (PodGroupSpec
  parentCompositePodGroupName, workloadRef);
- kai-scheduler/KAI-Scheduler `pkg/apis/scheduling/v2alpha2/podgroup_types.go` (minMember xor
  minSubGroup, subGroups[] {name, minMember, minSubGroup, parent, topologyConstraint}) and
  `docs/topology/multilevel.md` (pods name their leaf by label kai.scheduler/subgroup-name);
- kubernetes-sigs/kueue `pkg/controller/jobframework/tas_validation.go` and its test
  (podset-slice-size parsed as an integer; podset-slice-required-topology-constraints a JSON list
  of {"topology": KEY, "size": INT}), `apis/kueue/v1beta2` constants (pod-group-pod-index,
  pod-group-pod-index-label), the Job integration's PodIndexLabel
  batch.kubernetes.io/job-completion-index;
- volcano-sh/apis `pkg/apis/scheduling/v1beta1/types.go` (NetworkTopologySpec {mode hard|soft,
  highestTierAllowed, highestTierName}).
"""

from __future__ import annotations

import json

import pytest

from gputopo.gang import sources as gangsources
from gputopo.gang.planner import SubGroup
from gputopo.gang.sources import SourceError
from tests import fake_apiserver as fk
from tests.test_scheduler_interop import (  # noqa: F401 (live_with is a fixture)
    ALL_KINDS,
    BLOCK,
    RACK,
    TIER0,
    TIER1,
    gang_pods,
    live_with,
)


@pytest.fixture
def stand_in(live_with):  # noqa: F811 (the fixture imported above)
    """The API stand-in of tests/test_scheduler_interop.py: stand_in(nodes=..., objects=..., pods=...)."""
    return live_with


NODES = [(f"n{i}", {RACK: f"r{i // 2}", BLOCK: "b0", TIER0: f"s{i // 2}", TIER1: "t0"}) for i in range(4)]


def ask_of(live, pod: str):
    """The GangAsk the extender builds for `pod` now."""
    snap = live.state.snapshot()
    return live.ext._ask(snap.pods[pod], snap)


def groups_of(ask) -> dict[str, str]:
    return {m.pod: m.group for m in ask.members}


# --- Kubernetes CompositePodGroup -------------------------------------------------------------


def composite(name: str, parent: str | None = None, *, gang: int | None = 2, key: str | None = None) -> dict:
    spec: dict = {
        "workloadRef": {"workloadName": "train", "templateName": name},
        "schedulingPolicy": {"gang": {"minGroupCount": gang}} if gang else {"basic": {}},
    }
    if parent:
        spec["parentCompositePodGroupName"] = parent
    if key:
        spec["schedulingConstraints"] = {"topology": [{"key": key}]}
    meta = {"namespace": "ml", "name": name, "uid": f"uid-{name}"}
    return {
        "apiVersion": "scheduling.k8s.io/v1alpha3",
        "kind": "CompositePodGroup",
        "metadata": meta,
        "spec": spec,
    }


def podgroup(name: str, parent: str | None, count: int | None, key: str | None = RACK) -> dict:
    spec: dict = {
        "workloadRef": {"workloadName": "train", "templateName": "workers"},
        "schedulingPolicy": {"gang": {"minCount": count}} if count else {"basic": {}},
    }
    if parent:
        spec["parentCompositePodGroupName"] = parent
    if key:
        spec["schedulingConstraints"] = {"topology": [{"key": key}]}
    meta = {"namespace": "ml", "name": name, "uid": f"uid-{name}"}
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup", "metadata": meta, "spec": spec}


def test_composite_podgroup_tree_is_one_gang_with_a_subgroup_per_podgroup(stand_in) -> None:
    """1.37: the root CompositePodGroup is the gang (its topology key the gang's required level,
    its quorum the sum of its minGroupCount smallest children); each PodGroup under it a
    sub-group required in one domain of its own topology key, through a non-root composite."""
    objects = [
        ("k8s-compositepodgroups", composite("root", key=BLOCK)),
        ("k8s-compositepodgroups", composite("half", "root", gang=1)),
        ("k8s-podgroups", podgroup("pg-a", "root", 2)),
        ("k8s-podgroups", podgroup("pg-b", "half", 2, key=TIER0)),
    ]
    pods = gang_pods(2, spec={"schedulingGroup": {"podGroupName": "pg-a"}}, name="a")
    pods += gang_pods(2, spec={"schedulingGroup": {"podGroupName": "pg-b"}}, name="b")
    serve = {k: fk.EXTRA_KINDS[k][1] for k in ALL_KINDS} | {"k8s-podgroups": "v1beta1"}
    live = stand_in(serve=serve, nodes=NODES, objects=objects, pods=pods)
    snap = live.state.snapshot()
    a, b = snap.pods["ml/a-0"].gang, snap.pods["ml/b-1"].gang
    assert a.key == b.key == "ml/composite:root"
    assert (a.subgroup, b.subgroup) == ("podgroup:pg-a", "podgroup:pg-b")
    assert (a.named, a.min_member, a.required_level) == ("ml/podgroup:pg-a", 4, BLOCK)
    assert snap.min_members["ml/composite:root"] == 4 and "ml/podgroup:pg-a" not in snap.min_members
    ask = ask_of(live, "ml/a-0")
    assert ask.gang == "ml/composite:root" and ask.min_member == 4 and ask.required_level == BLOCK
    assert set(ask.groups) == {
        SubGroup("composite:half", "", None, None, 2),
        SubGroup("podgroup:pg-b", "composite:half", TIER0, None, 2),
        SubGroup("podgroup:pg-a", "", RACK, None, 2),
    }
    assert groups_of(ask) == {
        "ml/a-0": "podgroup:pg-a",
        "ml/a-1": "podgroup:pg-a",
        "ml/b-0": "podgroup:pg-b",
        "ml/b-1": "podgroup:pg-b",
    }
    assert live.state.group_ref("ml/composite:root")["kind"] == "CompositePodGroup"


def test_a_podgroup_whose_composite_is_missing_is_no_gang_and_a_basic_root_keeps_flat_gangs() -> None:
    pg = gangsources.groups_k8s_podgroup(podgroup("pg-a", "root", 2), "scheduling.k8s.io/v1beta1")
    assert gangsources.link(pg) == {}, "the parent not seen yet: wait for it, never a wrong gang"
    basic_root = gangsources.groups_k8s_composite(composite("root", gang=None), "v1alpha3")
    index = gangsources.link([*basic_root, *pg])
    assert list(index) == ["ml/podgroup:pg-a"] and index["ml/podgroup:pg-a"].min_member == 2
    cycle = [
        *gangsources.groups_k8s_composite(composite("x", "y"), "v"),
        *gangsources.groups_k8s_composite(composite("y", "x"), "v"),
        *gangsources.groups_k8s_podgroup(podgroup("p", "x", 2), "v"),
    ]
    assert gangsources.link(cycle) == {}
    deep = [*gangsources.groups_k8s_composite(composite("c0"), "v")]
    for i in range(1, gangsources.MAX_TREE_DEPTH + 2):
        deep += gangsources.groups_k8s_composite(composite(f"c{i}", f"c{i - 1}", gang=1), "v")
    deep += gangsources.groups_k8s_podgroup(podgroup("p", f"c{gangsources.MAX_TREE_DEPTH + 1}", 2), "v")
    assert gangsources.link(deep) == {}, "deeper than MAX_TREE_DEPTH: not modelled"


# --- KAI Scheduler v2alpha2 sub-groups --------------------------------------------------------


def test_kai_podgroup_sub_groups_and_min_sub_group_quorum(stand_in) -> None:
    """A KAI PodGroup counted by minSubGroup: its quorum is what its sub-groups give (here the 2
    smallest of 3 racks' minMember); pods name their leaf by label kai.scheduler/subgroup-name."""
    group = {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"namespace": "ml", "name": "pg-train", "uid": "kai-uid"},
        "spec": {
            "minSubGroup": 2,
            "queue": "default-queue",
            "topologyConstraint": {"topology": "cluster", "requiredTopologyLevel": BLOCK},
            "subGroups": [
                {"name": "rack-a", "minMember": 2, "topologyConstraint": {"requiredTopologyLevel": RACK}},
                {"name": "rack-b", "minMember": 1, "topologyConstraint": {"preferredTopologyLevel": RACK}},
                {"name": "pair", "minSubGroup": 1},
                {"name": "pair-x", "parent": "pair", "minMember": 3},
            ],
        },
    }
    pods = gang_pods(
        2, annotations={"pod-group-name": "pg-train"}, labels={"kai.scheduler/subgroup-name": "rack-a"}
    )
    pods += gang_pods(
        1,
        annotations={"pod-group-name": "pg-train"},
        labels={"kai.scheduler/subgroup-name": "nope"},
        name="x",
    )
    live = stand_in(nodes=NODES, objects=[("kai-podgroups", group)], pods=pods)
    gang = live.state.snapshot().pods["ml/w-0"].gang
    assert (gang.key, gang.min_member, gang.required_level, gang.subgroup) == (
        "ml/kai:pg-train",
        3,
        BLOCK,
        "rack-a",
    )
    ask = ask_of(live, "ml/w-1")
    assert ask.groups == (
        SubGroup("rack-a", "", RACK, None, 2),
        SubGroup("rack-b", "", None, RACK, 1),
        SubGroup("pair", "", None, None, 3),
        SubGroup("pair-x", "pair", None, None, 3),
    )
    assert groups_of(ask) == {"ml/w-0": "rack-a", "ml/w-1": "rack-a", "ml/x-0": ""}, "unknown: the root"


def test_kai_sub_group_lists_that_are_garbage_leave_the_gang_flat_or_none() -> None:
    meta = {"namespace": "ml", "name": "g"}
    bad_lists: list = [
        "x",
        [1],
        [{"name": "A"}],  # not a DNS label
        [{"name": "a"}, {"name": "a"}],
        [{"name": "a", "parent": "zz"}],
        [{"name": "a", "parent": "b"}, {"name": "b", "parent": "a"}],
        [{"name": "a", "minMember": -1}],
        [{"name": "a", "minMember": True}],
        [{"name": "a", "topologyConstraint": "rack"}],
        [
            {"name": f"s{i}", "parent": f"s{i - 1}" if i else None}
            for i in range(gangsources.MAX_TREE_DEPTH + 2)
        ],
    ]
    for bad in bad_lists:
        (flat,) = gangsources.groups_kai({"metadata": meta, "spec": {"minMember": 2, "subGroups": bad}}, "v")
        assert (flat.min_member, flat.subgroups) == (2, ()), bad
        assert (
            gangsources.groups_kai({"metadata": meta, "spec": {"minSubGroup": 1, "subGroups": bad}}, "v")
            == []
        )
    underivable = {"minSubGroup": 1, "subGroups": [{"name": "a"}]}
    assert gangsources.groups_kai({"metadata": meta, "spec": underivable}, "v") == [], "quorum 0: no gang"
    with pytest.raises(SourceError, match=r"kai\.scheduler/subgroup-name"):
        gangsources.pod_gang({"kai.scheduler/subgroup-name": "Not_A_Label"}, {"pod-group-name": "g"}, {})


# --- Kueue slices -----------------------------------------------------------------------------


def kueue_pods(n: int, extra: dict[str, str], name: str = "w") -> list[dict]:
    pods = []
    for i in range(n):
        (p,) = gang_pods(
            1,
            labels={
                "kueue.x-k8s.io/pod-group-name": "kq",
                "batch.kubernetes.io/job-completion-index": str(i),
            },
            annotations={"kueue.x-k8s.io/pod-group-total-count": str(n), **extra},
            name=f"{name}{i}",
        )
        pods.append(p)
    return pods


def test_kueue_slices_put_each_run_of_n_pods_in_one_domain(stand_in) -> None:
    """podset-slice-required-topology + podset-slice-size: slice k is the pods whose index (the
    Job completion index) // N == k, each required in one domain of the slice topology."""
    extra = {
        "kueue.x-k8s.io/podset-required-topology": BLOCK,
        "kueue.x-k8s.io/podset-slice-required-topology": RACK,
        "kueue.x-k8s.io/podset-slice-size": "2",
    }
    pods = kueue_pods(4, extra)
    live = stand_in(nodes=NODES, pods=pods)
    gang = live.state.snapshot().pods["ml/w3-0"].gang
    assert (gang.key, gang.min_member, gang.required_level, gang.subgroup) == (
        "ml/kueue:kq",
        4,
        BLOCK,
        "slice0-1",
    )
    ask = ask_of(live, "ml/w0-0")
    assert set(ask.groups) == {SubGroup("slice0-0", "", RACK), SubGroup("slice0-1", "", RACK)}
    assert groups_of(ask) == {
        "ml/w0-0": "slice0-0",
        "ml/w1-0": "slice0-0",
        "ml/w2-0": "slice0-1",
        "ml/w3-0": "slice0-1",
    }


def test_kueue_multi_layer_slices_and_podset_group_nest(stand_in) -> None:
    """podset-slice-required-topology-constraints, outermost first: slices of 4 in a block hold
    slices of 2 in a rack; podset-group-name is the sub-group above them."""
    constraints = [{"topology": BLOCK, "size": 4}, {"topology": RACK, "size": 2}]
    extra = {
        "kueue.x-k8s.io/podset-slice-required-topology-constraints": json.dumps(constraints),
        "kueue.x-k8s.io/podset-group-name": "lws",
    }
    pods = kueue_pods(4, extra)
    live = stand_in(nodes=NODES, pods=pods)
    ask = ask_of(live, "ml/w0-0")
    assert set(ask.groups) == {
        SubGroup("podset-lws"),
        SubGroup("podset-lws-slice0-0", "podset-lws", BLOCK),
        SubGroup("podset-lws-slice1-0", "podset-lws-slice0-0", RACK),
        SubGroup("podset-lws-slice1-1", "podset-lws-slice0-0", RACK),
    }
    assert groups_of(ask)["ml/w3-0"] == "podset-lws-slice1-1"


@pytest.mark.parametrize(
    "annotations",
    [
        {"kueue.x-k8s.io/podset-slice-required-topology": RACK},  # no size
        {"kueue.x-k8s.io/podset-slice-required-topology": RACK, "kueue.x-k8s.io/podset-slice-size": "0"},
        {
            "kueue.x-k8s.io/podset-slice-required-topology": "bad key!",
            "kueue.x-k8s.io/podset-slice-size": "2",
        },
        {"kueue.x-k8s.io/podset-slice-required-topology-constraints": "not json"},
        {"kueue.x-k8s.io/podset-slice-required-topology-constraints": "[]"},
        {
            "kueue.x-k8s.io/podset-slice-required-topology-constraints": json.dumps(
                [{"topology": RACK, "size": "2"}]
            )
        },
        {"kueue.x-k8s.io/podset-slice-required-topology-constraints": json.dumps([{"topology": RACK}] * 4)},
        {
            "kueue.x-k8s.io/podset-slice-required-topology-constraints": json.dumps(
                [{"topology": BLOCK, "size": 3}, {"topology": RACK, "size": 2}]
            )
        },
        {"kueue.x-k8s.io/podset-group-name": "Bad Name"},
    ],
)
def test_unusable_kueue_slice_annotations_are_a_clear_error(annotations: dict[str, str]) -> None:
    labels = {"kueue.x-k8s.io/pod-group-name": "kq", "batch.kubernetes.io/job-completion-index": "0"}
    ann = {"kueue.x-k8s.io/pod-group-total-count": "2", **annotations}
    with pytest.raises(SourceError, match=r"kueue\.x-k8s\.io/podset"):
        gangsources.pod_gang(labels, ann, {})


def test_kueue_slices_need_an_index_and_unconstrained_declares_nothing() -> None:
    labels = {"kueue.x-k8s.io/pod-group-name": "kq"}
    ann = {
        "kueue.x-k8s.io/pod-group-total-count": "2",
        "kueue.x-k8s.io/podset-slice-required-topology": RACK,
        "kueue.x-k8s.io/podset-slice-size": "2",
    }
    with pytest.raises(SourceError, match="index"):
        gangsources.pod_gang(labels, ann, {})
    sts = {**labels, "apps.kubernetes.io/pod-index": "3"}
    assert gangsources.pod_gang(sts, ann, {}).subgroup == "slice0-1"
    own = {**labels, "my.io/rank": "5", "jobset.sigs.k8s.io/job-index": "1"}
    named = gangsources.pod_gang(own, {**ann, "kueue.x-k8s.io/pod-group-pod-index-label": "my.io/rank"}, {})
    assert named.subgroup == "job1-slice0-2", "the label Kueue is told to read; JobSet jobs apart"
    loose = {
        "kueue.x-k8s.io/pod-group-total-count": "2",
        "kueue.x-k8s.io/podset-unconstrained-topology": "true",
    }
    found = gangsources.pod_gang(labels, loose, {})
    assert (found.subgroup, found.subgroups) == ("", ())


# --- Volcano networkTopology -------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "tier", "want"), [("hard", 1, (TIER0, None)), ("soft", 2, (None, TIER1))])
def test_volcano_network_topology_tier_is_a_level_counted_up_from_the_node(
    stand_in, mode, tier, want
) -> None:
    """Tier N is the N-th labelled level above the node (HyperNode label discovery: "from bottom
    to top, starting at tier 1"); hard = required, soft = preferred."""
    pg = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"namespace": "ml", "name": "vc", "uid": "vc-uid"},
        "spec": {"minMember": 2, "networkTopology": {"mode": mode, "highestTierAllowed": tier}},
    }
    nodes = [(n, {TIER0: labels[TIER0], TIER1: labels[TIER1]}) for n, labels in NODES]
    pods = gang_pods(2, annotations={"scheduling.k8s.io/group-name": "vc"})
    live = stand_in(nodes=nodes, objects=[("volcano-podgroups", pg)], pods=pods)
    ask = ask_of(live, "ml/w-0")
    assert (ask.required_level, ask.preferred_level) == want
    assert ask.groups == ()


def test_volcano_network_topology_garbage_costs_the_tier_not_the_gang() -> None:
    meta = {"namespace": "ml", "name": "vc"}
    for bad in [
        "x",
        {"mode": "strict"},
        {"highestTierAllowed": 0},
        {"highestTierAllowed": "1"},
        {"highestTierAllowed": 1, "highestTierName": "rack"},
        {"highestTierAllowed": 99},
    ]:
        (g,) = gangsources.groups_volcano(
            {"metadata": meta, "spec": {"minMember": 2, "networkTopology": bad}}, "v"
        )
        assert (g.min_member, g.tier) == (2, None), bad
    named = gangsources.Tier(True, name=RACK)
    assert gangsources.tier_level(named, ("kubernetes.io/hostname", RACK), [RACK]) == RACK
    assert gangsources.tier_level(gangsources.Tier(True, name="spine"), (RACK,), [RACK]) is None
    assert (
        gangsources.tier_level(gangsources.Tier(True, number=3), ("kubernetes.io/hostname", RACK), [RACK])
        is None
    )


# --- gputopo's own annotation -----------------------------------------------------------------


def test_gputopo_subgroup_annotation_beats_the_group_objects_tree(stand_in) -> None:
    """gputopo.io/subgroup on any gang's pods; over a KAI tree it wins (precedence as for levels)."""
    group = {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"namespace": "ml", "name": "g"},
        "spec": {"minMember": 4, "subGroups": [{"name": "kai-a", "minMember": 2}]},
    }
    own = {"gputopo.io/subgroup": "left", "gputopo.io/subgroup-required-topology": RACK}
    pods = gang_pods(
        2, annotations={"pod-group-name": "g", **own}, labels={"kai.scheduler/subgroup-name": "kai-a"}
    )
    pods += gang_pods(
        2, annotations={"pod-group-name": "g"}, labels={"kai.scheduler/subgroup-name": "kai-a"}, name="k"
    )
    live = stand_in(nodes=NODES, objects=[("kai-podgroups", group)], pods=pods)
    snap = live.state.snapshot()
    assert (snap.pods["ml/w-0"].gang.subgroup, snap.pods["ml/k-0"].gang.subgroup) == ("left", "kai-a")
    ask = ask_of(live, "ml/w-0")
    assert set(ask.groups) == {SubGroup("left", "", RACK), SubGroup("kai-a", "", None, None, 2)}
    assert groups_of(ask) == {"ml/w-0": "left", "ml/w-1": "left", "ml/k-0": "kai-a", "ml/k-1": "kai-a"}


@pytest.mark.parametrize(
    "annotations",
    [
        {"gputopo.io/subgroup": "Has Spaces"},
        {"gputopo.io/subgroup": "a" * 64},
        {"gputopo.io/subgroup": "ok", "gputopo.io/subgroup-required-topology": "not a key!"},
        {"gputopo.io/subgroup": "ok", "gputopo.io/subgroup-preferred-topology": "/x"},
    ],
)
def test_unusable_gputopo_subgroup_annotations_are_a_clear_error(annotations: dict[str, str]) -> None:
    with pytest.raises(SourceError, match=r"gputopo\.io/subgroup"):
        gangsources.pod_gang({"scheduling.x-k8s.io/pod-group": "g"}, annotations, {})


def test_valid_tree_drops_orphans_cycles_and_keeps_the_first_of_a_name() -> None:
    tree = gangsources.valid_tree(
        [
            SubGroup("a", "", RACK),
            SubGroup("a", "", BLOCK),
            SubGroup("b", "a"),
            SubGroup("orphan", "missing"),
            SubGroup("x", "y"),
            SubGroup("y", "x"),
        ]
    )
    assert tree == (SubGroup("a", "", RACK), SubGroup("b", "a"))


def test_composite_parsers_ignore_garbage() -> None:
    for spec in [
        "x",
        {"schedulingPolicy": {"gang": {"minGroupCount": 0}}},
        {"schedulingPolicy": {"gang": {"minGroupCount": "2"}}},
        {"schedulingPolicy": {}},
        {"schedulingPolicy": {"basic": {}}, "parentCompositePodGroupName": "a/b"},
    ]:
        obj = {"metadata": {"namespace": "ml", "name": "c"}, "spec": spec}
        assert gangsources.groups_k8s_composite(obj, "v") == [], spec
    assert gangsources.groups_k8s_composite({"metadata": {"name": 3}}, "v") == []
    pg = podgroup("p", "root", 2)
    pg["spec"]["parentCompositePodGroupName"] = 7
    assert gangsources.groups_k8s_podgroup(pg, "v") == []
    basic_flat = podgroup("p", None, None)
    assert gangsources.groups_k8s_podgroup(basic_flat, "v") == [], "basic, no parent: no gang (as before)"


# --- a tree placed end to end -----------------------------------------------------------------


def test_a_jobset_shaped_composite_is_placed_whole_each_podgroup_inside_one_clique(stand_in) -> None:
    """The root CompositePodGroup (no topology) holds two PodGroups that each require one NVLink
    clique (`nvidia.com/gpu.clique`), 2 pods of 8 GPUs each; the cliques are 3 nodes each, one
    node of the first busy. Through the sidecar over HTTP, filter and bind as kube-scheduler
    does: nothing binds before the whole tree is planned, then each PodGroup lands inside one
    clique and the plan says where each sub-group went."""
    from tests.test_scheduler_interop import place_all
    from tests.test_scheduler_live import annotation

    clique = "nvidia.com/gpu.clique"
    nodes = [(f"n{i}", {clique: f"cl.{i // 3}"}) for i in range(6)]
    objects = [
        ("k8s-compositepodgroups", composite("job", gang=2)),
        ("k8s-podgroups", podgroup("rank-0", "job", 2, key=clique)),
        ("k8s-podgroups", podgroup("rank-1", "job", 2, key=clique)),
    ]
    pods = gang_pods(2, spec={"schedulingGroup": {"podGroupName": "rank-0"}}, name="r0")
    pods += gang_pods(2, spec={"schedulingGroup": {"podGroupName": "rank-1"}}, name="r1")
    serve = {k: fk.EXTRA_KINDS[k][1] for k in ALL_KINDS} | {"k8s-podgroups": "v1beta1"}
    live = stand_in(serve=serve, nodes=nodes, objects=objects, pods=pods[:3])
    busy = fk.node(
        "n0", {clique: "cl.0"}, annotations={"gputopo.io/topology": annotation("n0", tuple(range(8)))}
    )
    live.api.put("nodes", busy)  # clique 0 keeps 2 free nodes, clique 1 has 3
    names = [n for n, _ in nodes]
    from tests.test_scheduler_live import args, wait_until

    wait_until(lambda: len(live.state.snapshot().nodes["n0"].topology.allocated) == 8)
    _, out = live.client.post("/filter", args(pods[0], names))
    assert out["NodeNames"] == [] and "waiting for members 3/4" in out["FailedAndUnresolvableNodes"]["n1"]
    live.api.put("pods", pods[3])
    wait_until(lambda: "ml/r1-1" in live.state.snapshot().pods)
    _, out = live.client.post("/filter", args(pods[0], names))
    assert len(out["NodeNames"]) == 1, out
    plan = live.ext.plans["ml/composite:job"]
    assert "sub-groups: podgroup:rank-0 → cl." in plan.why and "podgroup:rank-1 → cl." in plan.why
    placed = place_all(live, pods)
    by_group = {g: {placed[f"{g}-{i}"] for i in range(2)} for g in ("r0", "r1")}
    cliques = {g: {int(n[1:]) // 3 for n in got} for g, got in by_group.items()}
    assert all(len(c) == 1 for c in cliques.values()), by_group
    assert len(set(placed.values())) == 4 and "n0" not in placed.values()
