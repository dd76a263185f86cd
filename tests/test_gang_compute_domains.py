"""NVIDIA ComputeDomains as gangs, end to end over the API stand-in (fake API server <- official
client <- KubeState <- Extender, filter and bind over HTTP as kube-scheduler calls them).

Objects are shaped as upstream's (kubernetes-sigs/dra-driver-nvidia-gpu, August 2026 snapshot):
- `api/nvidia.com/resource/v1beta1/computedomain.go`: ComputeDomain `resource.nvidia.com/v1beta1`,
  namespaced, `spec.numNodes` (int, default 0, deprecated), `spec.channel.resourceClaimTemplate
  .name`, `spec.channel.allocationMode` (Single | All);
- `cmd/compute-domain-controller/computedomain.go` and `resourceclaimtemplate.go`, and
  `templates/compute-domain-workload-claim-template.tmpl.yaml`: the controller creates that
  ResourceClaimTemplate in the ComputeDomain's namespace, labelled
  `resource.nvidia.com/computeDomain: <uid>`, requesting DeviceClass
  `compute-domain-default-channel.nvidia.com` with opaque config `domainID: <uid>`;
- `demo/specs/imex/nvbandwidth-test-job-1.yaml`: worker pods ask `nvidia.com/gpu` and name the
  template in `spec.resourceClaims[].resourceClaimTemplateName`;
- `deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-compute-domain-default-channel.yaml`.
"""

from __future__ import annotations

import pytest

from gputopo.gang import sources as gangsources
from tests import fake_apiserver as fk
from tests.test_scheduler_interop import (  # noqa: F401 (live_with is a fixture)
    ALL_KINDS,
    gang_pods,
    live_with,
    place_all,
)
from tests.test_scheduler_live import annotation, args, wait_until


@pytest.fixture
def stand_in(live_with):  # noqa: F811 (the fixture imported above)
    """The API stand-in of tests/test_scheduler_interop.py: stand_in(nodes=..., objects=..., pods=...)."""
    return live_with


CLIQUE = "nvidia.com/gpu.clique"
TEMPLATE = "train-channel"


def compute_domain(name: str = "train", *, num_nodes: int | None = 3, template: str = TEMPLATE) -> dict:
    """A ComputeDomain as `kubectl get computedomain -o json` shows it (status as the controller
    writes it before any daemon joins)."""
    spec: dict = {"channel": {"resourceClaimTemplate": {"name": template}, "allocationMode": "Single"}}
    if num_nodes is not None:
        spec["numNodes"] = num_nodes
    return {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"namespace": "ml", "name": name, "uid": f"cd-uid-{name}"},
        "spec": spec,
        "status": {"status": "NotReady"},
    }


def domain_pods(n: int, template: str = TEMPLATE, name: str = "w") -> list[dict]:
    """Worker pods of 8 GPUs (`nvidia.com/gpu`) claiming the domain's channel, as upstream's demo."""
    claim = {"name": "compute-domain-channel", "resourceClaimTemplateName": template}
    pods = gang_pods(n, spec={"resourceClaims": [claim]}, name=name)
    for p in pods:
        p["spec"]["containers"][0]["resources"]["claims"] = [{"name": "compute-domain-channel"}]
    return pods


def clique_of(node: str) -> str:
    return f"cl.{0 if int(node[1:]) < 5 else 1}"


def cliques() -> list[tuple[str, dict[str, str]]]:
    """cl.0: n0..n4, cl.1: n5..n7, 8 free GPUs each (`mark_busy` takes some after start)."""
    return [(f"n{i}", {CLIQUE: clique_of(f"n{i}")}) for i in range(8)]


def mark_busy(live, busy: dict[str, tuple[int, ...]]) -> None:
    for name, gpus in busy.items():
        labels = {CLIQUE: clique_of(name)}
        live.api.put(
            "nodes", fk.node(name, labels, annotations={"gputopo.io/topology": annotation(name, gpus)})
        )
    wait_until(
        lambda: all(len(live.state.snapshot().nodes[n].topology.allocated) == len(g) for n, g in busy.items())
    )


#: cl.0 has 4 + 4 + 4 + 8 + 8 = 28 free GPUs but room for two 8-GPU pods; cl.1 has 24, room for 3.
HALF_BUSY = {"n0": (0, 1, 2, 3), "n1": (0, 1, 2, 3), "n2": (0, 1, 2, 3)}


def test_pods_of_one_compute_domain_land_in_one_clique(stand_in) -> None:
    """3 pods of a ComputeDomain with numNodes 3: one gang (quorum 3) required in one
    `nvidia.com/gpu.clique`; clique 0 has more free GPUs than clique 1 but cannot hold all
    three, so all go to clique 1."""
    pods = domain_pods(3)
    live = stand_in(nodes=cliques(), objects=[("computedomains", compute_domain())], pods=pods)
    mark_busy(live, HALF_BUSY)
    gang = live.state.snapshot().pods["ml/w-0"].gang
    assert (gang.key, gang.min_member, gang.required_level, gang.source) == (
        "ml/computedomain:train",
        3,
        CLIQUE,
        gangsources.COMPUTE_DOMAIN_LABEL,
    )
    placed = place_all(live, pods)
    assert set(placed.values()) == {"n5", "n6", "n7"}, placed
    assert live.state.group_ref("ml/computedomain:train")["kind"] == "ComputeDomain"


def test_num_nodes_zero_is_the_pods_seen_and_a_clique_too_small_says_why(stand_in) -> None:
    """numNodes 0 (upstream's default): the quorum is the domain's pods seen. With 4 pods of 8
    GPUs and no clique holding 4 free nodes, every member waits and the answer says why in one
    line, naming the clique level."""
    pods = domain_pods(4)
    cd = compute_domain(num_nodes=None)
    live = stand_in(nodes=cliques(), objects=[("computedomains", cd)], pods=pods)
    mark_busy(live, HALF_BUSY)
    assert live.state.snapshot().pods["ml/w-3"].gang.min_member == 4
    names = sorted(live.state.snapshot().nodes)
    _, out = live.client.post("/filter", args(pods[0], names))
    assert out["NodeNames"] == [], out
    reason = out["FailedAndUnresolvableNodes"]["n0"]
    assert "\n" not in reason and "gpu.clique" in reason, reason
    assert live.api.bindings == []


def test_a_cluster_without_the_crd_places_the_same_pods_one_by_one(stand_in) -> None:
    """ComputeDomains not served (no NVIDIA DRA driver): discovery says so, the sidecar is
    ready, and the pods are single pods as before (no gang, no wait)."""
    pods = domain_pods(3)
    serve = tuple(k for k in ALL_KINDS if k != "computedomains")
    live = stand_in(serve=serve, nodes=cliques(), pods=pods)
    snap = live.state.snapshot()
    assert all(snap.pods[f"ml/w-{i}"].gang is None for i in range(3))
    names = sorted(snap.nodes)
    _, out = live.client.post("/filter", args(pods[0], names))
    assert out["NodeNames"] == names, "a single pod: every node with 8 free GPUs fits"


def test_another_gang_source_wins_and_other_templates_are_no_domain(stand_in) -> None:
    """A pod that names a gang (here the pod-group labels) is that gang, ComputeDomain or not;
    a pod claiming another template is no member."""
    light = {
        "pod-group.scheduling.sigs.k8s.io/name": "g",
        "pod-group.scheduling.sigs.k8s.io/min-available": "1",
    }
    pods = domain_pods(1, name="named")
    pods[0]["metadata"]["labels"].update(light)
    pods += domain_pods(1, template="gpu-template", name="other")
    live = stand_in(nodes=cliques(), objects=[("computedomains", compute_domain())], pods=pods)
    snap = live.state.snapshot()
    assert snap.pods["ml/named-0"].gang.key == "ml/g"
    assert snap.pods["ml/other-0"].gang is None


@pytest.mark.parametrize(
    "spec",
    [
        "x",
        {},
        {"channel": {}},
        {"channel": {"resourceClaimTemplate": {"name": "a/b"}}},
        {"channel": {"resourceClaimTemplate": {"name": ""}}},
        {"channel": {"resourceClaimTemplate": {"name": "t"}}, "numNodes": -1},
        {"channel": {"resourceClaimTemplate": {"name": "t"}}, "numNodes": "2"},
        {"channel": {"resourceClaimTemplate": {"name": "t"}}, "numNodes": True},
        {"channel": "t"},
    ],
)
def test_an_unusable_compute_domain_defines_no_gang(spec) -> None:
    obj = {"metadata": {"namespace": "ml", "name": "cd"}, "spec": spec}
    assert gangsources.groups_compute_domain(obj, "resource.nvidia.com/v1beta1") == []


def test_compute_domain_gangs_count_the_pods_seen_only_without_num_nodes() -> None:
    (fixed,) = gangsources.groups_compute_domain(compute_domain("a", num_nodes=2, template="ta"), "v")
    (open_,) = gangsources.groups_compute_domain(compute_domain("b", num_nodes=0, template="tb"), "v")
    index = {fixed.key: fixed, open_.key: open_}
    pods = [
        ("ml/p0", "ml", ("gpus", "ta")),
        ("ml/p1", "ml", ("tb",)),
        ("ml/p2", "ml", ("tb", "ta")),
        ("other/p3", "other", ("ta",)),  # another namespace's template of the same name
    ]
    got = gangsources.compute_domain_gangs(pods, index)
    assert {k: (g.key, q) for k, (g, q) in got.items()} == {
        "ml/p0": ("ml/computedomain:a", 2),
        "ml/p1": ("ml/computedomain:b", 2),
        "ml/p2": ("ml/computedomain:b", 2),
    }
