"""Gangs and levels from the APIs users already write, end to end over the API stand-in:
fake API server <- official client <- KubeState <- Extender <- HTTP; binds as pods/binding.

Every gang source places a whole gang in one domain with unchanged pod specs; Topology objects
define the levels; a missing API group is logged once and is not an error."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from scheduler.extender import Extender
from scheduler.live.kube import KubeState
from scheduler.web.server import Server
from tests import fake_apiserver as fk
from tests.test_scheduler_http import Client
from tests.test_scheduler_live import KEY, NOW, annotation, args, wait_until

OLD_LEAF = "network.topology.nvidia.com/leaf"
TIER0 = "fabric.topograph.run/tier-0"
TIER1 = "fabric.topograph.run/tier-1"
XCLR = "accelerator.topograph.run/domain"
CLIQUE = "nvidia.com/gpu.clique"
RACK = "cloud.provider.com/topology-rack"
BLOCK = "cloud.provider.com/topology-block"
ALL_KINDS = tuple(fk.EXTRA_KINDS)


class Live:
    def __init__(self, api: fk.FakeAPI, state: KubeState, ext: Extender, client: Client) -> None:
        self.api, self.state, self.ext, self.client = api, state, ext, client


@pytest.fixture
def live_with() -> Iterator:
    """live_with(serve=..., nodes=[(name, labels)], objects=[(kind, obj)], pods=[...]) -> Live."""
    stack: list = []

    def make(serve=ALL_KINDS, nodes=(), objects=(), pods=(), **kw) -> Live:
        cm = fk.running(fk.FakeAPI(serve=serve))
        api, _, api_client = cm.__enter__()
        stack.append(cm.__exit__)
        for name, labels in nodes:
            api.put("nodes", fk.node(name, labels, annotations={KEY: annotation(name)}))
        for kind, obj in objects:
            api.put(kind, obj)
        for p in pods:
            api.put("pods", p)
        state = KubeState(
            api_client, clock=lambda: NOW, watch_timeout_s=5, backoff_s=(0.05, 0.2), discovery_ttl_s=0.1, **kw
        )
        ext = Extender(state, clock=lambda: NOW)
        server = Server(ext, "127.0.0.1", 0)
        state.start()
        stack.append(lambda *_: state.stop())
        wait_until(state.ready)
        server.start()
        stack.append(lambda *_: server.stop())
        return Live(api, state, ext, Client(server))

    yield make
    for close in reversed(stack):
        close(None, None, None)


def two_domains(label: str, extra: dict[str, str] | None = None) -> list[tuple[str, dict[str, str]]]:
    """n0,n1 in domain a and n2,n3 in domain b of `label`; 8 GPUs each (dgx-a100)."""
    return [(f"n{i}", {label: "ab"[i // 2], **(extra or {})}) for i in range(4)]


def gang_pods(n: int, *, labels=None, annotations=None, spec=None, name="w") -> list[dict]:
    pods = []
    for i in range(n):
        p = fk.pod("ml", f"{name}-{i}", 8, labels=labels, annotations=annotations)
        p["spec"].update(spec or {})
        pods.append(p)
    return pods


def place_all(live: Live, pods: list[dict]) -> dict[str, str]:
    """Filter then bind every member as kube-scheduler would; returns pod -> node."""
    names = sorted(live.state.snapshot().nodes)
    placed = {}
    for p in pods:
        _, out = live.client.post("/filter", args(p, names))
        assert len(out["NodeNames"]) == 1, out
        (node,) = out["NodeNames"]
        name = p["metadata"]["name"]
        body = {"PodName": name, "PodNamespace": "ml", "PodUID": p["metadata"]["uid"], "Node": node}
        assert live.client.post("/bind", body) == (200, {"Error": ""})
        placed[name] = node
    assert sorted(live.api.bindings) == sorted((f"ml/{k}", v) for k, v in placed.items())
    return placed


def one_domain(placed: dict[str, str]) -> bool:
    return len({int(n[1:]) // 2 for n in placed.values()}) == 1


def plan_of(live: Live, pod: dict, gang: str) -> tuple[str, str]:
    names = sorted(live.state.snapshot().nodes)
    live.client.post("/filter", args(pod, names))
    plan = live.ext.plans[gang]
    return plan.level, plan.domain


@pytest.mark.parametrize("version", ["v1beta1", "v1alpha2"])
def test_kubernetes_podgroup_with_its_topology_constraint(live_with, version: str) -> None:
    """Workload API (1.37 serves v1beta1, 1.36 v1alpha2): pods name their PodGroup in
    spec.schedulingGroup; the PodGroup's gang.minCount is the quorum and its topology key is a
    required level. The sidecar finds whichever version the API server serves."""
    pg = {
        "apiVersion": f"scheduling.k8s.io/{version}",
        "kind": "PodGroup",
        "metadata": {"namespace": "ml", "name": "train", "uid": "pg-uid"},
        "spec": {
            "schedulingPolicy": {"gang": {"minCount": 2}},
            "schedulingConstraints": {"topology": [{"key": TIER0}]},
        },
    }
    pods = gang_pods(2, spec={"schedulingGroup": {"podGroupName": "train"}})
    # n0,n1 also share an NVLink domain: unconstrained, the gang would be planned there
    nodes = [(n, {**labels, XCLR: f"x{labels[TIER0]}"}) for n, labels in two_domains(TIER0, {TIER1: "s"})]
    serve = {k: fk.EXTRA_KINDS[k][1] for k in ALL_KINDS} | {"k8s-podgroups": version}
    live = live_with(serve=serve, nodes=nodes, objects=[("k8s-podgroups", pg)], pods=pods[:1])
    _, out = live.client.post("/filter", args(pods[0], ["n0", "n1", "n2", "n3"]))
    assert "waiting for members 1/2" in out["FailedAndUnresolvableNodes"]["n0"]
    live.api.put("pods", pods[1])
    wait_until(lambda: "ml/w-1" in live.state.snapshot().pods)
    gang = live.state.snapshot().pods["ml/w-0"].gang
    assert gang.key == "ml/podgroup:train" and gang.required_level == TIER0 and gang.min_member == 2
    assert plan_of(live, pods[0], gang.key)[0] == TIER0
    assert one_domain(place_all(live, pods))


def test_kubernetes_workload_v1alpha1_per_replica(live_with) -> None:
    """1.35 form: spec.workloadRef {name, podGroup, podGroupReplicaKey}; minCount counts per
    replica, so two replicas are two gangs."""
    wl = {
        "apiVersion": "scheduling.k8s.io/v1alpha1",
        "kind": "Workload",
        "metadata": {"namespace": "ml", "name": "job", "uid": "wl-uid"},
        "spec": {"podGroups": [{"name": "workers", "policy": {"gang": {"minCount": 2}}}]},
    }
    ref = {"name": "job", "podGroup": "workers", "podGroupReplicaKey": "r0"}
    pods = gang_pods(2, spec={"workloadRef": ref})
    other = gang_pods(1, spec={"workloadRef": {**ref, "podGroupReplicaKey": "r1"}}, name="x")
    live = live_with(nodes=two_domains(OLD_LEAF), objects=[("k8s-workloads", wl)], pods=pods + other)
    snap = live.state.snapshot()
    assert snap.pods["ml/w-0"].gang.key == "ml/workload:job/workers/r0"
    assert snap.pods["ml/w-0"].gang.min_member == 2
    _, out = live.client.post("/filter", args(other[0], ["n0"]))
    assert "waiting for members 1/2" in out["FailedAndUnresolvableNodes"]["n0"], "replica r1 is its own gang"
    assert plan_of(live, pods[0], "ml/workload:job/workers/r0")[0] == OLD_LEAF
    assert one_domain(place_all(live, pods))


def test_volcano_podgroup_min_member(live_with) -> None:
    pg = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"namespace": "ml", "name": "vc-job", "uid": "vc-uid"},
        "spec": {"minMember": 2, "queue": "default"},
    }
    pods = gang_pods(2, annotations={"scheduling.k8s.io/group-name": "vc-job"})
    live = live_with(nodes=two_domains(OLD_LEAF), objects=[("volcano-podgroups", pg)], pods=pods)
    assert live.state.snapshot().pods["ml/w-1"].gang.min_member == 2
    assert one_domain(place_all(live, pods))


def test_kueue_pod_group_and_required_topology_with_kueues_topology_levels(live_with) -> None:
    """Kueue's plain-pod group (label + total-count annotation) and its podset annotation; the
    level list comes from Kueue's Topology object (served at v1beta2 here), broadest first."""
    topo = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Topology",
        "metadata": {"name": "default"},
        "spec": {
            "levels": [{"nodeLabel": BLOCK}, {"nodeLabel": RACK}, {"nodeLabel": "kubernetes.io/hostname"}]
        },
    }
    pods = gang_pods(
        2,
        labels={"kueue.x-k8s.io/pod-group-name": "kq"},
        annotations={
            "kueue.x-k8s.io/pod-group-total-count": "2",
            "kueue.x-k8s.io/podset-required-topology": RACK,
        },
    )
    serve = {**{k: v[1] for k, v in fk.EXTRA_KINDS.items()}, "kueue-topologies": "v1beta2"}
    live = live_with(
        serve=serve, nodes=two_domains(RACK, {BLOCK: "b1"}), objects=[("kueue-topologies", topo)], pods=pods
    )
    levels = live.state.snapshot().levels
    assert levels[:3] == ("kubernetes.io/hostname", RACK, BLOCK), "smallest first, then the defaults"
    assert plan_of(live, pods[0], "ml/kueue:kq") == (RACK, "a")
    assert one_domain(place_all(live, pods))


def test_kai_topology_annotations_and_kai_topology_levels(live_with) -> None:
    topo = {
        "apiVersion": "kai.scheduler/v1alpha1",
        "kind": "Topology",
        "metadata": {"name": "cluster"},
        "spec": {"levels": [{"nodeLabel": BLOCK}, {"nodeLabel": RACK}]},
    }
    pods = gang_pods(
        2,
        labels={"scheduling.x-k8s.io/pod-group": "g"},
        annotations={"kai.scheduler/topology-preferred-placement": RACK},
    )
    group = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"namespace": "ml", "name": "g"},
        "spec": {"minMember": 2},
    }
    live = live_with(
        nodes=two_domains(RACK, {BLOCK: "b1"}),
        objects=[("kai-topologies", topo), ("podgroups", group)],
        pods=pods,
    )
    assert live.state.snapshot().pods["ml/w-0"].gang.preferred_level == RACK
    assert plan_of(live, pods[0], "ml/g")[0] == RACK
    assert one_domain(place_all(live, pods))


def test_kai_podgroup_quorum_and_topology_constraint_with_kai_topology_levels(live_with) -> None:
    """KAI Scheduler's own PodGroup (scheduling.run.ai/v2alpha2): its pods carry only the pod
    grouper's `pod-group-name` annotation; minMember is the quorum and topologyConstraint's
    required level pins the gang to one rack."""
    topo = {
        "apiVersion": "kai.scheduler/v1alpha1",
        "kind": "Topology",
        "metadata": {"name": "cluster"},
        "spec": {"levels": [{"nodeLabel": BLOCK}, {"nodeLabel": RACK}]},
    }
    group = {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"namespace": "ml", "name": "pg-train", "uid": "kai-uid"},
        "spec": {
            "minMember": 2,
            "queue": "default-queue",
            "topologyConstraint": {"topology": "cluster", "requiredTopologyLevel": RACK},
        },
    }
    pods = gang_pods(2, annotations={"pod-group-name": "pg-train"})
    live = live_with(
        nodes=two_domains(RACK, {BLOCK: "b1"}),
        objects=[("kai-topologies", topo), ("kai-podgroups", group)],
        pods=pods,
    )
    gang = live.state.snapshot().pods["ml/w-0"].gang
    assert (gang.key, gang.min_member, gang.required_level) == ("ml/kai:pg-train", 2, RACK)
    assert plan_of(live, pods[1], "ml/kai:pg-train")[0] == RACK
    assert one_domain(place_all(live, pods))


def test_topograph_labels_and_the_gpu_clique_are_levels_by_default(live_with) -> None:
    """No Topology object: the recognised defaults. Topograph's accelerator domain groups
    n0,n1; nodes with only NVIDIA's clique label are grouped by their clique."""
    nodes = [
        ("n0", {XCLR: "nvl-a", TIER0: "s1"}),
        ("n1", {XCLR: "nvl-a", TIER0: "s1"}),
        ("n2", {CLIQUE: "uuid-1.7", TIER0: "s2"}),
        ("n3", {CLIQUE: "uuid-1.7", TIER0: "s2"}),
    ]
    group = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"namespace": "ml", "name": "g"},
        "spec": {"minMember": 2},
    }
    pods = gang_pods(2, labels={"scheduling.x-k8s.io/pod-group": "g"})
    live = live_with(nodes=nodes, objects=[("podgroups", group)], pods=pods)
    assert live.state.snapshot().levels == (), "no Topology object: the configured levels"
    assert plan_of(live, pods[0], "ml/g") == (XCLR, "nvl-a")
    place_all(live, pods)
    # the first domain is full now; the next gang goes to the clique
    more = gang_pods(2, labels={"scheduling.x-k8s.io/pod-group": "h"}, name="h")
    live.api.put("podgroups", {**group, "metadata": {"namespace": "ml", "name": "h"}})
    for p in more:
        live.api.put("pods", p)
    wait_until(
        lambda: live.state.snapshot().min_members.get("ml/h") == 2 and "ml/h-1" in live.state.snapshot().pods
    )
    assert plan_of(live, more[0], "ml/h") == (CLIQUE, "uuid-1.7")


def test_missing_api_groups_are_logged_once_and_not_an_error(live_with, caplog) -> None:
    caplog.set_level(logging.INFO, logger="gputopo.scheduler")
    pods = gang_pods(1, spec={"schedulingGroup": {"podGroupName": "train"}})
    live = live_with(serve=(), nodes=two_domains(OLD_LEAF), pods=pods)
    _, out = live.client.post("/filter", args(pods[0], ["n0"]))
    assert "PodGroup ml/podgroup:train not found" in out["FailedAndUnresolvableNodes"]["n0"]
    # retried quietly: wait for a second discovery round, still one log line per kind
    first = len([r for r in live.api.requests if r[0] == "discovery"])
    wait_until(lambda: len([r for r in live.api.requests if r[0] == "discovery"]) > first, timeout=15)
    absent = [r.fields["kind"] for r in caplog.records if r.getMessage() == "kind_absent"]
    assert sorted(absent) == sorted(fk.EXTRA_KINDS), absent


def test_a_podgroup_kind_appearing_later_is_picked_up(live_with) -> None:
    """A CRD installed after start: discovery is asked again, the kind is listed then."""
    pods = gang_pods(2, annotations={"scheduling.k8s.io/group-name": "vc"})
    live = live_with(serve=(), nodes=two_domains(OLD_LEAF), pods=pods)
    live.api.serve_kind("volcano-podgroups")
    live.api.put(
        "volcano-podgroups",
        {"metadata": {"namespace": "ml", "name": "vc"}, "spec": {"minMember": 2}},
    )
    wait_until(lambda: live.state.snapshot().min_members.get("ml/volcano:vc") == 2)
    assert one_domain(place_all(live, pods))


def test_precedence_when_a_pod_names_several_gangs_and_levels(live_with) -> None:
    """spec.schedulingGroup beats the scheduler-plugins label; gputopo's own level annotation
    beats the PodGroup's topology key, which beats Kueue's and KAI's annotations."""
    pg = {
        "metadata": {"namespace": "ml", "name": "train"},
        "spec": {
            "schedulingPolicy": {"gang": {"minCount": 2}},
            "schedulingConstraints": {"topology": [{"key": TIER1}]},
        },
    }
    both = {"scheduling.x-k8s.io/pod-group": "legacy", "kueue.x-k8s.io/pod-group-name": "kq"}
    kueue_kai = {
        "kueue.x-k8s.io/podset-required-topology": TIER0,
        "kai.scheduler/topology-required-placement": XCLR,
    }
    a = gang_pods(1, labels=both, annotations=kueue_kai, spec={"schedulingGroup": {"podGroupName": "train"}})
    b = gang_pods(1, annotations={**kueue_kai, "gputopo.io/preferred-topology": TIER0}, name="b")
    b[0]["spec"]["schedulingGroup"] = {"podGroupName": "train"}
    live = live_with(nodes=two_domains(TIER0, {TIER1: "s"}), objects=[("k8s-podgroups", pg)], pods=a + b)
    snap = live.state.snapshot()
    ga, gb = snap.pods["ml/w-0"].gang, snap.pods["ml/b-0"].gang
    assert ga.key == gb.key == "ml/podgroup:train"
    assert (ga.required_level, ga.preferred_level, ga.level_source) == (TIER1, None, "group")
    assert (gb.required_level, gb.preferred_level, gb.level_source) == (None, TIER0, "gputopo")
    assert plan_of(live, a[0], "ml/podgroup:train") == (TIER1, "s"), "the PodGroup's required level"


def test_a_kind_that_goes_away_takes_its_gangs_with_it(live_with) -> None:
    pg = {"metadata": {"namespace": "ml", "name": "vc"}, "spec": {"minMember": 2}}
    live = live_with(serve=("volcano-podgroups",), objects=[("volcano-podgroups", pg)])
    assert live.state.snapshot().min_members == {"ml/volcano:vc": 2}
    live.api.paths = {p: k for p, k in live.api.paths.items() if k != "volcano-podgroups"}
    live.api.served.pop("volcano-podgroups")
    live.api.break_watches()
    wait_until(lambda: live.state.snapshot().min_members == {})
