"""Offline renders of what an operator would install: `kubectl kustomize` and Helm's own engine.

The chart is rendered by Helm's Go SDK (helm-python-sdk, a native library, no `helm` binary),
with `.Capabilities.KubeVersion` set to the version under test, as `helm install` sets it from
the API server. Both renders return parsed objects; tests skip cleanly where a tool is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
CHART = ROOT / "charts" / "gputopo"
NAMESPACE = "gputopo-system"
RELEASE = "gputopo"

Obj = dict[str, Any]


def kustomize_dir(path: Path) -> tuple[Obj, ...]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: cannot render the kustomizations offline")
    out = subprocess.run(
        [kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, f"kubectl kustomize {path} failed: {out.stderr.strip()}"
    return tuple(doc for doc in yaml.safe_load_all(out.stdout) if doc)


@cache
def kustomize(path: str) -> tuple[Obj, ...]:
    """deploy/<path> rendered."""
    return kustomize_dir(DEPLOY / path)


def kustomize_with(tmp: Path, resources: list[str], components: tuple[str, ...] = ()) -> tuple[Obj, ...]:
    """A throw-away overlay over deploy/ folders, as an operator would write one (kustomize
    wants paths relative to the overlay)."""

    def rel(p: str) -> str:
        return os.path.relpath(DEPLOY / p, tmp)

    doc: Obj = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [rel(r) for r in resources],
    }
    if components:
        doc["components"] = [rel(c) for c in components]
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump(doc))
    return kustomize_dir(tmp)


def _helm() -> Any:
    return pytest.importorskip("helm_python", reason="helm-python-sdk is not installed (pip install .[dev])")


def render_chart(
    values: Obj | None = None,
    kube_version: str = "v1.35.4",
    namespace: str = NAMESPACE,
    api_versions: tuple[str, ...] = (),
    release: str = RELEASE,
) -> tuple[Obj, ...]:
    """The chart's objects as `helm install` against a cluster of `kube_version` would send them.

    helm-python-sdk's `Chart.render` does not expose Helm's `kube_version`/`api_versions` render
    options (its `lint` does); the native call underneath accepts them, so they are passed there.
    """
    files = render_chart_files(json.dumps(values or {}), kube_version, namespace, api_versions, release)
    return tuple(
        doc
        for path, text in files.items()
        if not path.endswith("NOTES.txt")  # shown to the user, not sent to the API server
        for doc in yaml.safe_load_all(text)
        if doc
    )


@cache
def render_chart_files(
    values_json: str,
    kube_version: str,
    namespace: str,
    api_versions: tuple[str, ...],
    release: str = RELEASE,
) -> dict[str, str]:
    helm = _helm()
    from helm_python import _native

    opts = {"name": release, "namespace": namespace, "kube_version": kube_version, "is_install": True}
    if api_versions:
        opts["api_versions"] = list(api_versions)
    with helm.Chart.load(CHART) as chart:
        # The schema check `helm install` does before rendering.
        chart.validate_schema(json.loads(values_json))
        rendered: dict[str, str] = json.loads(
            _native.call_string("helm_render", chart._raw(), values_json, json.dumps(opts))
        )
    return rendered


def one(docs: tuple[Obj, ...], kind: str, name: str | None = None) -> Obj:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def container(pod_spec: Obj, name: str) -> Obj:
    return next(c for c in pod_spec["containers"] if c["name"] == name)


def _expression_holds(expr: Obj, labels: dict[str, str]) -> bool:
    """One node selector requirement against a node's labels, as the scheduler evaluates it
    (NotIn and DoesNotExist hold for a node without the key)."""
    key, op = expr["key"], expr["operator"]
    if op == "In":
        return key in labels and labels[key] in expr["values"]
    if op == "NotIn":
        return key not in labels or labels[key] not in expr["values"]
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    raise AssertionError(f"operator {op} not modelled")


def node_selected(pod_spec: Obj, labels: dict[str, str]) -> bool:
    """Whether a pod of this spec may run on a node with these labels: nodeSelector and every
    requirement of at least one required nodeSelectorTerm (the terms are ORed)."""
    if any(labels.get(k) != v for k, v in pod_spec.get("nodeSelector", {}).items()):
        return False
    required = (
        pod_spec.get("affinity", {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution")
    )
    if required is None:
        return True
    return any(
        all(_expression_holds(e, labels) for e in term.get("matchExpressions", []))
        for term in required["nodeSelectorTerms"]
    )


#: Nodes as the GPU Operator, GPU/node feature discovery and an operator label them, and whether
#: the plugin must run there (Helm and kustomize alike; evidence for docs/operator.md's table).
NODES = {
    "operator node, its plugin running": (
        {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.deploy.device-plugin": "true"},
        False,
    ),
    "operator node moved over to gputopo": (
        {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.deploy.device-plugin": "false"},
        True,
    ),
    "GPU feature discovery, no operator": ({"nvidia.com/gpu.present": "true"}, True),
    "node feature discovery only": ({"feature.node.kubernetes.io/pci-10de.present": "true"}, True),
    "opted out": ({"nvidia.com/gpu.present": "true", "gputopo.io/device-plugin": "false"}, False),
    "CPU node": ({"kubernetes.io/os": "linux"}, False),
}
