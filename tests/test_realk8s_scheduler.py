"""End to end through the real kube-scheduler and kube-apiserver (v1.37, with etcd; built by
realk8s/build.sh): our sidecar in live mode and kube-scheduler configured as deploy/ configures
them (tests/realk8s.py). kube-scheduler does the filtering, queueing and binding calls; the
assertions are on where pods end up in the API.

The whole module runs twice: with Kubernetes' own gang scheduling off (the default of 1.37) and
on (feature gate GenericWorkload: the Workload/PodGroup API `scheduling.k8s.io/v1beta1` served
and kube-scheduler's GangScheduling plugin in its profile). One cluster serves each round; each
test uses its own namespace and node names and deletes them after. `make test-real` runs it;
without the built binaries it skips with one line.

kube-scheduler parks a pod the extender refused in its unschedulable queue until a cluster event
(or the 5-minute flush, which no test waits for). Pod and node adds, binds and the node label
updates some tests make are such events; a test that needs one says so.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from gputopo.network.levels import LEAF
from tests import realk8s as rk

pytestmark = pytest.mark.real

_ids = itertools.count()


@pytest.fixture(scope="module", params=[False, True], ids=["gang-api-off", "gang-api-on"])
def k8s(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[rk.Cluster]:
    rk.binaries()
    with rk.cluster(Path(tmp_path_factory.mktemp("realk8s")), gang_api=request.param) as c:
        yield c


@pytest.fixture
def ns(k8s: rk.Cluster) -> Iterator[str]:
    name = k8s.namespace(f"t{next(_ids)}")
    try:
        yield name
    finally:
        if k8s.sidecar is None:  # a test that killed it and failed before restarting it
            k8s.start_sidecar()
        k8s.reset()


def names(prefix: str, n: int) -> list[str]:
    return [f"{prefix}-{i}" for i in range(n)]


def leaf_of(k8s: rk.Cluster, node: str) -> str:
    return k8s.api.get(f"/api/v1/nodes/{node}")["metadata"]["labels"][LEAF]


def test_single_gpu_pods_land_only_where_the_plugin_says_gpus_are_free(k8s: rk.Cluster, ns: str) -> None:
    """kube-scheduler alone counts 8 free GPUs on both nodes (no pod requests them); the
    annotation of s0 says all 8 are in use (by pods outside this scheduler): only s1 is used."""
    k8s.add_nodes(
        rk.node(f"{ns}-s0", "leaf-a", allocated=range(8)),
        rk.node(f"{ns}-s1", "leaf-a"),
    )
    pods = names("p", 9)
    k8s.add_pods(ns, *(rk.pod(p, 1) for p in pods))
    # eight fit on s1; the ninth fits nowhere (kube-scheduler: s1 full; the sidecar: s0 full)
    got = k8s.wait_until(ns, lambda placed: sum(1 for n in placed.values() if n) == 8)
    assert set(got.values()) - {""} == {f"{ns}-s1"}
    (left,) = [p for p, n in got.items() if not n]
    # kube-scheduler: s1 has no room left; the sidecar, asked about s0 alone: no GPU free there
    k8s.wait_refused(ns, [left], match=r"(?=.*Insufficient nvidia\.com/gpu)(?=.*needs 1 GPUs, 0 free)")
    assert k8s.api.placement(ns)[left] == ""


def only_leaf_c_holds_two(ns: str) -> list[dict]:
    """Free 8-GPU nodes: one in leaf-a (beside a half-used one), one in leaf-b, two in leaf-c."""
    return [
        rk.node(f"{ns}-a0", "leaf-a", allocated=range(4)),
        rk.node(f"{ns}-a1", "leaf-a"),
        rk.node(f"{ns}-b0", "leaf-b"),
        rk.node(f"{ns}-c0", "leaf-c"),
        rk.node(f"{ns}-c1", "leaf-c"),
    ]


def test_a_2x8_gang_lands_whole_in_the_one_leaf_that_holds_it(k8s: rk.Cluster, ns: str) -> None:
    """Free 8-GPU nodes: one in leaf-a (beside a half-used one), one in leaf-b, two in leaf-c.
    Only leaf-c holds both members; a topology-blind placement would split them."""
    k8s.add_nodes(*only_leaf_c_holds_two(ns))
    members = names("g", 2)
    k8s.add_gang(ns, "g", *(rk.pod(m, 8, gang="g") for m in members))
    placed = k8s.wait_bound(ns, members)
    assert sorted(placed.values()) == [f"{ns}-c0", f"{ns}-c1"]


def test_a_gang_that_fits_nowhere_binds_nothing(k8s: rk.Cluster, ns: str) -> None:
    """3 x 8 GPUs with two free nodes in the cluster: every member is refused, none is bound."""
    k8s.add_nodes(
        rk.node(f"{ns}-a0", "leaf-a"),
        rk.node(f"{ns}-b0", "leaf-b"),
        rk.node(f"{ns}-b1", "leaf-b", allocated=range(4)),
    )
    members = names("g", 3)
    k8s.add_gang(ns, "g", *(rk.pod(m, 8, gang="g") for m in members))
    k8s.wait_refused(ns, members, match="does not fit")
    # a cluster event (a node label update) sends every parked member through the extender again
    before = {m: len(k8s.refusals(ns, m)) for m in members}
    k8s.patch_node(f"{ns}-a0", {"metadata": {"labels": {"example.com/touched": "1"}}})
    rk.wait_for(lambda: all(len(k8s.refusals(ns, m)) > before[m] for m in members), 15, "the members retried")
    assert k8s.api.placement(ns) == dict.fromkeys(members, "")


def test_a_gang_that_did_not_fit_is_placed_whole_once_a_node_is_added(k8s: rk.Cluster, ns: str) -> None:
    """The refused members wait in kube-scheduler's unschedulable queue; the Node add is the
    cluster event that brings them back, and the gang then fits (leaf-a: 2 nodes, leaf-b: 1).
    Issue 9 (waiting under kube-scheduler's queue): today the sidecar answers that retry
    "retry in 1s" from its own back-off and kube-scheduler parks the gang again until the next
    event, so the added node is never used."""
    k8s.add_nodes(rk.node(f"{ns}-a0", "leaf-a"), rk.node(f"{ns}-b0", "leaf-b"))
    members = names("g", 3)
    k8s.add_gang(ns, "g", *(rk.pod(m, 8, gang="g") for m in members))
    k8s.wait_refused(ns, members, match="does not fit")
    k8s.add_nodes(rk.node(f"{ns}-a1", "leaf-a"))
    placed = k8s.wait_bound(ns, members, timeout=15)
    assert sorted(placed.values()) == [f"{ns}-a0", f"{ns}-a1", f"{ns}-b0"]


def test_a_sidecar_killed_mid_gang_still_places_the_gang_whole(k8s: rk.Cluster, ns: str) -> None:
    """Member g-0 is bound; g-1 and g-2 are held back by kube-scheduler itself (a nodeSelector no
    node matches yet). The sidecar is SIGKILLed; the gate opens (a node label update, the cluster
    event that sends them to the extender) while it is down: nothing binds without it
    (ignorable: false). Restarted, it rebuilds its view from the API and places the rest in
    g-0's leaf."""
    gate = {"example.com/gate": "open"}
    nodes = [rk.node(f"{ns}-{leaf[-1]}{i}", leaf) for leaf in ("leaf-a", "leaf-b") for i in range(3)]
    k8s.add_nodes(*nodes)
    k8s.add_gang(
        ns,
        "g",
        rk.pod("g-0", 8, gang="g"),
        rk.pod("g-1", 8, gang="g", node_selector=gate),
        rk.pod("g-2", 8, gang="g", node_selector=gate),
    )
    placed = k8s.wait_until(ns, lambda p: p["g-0"] or k8s.refusals(ns, "g-0"), what="g-0 bound or refused")
    if not placed["g-0"]:
        # The sidecar's watch lagged behind ("waiting for members"): the held
        # members never reach the extender, so no bind follows that would bring g-0 back; a
        # node label update is the cluster event that does.
        k8s.patch_node(nodes[0]["metadata"]["name"], {"metadata": {"labels": {"example.com/touched": "1"}}})
    first = k8s.wait_bound(ns, ["g-0"])["g-0"]
    k8s.kill_sidecar()
    for n in nodes:
        k8s.patch_node(n["metadata"]["name"], {"metadata": {"labels": gate}})
    k8s.wait_refused(ns, ["g-1", "g-2"], match="connection refused")
    assert k8s.api.placement(ns) == {"g-0": first, "g-1": "", "g-2": ""}
    k8s.start_sidecar()
    # A member retried before the restarted sidecar has rebuilt the gang is refused and parked in
    # the unschedulable queue (seen once in three runs on 1.36); a node label update is the
    # cluster event that brings it back, as for g-0 above.
    k8s.patch_node(nodes[0]["metadata"]["name"], {"metadata": {"labels": {"example.com/touched": "2"}}})
    placed = k8s.wait_bound(ns, ["g-0", "g-1", "g-2"], timeout=60)
    assert len(set(placed.values())) == 3
    assert {leaf_of(k8s, n) for n in placed.values()} == {leaf_of(k8s, first)}


@pytest.mark.parametrize(
    "blocked",
    [
        pytest.param({"unschedulable": True}, id="cordoned"),
        pytest.param({"taints": [{"key": "example.com/maintenance", "effect": "NoSchedule"}]}, id="tainted"),
        pytest.param({"cpu": "500m"}, id="short-of-cpu"),
    ],
)
def test_issue9_item7_a_gang_avoids_the_leaf_with_a_node_kube_scheduler_will_not_use(
    k8s: rk.Cluster, ns: str, blocked: dict
) -> None:
    """3 x 8 GPUs; leaf-a's third node is cordoned (or tainted, or has less CPU than a member
    requests), leaf-b is free. GPU-wise both
    leaves fit (leaf-a wins the name tie-break), but kube-scheduler never offers a2: the gang must
    go whole to leaf-b, and no member may ever be bound in leaf-a."""
    a = [f"{ns}-a{i}" for i in range(3)]
    b = [f"{ns}-b{i}" for i in range(3)]
    k8s.add_nodes(
        rk.node(a[0], "leaf-a"),
        rk.node(a[1], "leaf-a"),
        rk.node(a[2], "leaf-a", **blocked),
        *(rk.node(n, "leaf-b") for n in b),
    )
    members = names("g", 3)
    k8s.add_gang(ns, "g", *(rk.pod(m, 8, gang="g") for m in members))
    placed = k8s.wait_bound(ns, members, forbidden=set(a))
    assert sorted(placed.values()) == b


def test_issue9_item8_a_gang_selecting_a_leaf_is_placed_there(k8s: rk.Cluster, ns: str) -> None:
    """Both leaves empty; the members' nodeSelector names leaf-b, so kube-scheduler offers only
    leaf-b's nodes: the plan must be made there."""
    a = [f"{ns}-a{i}" for i in range(2)]
    b = [f"{ns}-b{i}" for i in range(2)]
    k8s.add_nodes(*(rk.node(n, "leaf-a") for n in a), *(rk.node(n, "leaf-b") for n in b))
    members = names("g", 2)
    k8s.add_gang(ns, "g", *(rk.pod(m, 8, gang="g", node_selector={LEAF: "leaf-b"}) for m in members))
    placed = k8s.wait_bound(ns, members, forbidden=set(a), timeout=10)
    assert sorted(placed.values()) == b


def k8s_podgroup(name: str, min_count: int, topology_key: str | None = None) -> dict:
    """A standalone Kubernetes PodGroup (`scheduling.k8s.io/v1beta1` in 1.37, `v1alpha2` in 1.36:
    staging/src/k8s.io/api/scheduling/v1beta1/types.go, the same fields in both:
    spec.schedulingPolicy.gang.minCount, spec.schedulingConstraints.topology[].key)."""
    spec: dict = {"schedulingPolicy": {"gang": {"minCount": min_count}}}
    if topology_key:
        spec["schedulingConstraints"] = {"topology": [{"key": topology_key}]}
    return {
        "apiVersion": rk.GANG_API,
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": spec,
    }


def add_podgroup_gang(k8s: rk.Cluster, ns: str, n: int) -> list[str]:
    """A PodGroup `pg` of minCount n and its n pods of 8 GPUs, which name it in
    spec.schedulingGroup.podGroupName; the pods' names."""
    k8s.api.create(f"/apis/{rk.GANG_API}/namespaces/{ns}/podgroups", k8s_podgroup("pg", n))
    members = names("w", n)
    pods = [rk.pod(m, 8) for m in members]
    for p in pods:
        p["spec"]["schedulingGroup"] = {"podGroupName": "pg"}
    k8s.add_pods(ns, *pods)
    return members


def test_a_kubernetes_podgroup_gang_lands_whole_in_one_leaf(k8s: rk.Cluster, ns: str) -> None:
    """Kubernetes' own gang API (1.37: v1beta1; 1.36: v1alpha2): the pods name a PodGroup in
    spec.schedulingGroup.podGroupName. kube-scheduler's GangScheduling plugin holds each member
    at Permit until minCount are assumed; the sidecar reads the same PodGroup and plans the gang
    into the one leaf that holds it (leaf-c), so what the two schedulers agree on binds whole."""
    if not k8s.gang_api:
        pytest.skip("Kubernetes' Workload API is off in this round (feature gate GenericWorkload)")
    k8s.add_nodes(*only_leaf_c_holds_two(ns))
    members = add_podgroup_gang(k8s, ns, 2)
    got = k8s.api.get(f"/api/v1/namespaces/{ns}/pods/{members[0]}")
    assert got["spec"].get("schedulingGroup") == {"podGroupName": "pg"}, "the API server dropped the field"
    placed = k8s.wait_bound(ns, members, timeout=30)
    assert sorted(placed.values()) == [f"{ns}-c0", f"{ns}-c1"]


def test_a_kubernetes_podgroup_that_fits_nowhere_binds_nothing(k8s: rk.Cluster, ns: str) -> None:
    """3 x 8 GPUs under a Kubernetes PodGroup with two free nodes: no member is ever bound."""
    if not k8s.gang_api:
        pytest.skip("Kubernetes' Workload API is off in this round (feature gate GenericWorkload)")
    k8s.add_nodes(rk.node(f"{ns}-a0", "leaf-a"), rk.node(f"{ns}-b0", "leaf-b"))
    members = add_podgroup_gang(k8s, ns, 3)
    # every member goes through a scheduling cycle and none binds
    k8s.wait_refused(ns, members[:1], match=".", timeout=30)
    rk.time.sleep(3)
    assert k8s.api.placement(ns) == dict.fromkeys(members, "")


CLIQUE = "nvidia.com/gpu.clique"


def test_a_jobset_shaped_composite_binds_whole_each_podgroup_inside_one_clique(
    k8s: rk.Cluster, ns: str
) -> None:
    """Kubernetes 1.37's CompositePodGroup (gate CompositePodGroup, `scheduling.k8s.io/v1alpha3`,
    staging/src/k8s.io/api/scheduling/v1alpha3/types.go): a root composite `job` (gang of both
    children) over two PodGroups `rank-0` and `rank-1` (v1beta1, `parentCompositePodGroupName:
    job`, each required in one NVLink clique), 2 pods of 8 GPUs each, as JobSet creates them.
    Two cliques of three nodes, one node of the first full. kube-scheduler runs its own gang
    scheduling (GenericWorkload) with the sidecar as its extender: the tree binds whole, each
    PodGroup inside one clique, and neither scheduler leaves it part-bound."""
    if not k8s.gang_api or rk.COMPOSITE_API is None:
        pytest.skip("CompositePodGroup is served from Kubernetes 1.37 with the Workload API on")
    nodes = [f"{ns}-q{i}" for i in range(6)]
    k8s.add_nodes(
        *(
            rk.node(n, "leaf-a", labels={CLIQUE: f"cl.{i // 3}"}, allocated=range(8) if i == 0 else ())
            for i, n in enumerate(nodes)
        )
    )
    ref = {"workloadName": "job", "templateName": "job"}
    k8s.api.create(
        f"/apis/{rk.COMPOSITE_API}/namespaces/{ns}/compositepodgroups",
        {
            "apiVersion": rk.COMPOSITE_API,
            "kind": "CompositePodGroup",
            "metadata": {"name": "job"},
            "spec": {"workloadRef": ref, "schedulingPolicy": {"gang": {"minGroupCount": 2}}},
        },
    )
    members: list[str] = []
    for r in range(2):
        pg = k8s_podgroup(f"rank-{r}", 2, CLIQUE)
        pg["spec"]["parentCompositePodGroupName"] = "job"
        pg["spec"]["workloadRef"] = {"workloadName": "job", "templateName": f"rank-{r}"}
        k8s.api.create(f"/apis/{rk.GANG_API}/namespaces/{ns}/podgroups", pg)
        for i in range(2):
            p = rk.pod(f"r{r}-{i}", 8)
            p["spec"]["schedulingGroup"] = {"podGroupName": f"rank-{r}"}
            k8s.add_pods(ns, p)
            members.append(f"r{r}-{i}")
    placed = k8s.wait_bound(ns, members, forbidden={nodes[0]}, timeout=60)
    for r in range(2):
        cliques = {int(placed[f"r{r}-{i}"].rsplit("q", 1)[1]) // 3 for i in range(2)}
        assert len(cliques) == 1, placed
    assert len(set(placed.values())) == 4
