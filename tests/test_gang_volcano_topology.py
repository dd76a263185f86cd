"""Volcano's HyperNodes and Job partitions, end to end over the API stand-in (fake API server <-
official client <- KubeState <- Extender, filter and bind over HTTP as kube-scheduler calls them).

Objects are shaped as upstream's:
- volcano-sh/apis 536f121f `pkg/apis/topology/v1alpha1/hypernode_types.go`: HyperNode
  `topology.volcano.sh/v1alpha1`, cluster-scoped, `spec {tier, tierName, members[] {type
  Node|HyperNode, selector {exactMatch {name} | regexMatch {pattern} | labelMatch}}}`;
- volcano-sh/volcano ed72c7c8 `pkg/util/hypernode/member_selector.go` (regexMatch is Go's
  unanchored MatchString; an empty labelMatch selects nothing) and
  `pkg/scheduler/api/hyper_node_info.go` `HyperNodeTierNameMap` (tierName -> tier);
- volcano-sh/apis `pkg/apis/batch/v1alpha1/job.go` `PartitionPolicySpec {totalPartitions,
  partitionSize, networkTopology, minPartitions}`, `labels.go` (`volcano.sh/task-spec`,
  `volcano.sh/partition-id`); volcano-sh/volcano `pkg/controllers/job/job_controller_actions.go`
  `getSubGroupPolicy` (what the job controller writes on the PodGroup for a task's
  partitionPolicy) and `job_controller_util.go` (partition id = pod index // partitionSize);
  `pkg/scheduler/api/sub_job_info.go` `getSubJobMatchValues` / `getSubJobID` and `job_info.go`
  `getOrCreateSubJob` (how the scheduler groups pods: the first policy whose selector matches
  and whose match keys, at least one, are all non-empty labels; id `<policy>-<values>`);
- volcano-sh/apis `pkg/apis/scheduling/v1beta1/types.go` `SubGroupPolicySpec`.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gputopo.gang import hypernodes as hn
from gputopo.gang import sources as gangsources
from gputopo.gang.planner import SubGroup
from tests import fake_apiserver as fk
from tests.test_scheduler_interop import (  # noqa: F401 (live_with is a fixture)
    ALL_KINDS,
    TIER0,
    TIER1,
    gang_pods,
    live_with,
    place_all,
)


@pytest.fixture
def stand_in(live_with):  # noqa: F811 (the fixture imported above)
    """The API stand-in of tests/test_scheduler_interop.py: stand_in(nodes=..., objects=..., pods=...)."""
    return live_with


#: 8 nodes: tier-0 switches of 2 nodes (s0..s3), tier-1 switches of 4 (t0, t1)
NODES = [(f"n{i}", {TIER0: f"s{i // 2}", TIER1: f"t{i // 4}"}) for i in range(8)]


def hypernode(name: str, tier: int, members: list[dict], tier_name: str = "") -> dict:
    spec: dict = {"tier": tier, "members": members}
    if tier_name:
        spec["tierName"] = tier_name
    return {
        "apiVersion": "topology.volcano.sh/v1alpha1",
        "kind": "HyperNode",
        "metadata": {"name": name},
        "spec": spec,
    }


def node_member(**selector) -> dict:
    return {"type": "Node", "selector": selector}


#: Tier 1 ("leaf") is two HyperNodes of 4 nodes each: by exact names and by a pattern; tier 2
#: ("spine") holds both through HyperNode members.
HYPERNODES = [
    hypernode("leaf-a", 1, [node_member(exactMatch={"name": f"n{i}"}) for i in range(4)], "leaf"),
    hypernode("leaf-b", 1, [node_member(regexMatch={"pattern": "^n[4-7]$"})], "leaf"),
    hypernode(
        "spine", 2, [{"type": "HyperNode", "selector": {"regexMatch": {"pattern": "^leaf-"}}}], "spine"
    ),
]


def volcano_group(network: dict | None = None, policies: list | None = None, minimum: int = 4) -> dict:
    spec: dict = {"minMember": minimum, "queue": "default"}
    if network is not None:
        spec["networkTopology"] = network
    if policies is not None:
        spec["subGroupPolicy"] = policies
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"namespace": "ml", "name": "job-pg", "uid": "pg-uid"},
        "spec": spec,
    }


def ask_of(live, pod: str):
    snap = live.state.snapshot()
    return live.ext._ask(snap.pods[pod], snap)


def test_hypernodes_map_a_tier_to_the_level_their_nodes_share(stand_in) -> None:
    """Tier 1's HyperNodes hold 4 nodes each, which only tier-1 switches (TIER1) hold: the tier
    is that level, not the label rule's first level (TIER0); tierName works the same way, and
    tier 2 (all nodes, no level holds them) spans the cluster."""
    pods = gang_pods(2, annotations={"scheduling.k8s.io/group-name": "job-pg"})
    objects = [("volcano-podgroups", volcano_group({"mode": "hard", "highestTierAllowed": 1}, minimum=2))]
    objects += [("volcano-hypernodes", h) for h in HYPERNODES]
    live = stand_in(nodes=NODES, objects=objects, pods=pods)
    assert len(live.state.snapshot().hypernodes) == 3
    ask = ask_of(live, "ml/w-0")
    assert (ask.required_level, ask.preferred_level) == (TIER1, None)
    live.api.put("volcano-podgroups", volcano_group({"mode": "soft", "highestTierName": "leaf"}, minimum=2))
    from tests.test_scheduler_live import wait_until

    wait_until(lambda: ask_of(live, "ml/w-0").preferred_level == TIER1)
    live.api.put("volcano-podgroups", volcano_group({"highestTierName": "spine"}, minimum=2))
    wait_until(lambda: ask_of(live, "ml/w-0").required_level is None)


def test_without_hypernodes_the_label_rule_stands(stand_in) -> None:
    pods = gang_pods(2, annotations={"scheduling.k8s.io/group-name": "job-pg"})
    objects = [("volcano-podgroups", volcano_group({"highestTierAllowed": 1}, minimum=2))]
    serve = tuple(k for k in ALL_KINDS if k != "volcano-hypernodes")
    live = stand_in(serve=serve, nodes=NODES, objects=objects, pods=pods)
    assert ask_of(live, "ml/w-0").required_level == TIER0


def partition_policy(tier: int | None = 1, size: int = 2) -> dict:
    """The subGroupPolicy entry Volcano's job controller writes for task `worker` with
    partitionPolicy {totalPartitions: 2, partitionSize: 2, networkTopology: {mode: hard,
    highestTierAllowed: tier}} (getSubGroupPolicy)."""
    policy: dict = {
        "name": "worker",
        "subGroupSize": size,
        "minSubGroups": 0,
        "labelSelector": {"matchLabels": {"volcano.sh/task-spec": "worker"}},
        "matchLabelKeys": ["volcano.sh/partition-id"],
    }
    if tier is not None:
        policy["networkTopology"] = {"mode": "hard", "highestTierAllowed": tier}
    return policy


def job_pods(n: int, size: int = 2) -> list[dict]:
    """A Volcano Job task's pods as the job controller labels them (partition = index // size)."""
    pods = []
    for i in range(n):
        labels = {
            "volcano.sh/job-name": "job",
            "volcano.sh/task-spec": "worker",
            "volcano.sh/partition-id": str(i // size),
        }
        (p,) = gang_pods(
            1, labels=labels, annotations={"scheduling.k8s.io/group-name": "job-pg"}, name=f"w{i}"
        )
        pods.append(p)
    return pods


def test_a_partition_policy_makes_each_partition_a_sub_group_within_its_tier(stand_in) -> None:
    """partitionPolicy {partitionSize 2, tier 1} under a job tier 2: the gang is required in one
    TIER1 switch, each partition (pods with one volcano.sh/partition-id) in one TIER0 switch.
    Placed over HTTP: every partition shares a tier-0 switch, the job one tier-1 switch."""
    pods = job_pods(4)
    group = volcano_group({"mode": "hard", "highestTierAllowed": 2}, [partition_policy()])
    live = stand_in(nodes=NODES, objects=[("volcano-podgroups", group)], pods=pods)
    gang = live.state.snapshot().pods["ml/w2-0"].gang
    assert (gang.subgroup, gang.subgroup_source) == ("worker-1", "group")
    ask = ask_of(live, "ml/w0-0")
    assert ask.required_level == TIER1
    assert set(ask.groups) == {
        SubGroup("worker-0", "", TIER0, None, 2),
        SubGroup("worker-1", "", TIER0, None, 2),
    }
    assert {m.pod: m.group for m in ask.members} == {
        "ml/w0-0": "worker-0",
        "ml/w1-0": "worker-0",
        "ml/w2-0": "worker-1",
        "ml/w3-0": "worker-1",
    }
    placed = place_all(live, pods)
    switch = {n: labels for n, labels in NODES}
    for part in ("01", "23"):
        assert len({switch[placed[f"w{i}-0"]][TIER0] for i in map(int, part)}) == 1, placed
    assert len({switch[n][TIER1] for n in placed.values()}) == 1, placed


def test_pods_no_policy_takes_are_in_the_root_and_a_bad_policy_list_leaves_the_gang_flat(stand_in) -> None:
    pods = job_pods(2)
    pods[1]["metadata"]["labels"]["volcano.sh/task-spec"] = "ps"  # another task: no policy
    group = volcano_group({"highestTierAllowed": 2}, [partition_policy()], minimum=2)
    live = stand_in(nodes=NODES, objects=[("volcano-podgroups", group)], pods=pods)
    snap = live.state.snapshot()
    assert snap.pods["ml/w0-0"].gang.subgroup == "worker-0"
    assert snap.pods["ml/w1-0"].gang.subgroup == ""
    bad = volcano_group(
        {"highestTierAllowed": 2}, [partition_policy(), partition_policy()]
    )  # a repeated name
    (g,) = gangsources.groups_volcano(bad, "scheduling.volcano.sh/v1beta1")
    assert (g.min_member, g.partitions, g.tier) == (4, (), gangsources.Tier(True, number=2))


@pytest.mark.parametrize(
    "policies",
    [
        "x",
        [{"subGroupSize": 2}],  # no name
        [{"name": "w", "subGroupSize": 0}],
        [{"name": "w", "subGroupSize": "2"}],
        [{"name": "w", "matchLabelKeys": ["not a key!"]}],
        [{"name": "w", "labelSelector": {"matchExpressions": [{"key": "a", "operator": "Like"}]}}],
        [{"name": "w", "labelSelector": "task=w"}],
    ],
)
def test_unusable_sub_group_policies_cost_the_partitions_only(policies) -> None:
    (g,) = gangsources.groups_volcano(volcano_group(None, policies), "v")
    assert (g.min_member, g.partitions) == (4, ())


def test_partition_of_follows_volcanos_matching() -> None:
    (g,) = gangsources.groups_volcano(
        volcano_group(None, [partition_policy(), {"name": "any", "matchLabelKeys": ["rank"]}]), "v"
    )
    labels = {"volcano.sh/task-spec": "worker", "volcano.sh/partition-id": "3"}
    assert gangsources.partition_of(g.partitions, labels)[1] == "worker-3"
    assert gangsources.partition_of(g.partitions, {**labels, "volcano.sh/partition-id": ""}) is None
    assert gangsources.partition_of(g.partitions, {"rank": "7"})[1] == "any-7", "nil selector: any pod"
    assert gangsources.partition_of(g.partitions, {}) is None
    (keyless,) = gangsources.groups_volcano(volcano_group(None, [{"name": "all"}]), "v")
    assert gangsources.partition_of(keyless.partitions, labels) is None, "no match keys: Volcano's default"


@pytest.mark.parametrize(
    ("obj", "why"),
    [
        ({"metadata": {}, "spec": {}}, "metadata.name"),
        ({"metadata": {"name": "h"}, "spec": {"tier": "1", "members": []}}, "spec.tier"),
        ({"metadata": {"name": "h"}, "spec": {"tier": 1, "members": []}}, "spec.members"),
        (hypernode("h", 1, [{"type": "Pod", "selector": {}}]), "type"),
        (hypernode("h", 1, [node_member()]), "exactly one"),
        (
            hypernode("h", 1, [node_member(exactMatch={"name": "a"}, regexMatch={"pattern": "b"})]),
            "exactly one",
        ),
        (hypernode("h", 1, [node_member(regexMatch={"pattern": "(["})]), "not a regular expression"),
        (hypernode("h", 1, [node_member(regexMatch={"pattern": "(a+)+$"})]), "nested quantifiers"),
        (hypernode("h", 1, [{"type": "HyperNode", "selector": {"labelMatch": {}}}]), "type Node only"),
        (hypernode("h", 1, [node_member(labelMatch={"matchLabels": {"a": 1}})]), "matchLabels"),
    ],
)
def test_an_unusable_hypernode_is_skipped_with_its_reason(obj, why) -> None:
    got = hn.parse_hypernode(obj)
    assert isinstance(got, str) and why in got, got


def test_hyper_tiers_resolve_nested_members_labels_and_cycles() -> None:
    nodes = {name: labels for name, labels in NODES}
    parsed = [
        hn.parse_hypernode(h)
        for h in [
            hypernode("x", 1, [node_member(labelMatch={"matchLabels": {TIER0: "s0"}})], "rack"),
            hypernode(
                "y",
                1,
                [
                    node_member(
                        labelMatch={"matchExpressions": [{"key": TIER0, "operator": "In", "values": ["s1"]}]}
                    )
                ],
            ),
            hypernode("loop-a", 3, [{"type": "HyperNode", "selector": {"exactMatch": {"name": "loop-b"}}}]),
            hypernode("loop-b", 3, [{"type": "HyperNode", "selector": {"exactMatch": {"name": "loop-a"}}}]),
            hypernode("empty", 4, [node_member(labelMatch={})]),
        ]
    ]
    assert not any(isinstance(p, str) for p in parsed)
    tiers = hn.HyperTiers.build(parsed, nodes, ("kubernetes.io/hostname", TIER0, TIER1))  # type: ignore[arg-type]
    assert tiers.levels == {1: TIER0}, "cycles and empty selectors hold no node: left to the label rule"
    assert tiers.names == {"rack": 1}
    levels = ("kubernetes.io/hostname", TIER0, TIER1)
    assert gangsources.tier_level(gangsources.Tier(True, name="rack"), levels, [TIER0, TIER1], tiers) == TIER0
    assert gangsources.tier_level(gangsources.Tier(True, number=2), levels, [TIER0, TIER1], tiers) == TIER1
    assert gangsources.tier_level(gangsources.Tier(True, name="nope"), levels, [TIER0], tiers) is None
    assert fk.EXTRA_KINDS["volcano-hypernodes"][2] == "hypernodes"


# --- totality: any JSON costs its object only ----------------------------------------------------


KEYS = st.sampled_from(
    [
        "metadata", "name", "spec", "tier", "tierName", "members", "type", "selector", "exactMatch",
        "regexMatch", "pattern", "labelMatch", "matchLabels", "matchExpressions", "key", "operator",
        "values", "minMember", "subGroupPolicy", "subGroupSize", "labelSelector", "matchLabelKeys",
        "networkTopology", "mode", "highestTierAllowed", "highestTierName", "Node", "HyperNode", "In",
    ]
)  # fmt: skip
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-2, 4)
    | st.text(max_size=6)
    | st.sampled_from(["Node", "HyperNode", "n1"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=5),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(
    objs=st.lists(JSON, max_size=4),
    labels=st.dictionaries(st.text(max_size=8), st.text(max_size=4), max_size=3),
)
def test_hypernode_and_partition_readers_are_total(objs, labels) -> None:
    """Any JSON: a HyperNode or its reason, a tier map, a Volcano PodGroup (maybe without
    partitions), a ComputeDomain or none; never an exception."""
    parsed = []
    for obj in objs:
        doc = obj if isinstance(obj, dict) else {"spec": obj}
        got = hn.parse_hypernode(doc)
        assert isinstance(got, (str, hn.HyperNode))
        if isinstance(got, hn.HyperNode):
            parsed.append(got)
        for g in gangsources.groups_volcano({"metadata": {"name": "g"}, **doc}, "v"):
            gangsources.partition_of(g.partitions, labels)
        gangsources.groups_compute_domain({"metadata": {"name": "cd"}, **doc}, "v")
    nodes = {"n1": labels, "n2": {}}
    hn.HyperTiers.build(parsed, nodes, ("kubernetes.io/hostname", TIER0, TIER1))
