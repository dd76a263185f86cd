"""deploy/examples/jobs/: the training-job manifests docs/jobs.md tells users to apply.

Each manifest is checked three ways, none needing a cluster:

1. its structure: the built-in kind (batch/v1 Job) against the Kubernetes OpenAPI schemas of
   kubernetes-validate (strict: an unknown field is an error); each custom kind against a
   compact JSON schema of the fields used here, written from the upstream CRD's
   openAPIV3Schema (cited per kind below: nothing is copied from those repositories), and
   every pod or job template inside it against the Kubernetes schemas again;
2. what gputopo reads from the pods the controller makes of it (named and labelled as that
   controller does, per the cited source): the scheduler name, the GPU count, the gang and its
   quorum and level, through the sidecar's own parser (scheduler.model.parse_pod), so a
   template that would not be one gang fails here and not on a cluster;
3. the `kubectl gputopo why` output docs/jobs.md shows: run against the API server stand-in
   holding those pods, so the page shows real output.
"""

from __future__ import annotations

import copy
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gputopo.gang import sources as gangsources
from gputopo.pod import optin
from kubectl_gputopo.cli import main as kubectl_gputopo
from scheduler.model import parse_pod
from tests import fake_apiserver as fk
from tests.test_kubectl_gputopo import _Server

kv = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is not installed (pip install .[dev])"
)
jsonschema = pytest.importorskip(
    "jsonschema", reason="jsonschema is not installed (comes with kubernetes-validate)"
)

ROOT = Path(__file__).resolve().parent.parent
JOBS = ROOT / "deploy" / "examples" / "jobs"
PAGE = ROOT / "docs" / "jobs.md"
NAMESPACE = "ml"
LEAF = "network.topology.nvidia.com/leaf"
K8S_VERSIONS = ("1.28.0", kv.latest_version())


def scheduler_name() -> str:
    """The profile name pods opt in with, from the shipped kube-scheduler configuration."""
    config = yaml.safe_load(
        (ROOT / "deploy" / "base" / "scheduler" / "kube-scheduler-config.yaml").read_text()
    )
    return str(config["profiles"][0]["schedulerName"])


def load(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((JOBS / name).read_text()) if d]


# ------------------------------------------------------------------ compact CRD schemas
#
# Only the fields these manifests use, with the types, enums and required lists of the upstream
# CRD's openAPIV3Schema; `additionalProperties: false` where the upstream object is a closed
# struct, so a misspelt field fails. Templates are `object` here and validated as Kubernetes
# PodTemplateSpec / JobTemplateSpec by `templates()` below.

OBJ: dict[str, Any] = {"type": "object"}
INT: dict[str, Any] = {"type": "integer"}
STR: dict[str, Any] = {"type": "string"}
MAP: dict[str, Any] = {"type": "object", "additionalProperties": {"type": "string"}}
META: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": STR, "namespace": STR, "labels": MAP, "annotations": MAP},
}


def kind_schema(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": META,
            "spec": spec,
        },
    }


def closed(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
        "required": required or [],
    }


# kubeflow/training-operator v1.9.0, manifests/base/crds/kubeflow.org_pytorchjobs.yaml and
# pkg/apis/kubeflow.org/v1/{pytorch,common}_types.go: spec requires pytorchReplicaSpecs, a map of
# replica type (Master, Worker) to ReplicaSpec {replicas, restartPolicy, template}.
REPLICA_SPEC = closed(
    {
        "replicas": INT,
        "restartPolicy": {"enum": ["Always", "OnFailure", "Never", "ExitCode"]},
        "template": OBJ,
    }
)
RUN_POLICY = closed({"cleanPodPolicy": {"enum": ["All", "Running", "None"]}, "suspend": {"type": "boolean"}})
PYTORCHJOB = kind_schema(
    "kubeflow.org/v1",
    "PyTorchJob",
    closed(
        {
            "runPolicy": RUN_POLICY,
            "pytorchReplicaSpecs": {
                "type": "object",
                "propertyNames": {"enum": ["Master", "Worker"]},
                "additionalProperties": REPLICA_SPEC,
            },
        },
        ["pytorchReplicaSpecs"],
    ),
)

# kubeflow/mpi-operator, manifests/base/kubeflow.org_mpijobs.yaml and
# pkg/apis/kubeflow/v2beta1/types.go: spec requires mpiReplicaSpecs (Launcher, Worker);
# slotsPerWorker, launcherCreationPolicy (AtStartup | WaitForWorkersReady), runPolicy.
MPIJOB = kind_schema(
    "kubeflow.org/v2beta1",
    "MPIJob",
    closed(
        {
            "slotsPerWorker": INT,
            "launcherCreationPolicy": {"enum": ["AtStartup", "WaitForWorkersReady"]},
            "runPolicy": RUN_POLICY,
            "mpiReplicaSpecs": {
                "type": "object",
                "propertyNames": {"enum": ["Launcher", "Worker"]},
                "additionalProperties": REPLICA_SPEC,
            },
        },
        ["mpiReplicaSpecs"],
    ),
)

# kubernetes-sigs/jobset, config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml and
# api/jobset/v1alpha2/jobset_types.go: replicatedJobs[] requires name and template (a
# batch/v1 JobTemplateSpec); network.enableDNSHostnames.
REPLICATED_JOBS = {
    "type": "array",
    "items": closed(
        {"name": STR, "replicas": {"type": "integer", "minimum": 0}, "template": OBJ}, ["name", "template"]
    ),
}
JOBSET_SPEC = closed(
    {"network": closed({"enableDNSHostnames": {"type": "boolean"}}), "replicatedJobs": REPLICATED_JOBS}
)
JOBSET = kind_schema("jobset.x-k8s.io/v1alpha2", "JobSet", JOBSET_SPEC)

# kubernetes-sigs/lws, config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml and
# api/leaderworkerset/v1/leaderworkerset_types.go: spec requires leaderWorkerTemplate, which
# requires workerTemplate; restartPolicy is one of four values.
LWS = kind_schema(
    "leaderworkerset.x-k8s.io/v1",
    "LeaderWorkerSet",
    closed(
        {
            "replicas": {"type": "integer", "minimum": 0},
            "leaderWorkerTemplate": closed(
                {
                    "size": INT,
                    "restartPolicy": {
                        "enum": ["Default", "RecreateGroupOnPodRestart", "RecreateGroupAfterStart", "None"]
                    },
                    "leaderTemplate": OBJ,
                    "workerTemplate": OBJ,
                },
                ["workerTemplate"],
            ),
        },
        ["leaderWorkerTemplate"],
    ),
)

# kubeflow/trainer, manifests/base/crds/trainer.kubeflow.org_{trainjobs,clustertrainingruntimes}.yaml
# and pkg/apis/trainer/v1alpha1/{trainjob,trainingruntime}_types.go: a TrainJob requires
# runtimeRef (which requires name); trainer {numNodes, command, resourcesPerNode};
# runtimePatches[] requires manager and patches the runtime's JobSet template down to the pod
# template's metadata. A ClusterTrainingRuntime: mlPolicy, podGroupPolicy.coscheduling, and a
# JobSet template whose spec is a JobSetSpec.
TRAINJOB = kind_schema(
    "trainer.kubeflow.org/v1alpha1",
    "TrainJob",
    closed(
        {
            "runtimeRef": closed({"name": STR, "kind": STR, "apiGroup": STR}, ["name"]),
            "trainer": closed(
                {
                    "numNodes": {"type": "integer", "minimum": 0},
                    "command": {"type": "array", "items": STR},
                    "resourcesPerNode": OBJ,
                }
            ),
            "runtimePatches": {
                "type": "array",
                "maxItems": 16,
                "items": closed(
                    {
                        "manager": STR,
                        "trainingRuntimeSpec": closed(
                            {"template": closed({"spec": closed({"replicatedJobs": REPLICATED_JOBS})})}
                        ),
                    },
                    ["manager"],
                ),
            },
        },
        ["runtimeRef"],
    ),
)
RUNTIME = kind_schema(
    "trainer.kubeflow.org/v1alpha1",
    "ClusterTrainingRuntime",
    closed(
        {
            "mlPolicy": closed({"numNodes": INT, "torch": OBJ}),
            "podGroupPolicy": closed({"coscheduling": closed({"scheduleTimeoutSeconds": INT})}),
            "template": closed({"spec": JOBSET_SPEC}),
        }
    ),
)
SCHEMAS = {
    (s["properties"]["apiVersion"]["const"], s["properties"]["kind"]["const"]): s
    for s in (PYTORCHJOB, MPIJOB, JOBSET, LWS, TRAINJOB, RUNTIME)
}


def templates(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(where, "pod" | "job" | "patch", template) for every template inside a custom object."""
    spec = doc["spec"]
    for field in ("pytorchReplicaSpecs", "mpiReplicaSpecs"):
        for rtype, replica in spec.get(field, {}).items():
            yield f"{field}.{rtype}", "pod", replica["template"]
    lwt = spec.get("leaderWorkerTemplate", {})
    for field in ("leaderTemplate", "workerTemplate"):
        if field in lwt:
            yield f"leaderWorkerTemplate.{field}", "pod", lwt[field]
    jobset = spec.get("template", {}).get("spec", spec)  # a runtime's JobSet template, or a JobSet
    for rjob in jobset.get("replicatedJobs", []):
        yield f"replicatedJobs.{rjob['name']}", "job", rjob["template"]
    for patch in spec.get("runtimePatches", []):
        for rjob in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
            yield f"runtimePatches.{rjob['name']}", "patch", rjob["template"]["spec"]["template"]


def as_core(kind: str, template: dict[str, Any]) -> dict[str, Any]:
    """A template as the built-in object Kubernetes' schema checks: a PodTemplate holds a
    PodTemplateSpec, a Job a JobTemplateSpec's spec; a patch's pod metadata alone."""
    meta = {"name": "t", "namespace": NAMESPACE}
    if kind == "job":
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": template["spec"]}
    if kind == "patch":
        template = {"metadata": template["metadata"], "spec": {"containers": [{"name": "c", "image": "i"}]}}
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": meta, "template": template}


EXAMPLES = sorted(p.name for p in JOBS.glob("*.yaml"))


def test_every_kind_has_an_example_with_and_without_kueue() -> None:
    kinds = {(d["apiVersion"], d["kind"]) for name in EXAMPLES for d in load(name)}
    assert kinds == {("batch/v1", "Job"), *SCHEMAS}
    for name in EXAMPLES:
        queued = [d for d in load(name) if "kueue.x-k8s.io/queue-name" in d["metadata"].get("labels", {})]
        assert bool(queued) == name.endswith("-kueue.yaml"), name


@pytest.mark.parametrize("name", EXAMPLES)
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_manifest_and_template_is_valid(name: str, version: str) -> None:
    for doc in load(name):
        key = (doc["apiVersion"], doc["kind"])
        if key == ("batch/v1", "Job"):
            kv.validate(doc, version, strict=True)
            continue
        jsonschema.validate(doc, SCHEMAS[key])
        found = list(templates(doc))
        assert found or doc["kind"] == "TrainJob", f"{name}: no template found in {doc['kind']}"
        for where, kind, template in found:
            try:
                kv.validate(as_core(kind, template), version, strict=True)
            except kv.ValidationError as e:
                pytest.fail(f"{name} {doc['kind']} {where}: {e.message} at {list(e.path)}")
        if doc["kind"] == "TrainJob":  # the resources each node's container gets
            pod = as_core("pod", {"spec": {"containers": [{"name": "node", "image": "i"}]}})
            pod["template"]["spec"]["containers"][0]["resources"] = doc["spec"]["trainer"]["resourcesPerNode"]
            kv.validate(pod, version, strict=True)


def test_a_misspelt_field_fails_the_compact_schemas() -> None:
    """The compact schemas are closed where upstream's structs are: they catch typos."""
    (job,) = load("pytorchjob.yaml")
    bad = copy.deepcopy(job)
    bad["spec"]["pytorchReplicaSpecs"]["Worker"]["replica"] = 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, PYTORCHJOB)
    bad = copy.deepcopy(job)
    bad["spec"]["pytorchReplicaSpecs"]["Workers"] = bad["spec"]["pytorchReplicaSpecs"].pop("Worker")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, PYTORCHJOB)
    (lws,) = load("leaderworkerset.yaml")
    del lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(lws, LWS)


# ------------------------------------------------------------------ the pods each controller makes


def pod(name: str, template: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta = template.get("metadata", {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": f"uid-{name}",
            "labels": {**meta.get("labels", {}), **(labels or {})},
            "annotations": dict(meta.get("annotations", {})),
            "creationTimestamp": "2026-11-29T07:00:00Z",
        },
        "spec": copy.deepcopy(template["spec"]),
    }


#: The 5-character suffix a Job's controller appends to its pods' names (random on a cluster).
SUFFIX = ("x7k2p", "m4q9d", "c8w3n", "t5v6b")


def job_pods(
    job_name: str, job_spec: dict[str, Any], labels: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """An Indexed Job's pods: `<job>-<index>-<suffix>` (kubernetes pkg/controller/job)."""
    return [
        pod(f"{job_name}-{i}-{SUFFIX[i]}", job_spec["template"], labels)
        for i in range(job_spec["parallelism"])
    ]


def controller_pods(docs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(pods, group objects) the controllers create from the manifest's objects, named as they
    name them: training-operator `<job>-<type>-<i>` (pkg/controller.v1/common/util.go
    GenGeneralName); mpi-operator `<job>-worker-<i>` and a launcher Job `<job>-launcher`
    (pkg/controller/mpi_job_controller.go); JobSet Job `<jobset>-<replicatedJob>-<i>`; LWS
    leader `<lws>-<group>` and workers `<lws>-<group>-<i>` from 1; Kubeflow Trainer a JobSet named
    after the TrainJob, with the coscheduling plugin's label and PodGroup
    (pkg/runtime/framework/plugins/coscheduling/coscheduling.go)."""
    pods: list[dict[str, Any]] = []
    groups: list[dict[str, Any]] = []
    runtimes = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterTrainingRuntime"}
    if not runtimes:
        runtimes = {
            d["metadata"]["name"]: d for d in load("trainjob.yaml") if d["kind"] == "ClusterTrainingRuntime"
        }
    for doc in docs:
        name, spec = doc["metadata"]["name"], doc["spec"]
        if doc["kind"] == "Job":
            pods += job_pods(name, spec)
        elif doc["kind"] in ("PyTorchJob", "MPIJob"):
            replicas = spec.get("pytorchReplicaSpecs") or spec["mpiReplicaSpecs"]
            for rtype, replica in replicas.items():
                if rtype == "Launcher":
                    launcher = {"parallelism": 1, "template": replica["template"]}
                    pods += [pod(f"{name}-launcher-{SUFFIX[0]}", launcher["template"])]
                    continue
                pods += [
                    pod(f"{name}-{rtype.lower()}-{i}", replica["template"])
                    for i in range(replica["replicas"])
                ]
        elif doc["kind"] == "JobSet":
            for rjob in spec["replicatedJobs"]:
                for i in range(rjob["replicas"]):
                    pods += job_pods(f"{name}-{rjob['name']}-{i}", rjob["template"]["spec"])
        elif doc["kind"] == "LeaderWorkerSet":
            lwt = spec["leaderWorkerTemplate"]
            for g in range(spec["replicas"]):
                pods.append(pod(f"{name}-{g}", lwt["leaderTemplate"]))
                pods += [pod(f"{name}-{g}-{i}", lwt["workerTemplate"]) for i in range(1, lwt["size"])]
        elif doc["kind"] == "TrainJob":
            runtime = runtimes[spec["runtimeRef"]["name"]]
            (rjob,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
            template = copy.deepcopy(rjob["template"]["spec"]["template"])
            (container,) = template["spec"]["containers"]
            container["resources"] = spec["trainer"]["resourcesPerNode"]
            for patch in spec.get("runtimePatches", []):
                for p in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
                    meta = p["template"]["spec"]["template"]["metadata"]
                    template.setdefault("metadata", {}).setdefault("annotations", {}).update(
                        meta["annotations"]
                    )
            nodes = spec["trainer"]["numNodes"]
            labels = {}
            if "coscheduling" in runtime["spec"].get("podGroupPolicy", {}):
                labels = {gangsources.POD_GROUP_LABEL: name}
                groups.append(fk.podgroup(NAMESPACE, name, nodes))
            job_spec = {"parallelism": nodes, "template": template}
            pods += job_pods(f"{name}-{rjob['name']}-0", job_spec, labels)
    return pods, groups


@pytest.mark.parametrize("name", EXAMPLES)
def test_gputopo_reads_one_gang_of_every_gpu_pod(name: str) -> None:
    """Every GPU pod the controller makes names gputopo's scheduler, asks for 8 GPUs and is a
    member of one gang whose quorum is all of them; a pod without GPUs (MPI's launcher) is no
    member and the opt-in webhook leaves it to the default scheduler. Kueue's variants carry
    Kueue's level, which the sidecar takes as the gang's required level."""
    pods, groups = controller_pods(load(name))
    gpu_pods = [p for p in pods if parse_pod(p).gpus]
    assert len(gpu_pods) == 2
    for p in pods:
        info = parse_pod(p)
        decision = optin.decide(p, scheduler_name=scheduler_name())
        if info.gpus == 0:
            assert info.gang is None and decision.reason == "asks for no GPUs"
            continue
        assert info.gpus == 8 and decision.reason == f"already names {scheduler_name()}"
    gangs = {parse_pod(p).gang for p in gpu_pods}
    assert len(gangs) == 1
    (gang,) = gangs
    assert gang is not None
    named = gangsources.pod_gang(
        gpu_pods[0]["metadata"]["labels"], gpu_pods[0]["metadata"]["annotations"], {}
    )
    assert named is not None
    (group,) = groups or [None]
    assert gangsources.quorum(named, NAMESPACE, group) == len(gpu_pods)
    if name.endswith("-kueue.yaml"):
        assert (gang.required_level, gang.level_source) == (LEAF, "kueue")
    elif name == "indexed-job.yaml":
        assert (gang.required_level, gang.level_source) == (LEAF, "gputopo")
    else:
        assert gang.required_level is None


# ------------------------------------------------------------------ `kubectl gputopo why`

WHY = re.compile(r"```console\n\$ kubectl gputopo why -n ml (\S+)\n(.*?)```", re.S)


def shown() -> list[tuple[str, str]]:
    """(pod, output) of every `kubectl gputopo why` block on docs/jobs.md."""
    return [(m.group(1), m.group(2)) for m in WHY.finditer(PAGE.read_text())]


def why_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """`kubectl gputopo why -n ml POD` for the last GPU pod of every example, each example's pods alone
    in the API server stand-in (as the controller created them; nothing decided yet)."""
    out: dict[str, str] = {}
    for name in EXAMPLES:
        pods, groups = controller_pods(load(name))
        api = fk.FakeAPI()
        api.objects["events"] = {}
        api.objects["custom"] = {
            f"scheduling.x-k8s.io/v1alpha1/podgroups/{NAMESPACE}/{g['metadata']['name']}": g for g in groups
        }
        for p in pods:
            api.put("pods", p)
        server = _Server(api)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        kubeconfig = tmp_path / "kubeconfig"
        cluster = {"name": "c", "cluster": {"server": server.url}}
        context = {"name": "c", "context": {"cluster": "c", "user": "u"}}
        config = {
            "clusters": [cluster],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [context],
        }
        kubeconfig.write_text(
            yaml.safe_dump({"apiVersion": "v1", "kind": "Config", **config, "current-context": "c"})
        )
        try:
            target_name = [p for p in pods if parse_pod(p).gpus][-1]["metadata"]["name"]
            capsys.readouterr()
            code = kubectl_gputopo(["--kubeconfig", str(kubeconfig), "why", "-n", NAMESPACE, target_name])
            text, err = capsys.readouterr()
            assert (code, err) == (0, ""), (name, err)
            out[target_name] = text
        finally:
            server.closing = True
            server.shutdown()
            server.server_close()
    return out


def test_the_page_shows_what_kubectl_gputopo_why_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    actual = why_outputs(tmp_path, capsys)
    on_page = shown()
    assert sorted(p for p, _ in on_page) == sorted(actual), (
        "one `why` block per example, for its last GPU pod"
    )
    for pod_name, text in on_page:
        assert text == actual[pod_name], f"docs/jobs.md's `why` of {pod_name} differs from the real output"


def test_the_page_includes_every_example_and_cites_its_upstream_sources() -> None:
    page = PAGE.read_text()
    for name in EXAMPLES:
        assert f"deploy/examples/jobs/{name}" in page, name
        body = (JOBS / name).read_text()
        assert body.strip() in page, f"docs/jobs.md does not include {name} as it is"
    for repo in (
        "kubeflow/training-operator",
        "kubeflow/trainer",
        "kubeflow/mpi-operator",
        "kubernetes-sigs/jobset",
        "kubernetes-sigs/lws",
        "kubernetes-sigs/kueue",
    ):
        assert f"github.com/{repo}/" in page, repo
