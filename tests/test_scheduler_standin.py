"""Whole-cluster behaviour through a kube-scheduler stand-in on generated leaf/spine clusters."""

from __future__ import annotations

import random

import pytest

from gputopo.network.cluster import generate_cluster, parse_cluster
from gputopo.network.levels import CLUSTER, HOSTNAME, LEAF, SPINE
from scheduler.model import PodInfo
from scheduler.picture.feed import BindError, FileState, from_cluster
from tests import fake_apiserver as fk

LEVELS = (HOSTNAME, LEAF, SPINE)
GROUP = "scheduling.x-k8s.io/pod-group"


def level_of(nodes: set[str], labels: dict[str, dict[str, str]]) -> str:
    """The smallest level whose one domain holds all these nodes."""
    for level in LEVELS:
        if len({labels[n].get(level, n) for n in nodes}) == 1:
            return level
    return CLUSTER


def smallest_feasible(
    free: dict[str, int], labels: dict[str, dict[str, str]], size: int, count: int
) -> str | None:
    """Oracle for equal-size gangs: a domain holds the gang iff its nodes have room for `count`
    sets of `size` GPUs in total (each node holds floor(free / size) of them)."""
    for level in (*LEVELS, CLUSTER):
        slots: dict[str, int] = {}
        for n, f in free.items():
            dom = "*" if level == CLUSTER else labels[n].get(level, n)
            slots[dom] = slots.get(dom, 0) + f // size
        if any(s >= count for s in slots.values()):
            return level
    return None


def workload(seed: int) -> tuple[list[dict], dict[str, tuple[int, int]]]:
    """Gangs (equal-size members) interleaved with single pods, in a seeded random order."""
    rng = random.Random(seed)
    gangs = {
        "ml/g-a": (2, 8),
        "ml/g-b": (4, 4),
        "ml/g-c": (3, 8),
        "ml/g-d": (6, 8),
        "ml/g-e": (2, 2),
        "ml/g-f": (12, 8),
    }
    pods = []
    for key, (count, size) in gangs.items():
        name = key.split("/")[1]
        pods += [fk.pod("ml", f"{name}-{i}", size, labels={GROUP: name}) for i in range(count)]
    pods += [fk.pod("web", f"s-{i}", rng.choice([1, 1, 2, 4])) for i in range(25)]
    rng.shuffle(pods)
    return pods, gangs


@pytest.mark.parametrize(
    ("seed", "cache_mode"), [(1, True), (2, True), (3, True), (4, False), (5, True), (6, False)]
)
def test_gangs_all_or_nothing_smallest_level_no_double_booking(running, seed: int, cache_mode: bool) -> None:
    snap = generate_cluster(
        2, 2, 4, ["dgx-a100", "hgx-h100", "dgx1-v100"], seed, busy_fraction=0.5, levels=LEVELS
    )
    pods, gangs = workload(seed)
    groups = [{"namespace": "ml", "name": k.split("/")[1], "minMember": c} for k, (c, _) in gangs.items()]
    snap = parse_cluster({**snap.to_dict(), "podgroups": groups})
    state = from_cluster(snap)
    labels = {n.name: dict(n.labels) for n in snap.nodes}
    initially = {n.name: set(n.allocated) for n in snap.nodes}
    clock = [1000.0]
    ext, standin = running(state, clock)
    oracle: dict[str, str | None] = {}
    whys: dict[str, str] = {}
    at_plan: dict[str, str | None] = {}

    def before(pod: dict) -> None:
        gang = f"ml/{pod['metadata']['labels'].get(GROUP, '')}"
        if gang in gangs and gang not in ext.plans:
            s = state.snapshot()
            free = {n: len(i.topology.free) if i.topology else i.gpu_capacity for n, i in s.nodes.items()}
            for r in ext.reservations:
                free[r.node] -= r.count
            oracle[gang] = smallest_feasible(free, labels, gangs[gang][1], gangs[gang][0])

    def after(pod: dict, res: dict) -> None:
        gang = f"ml/{pod['metadata']['labels'].get(GROUP, '')}"
        if gang in ext.plans and gang not in at_plan:
            at_plan[gang] = oracle[gang]
            whys[gang] = ext.plans[gang].why

    standin.before_filter, standin.after_filter = before, after
    standin.cache_mode = cache_mode
    out = standin.run(pods, clock=clock)

    # all or nothing, and every gang that could be placed when it was planned was placed whole
    for gang, (count, _) in gangs.items():
        members = [k for k in out.bound if k.startswith(gang + "-")]
        assert len(members) in (0, count), f"{gang}: {len(members)}/{count} bound"
        if gang in at_plan:
            assert len(members) == count
            # the smallest level that could hold the gang when it was planned was used, or a
            # larger one whose plan the job-time model predicted faster (gang.predict), and
            # then the plan says so
            used = level_of({out.bound[m] for m in members}, labels)
            order = [*LEVELS, CLUSTER]
            assert order.index(used) >= order.index(at_plan[gang]), gang
            if used != at_plan[gang]:
                assert "predicted efficiency" in whys[gang], (gang, whys[gang])
        else:
            assert not members
    assert any(gang in at_plan for gang in gangs)
    assert "ml/g-f" not in at_plan, "12 x 8 GPUs never fits 16 half-busy nodes"
    assert any("does not fit" in r for k, r in out.pending.items() if k.startswith("ml/g-f"))
    # no GPU promised twice, none that was busy before
    seen: set[tuple[str, int]] = set()
    for node, gpus in state.held().values():
        for g in gpus:
            assert (node, g) not in seen and g not in initially[node]
            seen.add((node, g))
    assert len(ext.reservations) == 0 or all(r.gang == "ml/g-f" for r in ext.reservations)
    assert not out.bind_errors


class FlakyState(FileState):
    """A FileState whose n-th bind of a gang member fails — optionally taking its node away."""

    def __init__(self, inner: FileState, fail_at: int, remove_node: bool) -> None:
        snap = inner.snapshot()
        super().__init__(snap.nodes.values(), snap.pods.values(), snap.min_members, inner.levels)
        self.fail_at = fail_at
        self.remove = remove_node
        self.attempts = 0
        self.failed_on: str | None = None

    def bind(self, pod: PodInfo, node: str, gpus: tuple[int, ...]) -> None:
        if pod.gang is not None:
            self.attempts += 1
            if self.attempts == self.fail_at:
                self.failed_on = node
                if self.remove:
                    self.remove_node(node)
                raise BindError(f"injected: node {node} went away")
        super().bind(pod, node, gpus)


def two_leaves() -> FileState:
    nodes = [
        {
            "name": f"{leaf}-n{i}",
            "labels": {HOSTNAME: f"{leaf}-n{i}", LEAF: leaf, SPINE: "s"},
            "gpus": "dgx-a100",
        }
        for leaf in ("leaf-a", "leaf-b")
        for i in range(2)
    ]
    return from_cluster(
        parse_cluster(
            {
                "levels": list(LEVELS),
                "nodes": nodes,
                "podgroups": [{"namespace": "ml", "name": "g", "minMember": 2}],
            }
        )
    )


@pytest.mark.parametrize("remove_node", [True, False])
def test_replan_after_a_bind_failure(running, remove_node: bool) -> None:
    state = FlakyState(two_leaves(), 1, remove_node)
    clock = [1000.0]
    ext, standin = running(state, clock)
    pods = [fk.pod("ml", f"g-{i}", 8, labels={GROUP: "g"}) for i in range(2)]
    out = standin.run(pods, clock=clock)
    assert state.failed_on is not None, "the failure was injected"
    assert out.bind_errors and "injected" in out.bind_errors[0]
    members = {out.bound[f"ml/g-{i}"] for i in range(2)}
    assert len(members) == 2, "both members bound after the re-plan"
    leaves = {n.split("-n")[0] for n in members}
    assert len(leaves) == 1, "still one leaf"
    if remove_node:
        # the failed node's leaf has one node left: the whole gang moved to the other leaf
        assert leaves != {state.failed_on.split("-n")[0]}
    assert ext.metrics.plans.labels(result="dropped")._value.get() >= 1
    assert len(ext.reservations) == 0


def test_member_failing_after_others_bound_is_replanned_next_to_them(running) -> None:
    """Bound members cannot be moved: the rest is re-planned in the smallest domain around them."""
    nodes = [
        {"name": n, "labels": {HOSTNAME: n, LEAF: leaf, SPINE: "s"}, "gpus": "dgx-a100"}
        for n, leaf in (
            ("a-n0", "leaf-a"),
            ("a-n1", "leaf-a"),
            ("a-n2", "leaf-a"),
            ("b-n0", "leaf-b"),
            ("b-n1", "leaf-b"),
            ("b-n2", "leaf-b"),
        )
    ]
    inner = from_cluster(
        parse_cluster(
            {
                "levels": list(LEVELS),
                "nodes": nodes,
                "podgroups": [{"namespace": "ml", "name": "g", "minMember": 2}],
            }
        )
    )
    state = FlakyState(inner, 2, True)
    clock = [1000.0]
    _ext, standin = running(state, clock)
    out = standin.run([fk.pod("ml", f"g-{i}", 8, labels={GROUP: "g"}) for i in range(2)], clock=clock)
    assert state.failed_on is not None and len(out.bound) == 2
    first_leaf = {n[0] for n in out.bound.values()}
    assert len(first_leaf) == 1, "the re-plan stayed in the leaf of the member already bound"
    assert state.failed_on not in out.bound.values()


def test_gang_reservation_expires_and_capacity_returns(running) -> None:
    state = two_leaves()
    clock = [1000.0]
    ext, standin = running(state, clock, ttl_s=30)
    g0 = fk.pod("ml", "g-0", 8, labels={GROUP: "g"})
    g1 = fk.pod("ml", "g-1", 8, labels={GROUP: "g"})
    standin.schedule_one(g0, out := standin.run([], clock=clock))
    standin.schedule_one(g1, out)  # plans both; g-1 binds at once
    assert len(ext.reservations) == 1, "g-0 still holds its planned node"
    clock[0] += 31
    # g-0 never came back: its reservation lapsed; the next filter of a member re-plans
    standin.schedule_one(g0, out)
    assert out.bound.keys() == {"ml/g-0", "ml/g-1"}
    assert len({n.split("-n")[0] for n in out.bound.values()}) == 1


def test_binding_progress_renews_the_gang_reservations(running) -> None:
    nodes = [
        {"name": f"n{i}", "labels": {HOSTNAME: f"n{i}", LEAF: "leaf-a", SPINE: "s"}, "gpus": "dgx-a100"}
        for i in range(3)
    ]
    state = from_cluster(
        parse_cluster(
            {
                "levels": list(LEVELS),
                "nodes": nodes,
                "podgroups": [{"namespace": "ml", "name": "g", "minMember": 3}],
            }
        )
    )
    clock = [1000.0]
    ext, standin = running(state, clock, ttl_s=30)
    pods = [fk.pod("ml", f"g-{i}", 8, labels={GROUP: "g"}) for i in range(3)]
    out = standin.run([], clock=clock)
    for p in pods[:2]:
        standin.schedule_one(p, out)
    standin.schedule_one(pods[2], out)  # plans all three, binds g-2
    plan = ext.plans["ml/g"]
    for p in pods[:2]:
        clock[0] += 20  # each step inside the TTL, the sum beyond it
        standin.schedule_one(p, out)
        assert ext.plans.get("ml/g", plan) is plan, "the same plan, renewed by each bind"
    assert len(out.bound) == 3 and "ml/g" not in ext.plans
    assert ext.metrics.plans.labels(result="dropped")._value.get() == 0
