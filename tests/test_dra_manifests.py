"""DRA mode as shipped: the Helm switch `dra.enabled`, the kustomize component, the examples.

The DeviceClasses' CEL is run (cel-python) over the devices the node actually publishes
(gputopo.node.draslices), so a class selects exactly its devices; the admission policy is evaluated
over ResourceSlice requests as kube-apiserver would; everything is checked against the
Kubernetes schemas of the versions DRA mode supports.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from gputopo.node import draslices
from gputopo.node.allocator import Allocator
from gputopo.node.topofile import list_presets, load_preset
from tests.manifests import DEPLOY, NAMESPACE, kustomize, one, render_chart

kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed")
celpy = pytest.importorskip("celpy", reason="cel-python is not installed")
from celpy import celtypes  # noqa: E402

from tests.admission import evaluate  # noqa: E402

DRA_ON = {"dra": {"enabled": True, "driverName": "gputopo.io", "setSizes": [2, 4, 8, 16]}}
SCHEMAS = ("1.35.0", "1.36.0", kv.latest_version())
PLUGIN_USER = f"system:serviceaccount:{NAMESPACE}:gputopo-device-plugin"
Obj = dict[str, Any]
ROOT = Path(__file__).resolve().parent.parent


@cache
def helm_docs(kube_version: str = "v1.36.1") -> tuple[Obj, ...]:
    return render_chart(DRA_ON, kube_version=kube_version)


def kustomize_docs() -> tuple[Obj, ...]:
    return kustomize("overlays/dra")


def examples() -> list[tuple[str, Obj]]:
    return [
        (p.name, doc)
        for p in sorted((DEPLOY / "examples").glob("dra-*.yaml"))
        for doc in yaml.safe_load_all(p.read_text())
        if doc
    ]


@pytest.mark.parametrize("source", ["helm", "kustomize", "examples"])
@pytest.mark.parametrize("version", SCHEMAS)
def test_everything_is_valid_kubernetes(source: str, version: str) -> None:
    docs: list[tuple[str, Obj]] = (
        [("chart", d) for d in helm_docs()]
        if source == "helm"
        else [("overlays/dra", d) for d in kustomize_docs()]
        if source == "kustomize"
        else examples()
    )
    assert docs
    for where, doc in docs:
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as e:
            pytest.fail(f"{where}: {doc['kind']}/{doc['metadata']['name']} not valid {version}: {e.message}")


@pytest.mark.parametrize("preset", list_presets())
def test_published_slices_are_valid_kubernetes(preset: str) -> None:
    """Every kind of slice the node publishes is valid against each schema. Slices of one part
    (`gputopo.io/part` set4, set4-001, ...) differ only in which sets they list, so the first
    two of each part are validated: a 16-GPU node publishes 236 slices (14,827 devices), and
    validating all of them took 100 s of the suite for no further shape."""
    topo = load_preset(preset)
    slices = draslices.build_slices(
        topo, Allocator(topo), "node-a", healthy=range(1, topo.n), free=range(2, topo.n)
    )
    seen: dict[str, int] = {}
    sample = []
    for s in slices:
        part = s["metadata"]["labels"]["gputopo.io/part"].split("-")[0]
        seen[part] = seen.get(part, 0) + 1
        if seen[part] <= 2:
            sample.append(s)
    for version in SCHEMAS:
        for s in sample:
            kv.validate(s, version, strict=True)


@pytest.mark.parametrize("source", ["helm", "kustomize"])
def test_the_daemonset_runs_dra_mode_with_kubelets_plugin_folders(source: str) -> None:
    docs = helm_docs() if source == "helm" else kustomize_docs()
    spec = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    c = spec["containers"][0]
    assert c["args"][:2] == ["--mode", "dra"]
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {"/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins"} <= mounts
    paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert {"/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins"} <= paths
    # the probes ask the daemon over HTTP on its metrics port (it checks the DRA sockets itself):
    # no process started per probe, in DRA mode as in device-plugin mode
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert "exec" not in c[probe]
        assert c[probe]["httpGet"]["path"] == path and c[probe]["httpGet"]["port"] in (
            "metrics",
            ports["metrics"],
        )


def test_chart_and_kustomize_render_the_same_objects() -> None:
    from tests.test_helm_chart import differences

    chart = render_chart({"gpuOperator": {"enabled": False}, **DRA_ON}, kube_version="v1.35.4")
    assert differences(chart, kustomize_docs()) == []


def test_dra_off_by_default_in_the_chart() -> None:
    docs = render_chart({}, kube_version="v1.36.1")
    assert not [d for d in docs if d["kind"] == "DeviceClass"]
    assert "args" not in one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]


def test_helm_and_kustomize_ship_the_same_classes() -> None:
    def classes(docs: tuple[Obj, ...]) -> dict[str, Obj]:
        return {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "DeviceClass"}

    helm, kust = classes(helm_docs()), classes(kustomize_docs())
    assert (
        sorted(helm)
        == sorted(kust)
        == sorted(
            [
                "gpu.gputopo.io",
                "nvlink-2.gputopo.io",
                "nvlink-4.gputopo.io",
                "nvlink-8.gputopo.io",
                "nvlink-16.gputopo.io",
            ]
        )
    )
    for name in helm:
        assert helm[name]["extendedResourceName"] == kust[name]["extendedResourceName"]
        assert " ".join(helm[name]["selectors"][0]["cel"]["expression"].split()) == " ".join(
            kust[name]["selectors"][0]["cel"]["expression"].split()
        )


def test_the_shipped_classes_are_generated_from_the_layout_table() -> None:
    """deploy/'s DeviceClasses and the chart's layout rows are tools/dra_layouts.py's output from
    gputopo.node.draslices.LAYOUTS (`make dra-layouts`): a new layout reaches both, and the
    classes are the ones `device_class` builds."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("dra_layouts", ROOT / "tools" / "dra_layouts.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    for path, text in tool.outputs().items():
        assert path.read_text(encoding="utf-8") == text, f"{path} is out of date: run `make dra-layouts`"
    shipped = [d for d in kustomize_docs() if d["kind"] == "DeviceClass"]
    for doc in shipped:
        doc["metadata"].pop("labels")
        doc["metadata"].pop("namespace", None)
        doc["spec"]["selectors"][0]["cel"]["expression"] = " ".join(
            doc["spec"]["selectors"][0]["cel"]["expression"].split()
        )
    assert sorted(shipped, key=str) == sorted(draslices.device_classes(), key=str)


def _device_activation(driver: str, device: Obj) -> dict[str, Any]:
    """The CEL `device` variable as the scheduler builds it: attributes by domain, then name."""
    attrs: dict[str, dict[str, Any]] = {}
    for name, value in device["attributes"].items():
        domain, _, short = name.rpartition("/")
        attrs.setdefault(domain or driver, {})[short] = next(iter(value.values()))
    return {"device": celpy.json_to_cel({"driver": driver, "attributes": attrs, "capacity": {}})}


@pytest.mark.parametrize("preset", ["dgx1-v100", "dgx2-v100", "gb200-tray"])
def test_each_class_selects_exactly_its_healthy_devices(preset: str) -> None:
    """Each DeviceClass's CEL selects exactly the healthy devices of its size. The selectors
    read each device's own attributes, so a 16-GPU node is checked on a capped publication
    (`max_sets=128`, two slices a size): all 14,827 of its devices took 120 s of CEL."""
    topo = load_preset(preset)
    healthy = set(range(topo.n)) - {1}
    slices = draslices.build_slices(
        topo, Allocator(topo), "node-a", healthy=healthy, free=range(topo.n), max_sets=128
    )
    devices = [d for s in slices for d in s["spec"].get("devices") or []]
    env = celpy.Environment()
    for cls in (d for d in kustomize_docs() if d["kind"] == "DeviceClass"):
        program = env.program(env.compile(cls["spec"]["selectors"][0]["cel"]["expression"]))
        chosen = {
            d["name"]
            for d in devices
            if program.evaluate(_device_activation("gputopo.io", d)) == celtypes.BoolType(True)
        }
        found = draslices.layout_of_class(cls["metadata"]["name"])
        assert found is not None, cls["metadata"]["name"]
        layout, k = found
        members = {d["name"]: draslices.expand(d["name"], topo.n) for d in devices}
        want = {
            n
            for n, g in members.items()
            if n.startswith(layout.type + "-") and (not layout.sized or len(g) == k) and set(g) <= healthy
        }
        assert chosen == want, cls["metadata"]["name"]
        # a device of another driver with the same attributes is never selected
        other = _device_activation("gpu.nvidia.com", devices[0])
        assert program.evaluate(other) != celtypes.BoolType(True)


def _slice_request(operation: str, node_claim: str | None, name: str, user: str = PLUGIN_USER) -> Obj:
    extra = {"authentication.kubernetes.io/node-name": [node_claim]} if node_claim else {}
    return {
        "uid": "u",
        "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceSlice"},
        "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceslices"},
        "name": name,
        "operation": operation,
        "userInfo": {"username": user, "extra": extra},
    }


def _slice(node: str, driver: str = "gputopo.io") -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-x"},
        "spec": {"driver": driver, "nodeName": node},
    }


@pytest.mark.parametrize("source", ["helm", "kustomize"])
def test_admission_policy_keeps_each_plugin_to_its_own_slices(source: str) -> None:
    docs = helm_docs() if source == "helm" else kustomize_docs()
    policy = one(docs, "ValidatingAdmissionPolicy", "gputopo-dra-plugin-node-scope")
    binding = one(docs, "ValidatingAdmissionPolicyBinding", "gputopo-dra-plugin-node-scope")

    def decide(op: str, claim: str | None, new: Obj | None, old: Obj | None, user: str = PLUGIN_USER) -> Any:
        name = (new or old or {})["metadata"]["name"]
        return evaluate(policy, binding, _slice_request(op, claim, name, user), new, old)

    assert decide("CREATE", "n1", _slice("n1"), None).allowed
    assert decide("UPDATE", "n1", _slice("n1"), _slice("n1")).allowed
    assert decide("DELETE", "n1", None, _slice("n1")).allowed
    assert not decide("CREATE", "n1", _slice("n2"), None).allowed
    assert not decide("CREATE", "n1", _slice("n1", driver="gpu.nvidia.com"), None).allowed
    assert not decide("UPDATE", "n1", _slice("n1"), _slice("n2")).allowed
    assert not decide("DELETE", "n1", None, _slice("n2")).allowed
    denied = decide("CREATE", None, _slice("n1"), None)
    assert not denied.allowed and "without a node-name claim" in denied.reasons[0]
    assert not decide("CREATE", "n1", _slice("n2"), None, user="system:serviceaccount:x:y").matched


@pytest.mark.parametrize("source", ["helm", "kustomize"])
def test_rbac_grants_what_the_daemon_calls(source: str) -> None:
    docs = helm_docs() if source == "helm" else kustomize_docs()
    role = one(docs, "ClusterRole", "gputopo-dra-plugin")
    granted = {(res, verb) for rule in role["rules"] for res in rule["resources"] for verb in rule["verbs"]}
    # deviceplugin/dra/kubeapi.py: list, create, replace (update), delete slices; get claims
    assert {("resourceslices", v) for v in ("list", "create", "update", "delete")} <= granted
    assert ("resourceclaims", "get") in granted
    assert not {("resourceclaims", v) for v in ("update", "patch", "delete", "create")} & granted
    binding = one(docs, "ClusterRoleBinding", "gputopo-dra-plugin")
    assert (
        binding["subjects"][0]["name"]
        == one(docs, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"]
    )


def test_examples_name_shipped_classes_and_resources() -> None:
    classes = {d["metadata"]["name"]: d for d in kustomize_docs() if d["kind"] == "DeviceClass"}
    extended = {d["spec"]["extendedResourceName"] for d in classes.values()}
    used_classes, used_resources = set(), set()
    for _name, doc in examples():
        if doc["kind"] in ("ResourceClaimTemplate", "ResourceClaim"):
            spec = doc["spec"]["spec"] if doc["kind"] == "ResourceClaimTemplate" else doc["spec"]
            used_classes |= {r["exactly"]["deviceClassName"] for r in spec["devices"]["requests"]}
        if doc["kind"] == "Pod":
            for c in doc["spec"]["containers"]:
                used_resources |= {r for r in c.get("resources", {}).get("limits", {}) if "/" in r}
    assert used_classes and used_classes <= set(classes)
    assert used_resources and used_resources <= extended


def test_claim_constraints_name_published_attributes() -> None:
    topo = load_preset("dgx1-v100")
    slices = draslices.build_slices(topo, Allocator(topo), "node-a", healthy=range(8), free=range(8))
    gpu_attrs = set(slices[1]["spec"]["devices"][0]["attributes"])
    for _name, doc in examples():
        if doc["kind"] == "ResourceClaim":
            for c in doc["spec"]["devices"].get("constraints", []):
                attr = c["matchAttribute"]
                short = attr.removeprefix("gputopo.io/")
                assert short in gpu_attrs or attr in gpu_attrs, attr


def test_component_is_documented() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "dra.md").read_text()
    for needle in ("components/dra", "dra.enabled", "DRAPartitionableDevices", "DRAExtendedResource"):
        assert needle in text
