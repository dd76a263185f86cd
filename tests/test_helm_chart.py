"""charts/gputopo rendered by Helm's own engine, checked like deploy/ and against deploy/.

Helm's Go SDK renders the chart in process (helm-python-sdk, no `helm` binary, no cluster),
with `.Capabilities.KubeVersion` set per Kubernetes version as `helm install` sets it from the
API server. Every object is validated strictly against that version's OpenAPI schemas
(kubernetes-validate), the chart and the kustomize variants must render the same objects for
the same settings (compared whole, after removing what only Helm adds), values.schema.json must
refuse bad values, and the dashboard may only query series the daemons export.
"""

from __future__ import annotations

import copy
import json
import re
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from deviceplugin import settings as plugin_config
from deviceplugin.metrics import Metrics as PluginMetrics
from scheduler.__main__ import parser as sidecar_parser
from scheduler.report.metrics import Metrics as SidecarMetrics
from tests.manifests import CHART, NAMESPACE, NODES, ROOT, container, kustomize, one, render_chart

kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed")
jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is not installed")
helm = pytest.importorskip("helm_python", reason="helm-python-sdk is not installed (pip install .[dev])")

Obj = dict[str, Any]
# (what `helm install` would see from the API server, the kube-scheduler tag it must pick)
CLUSTERS = {
    "v1.28.15": "v1.28.15",
    "v1.29.4": "v1.29.4",
    "v1.30.5-gke.1014001": "v1.30.5",
    "v1.31.4": "v1.31.4",
    "v1.32.3-eks-4096722": "v1.32.3",
    "v1.33.5": "v1.33.5",
    "v1.34.1+k3s1": "v1.34.1",
    "v1.35.4": "v1.35.4",
    "v1.36.1": "v1.36.1",
}
POLICY_KINDS = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
MONITORING = {"metrics": {"serviceMonitor": {"enabled": True}, "grafanaDashboard": {"enabled": True}}}

# The fields of the Prometheus Operator's ServiceMonitor (monitoring.coreos.com/v1) the chart
# writes, strict: a misspelt field would be dropped silently by the operator.
SERVICE_MONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name", "namespace"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "jobLabel": {"type": "string"},
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"any": {"type": "boolean"}, "matchNames": {"type": "array"}},
                },
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "matchExpressions": {"type": "array"},
                    },
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": {
                                "type": "string",
                                "pattern": "^(0|(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
                            },
                            "scrapeTimeout": {"type": "string"},
                        },
                    },
                },
            },
        },
    },
}


def k8s_minor(version: str) -> str:
    major, minor = re.match(r"v?(\d+)\.(\d+)", version).groups()  # type: ignore[union-attr]
    return f"{major}.{minor}.0"


# ------------------------------------------------------------------ renders per Kubernetes version


@pytest.mark.parametrize("cluster", list(CLUSTERS))
def test_every_rendered_object_is_valid_for_that_kubernetes(cluster: str) -> None:
    docs = render_chart(MONITORING, kube_version=cluster)
    schema_version = k8s_minor(cluster)
    for doc in docs:
        label = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] == "ServiceMonitor":
            jsonschema.validate(doc, SERVICE_MONITOR_SCHEMA)
            continue
        try:
            kv.validate(doc, schema_version, strict=True)
        except kv.ValidationError as e:
            pytest.fail(f"{label} is not valid Kubernetes {schema_version}: {e.message} at {list(e.path)}")
    kinds = {d["kind"] for d in docs}
    has_policy = tuple(map(int, schema_version.split(".")[:2])) >= (1, 30)
    assert (kinds >= POLICY_KINDS) == has_policy, f"{cluster}: the admission policy exists from 1.30 on"
    assert len(docs) == (22 if has_policy else 20), sorted((d["kind"], d["metadata"]["name"]) for d in docs)


def test_strict_validation_catches_a_misspelt_field() -> None:
    """Guards the test above."""
    ds = copy.deepcopy(one(render_chart({}), "DaemonSet"))
    ds["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(kv.ValidationError):
        kv.validate(ds, "1.35.0", strict=True)
    sm = copy.deepcopy(one(render_chart(MONITORING), "ServiceMonitor"))
    sm["spec"]["endpoints"][0]["intervall"] = "30s"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(sm, SERVICE_MONITOR_SCHEMA)


@pytest.mark.parametrize(("cluster", "tag"), list(CLUSTERS.items()))
def test_kube_scheduler_follows_the_clusters_version(cluster: str, tag: str) -> None:
    spec = one(render_chart({}, kube_version=cluster), "Deployment")["spec"]["template"]["spec"]
    assert container(spec, "kube-scheduler")["image"] == f"registry.k8s.io/kube-scheduler:{tag}"


def test_a_set_kube_scheduler_tag_wins_over_the_clusters_version() -> None:
    values = {
        "images": {"kubeScheduler": {"repository": "mirror.example.com/kube-scheduler", "tag": "v1.31.9"}}
    }
    spec = one(render_chart(values, kube_version="v1.33.1"), "Deployment")["spec"]["template"]["spec"]
    assert container(spec, "kube-scheduler")["image"] == "mirror.example.com/kube-scheduler:v1.31.9"


def test_gputopo_images_default_to_the_charts_app_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"] == version
    docs = render_chart({})
    plugin = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    extender = container(one(docs, "Deployment")["spec"]["template"]["spec"], "extender")
    assert plugin["image"] == f"ghcr.io/gputopo/gputopo-device-plugin:{version}"
    assert extender["image"] == f"ghcr.io/gputopo/gputopo-scheduler-extender:{version}"
    values = {
        "images": {
            "devicePlugin": {"repository": "r.example.com/gdp", "tag": "dev-1", "pullPolicy": "Always"}
        }
    }
    plugin = one(render_chart(values), "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    assert (plugin["image"], plugin["imagePullPolicy"]) == ("r.example.com/gdp:dev-1", "Always")


def test_admission_policy_switch() -> None:
    def kinds(values: Obj, version: str) -> set[str]:
        return {d["kind"] for d in render_chart(values, kube_version=version)}

    assert not POLICY_KINDS & kinds({"admissionPolicy": {"enabled": False}}, "v1.35.0")
    assert (
        kinds({"admissionPolicy": {"enabled": True}}, "v1.29.0") >= POLICY_KINDS
    )  # v1beta1 users: their call
    assert not POLICY_KINDS & kinds({}, "v1.29.9")


def test_helm_lint_finds_no_warning() -> None:
    result = helm.lint(CHART, strict=True, kube_version="1.30.0")
    assert not result["errors"], result
    assert all(m["severity"] < 2 for m in result["messages"]), result["messages"]


# ------------------------------------------------------------------ chart == kustomize


HELM_ONLY_LABELS = {
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
}


def normalised(docs: tuple[Obj, ...]) -> dict[tuple[str, str, str], Obj]:
    """Objects by (kind, namespace, name), without what only one of the two tools adds.

    Helm adds its labels and a checksum annotation that rolls the pod on a config change;
    kustomize rolls it by a content hash in the ConfigMap's name instead. Config files are
    compared parsed, so comments may differ but no setting.
    """
    out: dict[tuple[str, str, str], Obj] = {}
    for doc in copy.deepcopy(docs):
        meta = doc["metadata"]
        for k in HELM_ONLY_LABELS:
            meta.get("labels", {}).pop(k, None)
        meta.get("annotations", {}).pop("helm.sh/resource-policy", None)
        if meta.get("annotations") == {}:
            del meta["annotations"]
        if doc["kind"] == "ConfigMap" and meta["name"].startswith("gputopo-scheduler-config"):
            meta["name"] = "gputopo-scheduler-config"
            doc["data"] = {k: yaml.safe_load(v) for k, v in doc["data"].items()}
        if doc["kind"] in ("Deployment", "DaemonSet"):
            tmeta = doc["spec"]["template"]["metadata"]
            tmeta["annotations"] = {
                k: v for k, v in tmeta.get("annotations", {}).items() if not k.startswith("checksum/")
            }
            for vol in doc["spec"]["template"]["spec"].get("volumes", []):
                if vol.get("configMap", {}).get("name", "").startswith("gputopo-scheduler-config"):
                    vol["configMap"]["name"] = "gputopo-scheduler-config"
        out[(doc["kind"], meta.get("namespace", ""), meta["name"])] = doc
    return out


def differences(chart: tuple[Obj, ...], kust: tuple[Obj, ...]) -> list[str]:
    """Every object or field in which the two renders differ; empty when they agree."""
    a, b = normalised(chart), normalised(tuple(d for d in kust if d["kind"] != "Namespace"))
    diffs = [f"only in the chart: {k}" for k in a.keys() - b.keys()]
    diffs += [f"only in kustomize: {k}" for k in b.keys() - a.keys()]

    def walk(x: Any, y: Any, path: str) -> None:
        if isinstance(x, dict) and isinstance(y, dict):
            for k in x.keys() | y.keys():
                walk(x.get(k, "<absent>"), y.get(k, "<absent>"), f"{path}.{k}")
        elif isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
            for i, (xi, yi) in enumerate(zip(x, y, strict=True)):
                walk(xi, yi, f"{path}[{i}]")
        elif x != y:
            diffs.append(f"{path}: chart {json.dumps(x)} != kustomize {json.dumps(y)}")

    for k in a.keys() & b.keys():
        walk(a[k], b[k], f"{k[0]}/{k[2]}")
    return sorted(diffs)


# The kube-scheduler tag kustomize pins, and the cluster version that makes the chart pick it;
# the APIs the cluster serves (the GPU Operator's ClusterPolicy turns its RuntimeClass on).
OPERATOR_API = ("nvidia.com/v1/ClusterPolicy",)
SAME_SETTINGS: dict[str, tuple[str, Obj, str, tuple[str, ...]]] = {
    "base": ("", {}, "v1.33.5", ()),
    "gpu-operator": ("overlays/gpu-operator", {}, "v1.33.5", OPERATOR_API),
    "gpu-operator, said by hand": (
        "overlays/gpu-operator",
        {"gpuOperator": {"enabled": True}},
        "v1.33.5",
        (),
    ),
    "kubernetes-1.28": ("overlays/kubernetes-1.28", {}, "v1.28.15", ()),
    "with-podgroup-crd": ("overlays/with-podgroup-crd", {"podGroupCRD": {"enabled": True}}, "v1.33.5", ()),
}
OPT_IN_KUSTOMIZE = "components/opt-in-policy"


def test_chart_opt_in_on_1_36_is_the_kustomize_component(tmp_path: Path) -> None:
    from tests.manifests import kustomize_with

    chart = render_chart(
        {"optIn": {"enabled": True}},
        kube_version="v1.33.5",
        api_versions=("admissionregistration.k8s.io/v1/MutatingAdmissionPolicy",),
    )
    assert differences(chart, kustomize_with(tmp_path, ["."], (OPT_IN_KUSTOMIZE,))) == []


@pytest.mark.parametrize("case", list(SAME_SETTINGS))
def test_chart_and_kustomize_render_the_same_objects(case: str) -> None:
    path, values, cluster, apis = SAME_SETTINGS[case]
    assert differences(render_chart(values, kube_version=cluster, api_versions=apis), kustomize(path)) == []


def test_the_comparison_notices_a_difference() -> None:
    """Guards the test above: one changed setting, one missing object, each is reported."""
    chart = render_chart({"plugin": {"metricsPort": 9500}})
    diffs = differences(chart, kustomize(""))
    assert any("GPUTOPO_METRICS_PORT" in d or "9500" in d for d in diffs), diffs
    no_quota = render_chart({"criticalPodsQuota": {"enabled": False}})
    assert "only in kustomize: ('ResourceQuota', 'gputopo-system', 'gputopo-critical-pods')" in differences(
        no_quota, kustomize("")
    )


# ------------------------------------------------------------------ values


BAD_VALUES = {
    "unknown key": {"replicas": 2},
    "misspelt nested key": {"plugin": {"tolerationz": []}},
    "tag with a space": {"images": {"extender": {"repository": "x/y", "tag": "a b", "pullPolicy": "Always"}}},
    "port 0": {"plugin": {"metricsPort": 0}},
    "metrics port on the extender's own port": {"scheduler": {"metricsPort": 8888}},
    "admission policy maybe": {"admissionPolicy": {"enabled": "maybe"}},
    "relative kubelet root": {"plugin": {"kubeletRoot": "var/lib/kubelet"}},
    "config name with a slash": {"plugin": {"config": {"a/b": {}}}},
    "pull policy": {"images": {"kubeScheduler": {"repository": "x", "tag": "", "pullPolicy": "Sometimes"}}},
    "env var name": {"plugin": {"env": [{"name": "1BAD", "value": "x"}]}},
    "no scheduler": {"scheduler": {"replicas": 0}},
    "lease in minutes without a unit": {"scheduler": {"leaderElection": {"leaseDuration": "15"}}},
    "the default scheduler's name": {"schedulerName": "default-scheduler"},
    "scheduler name with capitals": {"schedulerName": "GPU"},
    "gpu operator maybe": {"gpuOperator": {"enabled": "maybe"}},
    "opt-in mode": {"optIn": {"mode": "both"}},
    "webhook on the extender's port": {"scheduler": {"webhook": {"port": 8888}}},
    "fullname with a dot": {"fullnameOverride": "a.b"},
}


@pytest.mark.parametrize("what", list(BAD_VALUES))
def test_values_schema_refuses_bad_values(what: str) -> None:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError):
        chart.validate_schema(BAD_VALUES[what])


def test_default_values_pass_the_schema() -> None:
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema({})
        chart.validate_schema(yaml.safe_load((CHART / "values.yaml").read_text()))


def test_node_selection_tolerations_resources_and_priority_are_values() -> None:
    values = {
        "plugin": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}],
            "nodeSelector": {"pool": "a100"},
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
            ],
            "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
            "priorityClassName": "gpu-critical",
            "runtimeClassName": "nvidia-cdi",
        },
        "scheduler": {"priorityClassName": "sched-critical", "nodeSelector": {"role": "infra"}},
    }
    docs = render_chart(values)
    spec = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == values["plugin"]["nodeSelectorTerms"]
    assert spec["nodeSelector"] == {"pool": "a100"} and spec["runtimeClassName"] == "nvidia-cdi"
    assert (
        spec["tolerations"] == values["plugin"]["tolerations"] and spec["priorityClassName"] == "gpu-critical"
    )
    # Helm merges maps: a key the operator leaves out keeps its default (null removes it).
    assert spec["containers"][0]["resources"] == {
        "requests": {"cpu": "10m", "memory": "64Mi"},
        "limits": {"cpu": "1", "memory": "256Mi"},
    }
    sched = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert sched["priorityClassName"] == "sched-critical" and sched["nodeSelector"] == {"role": "infra"}
    quota = one(docs, "ResourceQuota")["spec"]["scopeSelector"]["matchExpressions"][0]["values"]
    assert quota == ["gpu-critical", "sched-critical"], "the quota must admit the classes in use"


def test_kubelet_root_moves_every_path_the_plugin_uses() -> None:
    spec = one(render_chart({"plugin": {"kubeletRoot": "/var/lib/k0s/kubelet/"}}), "DaemonSet")["spec"][
        "template"
    ]["spec"]
    c = spec["containers"][0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["GPUTOPO_KUBELET_DIR"] == "/var/lib/k0s/kubelet/device-plugins"
    assert env["GPUTOPO_POD_RESOURCES_SOCKET"] == "/var/lib/k0s/kubelet/pod-resources/kubelet.sock"
    assert {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v} == {
        "/var/lib/k0s/kubelet/device-plugins",
        "/var/lib/k0s/kubelet/pod-resources",
    }
    assert {m["mountPath"] for m in c["volumeMounts"]} >= {
        "/var/lib/k0s/kubelet/device-plugins",
        "/var/lib/k0s/kubelet/pod-resources",
    }


def test_extra_env_and_args_reach_the_daemons_which_accept_them() -> None:
    values = {
        "plugin": {
            "env": [{"name": "GPUTOPO_LOG_LEVEL", "value": "debug"}],
            "extraArgs": ["--health-recovery-seconds=120"],
        },
        "scheduler": {"extraArgs": ["--levels=kubernetes.io/hostname,topology.kubernetes.io/zone"]},
    }
    docs = render_chart(values)
    plugin = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value", "gpu-node-7") for e in plugin["env"]}
    cfg = plugin_config.load_config(plugin["args"], env)
    assert cfg.log_level == "debug" and cfg.health_recovery_seconds == 120
    extender = container(one(docs, "Deployment")["spec"]["template"]["spec"], "extender")
    args = sidecar_parser().parse_args(extender["args"])
    assert args.levels == "kubernetes.io/hostname,topology.kubernetes.io/zone"


def test_per_node_plugin_configs_are_one_configmap_mounted_at_the_config_dir() -> None:
    configs = {"dgx-h100": {"nvlinkGbpsPerLink": 25}, "pcie-l40s": {"pcieGbps": {"PIX": 24}}}
    docs = render_chart({"plugin": {"config": configs}})
    cm = one(docs, "ConfigMap", "gputopo-node-configs")
    # keys are the config names the plugin's node label selects; values its config files
    assert {k: yaml.safe_load(v) for k, v in cm["data"].items()} == {
        k: {"version": "v1", **v} for k, v in configs.items()
    }
    ds = one(docs, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    c = spec["containers"][0]
    (vol,) = [v for v in spec["volumes"] if v.get("configMap", {}).get("name") == cm["metadata"]["name"]]
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == vol["name"]]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert (
        env["GPUTOPO_CONFIG_DIR"] == mount["mountPath"] == "/etc/gputopo/node-configs" and mount["readOnly"]
    )
    assert vol["configMap"]["optional"] is True
    assert "GPUTOPO_NODE_CONFIG_LABEL" not in env  # the plugin's default label
    assert "checksum/plugin-config" in ds["spec"]["template"]["metadata"]["annotations"]
    # the plugin's own loader reads what the chart renders
    from deviceplugin.nodeconfig import config_names

    with tempfile.TemporaryDirectory() as tmp:
        for k, v in cm["data"].items():
            (Path(tmp) / k).write_text(v, encoding="utf-8")
        assert config_names(tmp) == sorted(configs)
    other = render_chart({"plugin": {"config": configs, "nodeConfigLabel": "example.com/gpu-profile"}})
    c2 = one(other, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"]: e.get("value") for e in c2["env"]}[
        "GPUTOPO_NODE_CONFIG_LABEL"
    ] == "example.com/gpu-profile"
    # Without configs the ConfigMap is not rendered; the optional mount stays for one made elsewhere.
    assert not [d for d in render_chart({}) if d["metadata"]["name"] == "gputopo-node-configs"]


# ------------------------------------------------------------------ monitoring


def test_service_monitor_finds_both_daemons_metrics_ports() -> None:
    docs = render_chart(MONITORING)
    sm = one(docs, "ServiceMonitor")
    selector = sm["spec"]["selector"]["matchLabels"]
    services = [
        d for d in docs if d["kind"] == "Service" and selector.items() <= d["metadata"]["labels"].items()
    ]
    assert {s["metadata"]["name"] for s in services} == {
        "gputopo-device-plugin-metrics",
        "gputopo-scheduler-metrics",
    }
    assert sm["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
    (endpoint,) = sm["spec"]["endpoints"]
    for svc in services:
        (port,) = [p for p in svc["spec"]["ports"] if p["name"] == endpoint["port"]]
        workload = next(
            d
            for d in docs
            if d["kind"] in ("DaemonSet", "Deployment")
            and svc["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
        )
        declared = {
            p["name"]: p["containerPort"]
            for c in workload["spec"]["template"]["spec"]["containers"]
            for p in c.get("ports", [])
        }
        assert declared[port["targetPort"]] == port["port"]
    assert not {"ServiceMonitor", "Service"} & {d["kind"] for d in render_chart({})}


def exported_series() -> set[str]:
    """Every series name the plugin and the sidecar expose, as Prometheus stores them."""
    suffixes = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
    names: set[str] = set()
    for registry in (PluginMetrics().registry, SidecarMetrics().registry):
        for family in registry.collect():
            names |= {family.name + s for s in suffixes.get(family.type, ("",))}
    return names


def dashboard() -> Obj:
    return json.loads((CHART / "dashboards" / "gputopo.json").read_text())


def test_dashboard_queries_only_series_the_daemons_export() -> None:
    exported = exported_series()
    queried: set[str] = set()
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            queried |= set(re.findall(r"\b(gputopo_[a-z0-9_]+)", target["expr"]))
    assert queried, "the dashboard queries nothing"
    assert queried <= exported, f"not exported: {sorted(queried - exported)}"
    # Every family of today's metrics has a panel (a series added later needs one added too).
    for family in (
        "gputopo_devices",
        "gputopo_preferred_allocation_seconds",
        "gputopo_extender_request_seconds",
        "gputopo_gang_plans",
        "gputopo_reservations_active",
        "gputopo_binds",
    ):
        assert any(q.startswith(family) for q in queried), family


def test_dashboard_panels_use_the_datasource_variable_and_do_not_overlap() -> None:
    d = dashboard()
    assert [v["name"] for v in d["templating"]["list"]] == ["datasource"]
    cells: set[tuple[int, int]] = set()
    for panel in d["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}"
        g = panel["gridPos"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {panel['title']!r} overlaps another"
        cells |= mine


def test_dashboard_configmap_carries_the_file() -> None:
    cm = one(render_chart(MONITORING), "ConfigMap", "gputopo-grafana-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["gputopo.json"]) == dashboard()


def test_install_notes_say_what_was_left_out_and_which_kube_scheduler() -> None:
    from tests.manifests import render_chart_files

    old = render_chart_files("{}", "v1.29.1", NAMESPACE, ())["gputopo/templates/NOTES.txt"]
    new = render_chart_files("{}", "v1.33.2", NAMESPACE, ())["gputopo/templates/NOTES.txt"]
    assert "registry.k8s.io/kube-scheduler:v1.29.1" in old and "admission policy" in old
    assert "registry.k8s.io/kube-scheduler:v1.33.2" in new and "admission policy" not in new
    assert "nvidia.com/gpu.deploy.device-plugin=false" in new
    assert "spec.schedulerName: gputopo-scheduler" in new


def test_install_notes_say_when_nodes_cannot_be_counted() -> None:
    """Offline (helm template, --dry-run) `lookup` lists no Node: the notes say so and how to
    see the DaemonSet's desired count, instead of claiming nodes match."""
    from tests.manifests import render_chart_files

    notes = render_chart_files(json.dumps({"fullnameOverride": "gpu-a"}), "v1.33.2", NAMESPACE, ())[
        "gputopo/templates/NOTES.txt"
    ]
    assert "could not list the cluster's Nodes" in notes
    assert f"kubectl -n {NAMESPACE} get daemonset gpu-a-device-plugin" in notes
    assert "exec ds/gpu-a-device-plugin" in notes and "spec.schedulerName: gpu-a-scheduler" in notes
    assert "objects named gpu-a-*" in notes


def test_the_charts_podgroup_crd_is_the_kustomize_components() -> None:
    """Helm cannot read deploy/, so the chart carries a copy; it must not drift."""
    chart_copy = (CHART / "files" / "podgroup-crd.yaml").read_bytes()
    assert chart_copy == (ROOT / "deploy" / "components" / "podgroup-crd" / "podgroup-crd.yaml").read_bytes()
    crd = one(render_chart({"podGroupCRD": {"enabled": True}}), "CustomResourceDefinition")
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert "CustomResourceDefinition" not in {d["kind"] for d in render_chart({})}


# ------------------------------------------------------------------ releases, failover, node selection


CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding",
    "MutatingWebhookConfiguration",
    "CustomResourceDefinition",
    "DeviceClass",
}


def identities(docs: tuple[Obj, ...]) -> set[tuple[str, str, str]]:
    return {
        (
            d["kind"],
            "" if d["kind"] in CLUSTER_SCOPED else d["metadata"].get("namespace", ""),
            d["metadata"]["name"],
        )
        for d in docs
    }


@pytest.mark.parametrize("namespace", [NAMESPACE, "gputopo-b"])
def test_two_releases_share_no_object_lease_label_or_scheduler_name(namespace: str) -> None:
    """`helm install gputopo` and `helm install other` (in the same namespace or another) own
    disjoint objects, select disjoint pods and answer to different scheduler names."""
    a = render_chart({}, release="gputopo")
    b = render_chart({}, namespace=namespace, release="other")
    assert not identities(a) & identities(b), sorted(identities(a) & identities(b))
    names_b = {d["metadata"]["name"] for d in b}
    assert "other-gputopo-device-plugin" in names_b and "other-gputopo-scheduler" in names_b

    def selectors(docs: tuple[Obj, ...]) -> list[dict[str, str]]:
        return [
            d["spec"]["selector"]["matchLabels"] for d in docs if d["kind"] in ("DaemonSet", "Deployment")
        ]

    def pod_labels(docs: tuple[Obj, ...]) -> list[dict[str, str]]:
        return [
            d["spec"]["template"]["metadata"]["labels"]
            for d in docs
            if d["kind"] in ("DaemonSet", "Deployment")
        ]

    for sel in selectors(a):
        assert not any(sel.items() <= labels.items() for labels in pod_labels(b)), sel
    for sel in selectors(b):
        assert not any(sel.items() <= labels.items() for labels in pod_labels(a)), sel

    def config(docs: tuple[Obj, ...]) -> Obj:
        cm = next(
            d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("scheduler-config")
        )
        return yaml.safe_load(cm["data"]["config.yaml"])

    ca, cb = config(a), config(b)
    assert ca["profiles"][0]["schedulerName"] == "gputopo-scheduler"
    assert cb["profiles"][0]["schedulerName"] == "other-gputopo-scheduler"
    assert ca["leaderElection"]["resourceName"] != cb["leaderElection"]["resourceName"]
    # The plugin's admission policy names the plugin's own service account of its release.
    vap = one(b, "ValidatingAdmissionPolicy")
    assert (
        f"system:serviceaccount:{namespace}:other-gputopo-device-plugin"
        in vap["spec"]["matchConditions"][0]["expression"]
    )
    assert one(b, "ValidatingAdmissionPolicyBinding")["spec"]["policyName"] == vap["metadata"]["name"]
    # RBAC binds each release's own accounts to its own roles.
    for binding in (d for d in b if d["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        for subject in binding["subjects"]:
            assert subject["name"].startswith("other-gputopo-") and subject["namespace"] == namespace
        if binding["roleRef"]["name"].startswith("system:") or binding["roleRef"]["name"].startswith(
            "extension-"
        ):
            continue
        assert binding["roleRef"]["name"] in names_b


#: Everything on that makes cluster-scoped objects: DRA (ClusterRole, binding, admission policy,
#: DeviceClasses), opt-in (a MutatingAdmissionPolicy on 1.36, the webhook on 1.33) and monitoring.
EVERYTHING_ON = {
    "dra": {"enabled": True, "driverName": "gputopo.io", "setSizes": [2, 4, 8, 16]},
    "optIn": {"enabled": True},
    **MONITORING,
}
#: Roles every cluster has, which each release binds (its own binding, the shared role).
BUILT_IN_ROLES = {
    "system:kube-scheduler",
    "system:volume-scheduler",
    "extension-apiserver-authentication-reader",
}


@pytest.mark.parametrize("cluster", ["v1.36.2", "v1.33.5"])
@pytest.mark.parametrize("namespace", [NAMESPACE, "gputopo-b"])
def test_two_releases_with_everything_on_share_no_cluster_scoped_object(cluster: str, namespace: str) -> None:
    """A cluster-scoped name two releases share is a failed `helm install` of the second
    ("exists and cannot be imported into the current release"), or with `kubectl apply` a
    silent takeover: the second binding replaces the first, whose plugin then loses its
    ResourceSlice rights. So no (kind, name) of a cluster-scoped object may be in both, and
    every binding and policy binding must point at its own release's role, policy and
    ServiceAccount, never the other's."""
    a = render_chart(EVERYTHING_ON, kube_version=cluster, release="gputopo")
    b = render_chart(EVERYTHING_ON, kube_version=cluster, namespace=namespace, release="other")
    for docs in (a, b):
        unplaced = [
            (d["kind"], d["metadata"]["name"])
            for d in docs
            if d["kind"] not in CLUSTER_SCOPED and not d["metadata"].get("namespace")
        ]
        assert not unplaced, (
            f"namespaced objects without a namespace, or a cluster-scoped kind to list: {unplaced}"
        )

    def cluster_scoped(docs: tuple[Obj, ...]) -> set[tuple[str, str]]:
        return {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] in CLUSTER_SCOPED}

    assert {"DeviceClass", "ClusterRoleBinding", "ValidatingAdmissionPolicy"} <= {
        k for k, _ in cluster_scoped(b)
    }
    shared = cluster_scoped(a) & cluster_scoped(b)
    assert not shared, sorted(shared)

    def extended(docs: tuple[Obj, ...]) -> set[str]:
        return {d["spec"]["extendedResourceName"] for d in docs if d["kind"] == "DeviceClass"}

    # "should be unique among all the device classes in a cluster" (DeviceClassSpec)
    assert len(extended(a)) == len(extended(b)) == 5 and not extended(a) & extended(b)

    for mine, ns, theirs in ((a, NAMESPACE, b), (b, namespace, a)):
        roles = {(d["kind"], d["metadata"]["name"]) for d in mine if d["kind"] in ("Role", "ClusterRole")}
        accounts = {(ns, d["metadata"]["name"]) for d in mine if d["kind"] == "ServiceAccount"}
        other_accounts = {
            (d["metadata"]["namespace"], d["metadata"]["name"])
            for d in theirs
            if d["kind"] == "ServiceAccount"
        }
        for binding in (d for d in mine if d["kind"] in ("ClusterRoleBinding", "RoleBinding")):
            label = f"{binding['kind']}/{binding['metadata']['name']}"
            ref = binding["roleRef"]
            assert (ref["kind"], ref["name"]) in roles or ref["name"] in BUILT_IN_ROLES, label
            for subject in binding["subjects"]:
                assert (subject["namespace"], subject["name"]) in accounts, label
                assert (subject["namespace"], subject["name"]) not in other_accounts, label
        policies = {
            (d["kind"], d["metadata"]["name"])
            for d in mine
            if d["kind"] in ("ValidatingAdmissionPolicy", "MutatingAdmissionPolicy")
        }
        for binding in (d for d in mine if d["kind"].endswith("AdmissionPolicyBinding")):
            policy_kind = binding["kind"].removesuffix("Binding")
            assert (policy_kind, binding["spec"]["policyName"]) in policies, binding["metadata"]["name"]
        for vap in (d for d in mine if d["kind"] == "ValidatingAdmissionPolicy"):
            users = re.findall(
                r"system:serviceaccount:([^:']+):([^']+)'", json.dumps(vap["spec"]["matchConditions"])
            )
            assert users and all(tuple(u) in accounts for u in users), vap["metadata"]["name"]


def test_name_overrides_and_scheduler_name_are_values() -> None:
    docs = render_chart({"fullnameOverride": "gpu-a", "schedulerName": "topo"})
    assert {d["metadata"]["name"] for d in docs if d["kind"] in ("DaemonSet", "Deployment")} == {
        "gpu-a-device-plugin",
        "gpu-a-scheduler",
    }
    cm = one(docs, "ConfigMap", "gpu-a-scheduler-config")
    assert yaml.safe_load(cm["data"]["config.yaml"])["profiles"][0]["schedulerName"] == "topo"
    named = render_chart({"nameOverride": "topo"}, release="prod")
    assert "prod-topo-scheduler" in {d["metadata"]["name"] for d in named}
    # Every name fits: a 40-character stem plus the longest suffix stays within a label value
    # (63) where the name is one, and Services (DNS labels) too.
    long = render_chart(MONITORING, release="a" * 53)
    for d in long:
        meta = d["metadata"]
        assert len(meta.get("labels", {}).get("app.kubernetes.io/name", "")) <= 63, meta["name"]
        assert len(meta["name"]) <= (63 if d["kind"] == "Service" else 253), meta["name"]


def test_schedulers_stand_by_on_other_nodes_with_a_budget_and_operator_set_lease() -> None:
    docs = render_chart({})
    deploy = one(docs, "Deployment")
    assert deploy["spec"]["replicas"] == 2
    assert deploy["spec"]["strategy"]["type"] == "RollingUpdate"
    assert deploy["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    anti = deploy["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert "preferredDuringSchedulingIgnoredDuringExecution" in anti
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert (
        pdb["spec"]["selector"]["matchLabels"].items()
        <= deploy["spec"]["template"]["metadata"]["labels"].items()
    )

    values = {
        "scheduler": {
            "replicas": 3,
            "antiAffinity": "hard",
            "leaderElection": {"leaseDuration": "30s", "renewDeadline": "20s", "retryPeriod": "4s"},
        }
    }
    docs = render_chart(values)
    deploy = one(docs, "Deployment")
    assert deploy["spec"]["replicas"] == 3
    (term,) = deploy["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    le = yaml.safe_load(one(docs, "ConfigMap", "gputopo-scheduler-config")["data"]["config.yaml"])[
        "leaderElection"
    ]
    assert (le["leaseDuration"], le["renewDeadline"], le["retryPeriod"]) == ("30s", "20s", "4s")
    none = one(render_chart({"scheduler": {"antiAffinity": "none"}}), "Deployment")["spec"]["template"][
        "spec"
    ]
    assert "affinity" not in none
    mine = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "role", "operator": "In", "values": ["infra"]}]}
                ]
            }
        }
    }
    own = one(render_chart({"scheduler": {"affinity": mine}}), "Deployment")["spec"]["template"]["spec"]
    assert own["affinity"] == mine, "a set affinity replaces the default spread"
    assert "PodDisruptionBudget" not in {
        d["kind"]
        for d in render_chart({"scheduler": {"podDisruptionBudget": {"enabled": False, "maxUnavailable": 1}}})
    }


@pytest.mark.parametrize("operator", ["installed", "absent"])
@pytest.mark.parametrize("what", list(NODES))
def test_default_node_selection_with_and_without_the_gpu_operator(operator: str, what: str) -> None:
    """One default for every cluster: never beside the operator's own plugin, never nowhere."""
    from tests.manifests import node_selected

    apis = OPERATOR_API if operator == "installed" else ()
    spec = one(render_chart({}, api_versions=apis), "DaemonSet")["spec"]["template"]["spec"]
    labels, expected = NODES[what]
    assert node_selected(spec, labels) is expected
    assert spec.get("runtimeClassName") == ("nvidia" if operator == "installed" else None)


def notes_with_nodes(tmp_path: Path, nodes: list[Obj], values: Obj | None = None) -> str:
    """NOTES.txt as `helm install` prints it on a cluster with these Nodes. Helm's `lookup`
    lists nothing offline, so a copy of the chart reads the same unstructured objects (what
    `lookup` returns: {"items": [...]}) from a file instead; the template is otherwise the
    shipped one."""
    import shutil as _shutil

    from helm_python import _native

    copy_dir = tmp_path / "gputopo"
    _shutil.copytree(CHART, copy_dir)
    notes = copy_dir / "templates" / "NOTES.txt"
    text = notes.read_text()
    assert text.count('lookup "v1" "Node" "" ""') == 1
    notes.write_text(
        text.replace('lookup "v1" "Node" "" ""', '(.Files.Get "files/test-nodes.json" | fromJson)')
    )
    (copy_dir / "files" / "test-nodes.json").write_text(json.dumps({"items": nodes}))
    opts = {"name": "gputopo", "namespace": NAMESPACE, "kube_version": "v1.33.5", "is_install": True}
    with helm.Chart.load(copy_dir) as chart:
        rendered = json.loads(
            _native.call_string("helm_render", chart._raw(), json.dumps(values or {}), json.dumps(opts))
        )
    return str(rendered["gputopo/templates/NOTES.txt"])


def k8s_node(name: str, labels: dict[str, str], gpus: str | None = None) -> Obj:
    status: Obj = {"allocatable": {"cpu": "64"}}
    if gpus is not None:
        status["allocatable"]["nvidia.com/gpu"] = gpus
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": status,
    }


def test_install_notes_count_the_nodes_the_plugin_selects(tmp_path: Path) -> None:
    nodes = [
        k8s_node(what.replace(" ", "-").replace(",", "").lower(), labels)
        for what, (labels, _) in NODES.items()
    ] + [k8s_node("unlabelled-gpu-node", {}, gpus="8")]
    expected = sum(1 for _, ok in NODES.values() if ok)
    notes = notes_with_nodes(tmp_path, nodes)
    gpu_like = (
        sum(
            1
            for labels, _ in NODES.values()
            if "nvidia.com/gpu.present" in labels or any("pci-10de" in k for k in labels)
        )
        + 1
    )
    assert (
        f"{expected} of the cluster's {len(nodes)} Nodes are selected ({gpu_like} look like GPU nodes)"
        in notes
    )
    assert "WARNING" not in notes


def test_install_notes_warn_when_no_node_matches(tmp_path: Path) -> None:
    """The silent install the notes exist for: a GPU Operator cluster where no node was moved over."""
    nodes = [
        k8s_node(
            "gpu-a01", {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.deploy.device-plugin": "true"}, "8"
        ),
        k8s_node(
            "gpu-a02", {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.deploy.device-plugin": "true"}, "8"
        ),
        k8s_node("cpu-1", {"kubernetes.io/os": "linux"}),
    ]
    notes = notes_with_nodes(tmp_path, nodes)
    assert "0 of the cluster's 3 Nodes are selected (2 look like GPU nodes)" in notes
    assert "WARNING: no Node matches" in notes and "GPU nodes: gpu-a01, gpu-a02." in notes
    assert "nvidia.com/gpu.deploy.device-plugin=false --overwrite" in notes
    # plugin.nodeSelector narrows the count as the scheduler would
    narrowed = notes_with_nodes(
        tmp_path / "b",
        [k8s_node("gpu-b1", {"nvidia.com/gpu.present": "true"})],
        {"plugin": {"nodeSelector": {"pool": "a"}}},
    )
    assert "0 of the cluster's 1 Nodes are selected" in narrowed


# ------------------------------------------------------------------ what docs/operator.md says


def operator_doc() -> str:
    return (ROOT / "docs" / "operator.md").read_text()


def test_the_docs_name_the_scheduler_configmap_each_install_method_makes() -> None:
    """The chart's ConfigMap has no hash (its pods roll by a checksum annotation); kustomize's
    configMapGenerator appends one. An operator looking for `…-config-<hash>` after
    `helm install` finds nothing, so the docs name each."""
    chart_name = one(render_chart({}), "ConfigMap", "gputopo-scheduler-config")["metadata"]["name"]
    kust = [d["metadata"]["name"] for d in kustomize("") if d["kind"] == "ConfigMap"]
    assert len(kust) == 1 and re.fullmatch(r"gputopo-scheduler-config-[a-z0-9]{10}", kust[0]), kust
    (row,) = [line for line in operator_doc().splitlines() if line.startswith("| ConfigMap ")]
    assert f"`{chart_name}` (Helm" in row
    assert "`gputopo-scheduler-config-<hash>` (kustomize" in row
    deploy = one(render_chart({}), "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert any(f"`{k}`" in row for k in deploy if k.startswith("checksum/")), row


def test_troubleshooting_names_the_mutating_admission_policy_gate_and_the_webhook_value() -> None:
    """On 1.36 the v1 API is served with `--feature-gates=MutatingAdmissionPolicy=false`, so the
    chart installs a policy nothing runs and pods are silently not mutated: the troubleshooting
    table must name that cause, how to see it, and a fix that is a real value of the chart."""
    rows = [line for line in operator_doc().splitlines() if "MutatingAdmissionPolicy=false" in line]
    assert any(
        r.startswith("| pods in opted-in namespaces keep `schedulerName: default-scheduler`") for r in rows
    )
    (row,) = [r for r in rows if r.startswith("| pods in opted-in")]
    assert "kubernetes_feature_enabled" in row and "mutatingadmissionpolicies" in row
    fix = re.search(r"Turn the gate back on, or install with `optIn\.mode=(\w+)`", row)
    assert fix is not None, row
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert fix.group(1) in schema["properties"]["optIn"]["properties"]["mode"]["enum"]
    docs = render_chart({"optIn": {"enabled": True, "mode": fix.group(1)}}, kube_version="v1.36.2")
    assert "MutatingWebhookConfiguration" in {d["kind"] for d in docs}
