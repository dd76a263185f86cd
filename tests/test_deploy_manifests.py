"""deploy/: what `kubectl apply -k` would send is valid Kubernetes, and it agrees with the code.

No cluster here: each kustomization is rendered offline with `kubectl kustomize`, every object
is validated against the Kubernetes OpenAPI schemas shipped by kubernetes-validate (strict: an
unknown field is an error, so a typo cannot silently drop a setting), and the settings that
two sides must share (the extender's URL and verbs, the plugin's folders, env and ports, the
gang labels) are checked against the daemons' own defaults and parsers instead of restated.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from deviceplugin import settings as plugin_config
from deviceplugin import settings as plugin_defaults
from gputopo.network.levels import validate_levels
from scheduler import defaults as sched_defaults
from scheduler.__main__ import parser as sidecar_parser
from scheduler.model import parse_pod
from tests.manifests import NODES, kustomize_with, node_selected

kv = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is not installed (pip install .[dev])"
)
jsonschema = pytest.importorskip(
    "jsonschema", reason="jsonschema is not installed (comes with kubernetes-validate)"
)

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
KUSTOMIZATIONS = (
    "",
    "overlays/gpu-operator",
    "overlays/with-podgroup-crd",
    "overlays/example-site",
    "overlays/kubernetes-1.28",
)
EXAMPLES = ("gang-training-job.yaml", "single-4gpu-pod.yaml")
# The oldest Kubernetes the manifests claim (docs/operator.md), the first that serves the
# admission policy (admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy), the newest shipped.
K8S_VERSIONS = ("1.28.0", "1.30.0", kv.latest_version())
# Each variant from the oldest Kubernetes it is for: all but one carry the admission policy.
OLDEST = {"deploy/overlays/kubernetes-1.28": "1.28.0"} | {f"deploy/examples/{e}": "1.28.0" for e in EXAMPLES}
POLICY_KINDS = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
SCHEDULER_NAME = "gputopo-scheduler"
# kube-scheduler's explicit default Score plugin weights (default_plugins.go) sum to 12; final
# extender contribution is Score (0..10) x weight x (MaxNodeScore 100 / MaxExtenderPriority 10).
DEFAULT_PLUGIN_WEIGHT_SUM = 12
MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10


@cache
def render(path: str) -> tuple[dict[str, Any], ...]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: cannot render the kustomizations offline")
    out = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, f"kubectl kustomize deploy/{path} failed: {out.stderr.strip()}"
    return tuple(doc for doc in yaml.safe_load_all(out.stdout) if doc)


@cache
def example(name: str) -> tuple[dict[str, Any], ...]:
    return tuple(doc for doc in yaml.safe_load_all((DEPLOY / "examples" / name).read_text()) if doc)


def one(docs: tuple[dict[str, Any], ...], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def container(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in pod_spec["containers"] if c["name"] == name)


def podgroup_schema() -> dict[str, Any]:
    crd = one(
        render("overlays/with-podgroup-crd"), "CustomResourceDefinition", "podgroups.scheduling.x-k8s.io"
    )
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == sched_defaults.PODGROUP_VERSION]
    return version["schema"]["openAPIV3Schema"]


def all_objects() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in KUSTOMIZATIONS:
        for doc in render(path):
            yield f"deploy/{path}", doc
    for name in EXAMPLES:
        for doc in example(name):
            yield f"deploy/examples/{name}", doc


# ------------------------------------------------------------------ schemas


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_is_valid_against_the_kubernetes_schemas(version: str) -> None:
    checked = 0
    for where, doc in all_objects():
        if tuple(map(int, version.split("."))) < tuple(map(int, OLDEST.get(where, "1.30.0").split("."))):
            continue
        label = f"{where}: {doc['kind']}/{doc['metadata']['name']}"
        if doc["apiVersion"] == f"{sched_defaults.PODGROUP_GROUP}/{sched_defaults.PODGROUP_VERSION}":
            # Not a built-in kind: checked against the CRD's own schema instead.
            jsonschema.validate(doc, podgroup_schema())
        else:
            try:
                kv.validate(doc, version, strict=True)
            except kv.ValidationError as e:
                pytest.fail(f"{label} is not valid Kubernetes {version}: {e.message} at {list(e.path)}")
        checked += 1
    assert checked >= 20


def test_the_schema_check_rejects_a_misspelt_field() -> None:
    """Guards the test above: strict validation must catch a typo deep in a pod template."""
    ds = copy.deepcopy(one(render(""), "DaemonSet"))
    ds["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(kv.ValidationError):
        kv.validate(ds, K8S_VERSIONS[-1], strict=True)
    bad_group = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "g"},
        "spec": {"minMember": "two"},
    }
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad_group, podgroup_schema())


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_every_namespaced_object_lives_in_gputopo_system_or_kube_system(path: str) -> None:
    cluster_scoped = {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        *POLICY_KINDS,
    }
    docs = render(path)
    assert one(docs, "Namespace")["metadata"]["name"] == "gputopo-system"
    for doc in docs:
        ns = doc["metadata"].get("namespace")
        if doc["kind"] in cluster_scoped:
            assert ns is None, f"{doc['kind']}/{doc['metadata']['name']} is cluster-scoped"
        elif doc["kind"] == "RoleBinding" and ns == "kube-system":
            assert doc["roleRef"]["name"] == "extension-apiserver-authentication-reader"
        else:
            assert ns == "gputopo-system", f"{doc['kind']}/{doc['metadata']['name']} is in {ns!r}"


def test_overlays_add_only_what_they_name() -> None:
    base = render("")
    operator = render("overlays/gpu-operator")
    ds = one(operator, "DaemonSet")
    assert ds["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    assert "runtimeClassName" not in one(base, "DaemonSet")["spec"]["template"]["spec"]
    assert {(d["kind"], d["metadata"]["name"]) for d in operator} == {
        (d["kind"], d["metadata"]["name"]) for d in base
    }
    # Node selection does not depend on the overlay: the same nodes with and without the operator.
    assert (
        ds["spec"]["template"]["spec"]["affinity"]
        == one(base, "DaemonSet")["spec"]["template"]["spec"]["affinity"]
    )
    old_k8s = render("overlays/kubernetes-1.28")
    assert {(d["kind"], d["metadata"]["name"]) for d in old_k8s} == {
        (d["kind"], d["metadata"]["name"]) for d in base if d["kind"] not in POLICY_KINDS
    }
    assert {d["kind"] for d in base} >= POLICY_KINDS
    with_crd = render("overlays/with-podgroup-crd")
    assert len(with_crd) == len(base) + 1
    assert "CustomResourceDefinition" not in {d["kind"] for d in base}
    site = render("overlays/example-site")
    images = {
        c["image"]
        for d in site
        if d["kind"] in ("Deployment", "DaemonSet")
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert not any(i.startswith("ghcr.io/gputopo/") for i in images), images


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_both_daemons_accept_the_settings_of_every_variant(path: str) -> None:
    """A flag or env value either daemon would refuse is a crash loop after `kubectl apply`."""
    docs = render(path)
    ds_spec = one(docs, "DaemonSet", "gputopo-device-plugin")["spec"]["template"]["spec"]
    plugin = container(ds_spec, "device-plugin")
    plugin_config.load_config(plugin.get("args", []), resolved_env(plugin, "gpu-node-7"))
    spec = one(docs, "Deployment", "gputopo-scheduler")["spec"]["template"]["spec"]
    args = sidecar_parser().parse_args(container(spec, "extender")["args"])
    if args.levels is not None:
        validate_levels([k.strip() for k in args.levels.split(",") if k.strip()], where="--levels")


# ------------------------------------------------------------------ scheduler <-> sidecar


def scheduler_config() -> dict[str, Any]:
    docs = render("")
    deploy = one(docs, "Deployment", "gputopo-scheduler")
    spec = deploy["spec"]["template"]["spec"]
    flag = next(a for a in container(spec, "kube-scheduler")["command"] if a.startswith("--config="))
    path = Path(flag.split("=", 1)[1])
    mount = next(
        m for m in container(spec, "kube-scheduler")["volumeMounts"] if m["mountPath"] == str(path.parent)
    )
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    cm = one(docs, "ConfigMap", volume["configMap"]["name"])
    assert path.name in cm["data"], f"kube-scheduler reads {path.name}, the ConfigMap has {list(cm['data'])}"
    return yaml.safe_load(cm["data"][path.name])


def sidecar_listen() -> str:
    """HOST:PORT the sidecar listens on, as its own argument parser reads the container's args."""
    spec = one(render(""), "Deployment", "gputopo-scheduler")["spec"]["template"]["spec"]
    host, port = sidecar_parser().parse_args(container(spec, "extender")["args"]).listen
    return f"{host}:{port}"


def test_extender_url_and_verbs_are_what_the_sidecar_serves() -> None:
    cfg = scheduler_config()
    assert cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert cfg["kind"] == "KubeSchedulerConfiguration"
    (ext,) = cfg["extenders"]
    url = urlsplit(ext["urlPrefix"])
    assert url.scheme == "http" and not ext.get("enableHTTPS", False)
    assert (url.hostname, url.port) == (sched_defaults.DEFAULT_HOST, sched_defaults.DEFAULT_PORT)
    assert sidecar_listen() == f"{sched_defaults.DEFAULT_HOST}:{sched_defaults.DEFAULT_PORT}"
    # kube-scheduler calls urlPrefix (trailing "/" trimmed) + "/" + verb.
    base = url.path.rstrip("/")
    assert base + "/" + ext["filterVerb"] == sched_defaults.FILTER_PATH
    assert base + "/" + ext["prioritizeVerb"] == sched_defaults.PRIORITIZE_PATH
    assert base + "/" + ext["bindVerb"] == sched_defaults.BIND_PATH
    assert "preemptVerb" not in ext


def test_extender_is_cache_capable_manages_gpus_and_outweighs_default_plugins() -> None:
    cfg = scheduler_config()
    (ext,) = cfg["extenders"]
    assert ext["nodeCacheCapable"] is True
    assert ext["managedResources"] == [{"name": sched_defaults.RESOURCE_NAME, "ignoredByScheduler": False}]
    assert ext["weight"] * MAX_EXTENDER_PRIORITY * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY) > (
        DEFAULT_PLUGIN_WEIGHT_SUM * MAX_NODE_SCORE
    )
    assert ext.get("ignorable", False) is False
    timeout = ext["httpTimeout"]
    assert timeout.endswith("s") and float(timeout[:-1]) > 5, "filter of a large gang needs more than 5 s"
    assert cfg["percentageOfNodesToScore"] == 100
    assert [p["schedulerName"] for p in cfg["profiles"]] == [SCHEDULER_NAME]


def test_leader_election_uses_its_own_lease_that_rbac_allows() -> None:
    le = scheduler_config()["leaderElection"]
    assert le["leaderElect"] is True
    assert le["resourceName"] != "kube-scheduler", "would fight the default scheduler for its lease"
    docs = render("")
    sa = one(docs, "Deployment", "gputopo-scheduler")["spec"]["template"]["spec"]["serviceAccountName"]
    granted: set[str] = set()
    for binding in (d for d in docs if d["kind"] == "RoleBinding"):
        if binding["metadata"]["namespace"] != le["resourceNamespace"]:
            continue
        if not any(s["name"] == sa for s in binding["subjects"]):
            continue
        role = one(docs, "Role", binding["roleRef"]["name"])
        for rule in role["rules"]:
            if "leases" in rule["resources"] and le["resourceName"] in rule.get("resourceNames", []):
                granted |= set(rule["verbs"])
    assert {"get", "update"} <= granted


def test_sidecar_probes_ask_its_health_endpoints_on_its_listen_address() -> None:
    spec = one(render(""), "Deployment", "gputopo-scheduler")["spec"]["template"]["spec"]
    side = container(spec, "extender")
    listen = sidecar_listen()
    live = " ".join(side["livenessProbe"]["exec"]["command"])
    ready = " ".join(side["readinessProbe"]["exec"]["command"])
    assert f"http://{listen}{sched_defaults.HEALTHZ_PATH}" in live
    assert f"http://{listen}{sched_defaults.READYZ_PATH}" in ready


def rbac_rules(docs: tuple[dict[str, Any], ...], service_account: str) -> list[dict[str, Any]]:
    """Every rule bound to a ServiceAccount by a ClusterRoleBinding to a ClusterRole defined here."""
    rules: list[dict[str, Any]] = []
    for binding in (d for d in docs if d["kind"] == "ClusterRoleBinding"):
        if any(s["name"] == service_account for s in binding["subjects"]):
            role = [
                d
                for d in docs
                if d["kind"] == "ClusterRole" and d["metadata"]["name"] == binding["roleRef"]["name"]
            ]
            rules += role[0]["rules"] if role else []
    return rules


def allows(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules)


def test_sidecar_can_read_what_it_watches_and_bind_but_not_write_objects() -> None:
    rules = rbac_rules(render(""), "gputopo-scheduler")
    for resource in ("nodes", "pods"):
        for verb in ("get", "list", "watch"):
            assert allows(rules, "", resource, verb), f"{verb} {resource}"
    for verb in ("get", "list", "watch"):
        assert allows(rules, sched_defaults.PODGROUP_GROUP, sched_defaults.PODGROUP_PLURAL, verb)
    assert allows(rules, "", "pods/binding", "create")
    assert allows(rules, "", "events", "create"), "the prediction Event written at bind"
    for resource in ("nodes", "pods"):
        for verb in ("create", "update", "patch", "delete"):
            assert not allows(rules, "", resource, verb), f"the extender role must not {verb} {resource}"


def test_sidecar_can_read_every_optional_kind_and_write_events() -> None:
    from scheduler.live.kinds import KINDS

    rules = rbac_rules(render(""), "gputopo-scheduler")
    for kind in KINDS:
        for verb in ("get", "list", "watch"):
            assert allows(rules, kind.group, kind.plural, verb), f"{verb} {kind.plural}.{kind.group}"
    assert allows(rules, "", "events", "create")
    assert allows(rules, "events.k8s.io", "events", "create"), "Events with microsecond times"
    assert not allows(rules, "", "events", "delete")


def test_plugin_can_write_events_on_its_node_and_nothing_else_new() -> None:
    """The plugin explains on its Node why it cannot publish: create Events, no other write."""
    rules = rbac_rules(render(""), "gputopo-device-plugin")
    assert allows(rules, "events.k8s.io", "events", "create") and allows(rules, "", "events", "create")
    for verb in ("update", "patch", "delete"):
        assert not allows(rules, "events.k8s.io", "events", verb)
    assert not allows(rules, "", "pods", "patch") and not allows(rules, "", "nodes", "update")


# ------------------------------------------------------------------ device plugin


def plugin_container() -> tuple[dict[str, Any], dict[str, Any]]:
    spec = one(render(""), "DaemonSet", "gputopo-device-plugin")["spec"]["template"]["spec"]
    return spec, container(spec, "device-plugin")


def resolved_env(c: dict[str, Any], node: str) -> dict[str, str]:
    """The container's environment as the kubelet would set it on `node`."""
    env: dict[str, str] = {}
    for var in c.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            assert var["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName", var
            env[var["name"]] = node
    return env


def loaded_plugin_config() -> tuple[plugin_config.PluginConfig, dict[str, Any], dict[str, Any]]:
    spec, c = plugin_container()
    env = resolved_env(c, "gpu-node-7")
    return plugin_config.load_config(c.get("args", []), env), spec, c


def host_path_of(spec: dict[str, Any], c: dict[str, Any], container_path: str) -> str:
    """The host folder mounted at `container_path` (or at a parent of it)."""
    best = max(
        (m for m in c["volumeMounts"] if Path(container_path).is_relative_to(m["mountPath"])),
        key=lambda m: len(m["mountPath"]),
    )
    volume = next(v for v in spec["volumes"] if v["name"] == best["name"])
    return str(Path(volume["hostPath"]["path"]) / Path(container_path).relative_to(best["mountPath"]))


def test_plugin_accepts_its_args_and_env_and_learns_its_node_name() -> None:
    cfg, _, c = loaded_plugin_config()
    assert cfg.node_name == "gpu-node-7"
    assert cfg.publish == "true", (
        "the scheduler needs the annotation: fail loudly when it cannot be published"
    )
    assert cfg.resource_name == sched_defaults.RESOURCE_NAME
    assert cfg.backend_kind == "nvml", "on a real node the plugin must read NVML, not a topology file"
    known = {opt.env for opt in plugin_config.OPTIONS} | {plugin_config.CONFIG_ENV}
    for var in c.get("env", []):
        assert var["name"] in known or var["name"].startswith("NVIDIA_"), f"{var['name']} is read by nobody"


def test_plugin_sees_the_kubelets_folders_at_the_host_paths() -> None:
    cfg, spec, c = loaded_plugin_config()
    assert host_path_of(spec, c, cfg.kubelet_dir) == plugin_defaults.KUBELET_DIR
    assert host_path_of(spec, c, cfg.pod_resources_socket) == plugin_defaults.POD_RESOURCES_SOCKET
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert not mounts[cfg.kubelet_dir].get("readOnly", False), "the plugin creates its socket there"


def test_plugin_metrics_port_is_declared_scraped_and_probed() -> None:
    cfg, _, c = loaded_plugin_config()
    assert cfg.metrics_port != 0
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["metrics"] == cfg.metrics_port
    template = one(render(""), "DaemonSet", "gputopo-device-plugin")["spec"]["template"]
    assert template["metadata"]["annotations"]["prometheus.io/port"] == str(cfg.metrics_port)
    probe = c["livenessProbe"].get("httpGet")
    if probe is not None:
        assert probe["port"] in ("metrics", cfg.metrics_port)


def test_plugin_runs_on_gpu_nodes_only_and_survives_pressure() -> None:
    spec, c = plugin_container()
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    for term in terms:
        keys = {e["key"] for e in term["matchExpressions"] if e["operator"] == "In"}
        assert keys & {"nvidia.com/gpu.present", "feature.node.kubernetes.io/pci-10de.present"}, term
    tolerated = {(t["key"], t.get("effect")) for t in spec["tolerations"]}
    assert ("nvidia.com/gpu", "NoSchedule") in tolerated and ("CriticalAddonsOnly", None) in tolerated
    assert spec["priorityClassName"] == "system-node-critical"
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    sc = c["securityContext"]
    assert sc["capabilities"]["drop"] == ["ALL"] and sc["allowPrivilegeEscalation"] is False


def test_plugin_rbac_is_patch_nodes_and_create_events_only() -> None:
    rules = rbac_rules(render(""), "gputopo-device-plugin")
    granted = {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert granted == {
        ("", "nodes", "get"),
        ("", "nodes", "patch"),
        ("", "events", "create"),
        ("events.k8s.io", "events", "create"),
    }, (
        "the publisher's one call is a merge patch of its Node; the per-node config reads its label; "
        "an Event on its Node says why it cannot publish"
    )


# ------------------------------------------------------------------ examples


def pod_from_template(template: dict[str, Any], namespace: str, name: str) -> dict[str, Any]:
    meta = {**template.get("metadata", {}), "namespace": namespace, "name": name, "uid": f"uid-{name}"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}


def test_gang_example_pods_are_one_gang_the_sidecar_recognises() -> None:
    docs = example("gang-training-job.yaml")
    job = one(docs, "Job")
    group = one(docs, "PodGroup")
    pods = [parse_pod(pod_from_template(job["spec"]["template"], "ml", f"llama-ft-{i}-x")) for i in range(2)]
    gangs = {p.gang for p in pods}
    assert len(gangs) == 1
    (gang,) = gangs
    assert gang is not None and gang.key == f"ml/{group['metadata']['name']}"
    assert gang.required_level == "network.topology.nvidia.com/leaf"
    assert gang.required_level in sched_defaults.DEFAULT_LEVELS
    # minMember comes from the PodGroup object (min_member None) and covers the whole Job.
    assert gang.min_member is None
    assert group["spec"]["minMember"] == job["spec"]["parallelism"] == job["spec"]["completions"] == 2
    assert all(p.gpus == 8 for p in pods)


def test_examples_ask_for_the_gputopo_scheduler_profile() -> None:
    profile = scheduler_config()["profiles"][0]["schedulerName"]
    job_spec = one(example("gang-training-job.yaml"), "Job")["spec"]["template"]["spec"]
    pod = one(example("single-4gpu-pod.yaml"), "Pod")
    assert job_spec["schedulerName"] == pod["spec"]["schedulerName"] == profile
    single = parse_pod(pod)
    assert single.gpus == 4 and single.gang is None


def test_gang_example_rendezvous_names_resolve_through_its_headless_service() -> None:
    docs = example("gang-training-job.yaml")
    job, svc = one(docs, "Job"), one(docs, "Service")
    spec = job["spec"]["template"]["spec"]
    assert svc["spec"]["clusterIP"] == "None" and spec["subdomain"] == svc["metadata"]["name"]
    assert svc["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
    command = " ".join(container(spec, "trainer")["command"])
    assert f"--master-addr={job['metadata']['name']}-0.{svc['metadata']['name']}" in command
    assert "--nnodes=2" in command and "--nproc-per-node=8" in command


def test_critical_priority_classes_are_covered_by_a_quota_in_their_namespace() -> None:
    """Where critical classes are limited to quota-covered namespaces, an uncovered pod is refused."""
    docs = render("")
    covered = {
        value
        for quota in (d for d in docs if d["kind"] == "ResourceQuota")
        for expr in quota["spec"]["scopeSelector"]["matchExpressions"]
        if expr["scopeName"] == "PriorityClass" and expr["operator"] == "In"
        for value in expr["values"]
    }
    used = {
        d["spec"]["template"]["spec"]["priorityClassName"]
        for d in docs
        if d["kind"] in ("DaemonSet", "Deployment")
    }
    assert used == {"system-node-critical", "system-cluster-critical"}
    assert used <= covered


# ------------------------------------------------------------------ images


def project_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def images_of(docs: tuple[dict[str, Any], ...]) -> dict[str, str]:
    """container name -> image, over both workloads."""
    return {
        c["name"]: c["image"]
        for d in docs
        if d["kind"] in ("Deployment", "DaemonSet")
        for c in d["spec"]["template"]["spec"]["containers"]
    }


@pytest.mark.parametrize("path", [p for p in KUSTOMIZATIONS if p != "overlays/example-site"])
def test_images_are_the_project_version_and_a_kube_scheduler_release(path: str) -> None:
    version = project_version()
    images = images_of(render(path))
    assert images["device-plugin"] == f"ghcr.io/gputopo/gputopo-device-plugin:{version}"
    assert images["extender"] == f"ghcr.io/gputopo/gputopo-scheduler-extender:{version}"
    m = re.fullmatch(r"registry\.k8s\.io/kube-scheduler:v1\.(\d+)\.(\d+)", images["kube-scheduler"])
    assert m is not None, images["kube-scheduler"]
    assert int(m.group(1)) >= 28
    for dockerfile in ("Dockerfile.plugin", "Dockerfile.scheduler"):
        assert f"ARG VERSION={version}\n" in (ROOT / dockerfile).read_text()


def test_make_images_builds_the_names_the_manifests_pull() -> None:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    out = subprocess.run(
        [make, "-n", "images"], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True
    )
    tags = set(re.findall(r"-t (\S+)", out.stdout))
    images = images_of(render(""))
    assert tags == {images["device-plugin"], images["extender"]}


def test_kube_scheduler_tag_is_a_kustomize_image_override(tmp_path: Path) -> None:
    """What docs/operator.md tells operators to write in their overlay."""
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(DEPLOY, tmp_path)],
                "images": [
                    {"name": "registry.k8s.io/kube-scheduler", "newTag": "v1.31.4"},
                    {"name": "ghcr.io/gputopo/gputopo-device-plugin", "newName": "registry.example.com/gdp"},
                ],
            }
        )
    )
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    out = subprocess.run(
        [kubectl, "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=60, check=True
    )
    images = images_of(tuple(d for d in yaml.safe_load_all(out.stdout) if d))
    assert images["kube-scheduler"] == "registry.k8s.io/kube-scheduler:v1.31.4"
    assert images["device-plugin"] == f"registry.example.com/gdp:{project_version()}"
    assert images["extender"] == images_of(render(""))["extender"]


def test_the_overlay_docs_operator_md_shows_renders_as_it_says(tmp_path: Path) -> None:
    """docs/operator.md's example overlay, applied from a copy next to a checkout of the repo."""
    text = (ROOT / "docs" / "operator.md").read_text()
    block = re.search(r"```yaml\n# my-gputopo/kustomization.yaml\n(.*?)```", text, re.S)
    assert block is not None, "the example overlay is gone from docs/operator.md"
    doc = yaml.safe_load(block.group(1))
    (base,) = doc["resources"]
    assert base.startswith("../gputopo/deploy")
    doc["resources"] = [os.path.relpath(ROOT / base.removeprefix("../gputopo/"), tmp_path)]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(doc))
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    out = subprocess.run(
        [kubectl, "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=60, check=True
    )
    images = images_of(tuple(d for d in yaml.safe_load_all(out.stdout) if d))
    version = project_version()
    assert images == {
        "device-plugin": f"registry.example.com/gputopo/gputopo-device-plugin:{version}",
        "extender": f"registry.example.com/gputopo/gputopo-scheduler-extender:{version}",
        "kube-scheduler": "registry.k8s.io/kube-scheduler:v1.32.9",
    }


def test_the_kube_scheduler_the_real_scheduler_tests_run_has_its_component(tmp_path: Path) -> None:
    """The default stays low (never newer than a 1.33+ API server); the release the real-cluster
    tests run is one component away."""
    readme = ROOT.parent / "shared" / "realk8s" / "README.md"
    if not readme.exists():
        pytest.skip("../shared is absent (a newcomer's clone)")
    tested = re.search(r"## kube-scheduler \((v[0-9.]+)\)", readme.read_text())
    assert tested is not None
    minor = ".".join(tested.group(1).lstrip("v").split(".")[:2])
    docs = kustomize_with(tmp_path, ["."], (f"components/kube-scheduler-{minor}",))
    assert images_of(docs)["kube-scheduler"] == f"registry.k8s.io/kube-scheduler:{tested.group(1)}"


def test_default_kube_scheduler_is_not_newer_than_most_control_planes() -> None:
    tag = images_of(render(""))["kube-scheduler"].rsplit(":", 1)[1]
    assert tag == "v1.33.5", "docs/operator.md and deploy/base/kustomization.yaml name this default"
    assert "v1.33.5" in (ROOT / "docs" / "operator.md").read_text()


KUBE_SCHEDULER_COMPONENTS = sorted(
    p.parent.name for p in DEPLOY.glob("components/kube-scheduler-*/kustomization.yaml")
)


@pytest.mark.parametrize("component", KUBE_SCHEDULER_COMPONENTS)
def test_each_kube_scheduler_component_sets_a_release_of_its_minor(component: str, tmp_path: Path) -> None:
    minor = component.removeprefix("kube-scheduler-")
    docs = kustomize_with(tmp_path, ["."], (f"components/{component}",))
    image = images_of(docs)["kube-scheduler"]
    assert re.fullmatch(rf"registry\.k8s\.io/kube-scheduler:v{re.escape(minor)}\.\d+", image), image
    # kubescheduler.config.k8s.io/v1 (extenders included) is served from 1.25 on.
    assert tuple(map(int, minor.split("."))) >= (1, 25)
    assert scheduler_config()["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    # everything else is the base's
    assert {(d["kind"], d["metadata"]["name"]) for d in docs} == {
        (d["kind"], d["metadata"]["name"]) for d in render("")
    }


def test_kube_scheduler_components_cover_every_minor_the_base_supports() -> None:
    minors = {int(c.split(".")[-1]) for c in KUBE_SCHEDULER_COMPONENTS}
    assert minors >= set(range(30, 36)), KUBE_SCHEDULER_COMPONENTS


# ------------------------------------------------------------------ failover and node selection


def test_two_schedulers_on_different_nodes_with_a_budget_and_rolling_one_at_a_time() -> None:
    docs = render("")
    deploy = one(docs, "Deployment", "gputopo-scheduler")
    assert deploy["spec"]["replicas"] >= 2
    assert deploy["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    (term,) = deploy["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= labels.items()
    pdb = one(docs, "PodDisruptionBudget", "gputopo-scheduler")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]


def test_lease_timings_are_set_and_ordered_as_kube_scheduler_requires() -> None:
    le = scheduler_config()["leaderElection"]

    def seconds(d: str) -> float:
        return float(d.removesuffix("s"))

    lease, renew, retry = (seconds(le[k]) for k in ("leaseDuration", "renewDeadline", "retryPeriod"))
    assert lease > renew > retry > 0


@pytest.mark.parametrize("path", ["", "overlays/gpu-operator"])
@pytest.mark.parametrize("what", list(NODES))
def test_plugin_runs_on_every_gpu_node_but_never_beside_the_operators_plugin(path: str, what: str) -> None:
    labels, expected = NODES[what]
    spec = one(render(path), "DaemonSet", "gputopo-device-plugin")["spec"]["template"]["spec"]
    assert node_selected(spec, labels) is expected
