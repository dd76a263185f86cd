"""The plugin's ValidatingAdmissionPolicy: its own Node, only the gputopo.io/topology annotation.

The CEL evaluated is the CEL shipped: the policy is taken from `kubectl kustomize deploy/`, from
the overlay with components/admission-policy-without-node-claim, and from the Helm chart
rendered by Helm's engine, never from a copy. Requests are built as kube-apiserver builds them
for the plugin's one call (a merge patch of its Node's annotation) and for what a compromised
plugin could try instead; tests/admission.py evaluates them with cel-python.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deviceplugin import defaults as plugin_defaults
from gputopo.network.annotation import encode, make
from gputopo.node.topofile import load_preset
from tests.admission import Decision, admission_request, evaluate
from tests.manifests import NAMESPACE, kustomize, kustomize_with, one, render_chart

POLICY = "gputopo-device-plugin-node-scope"
PLUGIN_SA = "gputopo-device-plugin"
NODE_CLAIM = "authentication.kubernetes.io/node-name"
OWN, OTHER = "gpu-node-7", "gpu-node-8"
Obj = dict[str, Any]


def policy_pair(docs: tuple[Obj, ...]) -> tuple[Obj, Obj]:
    return one(docs, "ValidatingAdmissionPolicy", POLICY), one(
        docs, "ValidatingAdmissionPolicyBinding", POLICY
    )


@pytest.fixture(scope="module")
def variants(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Obj, Obj]]:
    """Every shipped form of the policy, by how it is installed."""
    tmp = tmp_path_factory.mktemp("overlay")
    return {
        "kustomize": policy_pair(kustomize("")),
        "chart": policy_pair(render_chart({}, kube_version="v1.32.3")),
        "kustomize-without-node-claim": policy_pair(
            kustomize_with(tmp, ["."], ("components/admission-policy-without-node-claim",))
        ),
        "chart-without-node-claim": policy_pair(
            render_chart({"admissionPolicy": {"requireNodeClaim": False}}, kube_version="v1.30.0")
        ),
    }


STRICT = ("kustomize", "chart")
LENIENT = ("kustomize-without-node-claim", "chart-without-node-claim")
ALL = STRICT + LENIENT


def node(name: str = OWN) -> Obj:
    """A GPU Node as the API server stores it (what `oldObject` is)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "81234",
            "creationTimestamp": "2026-11-02T08:00:00Z",
            "labels": {
                "kubernetes.io/hostname": name,
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.deploy.device-plugin": "false",
                "network.topology.nvidia.com/leaf": "leaf-a",
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
            "managedFields": [
                {
                    "manager": "kubelet",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-11-02T08:00:00Z",
                }
            ],
        },
        "spec": {
            "podCIDR": "10.244.7.0/24",
            "podCIDRs": ["10.244.7.0/24"],
            "providerID": f"aws:///us-east-1a/i-{name}",
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
        },
        "status": {
            "capacity": {"cpu": "96", "memory": "1056000000Ki", "nvidia.com/gpu": "8"},
            "allocatable": {"cpu": "95", "memory": "1040000000Ki", "nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch, what the API server applies for application/merge-patch+json."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def publisher_patch(name: str = OWN) -> Obj:
    """The body the plugin's publisher sends: one merge patch of its annotation."""
    text = encode(make(name, load_preset("dgx1-v100"), generated_at=1_790_000_000.0, plugin_version="0.1.0"))
    return {"metadata": {"annotations": {plugin_defaults.TOPOLOGY_ANNOTATION: text}}}


def after(old: Obj, patch: Obj) -> Obj:
    """`object` as admission sees it: the patch applied, resourceVersion and managedFields moved on."""
    new = merge_patch(old, patch)
    new["metadata"]["resourceVersion"] = str(int(old["metadata"]["resourceVersion"]) + 1)
    new["metadata"]["managedFields"] = [
        *old["metadata"]["managedFields"],
        {"manager": "gputopo-device-plugin", "operation": "Update", "apiVersion": "v1"},
    ]
    return new


def sa_user(namespace: str = NAMESPACE, name: str = PLUGIN_SA, node_name: str | None = OWN) -> Obj:
    """userInfo of a pod-bound service-account token (node claims only where the cluster adds them)."""
    extra: dict[str, list[str]] = {
        "authentication.kubernetes.io/pod-name": [f"{name}-x7k2p"],
        "authentication.kubernetes.io/pod-uid": ["3c7d4c1e-0d5b-4c38-9a63-5b0f8a2b1f10"],
        "authentication.kubernetes.io/credential-id": ["JTI=8d1c0f5e-0e0b-4a7e-9d5c-7d3f2a1b0c9e"],
    }
    if node_name is not None:
        extra[NODE_CLAIM] = [node_name]
        extra["authentication.kubernetes.io/node-uid"] = [f"uid-{node_name}"]
    return {
        "username": f"system:serviceaccount:{namespace}:{name}",
        "uid": "1f0a2b3c-4d5e-6f70-8192-a3b4c5d6e7f8",
        "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"],
        "extra": extra,
    }


def update(
    variants: dict[str, tuple[Obj, Obj]],
    variant: str,
    patch: Obj,
    user: Obj | None = None,
    name: str = OWN,
    subresource: str = "",
) -> Decision:
    old = node(name)
    new = after(old, patch)
    req = admission_request("UPDATE", user if user is not None else sa_user(), new, old, subresource)
    return evaluate(*variants[variant], req, new, old)


# ------------------------------------------------------------------ what the plugin does


@pytest.mark.parametrize("variant", ALL)
def test_the_publishers_own_patch_of_its_own_node_is_allowed(variants: dict, variant: str) -> None:
    d = update(variants, variant, publisher_patch())
    assert d.matched and d.allowed, d.reasons


@pytest.mark.parametrize("variant", ALL)
def test_replacing_and_removing_its_annotation_is_allowed(variants: dict, variant: str) -> None:
    old = after(node(), publisher_patch())
    for patch in (
        publisher_patch(),
        {"metadata": {"annotations": {plugin_defaults.TOPOLOGY_ANNOTATION: None}}},
    ):
        new = after(old, patch)
        d = evaluate(*variants[variant], admission_request("UPDATE", sa_user(), new, old), new, old)
        assert d.allowed, (patch, d.reasons)


# ------------------------------------------------------------------ what a compromised plugin might try


@pytest.mark.parametrize("variant", ALL)
def test_another_nodes_annotation_is_denied(variants: dict, variant: str) -> None:
    d = update(variants, variant, publisher_patch(OTHER), name=OTHER)
    assert d.matched and not d.allowed
    assert any(f"on Node {OWN} may not change Node {OTHER}" in r for r in d.reasons), d.reasons


LABEL_AND_TAINT_PATCHES = {
    "label added": {"metadata": {"labels": {"network.topology.nvidia.com/leaf": None, "evil": "1"}}},
    "leaf label changed": {"metadata": {"labels": {"network.topology.nvidia.com/leaf": "leaf-b"}}},
    "label removed": {"metadata": {"labels": {"nvidia.com/gpu.deploy.device-plugin": None}}},
    "taint removed": {"spec": {"taints": None}},
    "taint added": {
        "spec": {
            "taints": [
                {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                {"key": "evict", "effect": "NoExecute"},
            ]
        }
    },
    "cordon": {"spec": {"unschedulable": True}},
    "pod CIDR": {"spec": {"podCIDR": "10.0.0.0/8", "podCIDRs": ["10.0.0.0/8"]}},
    "other annotation changed": {"metadata": {"annotations": {"node.alpha.kubernetes.io/ttl": "30"}}},
    "other annotation added": {"metadata": {"annotations": {"gputopo.io/required-topology": "x"}}},
    "other annotation removed": {"metadata": {"annotations": {"node.alpha.kubernetes.io/ttl": None}}},
    "finalizer added": {"metadata": {"finalizers": ["example.com/block-delete"]}},
    "annotation and label together": merge_patch(
        publisher_patch(), {"metadata": {"labels": {"network.topology.nvidia.com/leaf": "leaf-b"}}}
    ),
}


@pytest.mark.parametrize("variant", ALL)
@pytest.mark.parametrize("what", list(LABEL_AND_TAINT_PATCHES))
def test_own_nodes_labels_taints_spec_and_other_annotations_are_denied(
    variants: dict, variant: str, what: str
) -> None:
    d = update(variants, variant, LABEL_AND_TAINT_PATCHES[what])
    assert d.matched and not d.allowed, what
    assert all(not r.startswith("error:") for r in d.reasons), d.reasons


@pytest.mark.parametrize("variant", ALL)
def test_status_through_the_status_subresource_is_denied(variants: dict, variant: str) -> None:
    patch = {"status": {"allocatable": {"nvidia.com/gpu": "16"}}}
    d = update(variants, variant, patch, subresource="status")
    assert d.matched and not d.allowed and any("status" in r for r in d.reasons), d.reasons


@pytest.mark.parametrize("variant", ALL)
@pytest.mark.parametrize("operation", ["CREATE", "DELETE"])
def test_creating_or_deleting_a_node_is_denied(variants: dict, variant: str, operation: str) -> None:
    n = node()
    obj, old = (n, None) if operation == "CREATE" else (None, n)
    d = evaluate(*variants[variant], admission_request(operation, sa_user(), obj, old), obj, old)
    assert d.matched and not d.allowed
    assert any("never create or delete" in r for r in d.reasons), d.reasons


# ------------------------------------------------------------------ the node-name claim


@pytest.mark.parametrize("variant", STRICT)
def test_without_the_node_claim_the_strict_policy_allows_no_node(variants: dict, variant: str) -> None:
    d = update(variants, variant, publisher_patch(), user=sa_user(node_name=None))
    assert not d.allowed and any("without a node-name claim" in r for r in d.reasons), d.reasons


@pytest.mark.parametrize("variant", LENIENT)
def test_without_the_node_claim_the_fallback_still_restricts_the_fields(variants: dict, variant: str) -> None:
    no_claim = sa_user(node_name=None)
    assert update(variants, variant, publisher_patch(OTHER), user=no_claim, name=OTHER).allowed
    for what, patch in LABEL_AND_TAINT_PATCHES.items():
        assert not update(variants, variant, patch, user=no_claim).allowed, what
    # A token that names a node is still held to it.
    assert not update(variants, variant, publisher_patch(OTHER), name=OTHER).allowed


@pytest.mark.parametrize("variant", ALL)
def test_an_ambiguous_node_claim_counts_as_none(variants: dict, variant: str) -> None:
    user = sa_user()
    user["extra"][NODE_CLAIM] = [OWN, OTHER]
    d = update(variants, variant, publisher_patch(OTHER), user=user, name=OTHER)
    assert not d.allowed or variant in LENIENT
    assert not update(variants, variant, LABEL_AND_TAINT_PATCHES["cordon"], user=user).allowed


# ------------------------------------------------------------------ who is judged


OTHER_USERS = {
    "kubelet": {"username": f"system:node:{OWN}", "groups": ["system:nodes", "system:authenticated"]},
    "cluster admin": {
        "username": "kubernetes-admin",
        "groups": ["kubeadm:cluster-admins", "system:authenticated"],
    },
    "the scheduler's service account": sa_user(name="gputopo-scheduler"),
    "same name, other namespace": sa_user(namespace="default"),
    "GPU Operator's feature discovery": sa_user(namespace="gpu-operator", name="node-feature-discovery"),
}


@pytest.mark.parametrize("variant", ALL)
@pytest.mark.parametrize("who", list(OTHER_USERS))
def test_other_users_are_not_matched(variants: dict, variant: str, who: str) -> None:
    for patch in (LABEL_AND_TAINT_PATCHES["leaf label changed"], LABEL_AND_TAINT_PATCHES["cordon"]):
        d = update(variants, variant, patch, user=OTHER_USERS[who], name=OTHER)
        assert d == Decision(matched=False, allowed=True), (who, d)


def test_a_pod_or_configmap_request_is_outside_the_policy(variants: dict) -> None:
    req = admission_request("UPDATE", sa_user(), node(), node())
    req["resource"] = {"group": "", "version": "v1", "resource": "configmaps"}
    assert evaluate(*variants["kustomize"], req, node(), node()) == Decision(matched=False, allowed=True)


# ------------------------------------------------------------------ the design


@pytest.mark.parametrize("variant", ALL)
def test_policy_is_paramless_fail_closed_and_denies(variants: dict, variant: str) -> None:
    policy, binding = variants[variant]
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert "paramKind" not in policy["spec"] and "paramRef" not in binding["spec"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert "matchResources" not in binding["spec"], "the binding must not narrow the policy's match"
    (cond,) = policy["spec"]["matchConditions"]
    assert cond["expression"].strip() == (
        f"request.userInfo.username == 'system:serviceaccount:{NAMESPACE}:{PLUGIN_SA}'"
    )


def test_match_condition_names_the_daemonsets_service_account() -> None:
    """Renaming the account in one place and not the other would silently disable the policy."""
    for docs in (kustomize(""), render_chart({}, kube_version="v1.33.0")):
        ds = one(docs, "DaemonSet", "gputopo-device-plugin")
        sa = ds["spec"]["template"]["spec"]["serviceAccountName"]
        policy, _ = policy_pair(docs)
        expr = policy["spec"]["matchConditions"][0]["expression"]
        assert f"system:serviceaccount:{ds['metadata']['namespace']}:{sa}'" in expr


def test_the_only_annotation_let_through_is_the_one_the_plugin_publishes(variants: dict) -> None:
    for variant in ALL:
        policy, _ = variants[variant]
        literals = {
            m
            for v in policy["spec"]["validations"]
            for m in re.findall(r"'([a-z0-9.-]+\.[a-z]+/[A-Za-z0-9._-]+)'", v["expression"])
        }
        assert literals == {plugin_defaults.TOPOLOGY_ANNOTATION}, (variant, literals)


def test_the_evaluator_would_notice_a_weakened_policy(variants: dict) -> None:
    """Guards every test above: with the annotation rule removed, a forbidden patch gets through."""
    policy, binding = copy.deepcopy(variants["kustomize"])
    policy["spec"]["validations"] = [
        v for v in policy["spec"]["validations"] if "gputopo.io/topology" not in v["expression"]
    ]
    weakened = {"kustomize": (policy, binding)}
    assert update(weakened, "kustomize", LABEL_AND_TAINT_PATCHES["other annotation changed"]).allowed
    assert not update(variants, "kustomize", LABEL_AND_TAINT_PATCHES["other annotation changed"]).allowed


# ------------------------------------------------------------------ against an oracle

LABEL_KEYS = ["kubernetes.io/hostname", "network.topology.nvidia.com/leaf", "evil.example.com/x"]
ANNOTATION_KEYS = [plugin_defaults.TOPOLOGY_ANNOTATION, "node.alpha.kubernetes.io/ttl", "example.com/other"]
values = st.one_of(st.none(), st.sampled_from(["a", "b", "leaf-a", "0", OWN]))
changes = st.fixed_dictionaries(
    {
        "labels": st.dictionaries(st.sampled_from(LABEL_KEYS), values, max_size=3),
        "annotations": st.dictionaries(st.sampled_from(ANNOTATION_KEYS), values, max_size=3),
        "unschedulable": st.sampled_from([None, True, False]),
        "taints": st.sampled_from([None, "drop", "add"]),
    }
)


def oracle_patch(change: Obj) -> Obj:
    patch: Obj = {"metadata": {}}
    if change["labels"]:
        patch["metadata"]["labels"] = change["labels"]
    if change["annotations"]:
        patch["metadata"]["annotations"] = change["annotations"]
    spec: Obj = {}
    if change["unschedulable"] is not None:
        spec["unschedulable"] = change["unschedulable"]
    if change["taints"] == "drop":
        spec["taints"] = None
    elif change["taints"] == "add":
        spec["taints"] = [*node()["spec"]["taints"], {"key": "k", "effect": "NoSchedule"}]
    if spec:
        patch["spec"] = spec
    return patch


def only_the_annotation_differs(old: Obj, new: Obj) -> bool:
    """The rule in plain Python: everything but the topology annotation is as it was."""

    def strip(n: Obj) -> Obj:
        n = copy.deepcopy(n)
        for k in ("resourceVersion", "managedFields"):
            n["metadata"].pop(k, None)
        n["metadata"].get("annotations", {}).pop(plugin_defaults.TOPOLOGY_ANNOTATION, None)
        if not n["metadata"].get("annotations"):
            n["metadata"].pop("annotations", None)
        if not n["metadata"].get("labels"):
            n["metadata"].pop("labels", None)
        return n

    return strip(old) == strip(new)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(change=changes, own=st.booleans())
def test_random_node_edits_are_allowed_exactly_when_the_oracle_says(
    variants: dict, change: Obj, own: bool
) -> None:
    name = OWN if own else OTHER
    old = node(name)
    new = after(old, oracle_patch(change))
    expected = own and only_the_annotation_differs(old, new)
    for variant in STRICT:
        d = evaluate(*variants[variant], admission_request("UPDATE", sa_user(), new, old), new, old)
        assert d.allowed == expected, (variant, change, d.reasons)
