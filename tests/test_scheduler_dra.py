"""The sidecar on a DRA cluster, end to end over HTTP: fake API server serving ResourceSlices and
ResourceClaims (`resource.k8s.io/v1`) <- official client <- KubeState <- Extender <- HTTP.

Nodes here have no `gputopo.io/topology` annotation and no `nvidia.com/gpu` allocatable: all the
sidecar knows of their GPUs comes from the slices their driver published and the claims
kube-scheduler allocated. Without that reading every such node would be "unknown topology"
with 0 GPUs, and every GPU pod would fail the filter."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest

from gputopo.network.annotation import encode, make
from gputopo.network.draview import DraViewError, read_pool
from gputopo.node.allocator import Allocator
from gputopo.node.draslices import build_slices
from gputopo.node.topofile import load_preset
from scheduler.live.kube import KubeState
from tests import fake_apiserver as fk
from tests.test_scheduler_http import Client
from tests.test_scheduler_live import KEY, LEAF, NOW, args, bind_body, live_sidecar, wait_until

DGX1 = load_preset("dgx1-v100")
A100 = load_preset("dgx-a100")
DRA = ("resourceslices", "resourceclaims")


@pytest.fixture
def live():
    with live_sidecar(fk.FakeAPI(serve=DRA)) as (api, state, ext, start, _clock):
        yield api, state, ext, start


def publish(api: fk.FakeAPI, node: str, topo=DGX1, free: tuple[int, ...] | None = None) -> list[dict]:
    """gputopo's slices of `node` (gputopo/node/draslices.py), as its DRA daemon publishes them."""
    n = topo.n
    slices = build_slices(
        topo, Allocator(topo), node, healthy=range(n), free=range(n) if free is None else free
    )
    for s in slices:
        api.put("resourceslices", s)
    return slices


def nvidia_slice(node: str, n: int = 8) -> dict[str, Any]:
    """NVIDIA's DRA driver's slice: one device per GPU, PCIe roots in pairs, nothing on NVLink."""
    devices = [
        {
            "name": f"gpu-{i}",
            "attributes": {
                "type": {"string": "gpu"},
                "index": {"int": i},
                "uuid": {"string": f"GPU-{node}-{i}"},
                "productName": {"string": "Tesla V100-SXM2-16GB"},
                "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{i // 2:02x}"},
            },
        }
        for i in range(n)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu.nvidia.com"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def claim(
    name: str,
    cls: str,
    count: int = 1,
    *,
    node: str = "",
    devices: tuple[str, ...] = (),
    driver: str = "gputopo.io",
) -> dict[str, Any]:
    """A ResourceClaim in namespace ml asking `count` devices of `cls`; allocated on `node`
    (results naming `devices`) when devices are given."""
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": "ml", "name": name},
        "spec": {
            "devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": cls, "count": count}}]}
        },
    }
    if devices:
        results = [{"request": "gpus", "driver": driver, "pool": node, "device": d} for d in devices]
        obj["status"] = {"allocation": {"devices": {"results": results}}}
    return obj


def dra_pod(name: str, claim_name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod with no GPU resource of its own, using a ResourceClaim (made from a template: the
    claim's name is in status.resourceClaimStatuses, as the resourceclaim controller writes it)."""
    pod = fk.pod("ml", name, 0, labels=labels)
    pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "eight"}]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpus"}]
    for part in ("limits", "requests"):
        del pod["spec"]["containers"][0]["resources"][part]["nvidia.com/gpu"]
    pod["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": claim_name}]
    return pod


def scores_of(client: Client, pod: dict, names: list[str]) -> dict[str, int]:
    _, out = client.post("/prioritize", args(pod, names))
    return {h["Host"]: h["Score"] for h in out}


def test_a_dra_node_is_filtered_and_scored_like_the_annotated_node_it_equals(live) -> None:
    """Pairs of DGX-1s, one annotated and one DRA-only, in the same states of use: the same
    filter answer and the same score for each; in-use GPUs come from allocated claims (a set
    device counts as all its GPUs)."""
    api, state, _ext, start = live
    for name, used in (("a-free", ()), ("a-used", (0, 1, 2, 3, 5))):
        ann = encode(make(name, DGX1, generated_at=NOW, plugin_version="0.1.0", allocated=used))
        api.put("nodes", fk.node(name, {LEAF: "l1"}, annotations={KEY: ann}))
    for name in ("d-free", "d-used"):
        api.put("nodes", fk.node(name, {LEAF: "l1"}, gpus=0))
        publish(api, name)
    api.put("resourceclaims", claim("c1", "nvlink-4.gputopo.io", node="d-used", devices=("set-0-1-2-3",)))
    api.put("resourceclaims", claim("c2", "gpu.gputopo.io", node="d-used", devices=("gpu-5",)))
    api.put("resourceclaims", claim("pending", "nvlink-2.gputopo.io"))  # not allocated: holds nothing
    client = start()
    snap = state.snapshot()
    assert snap.nodes["d-used"].topology is not None
    assert snap.nodes["d-used"].topology.allocated == {0, 1, 2, 3, 5}
    assert snap.nodes["d-used"].topology.topology.bandwidth_mbps.tolist() == DGX1.bandwidth_mbps.tolist()
    names = ["a-free", "a-used", "d-free", "d-used"]
    for size in (1, 2, 3, 4):
        pod = fk.pod("ml", f"p{size}", size)
        _, out = client.post("/filter", args(pod, names))
        _, out_d = client.post("/filter", args(pod, names))
        assert out == out_d
        fits = set(out["NodeNames"])
        assert ("a-used" in fits) == ("d-used" in fits) and ("a-free" in fits) == ("d-free" in fits)
        s = scores_of(client, pod, names)
        assert s["a-free"] == s["d-free"] and s["a-used"] == s["d-used"], (size, s)
    _, out = client.post("/filter", args(fk.pod("ml", "big", 4), ["d-used"]))
    assert out["FailedNodes"] == {"d-used": "needs 4 GPUs, 3 free"}


def test_a_pod_sized_by_its_claim_or_by_an_extended_resource(live) -> None:
    """`gputopo.io/nvlink-4: 1` (a DeviceClass's extendedResourceName) is 4 GPUs; a pod whose
    claim asks for one nvlink-8 device is 8."""
    api, state, _ext, start = live
    api.put("nodes", fk.node("d1", gpus=0))
    publish(api, "d1", free=tuple(range(2, 8)))
    api.put("resourceclaims", claim("held", "nvlink-2.gputopo.io", node="d1", devices=("set-0-3",)))
    api.put("resourceclaims", claim("big", "nvlink-8.gputopo.io"))
    api.put("pods", dra_pod("wants-8", "big"))
    client = start()
    wait_until(lambda: "ml/wants-8" in state.snapshot().pods)
    assert state.snapshot().pods["ml/wants-8"].gpus == 8
    _, out = client.post("/filter", args(dra_pod("wants-8", "big"), ["d1"]))
    assert out["FailedNodes"] == {"d1": "needs 8 GPUs, 6 free"}
    ext4 = fk.pod("ml", "ext4", 0)
    ext4["spec"]["containers"][0]["resources"]["limits"]["gputopo.io/nvlink-4"] = "1"
    _, out = client.post("/filter", args(ext4, ["d1"]))
    assert out["NodeNames"] == ["d1"]
    ext4["spec"]["containers"][0]["resources"]["limits"]["gputopo.io/nvlink-4"] = "2"
    _, out = client.post("/filter", args(ext4, ["d1"]))
    assert out["FailedNodes"] == {"d1": "needs 8 GPUs, 6 free"}


def test_a_2x8_gang_of_dra_pods_lands_in_one_leaf(live) -> None:
    """Leaf l1: n0 free, n1 with half its GPUs held by a claim; leaf l2: n2, n3 free. The gang
    (two pods, each claiming one 8-GPU set) can only be whole in l2, and lands there."""
    api, _state, _ext, start = live
    for i, leaf in enumerate(["l1", "l1", "l2", "l2"]):
        api.put("nodes", fk.node(f"n{i}", {LEAF: leaf}, gpus=0))
        publish(api, f"n{i}", A100)
    api.put("resourceclaims", claim("half", "nvlink-4.gputopo.io", node="n1", devices=("set-0-1-2-3",)))
    api.put("podgroups", fk.podgroup("ml", "g", 2))
    label = {"scheduling.x-k8s.io/pod-group": "g"}
    pods = []
    for k in range(2):
        api.put("resourceclaims", claim(f"g-{k}-gpus", "nvlink-8.gputopo.io"))
        pods.append(dra_pod(f"g-{k}", f"g-{k}-gpus", labels=label))
        api.put("pods", pods[-1])
    client = start()
    names = [f"n{i}" for i in range(4)]
    placed = {}
    for p in pods:
        _, out = client.post("/filter", args(p, names))
        (node,) = out["NodeNames"]
        name = p["metadata"]["name"]
        assert client.post("/bind", bind_body(name, node))[1] == {"Error": ""}
        placed[name] = node
    assert sorted(placed.values()) == ["n2", "n3"]


def test_nvidia_slices_give_a_conservative_view_and_claims_their_use(live) -> None:
    """NVIDIA's driver names no NVLink: the node is read with PCIe links only (PHB within a PCIe
    root, SYS across), never better than it is; its claims' GPUs are in use."""
    api, state, _ext, start = live
    api.put("nodes", fk.node("nv", gpus=0))
    api.put("resourceslices", nvidia_slice("nv"))
    api.put(
        "resourceclaims",
        claim("x", "gpu.nvidia.com", 2, node="nv", devices=("gpu-0", "gpu-3"), driver="gpu.nvidia.com"),
    )
    client = start()
    topo = state.snapshot().nodes["nv"].topology
    assert topo is not None and topo.allocated == {0, 3}
    assert topo.topology.code(0, 1) == "PHB" and topo.topology.code(1, 2) == "SYS"
    assert max(topo.topology.bandwidth_mbps.flatten()) <= 16_000
    _, out = client.post("/filter", args(fk.pod("ml", "p", 7), ["nv"]))
    assert out["FailedNodes"] == {"nv": "needs 7 GPUs, 6 free"}


def test_a_bad_slice_or_claim_costs_its_node_only(live, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="gputopo.scheduler")
    api, state, _ext, start = live
    for name in ("good", "bad-slice", "bad-claim", "partial"):
        api.put("nodes", fk.node(name, gpus=0))
    publish(api, "good")
    broken = publish(api, "bad-slice")
    gpus = copy.deepcopy(broken[1])
    gpus["spec"]["devices"][2]["attributes"]["link5"] = {"int": 7}  # a link code must be a string
    api.put("resourceslices", gpus)
    publish(api, "bad-claim")
    api.put("resourceclaims", claim("ghost", "gpu.gputopo.io", node="bad-claim", devices=("gpu-99",)))
    api.put("resourceclaims", {"metadata": {"namespace": "ml", "name": "junk"}, "status": {"allocation": 5}})
    for s in build_slices(DGX1, Allocator(DGX1), "partial", healthy=range(8), free=range(8))[:2]:
        api.put("resourceslices", s)  # the publisher has written 2 of its slices so far
    client = start()
    snap = state.snapshot()
    assert snap.nodes["good"].topology is not None
    assert snap.nodes["bad-slice"].topology is None and "link5" in snap.nodes["bad-slice"].topology_problem
    assert snap.nodes["bad-claim"].topology is None and "gpu-99" in snap.nodes["bad-claim"].topology_problem
    assert (
        snap.nodes["partial"].topology is None
        and "still being published" in snap.nodes["partial"].topology_problem
    )
    _, out = client.post("/filter", args(fk.pod("ml", "p", 2), ["good", "bad-slice", "bad-claim", "partial"]))
    assert out["NodeNames"] == ["good"]
    # the publisher finishes: the node is read from then on
    for s in build_slices(DGX1, Allocator(DGX1), "partial", healthy=range(8), free=range(8))[2:]:
        api.put("resourceslices", s)
    wait_until(lambda: state.snapshot().nodes["partial"].topology is not None)


def test_an_annotation_wins_over_the_nodes_slices(live) -> None:
    api, state, _ext, start = live
    ann = encode(make("a1", DGX1, generated_at=NOW, plugin_version="0.1.0", allocated=(7,)))
    api.put("nodes", fk.node("a1", annotations={KEY: ann}))
    publish(api, "a1")
    api.put("resourceclaims", claim("c", "gpu.gputopo.io", node="a1", devices=("gpu-0",)))
    start()
    assert state.snapshot().nodes["a1"].topology.allocated == {7}


def test_a_cluster_without_dra_is_served() -> None:
    with fk.running() as (api, _, api_client):  # resource.k8s.io not served: 404s
        ann = encode(make("a1", DGX1, generated_at=NOW, plugin_version="0.1.0"))
        api.put("nodes", fk.node("a1", annotations={KEY: ann}))
        api.put("nodes", fk.node("u1", gpus=4))
        state = KubeState(api_client, clock=lambda: NOW, watch_timeout_s=5, backoff_s=(0.05, 0.2))
        state.start()
        try:
            wait_until(state.ready)
            snap = state.snapshot()
            assert snap.nodes["a1"].topology is not None
            assert snap.nodes["u1"].topology is None and snap.nodes["u1"].gpu_capacity == 4
        finally:
            state.stop()


def test_read_pool_refuses_disagreeing_links() -> None:
    slices = build_slices(DGX1, Allocator(DGX1), "n", healthy=range(8), free=range(8))
    read_pool("n", "gputopo.io", slices)  # as published: readable
    devs = slices[1]["spec"]["devices"]
    devs[0]["attributes"]["link1"] = {"string": "SYS"}  # GPU 1 still says NV1 (or NV2)
    with pytest.raises(DraViewError, match="disagree"):
        read_pool("n", "gputopo.io", slices)


def test_claims_and_slices_followed_through_the_watch(live) -> None:
    """A claim allocated, then released, and the node's slices removed, all while running."""
    api, state, _ext, start = live
    api.put("nodes", fk.node("d1", gpus=0))
    slices = publish(api, "d1")
    client = start()
    _, out = client.post("/filter", args(fk.pod("ml", "p", 8), ["d1"]))
    assert out["NodeNames"] == ["d1"]
    api.put("resourceclaims", claim("c", "nvlink-2.gputopo.io", node="d1", devices=("set-0-3",)))
    wait_until(lambda: state.snapshot().nodes["d1"].topology.allocated == {0, 3})
    before = state.snapshot().nodes["d1"].topology.topology
    for sl in build_slices(
        DGX1, Allocator(DGX1), "d1", healthy=range(8), free=(1, 2, 4, 5, 6, 7), generation=2
    ):
        api.put("resourceslices", sl)  # the daemon republishes after the prepare: new order, same node
    wait_until(lambda: state.snapshot() is not None and getattr(state.dra.pool("d1"), "generation", 0) == 2)
    assert state.snapshot().nodes["d1"].topology.topology is before, "an equal Topology is kept, not rebuilt"
    assert state.snapshot().nodes["d1"].topology.allocated == {0, 3}
    _, out = client.post("/filter", args(fk.pod("ml", "p", 8), ["d1"]))
    assert out["FailedNodes"] == {"d1": "needs 8 GPUs, 6 free"}
    api.delete("resourceclaims", "ml/c")
    wait_until(lambda: not state.snapshot().nodes["d1"].topology.allocated)
    for s in slices:
        api.delete("resourceslices", s["metadata"]["name"])
    wait_until(lambda: state.snapshot().nodes["d1"].topology is None)


def test_a_malformed_gpu_request_is_a_400_with_a_reason(live) -> None:
    api, _state, _ext, start = live
    api.put("nodes", fk.node("d1", gpus=0))
    publish(api, "d1")
    client = start()
    pod = fk.pod("ml", "p", 0)
    pod["spec"]["containers"][0]["resources"]["limits"]["gputopo.io/nvlink-4"] = "lots"
    code, out = client.post("/filter", args(pod, ["d1"]))
    assert code == 400 and "gputopo.io/nvlink-4" in out["Error"]
    pod = fk.pod("ml", "q", 0)
    pod["spec"]["resourceClaims"] = {"name": "not-a-list"}
    code, out = client.post("/filter", args(pod, ["d1"]))
    assert code == 400 and "resource claims" in out["Error"]


@pytest.mark.parametrize(
    ("name", "gpus"),
    [
        ("gputopo.io", 1),
        ("research-gputopo.gputopo.io", 1),
        ("a.b-c.gputopo.io", 1),
        ("gputopo.io.example.com", 0),
        ("xgputopo.io", 0),
        (".gputopo.io", 0),
    ],
)
def test_another_releases_device_classes_count_as_gputopos(name: str, gpus: int) -> None:
    """A second Helm release names its DeviceClasses in a domain of its own under gputopo.io
    (the chart's gputopo.draClassDomain: cluster-scoped names must not collide); its claims and
    extended resources are sized like the first release's, and a look-alike domain is not."""
    from scheduler.live.dra import requested_gpus
    from scheduler.model import parse_pod

    assert requested_gpus(claim("c", f"gpu.{name}", count=2)) == 2 * gpus
    assert requested_gpus(claim("c", f"nvlink-4.{name}")) == 4 * gpus
    pod = fk.pod("ml", "ext", 0)
    pod["spec"]["containers"][0]["resources"]["limits"][f"{name}/nvlink-8"] = "1"
    pod["spec"]["containers"][0]["resources"]["limits"][f"{name}/gpu"] = "2"
    assert parse_pod(pod).gpus == 10 * gpus
