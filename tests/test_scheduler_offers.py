"""Gang plans stay within what kube-scheduler offers, over the extender's real HTTP server.

kube-scheduler removes cordoned, tainted, NotReady nodes and nodes failing the pod's selectors
before it calls the extender; a plan that uses such a node strands the members bound elsewhere
(issue 9, items 7 and 8). These tests drive the sidecar as kube-scheduler does (the stand-in
passes `NodeNames` filtered by its own rules), plus the re-plans a plan's breakage triggers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gputopo.network.cluster import parse_cluster
from gputopo.network.levels import HOSTNAME, LEAF, SPINE
from scheduler.extender import Extender
from scheduler.model import PodInfo
from scheduler.picture.feed import FileState, from_cluster
from scheduler.web.server import Server
from tests import fake_apiserver as fk
from tests.kube_scheduler_standin import StandIn
from tests.test_scheduler_http import Client, args

LEVELS = (HOSTNAME, LEAF, SPINE)
GROUP = "scheduling.x-k8s.io/pod-group"
NAMES = [f"{leaf}-n{i}" for leaf in ("a", "b") for i in range(3)]
LABELS = {n: {HOSTNAME: n, LEAF: f"leaf-{n[0]}", SPINE: "s"} for n in NAMES}


def two_leaves(min_member: int = 3, **extra: Any) -> FileState:
    """Leaves a and b of three empty 8-GPU DGX A100 nodes each: a 3 x 8 gang fits either."""
    nodes = [{"name": n, "labels": LABELS[n], "gpus": "dgx-a100"} for n in NAMES]
    groups = [{"namespace": "ml", "name": "g", "minMember": min_member}]
    return from_cluster(parse_cluster({"levels": list(LEVELS), "nodes": nodes, "podgroups": groups, **extra}))


def member(i: int, gpus: int = 8, **spec: Any) -> dict:
    pod = fk.pod("ml", f"g-{i}", gpus, labels={GROUP: "g"})
    pod["spec"].update(spec)
    return pod


@pytest.fixture
def running() -> Iterator[Any]:
    started: list[tuple[Server, StandIn | None]] = []

    def start(state: FileState, clock: list[float], **kw: Any) -> tuple[Extender, StandIn, Client]:
        ext = Extender(state, LEVELS, clock=lambda: clock[0], backoff_s=(30.0, 60.0))
        server = Server(ext, "127.0.0.1", 0)
        server.start()
        standin = StandIn(*server.address, NAMES, node_labels=LABELS, **kw)
        started.append((server, standin))
        return ext, standin, Client(server)

    yield start
    for server, standin in started:
        if standin is not None:
            standin.close()
        server.stop()


def held_nodes(state: FileState) -> dict[str, str]:
    return {pod: node for pod, (node, _) in state.held().items()}


def test_a_cordoned_node_is_never_planned_and_the_gang_goes_whole_to_the_other_leaf(running) -> None:
    """Leaf a would win on name order; with a-n1 cordoned it holds only two members."""
    state = two_leaves()
    clock = [1000.0]
    ext, standin, _ = running(state, clock, unschedulable={"a-n1"})
    seen_reserved: set[str] = set()
    standin.after_filter = lambda pod, res: seen_reserved.update(r.node for r in ext.reservations)
    out = standin.run([member(i) for i in range(3)], clock=clock)
    assert set(out.bound) == {"ml/g-0", "ml/g-1", "ml/g-2"}, out.pending
    assert {n[0] for n in out.bound.values()} == {"b"}, "all three members in leaf b"
    assert not any(n.startswith("a-") for n in seen_reserved), "nothing was ever held on leaf a"
    assert not any(n.startswith("a-") for n in held_nodes(state).values())
    assert not out.bind_errors and len(ext.reservations) == 0


def test_a_gang_whose_pods_select_leaf_b_is_planned_on_leaf_b(running) -> None:
    state = two_leaves()
    clock = [1000.0]
    ext, standin, _ = running(state, clock)
    pods = [member(i, nodeSelector={LEAF: "leaf-b"}) for i in range(3)]
    out = standin.run(pods, clock=clock)
    assert sorted(out.bound.values()) == ["b-n0", "b-n1", "b-n2"], out.pending
    assert not out.bind_errors and len(ext.reservations) == 0


def test_a_member_not_offered_its_planned_node_replans_the_gang_before_any_bind(running) -> None:
    """Planned on leaf a while every node was offered; then a-n0 is cordoned before its member
    comes back: the unbound members are re-planned at once without a-n0, none was bound first."""
    state = two_leaves()
    clock = [1000.0]
    ext, _, client = running(state, clock)
    for i in range(3):
        _, out = client.post("/filter", args(member(i), NAMES))
    planned = {r.pod: r.node for r in ext.reservations}
    assert sorted(planned.values()) == ["a-n0", "a-n1", "a-n2"]
    victim = next(p for p, n in planned.items() if n == "a-n0")
    offer = [n for n in NAMES if n != "a-n0"]
    _, out = client.post("/filter", args(member(int(victim[-1])), offer))
    (node,) = out["NodeNames"]
    assert node.startswith("b-"), "leaf a has only two offered nodes left"
    replanned = {r.pod: r.node for r in ext.reservations}
    assert sorted(replanned.values()) == ["b-n0", "b-n1", "b-n2"], "the whole gang moved, a-n0 released"
    assert ext.metrics.plans.labels(result="dropped")._value.get() == 1
    for pod, where in replanned.items():
        name = pod.split("/")[1]
        assert client.post("/bind", {"PodName": name, "PodNamespace": "ml", "PodUID": "", "Node": where}) == (
            200,
            {"Error": ""},
        )
    assert sorted(held_nodes(state).values()) == ["b-n0", "b-n1", "b-n2"]


def test_reserved_gpus_taken_by_another_pod_break_the_plan_and_the_rest_is_replanned(running) -> None:
    """A pod the plugin (or anyone) put on a reserved GPU: the member bound there next would be
    refused by kubelet; the sidecar re-plans the unbound members at once, around that GPU."""
    state = two_leaves(min_member=2)
    clock = [1000.0]
    ext, _, client = running(state, clock)
    for i in range(2):
        client.post("/filter", args(member(i), NAMES))
    first = {r.pod: (r.node, r.gpus) for r in ext.reservations}
    (node, gpus) = first["ml/g-0"]
    state.bind(PodInfo("web", "intruder", "", 1), node, (gpus[0],))  # the annotation now shows it
    _, out = client.post("/filter", args(fk.pod("web", "probe", 1), NAMES))  # any call sees it
    after = {r.pod: (r.node, r.gpus) for r in ext.reservations}
    assert set(after) == {"ml/g-0", "ml/g-1"}, "re-planned at once, not at the next member filter"
    assert node not in {n for n, _ in after.values()}, "an 8-GPU member no longer fits there"
    assert ext.metrics.plans.labels(result="dropped")._value.get() == 1
    for i in range(2):
        _, out = client.post("/filter", args(member(i), NAMES))
        (where,) = out["NodeNames"]
        bind = {"PodName": f"g-{i}", "PodNamespace": "ml", "PodUID": "", "Node": where}
        assert client.post("/bind", bind) == (200, {"Error": ""})
    assert len(ext.reservations) == 0


def test_a_waiting_gang_is_planned_at_the_first_filter_after_the_cluster_changed(running) -> None:
    """kube-scheduler asks again only on a cluster event (or after 5 minutes): the back-off of a
    gang that fits nowhere must not outlive the state it was computed for."""
    state = two_leaves(min_member=2)
    for n in NAMES[:5]:
        state.bind(PodInfo("web", f"big-{n}", "", 8), n, tuple(range(8)))
    clock = [1000.0]
    ext, _, client = running(state, clock)
    client.post("/filter", args(member(0), NAMES))
    _, out = client.post("/filter", args(member(1), NAMES))
    assert "does not fit" in out["FailedAndUnresolvableNodes"]["b-n2"]
    _, out = client.post("/filter", args(member(1), NAMES))
    assert "retry in" in out["FailedAndUnresolvableNodes"]["b-n2"], "same question, same answer"
    state.delete_pod("web/big-b-n0")  # a cluster event: kube-scheduler moves the pod back
    _, out = client.post("/filter", args(member(1), NAMES))
    assert out["NodeNames"], out["FailedAndUnresolvableNodes"]
    assert len(ext.reservations) == 2


def test_pinning_around_bound_members_uses_network_domains_not_raw_label_values(running) -> None:
    """Two nodes whose leaf label is empty are two leaves (network.domain_of), not one leaf "":
    with the required leaf, the member left must join the bound one on its own node or wait."""
    nodes = [
        {"name": n, "labels": {HOSTNAME: n, LEAF: "", SPINE: "s"}, "gpus": "dgx-a100", "allocated": held}
        for n, held in (("x", list(range(8))), ("y", []))
    ]
    state = from_cluster(
        parse_cluster(
            {
                "levels": list(LEVELS),
                "nodes": nodes,
                "podgroups": [{"namespace": "ml", "name": "g", "minMember": 2}],
                "pods": [{"namespace": "ml", "name": "g-0", "gpus": 8, "node": "x", "labels": {GROUP: "g"}}],
            }
        )
    )
    clock = [1000.0]
    ext, _, client = running(state, clock)
    pod = member(1)
    pod["metadata"]["annotations"] = {"gputopo.io/required-topology": LEAF}
    _, out = client.post("/filter", args(pod, ["x", "y"]))
    assert out["NodeNames"] == [], "y is another leaf than x: the gang would span two leaves"
    assert "does not fit" in out["FailedAndUnresolvableNodes"]["y"]
    assert len(ext.reservations) == 0
