"""Each deploy/examples/gang-*.yaml for another API places its whole gang through the sidecar:
the example's objects are served by the API stand-in as they are written, the pods are made as
their controller would (a Job's template, numbered), and every member lands in one domain."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from tests.test_scheduler_interop import live_with, one_domain, place_all  # noqa: F401 (fixture)

EXAMPLES = Path(__file__).resolve().parent.parent / "deploy" / "examples"
KIND_OF = {
    ("scheduling.k8s.io/v1alpha2", "PodGroup"): "k8s-podgroups",
    ("scheduling.k8s.io/v1alpha1", "Workload"): "k8s-workloads",
    ("scheduling.volcano.sh/v1beta1", "PodGroup"): "volcano-podgroups",
    ("scheduling.run.ai/v2alpha2", "PodGroup"): "kai-podgroups",
    ("kueue.x-k8s.io/v1beta1", "Topology"): "kueue-topologies",
    ("kai.scheduler/v1alpha1", "Topology"): "kai-topologies",
    ("scheduling.x-k8s.io/v1alpha1", "PodGroup"): "podgroups",
    ("resource.nvidia.com/v1beta1", "ComputeDomain"): "computedomains",
}
# Two domains (n0,n1 | n2,n3) at every level the examples name.
LABELS = (
    "fabric.topograph.run/tier-0",
    "cloud.provider.com/topology-rack",
    "network.topology.nvidia.com/leaf",
    "nvidia.com/gpu.clique",
)
CASES = {
    "gang-k8s-podgroup.yaml": ("ml/podgroup:train", "fabric.topograph.run/tier-0"),
    "gang-k8s-workload.yaml": ("ml/workload:finetune/workers", None),
    "gang-volcano.yaml": ("ml/volcano:resnet", None),
    "gang-kueue.yaml": ("ml/kueue:kq", "cloud.provider.com/topology-rack"),
    "gang-kai.yaml": ("ml/kai:kai-job", "cloud.provider.com/topology-rack"),
    "gang-computedomain.yaml": ("ml/computedomain:train", "nvidia.com/gpu.clique"),
}


def objects_and_pods(name: str) -> tuple[list[tuple[str, dict]], list[dict]]:
    objects, pods = [], []
    for doc in yaml.safe_load_all((EXAMPLES / name).read_text()):
        if not doc:
            continue
        doc = copy.deepcopy(doc)
        if doc["kind"] in ("Pod", "Job"):
            if doc["kind"] == "Pod":
                made = [doc]
            else:
                template = doc["spec"]["template"]
                made = [
                    {
                        "metadata": copy.deepcopy(template.get("metadata", {})),
                        "spec": copy.deepcopy(template["spec"]),
                    }
                    for _ in range(doc["spec"]["parallelism"])
                ]
                for i, p in enumerate(made):
                    p["metadata"]["name"] = f"{doc['metadata']['name']}-{i}"
            for p in made:
                p["metadata"].update(namespace="ml", uid=f"uid-{p['metadata']['name']}")
                p["status"] = {"phase": "Pending"}
                pods.append(p)
        else:
            kind = KIND_OF[(doc["apiVersion"], doc["kind"])]
            if kind not in ("kueue-topologies", "kai-topologies"):
                doc["metadata"]["namespace"] = "ml"
            objects.append((kind, doc))
    return objects, pods


@pytest.mark.parametrize("name", sorted(CASES))
def test_example_places_its_gang_over_the_api_stand_in(live_with, name) -> None:  # noqa: F811
    gang_key, level = CASES[name]
    objects, pods = objects_and_pods(name)
    assert len(pods) == 2 and all(p["spec"]["schedulerName"] == "gputopo-scheduler" for p in pods)
    nodes = [
        (f"n{i}", {**{k: "ab"[i // 2] for k in LABELS}, "cloud.provider.com/topology-block": "b"})
        for i in range(4)
    ]
    live = live_with(nodes=nodes, objects=objects, pods=pods)
    gang = live.state.snapshot().pods[f"ml/{pods[0]['metadata']['name']}"].gang
    assert gang.key == gang_key and (gang.min_member or live.state.snapshot().min_members[gang_key]) == 2
    assert gang.required_level == level
    assert one_domain(place_all(live, pods))


def test_every_gang_example_is_covered() -> None:
    assert {p.name for p in EXAMPLES.glob("gang-*.yaml")} - {"gang-training-job.yaml"} == set(CASES)
