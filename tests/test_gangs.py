"""The gang lifecycle in the core (gputopo.gang.tracker): quorum, plans within the offer, permit, TTL."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gputopo.gang import tracker as gangs
from gputopo.gang.asks import GangAsk, GangMember, Planned, Refused, Wait
from gputopo.gang.tracker import GangTracker
from gputopo.network.levels import HOSTNAME, LEAF, SPINE, NetworkIndex
from gputopo.network.nodeview import NodeView
from gputopo.node.allocator import AllocatorPool
from gputopo.node.topofile import load_preset

LEVELS = (HOSTNAME, LEAF, SPINE)
NAMES = [f"{leaf}{i}" for leaf in "ab" for i in range(3)]
POOL = AllocatorPool()


def views(free: dict[str, frozenset[int]] | None = None) -> dict[str, NodeView]:
    alloc = POOL.get(load_preset("dgx-a100"))
    free = free or {}
    return {
        n: NodeView(n, {HOSTNAME: n, LEAF: n[0], SPINE: "s"}, 8, free.get(n, frozenset(range(8))), alloc)
        for n in NAMES
    }


INDEX = NetworkIndex.build(((n, v.labels) for n, v in views().items()), LEVELS)


def ask(pod: int, count: int = 3, need: int | None = 3, bound: dict[int, str] | None = None) -> GangAsk:
    bound = bound or {}
    members = tuple(GangMember(f"ml/w-{i}", 8, bound.get(i, "")) for i in range(count))
    return GangAsk("ml/g", f"ml/w-{pod}", members, need)


def test_quorum_first_then_a_plan_with_reservations() -> None:
    t = GangTracker(LEVELS)
    v = views()
    got = t.filter(ask(0, count=2), NAMES, v, INDEX, 0.0)
    assert got == Wait("gang ml/g waiting for members 2/3")
    assert [e.kind for e in t.drain()] == ["quorum_wait"]
    got = t.filter(ask(2), NAMES, v, INDEX, 0.0)
    assert isinstance(got, Planned) and got.node.startswith("a")
    assert sorted(r.node for r in t.reservations) == ["a0", "a1", "a2"]
    assert [e.kind for e in t.drain()] == ["plan"]
    assert t.filter(ask(0), NAMES, v, INDEX, 1.0) == Planned(
        t.planned_node("ml/w-0", "ml/g"), "gang ml/g planned on a0"
    )


def test_a_missing_podgroup_waits() -> None:
    t = GangTracker(LEVELS)
    assert "not found" in t.filter(ask(0, need=None), NAMES, views(), INDEX, 0.0).reason  # type: ignore[union-attr]


def test_permit_refuses_binds_the_plan_does_not_allow_and_bound_completes_the_gang() -> None:
    t = GangTracker(LEVELS, ttl_s=10)
    t.filter(ask(0), NAMES, views(), INDEX, 0.0)
    node = t.planned_node("ml/w-0", "ml/g")
    with pytest.raises(Refused, match="planned ml/w-0 on"):
        t.permit("ml/w-0", "ml/g", 8, "b0")
    with pytest.raises(Refused, match="no reservation"):
        t.permit("ml/other", "ml/g", 8, "b0")
    assert t.permit("ml/solo", None, 1, "b0") is None, "a single pod needs no permit"
    for i in range(3):
        r = t.permit(f"ml/w-{i}", "ml/g", 8, t.planned_node(f"ml/w-{i}", "ml/g") or "")
        assert r is not None and (i or r.node == node)
        t.bound(f"ml/w-{i}", "ml/g", 5.0 * (i + 1))  # each bind renews the others' TTL
        assert t.expire(5.0 * (i + 1) + 9) == []
    assert "ml/g" not in t.plans and len(t.reservations) == 0
    assert t.drain()[-1].kind == "gang_bound"


def test_a_plan_that_stops_binding_expires() -> None:
    t = GangTracker(LEVELS, ttl_s=10)
    t.filter(ask(0), NAMES, views(), INDEX, 0.0)
    assert t.expire(9.9) == [] and t.expire(10.0) == ["ml/g"]
    assert not t.plans and not len(t.reservations)
    assert t.drain()[-1].cause == "expired"


def test_the_back_off_holds_only_for_the_same_question() -> None:
    t = GangTracker(LEVELS, backoff_s=(30.0, 60.0))
    full = views({n: frozenset() for n in NAMES[:5]})
    first = t.filter(ask(0), NAMES, full, INDEX, 0.0)
    assert isinstance(first, Wait) and "does not fit" in first.reason
    again = t.filter(ask(0), NAMES, full, INDEX, 1.0)
    assert isinstance(again, Wait) and "retry in 29s" in again.reason
    other_offer = t.filter(ask(0), NAMES[1:], full, INDEX, 1.0)
    assert isinstance(other_offer, Wait) and "retry in" not in other_offer.reason
    freed = views({n: frozenset() for n in NAMES[3:5]})  # a cluster event freed leaf a
    assert isinstance(t.filter(ask(0), NAMES, freed, INDEX, 2.0), Planned)


def test_reserved_gpus_found_in_use_break_the_plan() -> None:
    t = GangTracker(LEVELS)
    t.filter(ask(0), NAMES, views(), INDEX, 0.0)
    node = t.planned_node("ml/w-1", "ml/g")
    broken = t.sweep(
        alive=lambda p: True, has_node=lambda n: True, in_use=lambda n: {3} if n == node else set()
    )
    assert broken == ["ml/g"] and not t.plans and not len(t.reservations)
    assert t.drain()[-1].cause == "gpus_taken"
    assert t.sweep(alive=lambda p: True, has_node=lambda n: True, in_use=lambda n: set()) == []


def test_a_replan_after_a_failed_bind_stays_next_to_the_bound_member_and_in_the_offer() -> None:
    t = GangTracker(LEVELS)
    offer = [n for n in NAMES if n != "a2"]
    t.filter(ask(0), offer, views(), INDEX, 0.0)
    assert {r.node for r in t.reservations} <= set(offer)
    w0 = t.planned_node("ml/w-0", "ml/g") or ""
    t.permit("ml/w-0", "ml/g", 8, w0)
    w1 = t.planned_node("ml/w-1", "ml/g") or ""
    t.permit("ml/w-1", "ml/g", 8, w1)
    assert t.bind_failed("ml/w-1", "ml/g", w1, "injected"), "the plan it was permitted under is dropped"
    assert not t.plans and not len(t.reservations)
    v = views({w0: frozenset()})
    plan = t.replan(ask(1, bound={0: w0}), v, INDEX, 1.0, "bind_failed")
    assert not isinstance(plan, Wait)
    assert {p.pod for p in plan.placements} == {"ml/w-1", "ml/w-2"}
    assert all(p.node in offer for p in plan.placements), "never a node kube-scheduler did not offer"


def test_a_failed_bind_older_than_the_plan_keeps_the_plan_that_already_places_the_pod() -> None:
    """w-0's bind to a0 is in flight when a0 goes away: the next plan places w-0 again (the
    sidecar counts a bind to a deleted node as unplaced), whole in leaf b. When that old bind
    then fails, the plan made since stands: dropping it would re-plan around members already
    binding in leaf b, or split the gang."""
    t = GangTracker(LEVELS)
    t.filter(ask(0), NAMES, views(), INDEX, 0.0)
    assert t.planned_node("ml/w-0", "ml/g") == "a0"
    t.permit("ml/w-0", "ml/g", 8, "a0")
    gone = {n: v for n, v in views().items() if n != "a0"}
    got = t.filter(ask(1), [n for n in NAMES if n not in ("a0", "a1")], gone, INDEX, 1.0)
    assert isinstance(got, Planned) and got.node.startswith("b")
    plan = t.plans["ml/g"]
    assert {p.pod for p in plan.placements} == {"ml/w-0", "ml/w-1", "ml/w-2"}
    assert {p.node[0] for p in plan.placements} == {"b"}, "whole in one leaf"
    t.drain()
    assert not t.bind_failed("ml/w-0", "ml/g", "a0", "404 Not Found")
    assert t.plans["ml/g"] is plan and len(t.reservations) == 3
    (kept,) = t.drain()
    assert kept.kind == "plan_kept" and "a0" in kept.reason
    mine = t.planned_node("ml/w-0", "ml/g")
    assert mine is not None and t.filter(ask(0), NAMES, gone, INDEX, 2.0) == Planned(
        mine, f"gang ml/g planned on {mine}"
    )
    assert t.bind_failed("ml/w-0", "ml/g", mine, "409"), "a bind the plan made fails: dropped"


@settings(max_examples=60, deadline=None)
@given(
    offer=st.sets(st.sampled_from(NAMES), min_size=1),
    later=st.sets(st.sampled_from(NAMES), min_size=1),
    who=st.integers(0, 2),
)
def test_plans_never_use_a_node_outside_the_offer_they_were_made_in(offer, later, who) -> None:
    """Oracle: a 3 x 8 gang fits an offer iff it has 3 nodes; every planned node is offered; a
    member whose later offer lacks its node gets a plan inside that later offer, or waits."""
    t = GangTracker(LEVELS)
    got = t.filter(ask(0), sorted(offer), views(), INDEX, 0.0)
    assert isinstance(got, Planned) == (len(offer) >= 3)
    assert {r.node for r in t.reservations} <= offer
    if not isinstance(got, Planned):
        return
    mine = t.planned_node(f"ml/w-{who}", "ml/g")
    got = t.filter(ask(who), sorted(later), views(), INDEX, 1.0)
    if isinstance(got, Planned):
        assert got.node in later
        held = {r.node for r in t.reservations}
        assert held <= (offer if mine in later else later), "a re-plan stays inside the later offer"
    else:
        assert len(later) < 3 and len(t.reservations) == 0


def test_the_wait_runs_from_the_first_filter_to_the_last_bind() -> None:
    t = GangTracker(LEVELS, ttl_s=100)
    assert t.first_seen("ml/g") is None
    t.filter(ask(0, count=2), NAMES, views(), INDEX, 10.0)  # quorum not met: first seen anyway
    t.filter(ask(1), NAMES, views(), INDEX, 25.0)
    assert t.first_seen("ml/g") == 10.0, "later filters keep the first time"
    waits = []
    for i in range(3):
        t.permit(f"ml/w-{i}", "ml/g", 8, t.planned_node(f"ml/w-{i}", "ml/g") or "")
        waits.append(t.bound(f"ml/w-{i}", "ml/g", 40.0 + i))
    assert waits == [None, None, 32.0], "only the last member's bind ends the wait"
    assert t.drain()[-1].fields["waited_s"] == 32.0
    assert t.first_seen("ml/g") is None, "forgotten once bound: a new gang of that name starts over"


def test_the_first_seen_times_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gangs deleted before they bind are never told: the oldest are forgotten, not kept for ever."""
    monkeypatch.setattr(gangs, "MAX_WAITING_GANGS", 2)
    t = GangTracker(LEVELS)
    for k, name in enumerate(["ml/a", "ml/b", "ml/c"]):
        t.filter(
            GangAsk(name, f"{name}-0", (GangMember(f"{name}-0", 8),), 2), NAMES, views(), INDEX, float(k)
        )
    assert [t.first_seen(g) for g in ("ml/a", "ml/b", "ml/c")] == [None, 1.0, 2.0]
