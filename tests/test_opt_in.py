"""Pods opt in to gputopo's scheduler without being edited: the shipped MutatingAdmissionPolicy
(its CEL run with cel-python, tests/mutation.py) and the webhook configuration the chart
chooses where the cluster serves no such policy.

Every shipped form is evaluated, never a copy: the chart rendered by Helm's engine for each
API version it can choose (v1 from 1.36, v1beta1 and v1alpha1 where the cluster turned them
on) and the kustomize component. A pod is handed over exactly when it asks for nvidia.com/gpu,
names no scheduler of its own, and is opted in by its namespace's or its own label; a property
test holds the policy to that rule over random pods.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.manifests import NAMESPACE, container, kustomize_with, one, render_chart
from tests.mutation import admit, conditions_hold

kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed")
Obj = dict[str, Any]
OPT_IN = {"gputopo.io/opt-in": "true"}
MAP_KINDS = {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}


def api(version: str) -> tuple[str, ...]:
    return (f"admissionregistration.k8s.io/{version}/MutatingAdmissionPolicy",)


def policy_of(docs: tuple[Obj, ...]) -> tuple[Obj, list[Obj]]:
    policy = one(docs, "MutatingAdmissionPolicy")
    bindings = [d for d in docs if d["kind"] == "MutatingAdmissionPolicyBinding"]
    return policy, bindings


@pytest.fixture(scope="module")
def forms(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Obj, list[Obj], str]]:
    """Every shipped form of the policy: (policy, bindings, the scheduler name it sets)."""
    on = {"optIn": {"enabled": True}}
    tmp = tmp_path_factory.mktemp("optin")
    return {
        "chart v1 (1.36)": (*policy_of(render_chart(on, kube_version="v1.36.1")), "gputopo-scheduler"),
        "chart v1beta1 (1.34, turned on)": (
            *policy_of(render_chart(on, kube_version="v1.34.2", api_versions=api("v1beta1"))),
            "gputopo-scheduler",
        ),
        "chart v1alpha1 (1.33, turned on)": (
            *policy_of(render_chart(on, kube_version="v1.33.5", api_versions=api("v1alpha1"))),
            "gputopo-scheduler",
        ),
        "chart, another release": (
            *policy_of(render_chart(on, kube_version="v1.36.1", release="research")),
            "research-gputopo-scheduler",
        ),
        "kustomize component": (
            *policy_of(kustomize_with(tmp, ["."], ("components/opt-in-policy",))),
            "gputopo-scheduler",
        ),
    }


FORMS = (
    "chart v1 (1.36)",
    "chart v1beta1 (1.34, turned on)",
    "chart v1alpha1 (1.33, turned on)",
    "chart, another release",
    "kustomize component",
)
#: The label each form's default selectors match: gputopo.io/opt-in=true for release gputopo
#: (and deploy/), the release's stem for any other, so two releases' defaults are disjoint.
LABELS = {form: OPT_IN for form in FORMS} | {
    "chart, another release": {"gputopo.io/opt-in": "research-gputopo"}
}


def relabelled(labels: dict[str, str], form: str) -> dict[str, str]:
    """The default opt-in labels as this form spells them; any other labels unchanged."""
    return LABELS[form] if labels == OPT_IN else labels


def pod(
    gpus: str | int | None = "1",
    where: str = "limits",
    scheduler: str | None = None,
    labels: dict[str, str] | None = None,
    init: bool = False,
) -> Obj:
    resources: Obj = {"requests": {"cpu": "1"}}
    if gpus is not None:
        resources.setdefault(where, {})["nvidia.com/gpu"] = gpus
    c = {"name": "train", "image": "example.com/train:1", "resources": resources}
    spec: Obj = {"containers": [{"name": "side", "image": "example.com/side:1"}]}
    if init:
        spec["initContainers"] = [c]
    else:
        spec["containers"].append(c)
    # The API server defaults an unset schedulerName before admission.
    spec["schedulerName"] = scheduler if scheduler is not None else "default-scheduler"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team-a", "labels": labels or {}},
        "spec": spec,
    }


# (pod, namespace labels, handed over?)
CASES: dict[str, tuple[Obj, dict[str, str], bool]] = {
    "GPU limit, namespace opted in": (pod(), OPT_IN, True),
    "GPU request only, namespace opted in": (pod(where="requests"), OPT_IN, True),
    "GPU as an integer": (pod(gpus=2), OPT_IN, True),
    "GPU in an init container": (pod(init=True), OPT_IN, True),
    "pod label, namespace not opted in": (pod(labels=OPT_IN), {}, True),
    "pod label and namespace": (pod(labels=OPT_IN), OPT_IN, True),
    "explicit default-scheduler": (pod(scheduler="default-scheduler"), OPT_IN, True),
    "empty scheduler name": (pod(scheduler=""), OPT_IN, True),
    "not opted in": (pod(), {}, False),
    "other label value": (pod(labels={"gputopo.io/opt-in": "false"}), {"gputopo.io/opt-in": "no"}, False),
    "CPU pod in an opted-in namespace": (pod(gpus=None), OPT_IN, False),
    "zero GPUs": (pod(gpus="0"), OPT_IN, False),
    "names Volcano": (pod(scheduler="volcano"), OPT_IN, False),
}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("case", list(CASES))
def test_gpu_pods_opted_in_get_the_scheduler_name_and_no_other_pod_changes(
    forms: dict[str, tuple[Obj, list[Obj], str]], form: str, case: str
) -> None:
    policy, bindings, name = forms[form]
    p, ns_labels, handed = CASES[case]
    p = dict(p, metadata=dict(p["metadata"], labels=relabelled(p["metadata"]["labels"], form)))
    out = admit(policy, bindings, p, "team-a", relabelled(ns_labels, form))
    assert not out.refused, out.refused
    expected = dict(p, spec=dict(p["spec"], schedulerName=name)) if handed else p
    assert out.pod == expected, f"{case}: {out.pod['spec'].get('schedulerName')}"


@pytest.mark.parametrize("form", FORMS)
def test_a_pod_already_naming_the_scheduler_is_left_alone(
    forms: dict[str, tuple[Obj, list[Obj], str]], form: str
) -> None:
    policy, bindings, name = forms[form]
    p = pod(scheduler=name)
    out = admit(policy, bindings, p, "team-a", LABELS[form])
    assert out.pod == p and not out.applied and not out.refused


def test_the_evaluator_notices_a_changed_policy(forms: dict[str, tuple[Obj, list[Obj], str]]) -> None:
    """Guards the tests above: a policy that forgot the GPU condition hands CPU pods over."""
    policy, bindings, _ = forms["chart v1 (1.36)"]
    loose = json.loads(json.dumps(policy))
    loose["spec"]["matchConditions"] = [
        c for c in loose["spec"]["matchConditions"] if c["name"] != "asks-for-gpus"
    ]
    assert admit(loose, bindings, pod(gpus=None), "team-a", OPT_IN).applied


quantities = st.one_of(st.none(), st.sampled_from(["0", "1", "2", "8", 0, 1, 4]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    gpus=st.lists(st.tuples(quantities, quantities), min_size=1, max_size=3),
    init=st.tuples(quantities, quantities),
    scheduler=st.sampled_from(["default-scheduler", "", "volcano", "gputopo-scheduler"]),
    ns_in=st.booleans(),
    pod_in=st.booleans(),
)
def test_policy_against_the_rule_on_random_pods(
    forms: dict[str, tuple[Obj, list[Obj], str]],
    gpus: list[tuple[Any, Any]],
    init: tuple[Any, Any],
    scheduler: str,
    ns_in: bool,
    pod_in: bool,
) -> None:
    policy, bindings, name = forms["chart v1 (1.36)"]

    def c(i: int, req: Any, lim: Any) -> Obj:
        r: Obj = {}
        if req is not None:
            r["requests"] = {"nvidia.com/gpu": req}
        if lim is not None:
            r["limits"] = {"nvidia.com/gpu": lim}
        return {"name": f"c{i}", "image": "x", "resources": r}

    p = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "labels": OPT_IN if pod_in else {}},
        "spec": {
            "containers": [c(i, r, lim) for i, (r, lim) in enumerate(gpus)],
            "initContainers": [c(9, *init)],
            "schedulerName": scheduler,
        },
    }
    every = [*gpus, init]
    asks = any(str(q) != "0" for pair in every for q in pair if q is not None)
    rule = asks and scheduler in ("", "default-scheduler") and (ns_in or pod_in)
    out = admit(policy, bindings, p, "team-a", OPT_IN if ns_in else {})
    assert not out.refused
    assert out.pod["spec"]["schedulerName"] == (name if rule else scheduler)
    assert {k: v for k, v in out.pod["spec"].items() if k != "schedulerName"} == {
        k: v for k, v in p["spec"].items() if k != "schedulerName"
    }


# ------------------------------------------------------------------ which form the chart ships


@pytest.mark.parametrize(
    ("cluster", "apis", "expected"),
    [
        ("v1.30.5", (), "webhook"),
        ("v1.33.5", (), "webhook"),
        ("v1.33.5", api("v1alpha1"), "v1alpha1"),
        ("v1.34.1", (), "webhook"),  # v1beta1 exists but is off unless turned on
        ("v1.35.4", api("v1beta1"), "v1beta1"),
        ("v1.35.4", (*api("v1beta1"), *api("v1alpha1")), "v1beta1"),
        ("v1.36.1", (), "v1"),
        ("v1.37.0", api("v1"), "v1"),
    ],
)
def test_the_chart_picks_the_policy_the_cluster_serves_else_the_webhook(
    cluster: str, apis: tuple[str, ...], expected: str
) -> None:
    docs = render_chart({"optIn": {"enabled": True}}, kube_version=cluster, api_versions=apis)
    kinds = {d["kind"] for d in docs}
    if expected == "webhook":
        assert not kinds & MAP_KINDS and "MutatingWebhookConfiguration" in kinds
    else:
        assert "MutatingWebhookConfiguration" not in kinds
        assert {d["apiVersion"] for d in docs if d["kind"] in MAP_KINDS} == {
            f"admissionregistration.k8s.io/{expected}"
        }
    schema_version = ".".join(cluster.lstrip("v").split(".")[:2]) + ".0"
    for d in docs:
        if d["kind"] in MAP_KINDS | {"MutatingWebhookConfiguration", "Secret", "Service"}:
            kv.validate(d, schema_version, strict=True)


def test_opt_in_is_off_by_default_and_modes_can_be_forced() -> None:
    kinds = {d["kind"] for d in render_chart({}, kube_version="v1.36.1")}
    assert not kinds & (MAP_KINDS | {"MutatingWebhookConfiguration"})
    forced = render_chart({"optIn": {"enabled": True, "mode": "webhook"}}, kube_version="v1.36.1")
    assert "MutatingWebhookConfiguration" in {d["kind"] for d in forced}
    helm = pytest.importorskip("helm_python")
    with pytest.raises(helm.HelmError, match="serves no MutatingAdmissionPolicy"):
        render_chart({"optIn": {"enabled": True, "mode": "policy"}}, kube_version="v1.33.5")


# ------------------------------------------------------------------ the webhook form


def webhook_docs(values: Obj | None = None) -> tuple[Obj, ...]:
    v = {"optIn": {"enabled": True}} | (values or {})
    return render_chart(v, kube_version="v1.33.5")


def test_webhooks_reach_the_scheduler_pods_on_the_agreed_path_port_and_certificate() -> None:
    docs = webhook_docs()
    mwc = one(docs, "MutatingWebhookConfiguration")
    svc = one(docs, "Service", "gputopo-scheduler-webhook")
    deploy = one(docs, "Deployment")
    spec = deploy["spec"]["template"]["spec"]
    ext = container(spec, "extender")
    assert {
        "--webhook",
        "--webhook-listen=0.0.0.0:8443",
        "--webhook-scheduler-name=gputopo-scheduler",
    } <= set(ext["args"])
    ports = {p["name"]: p["containerPort"] for p in ext["ports"]}
    assert ports["webhook"] == 8443 and svc["spec"]["ports"][0]["targetPort"] == "webhook"
    assert svc["spec"]["selector"].items() <= deploy["spec"]["template"]["metadata"]["labels"].items()
    (mount,) = [m for m in ext["volumeMounts"] if m["name"] == "webhook-tls"]
    assert mount["mountPath"] == "/etc/gputopo/webhook-tls" and mount["readOnly"]
    (vol,) = [v for v in spec["volumes"] if v["name"] == "webhook-tls"]
    secret = one(docs, "Secret", vol["secret"]["secretName"])
    assert secret["type"] == "kubernetes.io/tls" and {"tls.crt", "tls.key"} <= secret["data"].keys()
    by = {w["name"].split(".")[0]: w for w in mwc["webhooks"]}
    assert set(by) == {"namespace", "pod"}
    assert (
        by["namespace"]["namespaceSelector"] == {"matchLabels": OPT_IN}
        and "objectSelector" not in by["namespace"]
    )
    assert by["pod"]["objectSelector"] == {"matchLabels": OPT_IN} and "namespaceSelector" not in by["pod"]
    for w in mwc["webhooks"]:
        ref = w["clientConfig"]["service"]
        assert (ref["name"], ref["namespace"], ref["path"], ref["port"]) == (
            svc["metadata"]["name"],
            NAMESPACE,
            "/mutate-pods",
            443,
        )
        assert w["sideEffects"] == "None" and w["admissionReviewVersions"] == ["v1"]
        assert w["rules"] == [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ]
        assert w["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]


def test_webhook_is_called_only_for_gpu_pods_naming_no_scheduler() -> None:
    """Its matchConditions are the policy's: the API server never calls it for other pods."""
    mwc = one(webhook_docs(), "MutatingWebhookConfiguration")
    policy, _ = policy_of(render_chart({"optIn": {"enabled": True}}, kube_version="v1.36.1"))
    for w in mwc["webhooks"]:
        assert w["matchConditions"] == policy["spec"]["matchConditions"]
        assert conditions_hold(w["matchConditions"], pod(), "team-a")
        assert not conditions_hold(w["matchConditions"], pod(gpus=None), "team-a")
        assert not conditions_hold(w["matchConditions"], pod(scheduler="volcano"), "team-a")


def test_the_generated_certificate_serves_https_for_the_service_name_under_the_ca_bundle() -> None:
    """A TLS handshake as the API server makes it: to <service>.<namespace>.svc, trusting only
    the webhook's caBundle, against a server holding the Secret's certificate and key."""
    docs = webhook_docs()
    secret = one(docs, "Secret", "gputopo-scheduler-webhook-tls")
    ca = base64.b64decode(
        one(docs, "MutatingWebhookConfiguration")["webhooks"][0]["clientConfig"]["caBundle"]
    )
    with tempfile.TemporaryDirectory() as tmp:
        crt, key = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
        crt.write_bytes(base64.b64decode(secret["data"]["tls.crt"]))
        key.write_bytes(base64.b64decode(secret["data"]["tls.key"]))
        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.load_cert_chain(crt, key)

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = b'{"ok": true}'
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        httpd = HTTPServer(("127.0.0.1", 0), Handler)
        httpd.socket = server_ctx.wrap_socket(httpd.socket, server_side=True)
        port = httpd.server_address[1]
        t = threading.Thread(target=httpd.serve_forever, daemon=True)
        t.start()
        try:
            client = ssl.create_default_context(cadata=ca.decode())
            for name in (f"gputopo-scheduler-webhook.{NAMESPACE}.svc", "gputopo-scheduler-webhook"):
                with (
                    socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
                    client.wrap_socket(raw, server_hostname=name) as tls,
                ):
                    tls.sendall(b"POST /mutate-pods HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
                    assert tls.recv(100).startswith(b"HTTP/1.0 200")
            with (
                socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
                pytest.raises(ssl.SSLCertVerificationError),
            ):
                client.wrap_socket(raw, server_hostname="gputopo-scheduler-webhook.elsewhere.svc")
            with (
                socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
                pytest.raises(ssl.SSLCertVerificationError),
            ):
                ssl.create_default_context().wrap_socket(
                    raw, server_hostname=f"gputopo-scheduler-webhook.{NAMESPACE}.svc"
                )
        finally:
            httpd.shutdown()
            httpd.server_close()


def test_a_secret_of_ones_own_replaces_the_generated_one() -> None:
    docs = webhook_docs(
        {"scheduler": {"webhook": {"port": 9443, "tlsSecretName": "my-cert", "caBundle": "Q0E="}}}
    )
    assert not [d for d in docs if d["kind"] == "Secret"]
    spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    (vol,) = [v for v in spec["volumes"] if v["name"] == "webhook-tls"]
    assert vol["secret"]["secretName"] == "my-cert"
    assert "--webhook-listen=0.0.0.0:9443" in container(spec, "extender")["args"]
    assert all(
        w["clientConfig"]["caBundle"] == "Q0E=" for w in one(docs, "MutatingWebhookConfiguration")["webhooks"]
    )


def test_no_webhook_objects_without_webhook_mode() -> None:
    docs = render_chart({"optIn": {"enabled": True}}, kube_version="v1.36.1")
    ext = container(one(docs, "Deployment")["spec"]["template"]["spec"], "extender")
    assert not any(a.startswith("--webhook") for a in ext["args"])
    assert not [d for d in docs if d["kind"] in ("Secret", "Service", "MutatingWebhookConfiguration")]
    assert yaml.safe_dump(docs)  # renders to plain YAML


@pytest.mark.parametrize("cluster", ["v1.36.1", "v1.33.5"])
def test_one_way_to_opt_in_can_be_switched_off(cluster: str) -> None:
    """A selector set to null (helm --set optIn.namespaceSelector=null) drops that binding or
    webhook; an empty one would match every namespace, so null is the way to turn it off."""
    from tests.manifests import render_chart_files

    values = {"optIn": {"enabled": True, "namespaceSelector": None}}
    docs = render_chart(values, kube_version=cluster)
    if cluster == "v1.36.1":
        bindings = [d for d in docs if d["kind"] == "MutatingAdmissionPolicyBinding"]
        assert [b["metadata"]["name"] for b in bindings] == ["gputopo-opt-in-pod"]
    else:
        hooks = one(docs, "MutatingWebhookConfiguration")["webhooks"]
        assert [w["name"].split(".")[0] for w in hooks] == ["pod"]
    notes = render_chart_files(json.dumps(values), cluster, NAMESPACE, ())["gputopo/templates/NOTES.txt"]
    assert "or by label" in notes and "kubectl label namespace <namespace>" not in notes
    on = render_chart_files(json.dumps({"optIn": {"enabled": True}}), cluster, NAMESPACE, ())
    assert "kubectl label namespace <namespace> gputopo.io/opt-in=true" in on["gputopo/templates/NOTES.txt"]


def selectors_of(docs: tuple[Obj, ...]) -> dict[str, Obj]:
    """The selector of each way to opt in ("namespace", "pod"), policy bindings or webhooks."""
    out: dict[str, Obj] = {}
    for d in docs:
        if d["kind"] == "MutatingAdmissionPolicyBinding":
            match = d["spec"]["matchResources"]
            by = d["metadata"]["name"].rsplit("-", 1)[1]
            out[by] = match["namespaceSelector" if by == "namespace" else "objectSelector"]
        elif d["kind"] == "MutatingWebhookConfiguration":
            for w in d["webhooks"]:
                by = w["name"].split(".")[0]
                out[by] = w["namespaceSelector" if by == "namespace" else "objectSelector"]
    return out


@pytest.mark.parametrize("cluster", ["v1.36.1", "v1.33.5"])
def test_a_selector_of_ones_own_replaces_the_default_label(cluster: str) -> None:
    """Helm merges a user's map into the chart's default map, so a default label in
    values.yaml's selector would stay beside `team: a` and still opt every namespace labelled
    gputopo.io/opt-in=true in. A selector set is the selector used, for the policy and the
    webhook alike; the one not set keeps the default."""
    team = {"matchLabels": {"team": "a"}}
    expressions = {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu"]}]}
    values = {"optIn": {"enabled": True, "namespaceSelector": team, "podSelector": expressions}}
    docs = render_chart(values, kube_version=cluster)
    assert selectors_of(docs) == {"namespace": team, "pod": expressions}
    assert selectors_of(render_chart({"optIn": {"enabled": True}}, kube_version=cluster)) == {
        "namespace": {"matchLabels": OPT_IN},
        "pod": {"matchLabels": OPT_IN},
    }
    from tests.manifests import render_chart_files

    notes = render_chart_files(json.dumps(values), cluster, NAMESPACE, ())["gputopo/templates/NOTES.txt"]
    assert "kubectl label namespace <namespace> team=a\n" in notes
    if cluster == "v1.36.1":
        policy, bindings = policy_of(docs)
        assert admit(policy, bindings, pod(), "team-a", {"team": "a"}).applied
        assert not admit(policy, bindings, pod(), "team-a", OPT_IN).applied


@pytest.mark.parametrize("cluster", ["v1.36.1", "v1.33.5"])
def test_two_releases_default_opt_in_labels_are_disjoint(cluster: str) -> None:
    """Two releases with opt-in on and default selectors: were both gputopo.io/opt-in=true, a
    labelled namespace would be mutated by whichever ran first, always the same one. Release
    gputopo keeps "true" (deploy/'s label); any other release matches its own stem, and a
    namespace or pod carrying one release's label is handed to that release's scheduler only."""
    on = {"optIn": {"enabled": True}}
    first = render_chart(on, kube_version=cluster)
    second = render_chart(on, kube_version=cluster, namespace="gputopo-b", release="research")
    mine = {"gputopo.io/opt-in": "research-gputopo"}
    for by in ("namespace", "pod"):
        assert selectors_of(first)[by] == {"matchLabels": OPT_IN}
        assert selectors_of(second)[by] == {"matchLabels": mine}
    from tests.manifests import render_chart_files

    notes = render_chart_files(json.dumps(on), cluster, "gputopo-b", (), "research")[
        "gputopo/templates/NOTES.txt"
    ]
    assert "kubectl label namespace <namespace> gputopo.io/opt-in=research-gputopo" in notes
    if cluster != "v1.36.1":
        return
    releases = {"gputopo-scheduler": policy_of(first), "research-gputopo-scheduler": policy_of(second)}
    for labels, owner in ((OPT_IN, "gputopo-scheduler"), (mine, "research-gputopo-scheduler")):
        for by_namespace in (True, False):
            p = pod(labels=None if by_namespace else labels)
            ns = labels if by_namespace else {}
            handed = {
                name
                for name, (policy, bindings) in releases.items()
                if admit(policy, bindings, p, "team-a", ns).applied
            }
            assert handed == {owner}, (labels, by_namespace, handed)


def test_the_chart_webhook_args_run_the_sidecar_webhook_with_the_generated_certificate(
    tmp_path: Path,
) -> None:
    """The extender's args as the chart writes them parse with the sidecar's own parser, and the
    webhook they describe, served with the chart's Secret as mounted, sets the release's
    scheduler name on a GPU pod for a client that trusts only the MutatingWebhookConfiguration's
    caBundle and checks the Service's DNS name, as the API server does."""
    from scheduler.__main__ import parser as sidecar_parser
    from scheduler.web.webhook import MUTATE_PATH, WebhookConfig, WebhookServer, tls_files

    docs = render_chart({"optIn": {"enabled": True}, "schedulerName": "topo-sched"}, kube_version="v1.33.5")
    deploy = one(docs, "Deployment")
    spec = deploy["spec"]["template"]["spec"]
    args = sidecar_parser().parse_args(container(spec, "extender")["args"])
    assert args.webhook and args.webhook_listen[1] == 8443 and args.webhook_scheduler_name == "topo-sched"
    (vol,) = [v for v in spec["volumes"] if v["name"] == "webhook-tls"]
    secret = one(docs, "Secret", vol["secret"]["secretName"])
    for name in ("tls.crt", "tls.key"):
        (tmp_path / name).write_bytes(base64.b64decode(secret["data"][name]))
    crt, key = tls_files(str(tmp_path))
    server = WebhookServer(
        WebhookConfig(crt, key, scheduler_name=args.webhook_scheduler_name), "127.0.0.1", 0
    )
    server.start()
    try:
        mwc = one(docs, "MutatingWebhookConfiguration")
        ref = mwc["webhooks"][0]["clientConfig"]
        ctx = ssl.create_default_context(cadata=base64.b64decode(ref["caBundle"]).decode())
        dns = f"{ref['service']['name']}.{ref['service']['namespace']}.svc"
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "operation": "CREATE",
                "object": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "p", "namespace": "ml"},
                    "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 2}}}]},
                },
            },
        }
        body = json.dumps(review).encode()
        with (
            socket.create_connection(server.address, timeout=10) as raw,
            ctx.wrap_socket(raw, server_hostname=dns) as tls,
        ):
            tls.sendall(
                f"POST {MUTATE_PATH} HTTP/1.1\r\nHost: {dns}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            answer = b""
            while chunk := tls.recv(65536):
                answer += chunk
    finally:
        server.stop()
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") or head.startswith(b"HTTP/1.0 200"), head
    response = json.loads(payload)["response"]
    assert response["allowed"] and response["uid"] == "u-1"
    ops = json.loads(base64.b64decode(response["patch"]))
    assert {"op": "add", "path": "/spec/schedulerName", "value": "topo-sched"} in ops or {
        "op": "replace",
        "path": "/spec/schedulerName",
        "value": "topo-sched",
    } in ops
