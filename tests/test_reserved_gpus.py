"""Issue 30: a single pod never takes GPUs a gang plan reserved for a member.

kubelet offers a node's plugin every free healthy GPU, reserved ones included, and the plugin's
GetPreferredAllocation picks the best set among them: a single pod bound beside a reservation
used to land inside it, which broke the reservation and re-planned the gang. Here a 2x2 gang
is planned on one HGX H100 node and single pods are filtered, prioritized and bound between the
plan and the members' binds, over real HTTP (fake API server <- KubeState <- Extender <- Server),
with `Plugin` standing in for kubelet and the device plugin. The single pods go where the GPUs
their plugin would give avoid every reservation, or are refused with a reason naming it; the
members bind on their first plan, with the GPUs it reserved for them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from scheduler.live.accounting import PREDICTED_REASON
from tests import fake_apiserver as fk
from tests.test_cluster_view import GROUP, Live, Plugin
from tests.test_scheduler_live import wait_until


@pytest.fixture
def live() -> Iterator[Live]:
    """The live path of tests/test_cluster_view.py: fake API server, KubeState, Extender, HTTP."""
    with fk.running() as (api, _, api_client):
        world = Live(api, api_client)
        try:
            yield world
        finally:
            world.server.stop()
            world.state.stop()


def _key(pod: dict[str, Any]) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


def _predicted(live: Live, pod: dict[str, Any]) -> set[int]:
    """The GPUs the sidecar predicted for `pod` at bind (its GPUsPredicted Event)."""
    name = pod["metadata"]["name"]
    (event,) = [
        v
        for v in map(fk.event_view, live.api.events)
        if v["name"] == name and v["reason"] == PREDICTED_REASON
    ]
    return {int(g) for g in event["message"].split("GPUs ")[1].split(" on ")[0].split(",")}


def _gang(live: Live, size: int = 2, gpus: int = 2) -> list[dict[str, Any]]:
    live.api.put(
        "podgroups",
        {"kind": "PodGroup", "metadata": {"namespace": "ml", "name": "g"}, "spec": {"minMember": size}},
    )
    gang = [fk.pod("ml", f"g-{i}", gpus, labels={GROUP: "g"}) for i in range(size)]
    for p in gang:
        live.api.put("pods", p)
    return gang


def _singles(live: Live, *gpus: int) -> list[dict[str, Any]]:
    pods = [fk.pod("ml", f"solo-{i}", n) for i, n in enumerate(gpus)]
    for p in pods:
        live.api.put("pods", p)
    return pods


def _place(live: Live, plugins: dict[str, Plugin], pod: dict[str, Any], names: list[str]) -> str | None:
    """kube-scheduler's cycle for one pod: filter, prioritize, the best node, bind; then kubelet."""
    out = live.filter(pod, names)
    fit = out["NodeNames"] or []
    if not fit:
        return None
    scores = live.prioritize(pod, fit) if len(fit) > 1 else {fit[0]: 0}
    node = max(fit, key=lambda n: (scores[n], -fit.index(n)))
    assert live.bind(pod, node) == ""
    wait_until(lambda: live.state.snapshot().pods[_key(pod)].node == node)
    plugins[node].admit(pod)
    return node


def _first_plan_only(live: Live) -> None:
    plans = live.metrics.plans
    assert plans.labels(result="planned")._value.get() == 1, "the gang was planned once"
    assert plans.labels(result="dropped")._value.get() == 0, "and never re-planned"
    assert live.metrics.broken_reservations._value.get() == 0


@pytest.mark.parametrize("order", [(0, 1), (1, 0)], ids=["members-in-order", "members-reversed"])
def test_single_pods_between_plan_and_binds_never_take_reserved_gpus(
    live: Live, order: tuple[int, int]
) -> None:
    """The 2x2 of the issue on one HGX H100 node (the only one offered), single pods of 1 and
    2 GPUs filtered, prioritized and bound after the plan, before either member's bind. The
    plugin would give each of them GPU 0 (or 0 and 1), inside the first member's reservation: they
    are refused, naming it, and placed once the gang is bound. The members bind on their first
    plan in either order: bound second-first, the plugin gives the second member the first one's
    planned set, and the two members' reservations are exchanged rather than broken."""
    plugins = {"n1": Plugin(live, "n1", "hgx-h100")}
    plugins["n1"].publish()
    gang = _gang(live)
    solos = _singles(live, 1, 2)
    live.start()
    assert live.filter(gang[0], ["n1"])["NodeNames"] == ["n1"]
    held = {k: live.ext.reservations.get(f"ml/g-{k}") for k in range(2)}
    assert all(r is not None and r.node == "n1" for r in held.values())
    reserved = {g for r in held.values() if r is not None for g in r.gpus}
    for solo in solos:
        out = live.filter(solo, ["n1"])
        assert out["NodeNames"] == [], f"{_key(solo)} passed the node of the reservations"
        why = out["FailedNodes"]["n1"]
        assert "reserved for ml/g-0 of gang ml/g" in why, why
        assert live.prioritize(solo, ["n1"]) == {"n1": 0}
        assert "reserved for ml/g-0 of gang ml/g" in live.bind(solo, "n1")
    assert not live.api.bindings, "refused before any API call"
    for k in order:
        assert _place(live, plugins, gang[k], ["n1"]) == "n1"
    given = {k: set(plugins["n1"].pods[_key(m)]) for k, m in enumerate(gang)}
    assert given[0] | given[1] == reserved and not given[0] & given[1], "the planned GPUs"
    if order == (0, 1):
        assert all(given[k] == set(r.gpus) for k, r in held.items() if r is not None)
    _first_plan_only(live)
    for solo in solos:
        assert _place(live, plugins, solo, ["n1"]) == "n1", "room beside the bound gang"
        assert not set(plugins["n1"].pods[_key(solo)]) & reserved
    outcomes = live.state.accounting.outcomes()
    assert len(outcomes) == 4 and all(o.matched for o in outcomes.values()), "predicted = given"
    used = [g for gs in plugins["n1"].pods.values() for g in gs]
    assert len(used) == len(set(used)) == 7, "no GPU given twice"


def test_a_single_pod_goes_beside_the_reservations_to_another_node(live: Live) -> None:
    """With a second node offered, a single pod whose plugin pick on the planned node would land
    inside a reservation goes to the other node; the gang binds on its first plan."""
    plugins = {n: Plugin(live, n, "hgx-h100") for n in ("n1", "n2")}
    for p in plugins.values():
        p.publish()
    gang = _gang(live)
    solos = _singles(live, 1, 1, 2)
    live.start()
    assert live.filter(gang[0], ["n1"])["NodeNames"] == ["n1"]
    reserved = {g for r in live.ext.reservations if r.node == "n1" for g in r.gpus}
    assert len(reserved) == 4
    for solo in solos:
        assert "reserved for ml/g-0" in live.filter(solo, ["n1", "n2"])["FailedNodes"]["n1"]
        assert _place(live, plugins, solo, ["n1", "n2"]) == "n2"
    for member in gang:
        assert _place(live, plugins, member, ["n1", "n2"]) == "n1"
    _first_plan_only(live)


def test_a_single_pod_filtered_before_the_plan_is_refused_at_bind(live: Live) -> None:
    """The race itself: the single pod's filter passed before the gang was planned; its bind
    comes after the plan. The bind judges the node as it is now: refused, naming the
    reservation, before any API call; filtered again, the pod goes elsewhere."""
    plugins = {n: Plugin(live, n, "hgx-h100") for n in ("n1", "n2")}
    for p in plugins.values():
        p.publish()
    gang = _gang(live)
    (solo,) = _singles(live, 1)
    live.start()
    assert "n1" in live.filter(solo, ["n1"])["NodeNames"]
    assert live.filter(gang[0], ["n1"])["NodeNames"] == ["n1"]
    error = live.bind(solo, "n1")
    assert "reserved for ml/g-0 of gang ml/g" in error and "filter it again" in error, error
    assert ("ml/solo-0", "n1") not in live.api.bindings, "refused before any API call"
    assert _place(live, plugins, solo, ["n1", "n2"]) == "n2"
    for member in gang:
        assert _place(live, plugins, member, ["n1", "n2"]) == "n1"
    _first_plan_only(live)
