"""The opt-in admission webhook over real HTTPS (a self-signed certificate made here with the
openssl CLI), as the API server calls it: AdmissionReview v1 in, a base64 JSONPatch out; and the
sidecar process with --webhook, its flags and its one-line errors."""

from __future__ import annotations

import base64
import http.client
import json
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from gputopo.pod.optin import decide
from scheduler.web.webhook import MUTATE_PATH, WebhookConfig, WebhookServer, review

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")


def make_cert(directory: Path, cn: str = "gputopo-webhook") -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost, as a kubernetes.io/tls Secret holds."""
    directory.mkdir(parents=True, exist_ok=True)
    crt, key = directory / "tls.crt", directory / "tls.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-keyout", str(key), "-out", str(crt), "-subj", f"/CN={cn}",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return crt, key


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_cert(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def hook(tls: tuple[Path, Path]) -> Iterator[WebhookServer]:
    crt, key = tls
    server = WebhookServer(
        WebhookConfig(str(crt), str(key), resources=("example.com/gpu",)), "127.0.0.1", 0, timeout_s=2.0
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def client_context(crt: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(crt))  # verifies the chain and 127.0.0.1
    return ctx


def post(
    server: WebhookServer, crt: Path, body: bytes, path: str = MUTATE_PATH + "?timeout=10s"
) -> tuple[int, Any]:
    host, port = server.address
    conn = http.client.HTTPSConnection(host, port, context=client_context(crt), timeout=10)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.getheader("Content-Type") == "application/json"
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def pod(
    *,
    gpus: Any = 1,
    where: str = "containers",
    scheduler: str | None = "default-scheduler",
    part: str = "limits",
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": "x", "resources": {}}
    if gpus is not None:
        container["resources"][part] = {"nvidia.com/gpu": gpus}
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "x"}]}
    spec.setdefault(where, []).append(container)
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "train-", "namespace": "ml"},
        "spec": spec,
    }


def admission(obj: Any, *, operation: str = "CREATE", kind: str = "Pod", uid: str = "u-1") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ml",
            "operation": operation,
            "object": obj,
        },
    }


def patch_of(answer: dict[str, Any]) -> list[dict[str, Any]] | None:
    response = answer["response"]
    if "patch" not in response:
        assert "patchType" not in response
        return None
    assert response["patchType"] == "JSONPatch"
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return ops


def apply(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 add/replace on object members: enough for the patches this webhook writes."""
    out = json.loads(json.dumps(obj))
    for op in ops:
        assert op["op"] in ("add", "replace")
        *parents, last = op["path"].lstrip("/").split("/")
        target = out
        for p in parents:
            target = target[p]
        target[last] = op["value"]
    return out


SET = [{"op": "add", "path": "/spec/schedulerName", "value": "gputopo-scheduler"}]


@pytest.mark.parametrize(
    ("obj", "expect"),
    [
        (pod(), SET),
        (pod(part="requests"), SET),
        (pod(gpus="8"), SET),
        (pod(where="initContainers"), SET),
        (pod(scheduler=None), SET),  # unset (the API server defaults it after admission in some versions)
        (pod(scheduler=""), SET),
        (pod(gpus=0), None),
        (pod(gpus="0"), None),
        (pod(gpus=None), None),  # no GPUs: stays with the default scheduler
        (pod(scheduler="volcano"), None),  # another scheduler named on purpose: never touched
        (pod(scheduler="gputopo-scheduler"), None),  # already ours
        ({"metadata": {}}, None),  # no spec
        ({"spec": {"containers": "nonsense"}}, None),
        ({"spec": {"containers": [{"resources": {"limits": ["nvidia.com/gpu"]}}]}}, None),
        ({"spec": {"schedulerName": 7, "containers": []}}, None),
        ("a string", None),
    ],
)
def test_admission_reviews_over_https(
    hook: WebhookServer, tls: tuple[Path, Path], obj: Any, expect: list[dict[str, Any]] | None
) -> None:
    code, answer = post(hook, tls[0], json.dumps(admission(obj, uid="abc")).encode())
    assert code == 200
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == "abc" and answer["response"]["allowed"] is True
    assert patch_of(answer) == expect
    if expect is not None:
        assert apply(obj, expect)["spec"]["schedulerName"] == "gputopo-scheduler"


def test_a_configured_gpu_resource_counts(hook: WebhookServer, tls: tuple[Path, Path]) -> None:
    obj = pod(gpus=None)
    obj["spec"]["containers"][0]["resources"] = {"limits": {"example.com/gpu": "2"}}
    assert patch_of(post(hook, tls[0], json.dumps(admission(obj)).encode())[1]) == SET
    obj["spec"]["containers"][0]["resources"] = {"limits": {"example.com/other": "2"}}
    assert patch_of(post(hook, tls[0], json.dumps(admission(obj)).encode())[1]) is None


@pytest.mark.parametrize(
    "request_doc",
    [
        admission(pod(), operation="UPDATE"),
        admission(pod(), operation="DELETE"),
        admission(pod(), kind="Deployment"),
        {**admission(pod()), "request": {**admission(pod())["request"], "subResource": "status"}},
        {**admission(pod()), "request": {**admission(pod())["request"], "kind": "Pod"}},  # kind not an object
    ],
)
def test_anything_but_a_pod_create_is_allowed_unchanged(
    hook: WebhookServer, tls: tuple[Path, Path], request_doc: dict[str, Any]
) -> None:
    code, answer = post(hook, tls[0], json.dumps(request_doc).encode())
    assert code == 200 and answer["response"]["allowed"] is True and patch_of(answer) is None


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"{not json", "malformed JSON"),
        (b"[]", "must be a JSON object"),
        (json.dumps({"kind": "Pod", "apiVersion": "v1"}).encode(), "expected kind AdmissionReview"),
        (json.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1beta1", "request": {"uid": "x"}}).encode(),
         "apiVersion admission.k8s.io/v1"),
        (json.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}).encode(), "no request"),
        (json.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"uid": 3}}).encode(),
         "no uid"),
    ],
)  # fmt: skip
def test_bad_bodies_are_400_json(
    hook: WebhookServer, tls: tuple[Path, Path], body: bytes, reason: str
) -> None:
    code, answer = post(hook, tls[0], body)
    assert code == 400 and reason in answer["error"]
    code, answer = post(hook, tls[0], json.dumps(admission(pod())).encode())  # still serving
    assert code == 200 and patch_of(answer) == SET


def test_unknown_path_missing_length_and_oversized_body(hook: WebhookServer, tls: tuple[Path, Path]) -> None:
    code, answer = post(hook, tls[0], json.dumps(admission(pod())).encode(), path="/mutate")
    assert code == 404 and "no such path" in answer["error"]
    host, port = hook.address
    with socket.create_connection((host, port), timeout=5) as raw:
        tls_sock = client_context(tls[0]).wrap_socket(raw, server_hostname=host)
        tls_sock.sendall(b"POST /mutate-pods HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n")
        answer = b""
        while chunk := tls_sock.recv(4096):  # the server closes after the refusal
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 413") and b"exceeds 8388608" in answer


def test_plain_http_and_a_stalled_handshake_do_not_stop_it(
    hook: WebhookServer, tls: tuple[Path, Path]
) -> None:
    host, port = hook.address
    stalled = socket.create_connection((host, port), timeout=5)  # never says hello
    with socket.create_connection((host, port), timeout=5) as plain:
        plain.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # not TLS: the handshake fails
        try:
            plain.recv(100)
        except OSError:
            pass
    code, answer = post(hook, tls[0], json.dumps(admission(pod())).encode())
    assert code == 200 and patch_of(answer) == SET
    stalled.close()


def test_renewed_certificate_is_served_without_a_restart(tmp_path: Path) -> None:
    old_crt, key = make_cert(tmp_path / "tls", cn="old")
    server = WebhookServer(WebhookConfig(str(old_crt), str(key)), "127.0.0.1", 0, reload_s=0.0)
    server.start()
    try:
        saved = old_crt.read_bytes()
        new_crt, _ = make_cert(tmp_path / "tls", cn="new")  # the same paths, new files
        assert new_crt.read_bytes() != saved
        code, answer = post(server, new_crt, json.dumps(admission(pod())).encode())
        assert code == 200 and patch_of(answer) == SET
        old = tmp_path / "old.crt"
        old.write_bytes(saved)
        with pytest.raises(ssl.SSLCertVerificationError):
            post(server, old, json.dumps(admission(pod())).encode())
    finally:
        server.stop()


def test_reviews_are_counted_on_the_given_registry(tls: tuple[Path, Path]) -> None:
    registry = CollectorRegistry()
    server = WebhookServer(WebhookConfig(str(tls[0]), str(tls[1])), "127.0.0.1", 0, registry=registry)
    server.start()
    try:
        post(server, tls[0], json.dumps(admission(pod())).encode())
        post(server, tls[0], json.dumps(admission(pod(gpus=None))).encode())
        post(server, tls[0], json.dumps(admission(pod(scheduler="volcano"))).encode())
        post(server, tls[0], b"{not json")
    finally:
        server.stop()
    count = {
        r: registry.get_sample_value("gputopo_webhook_reviews_total", {"result": r})
        for r in ("mutated", "admitted", "bad_request")
    }
    assert count == {"mutated": 1.0, "admitted": 2.0, "bad_request": 1.0}


# ---------------------------------------------------------------------------- the decision


GPU_NAMES = st.sampled_from(["nvidia.com/gpu", "example.com/gpu", "cpu", "memory", "nvidia.com/mig-1g.5gb"])
QUANTITIES = st.one_of(
    st.integers(-2, 9), st.sampled_from(["0", "1", "2", "0.0", "", "100m", "x"]), st.none()
)
RESOURCES = st.dictionaries(GPU_NAMES, QUANTITIES, max_size=3)
CONTAINER = st.fixed_dictionaries(
    {},
    optional={"resources": st.fixed_dictionaries({}, optional={"requests": RESOURCES, "limits": RESOURCES})},
)
SPEC = st.fixed_dictionaries(
    {}, optional={
        "containers": st.lists(CONTAINER, max_size=3),
        "initContainers": st.lists(CONTAINER, max_size=2),
        "schedulerName": st.sampled_from(["", "default-scheduler", "gputopo-scheduler", "volcano", "kai-scheduler"]),
    },
)  # fmt: skip


def _asks(spec: dict[str, Any], names: set[str]) -> bool:
    """Brute force: any container or init container with a positive quantity of a GPU name."""
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        for part in ("requests", "limits"):
            for name, q in c.get("resources", {}).get(part, {}).items():
                if name not in names:
                    continue
                if isinstance(q, int) and q > 0:
                    return True
                if isinstance(q, str) and q not in ("", "0", "0.0"):
                    return True
    return False


@settings(max_examples=300, deadline=None)
@given(SPEC)
def test_decide_matches_a_brute_force_oracle(spec: dict[str, Any]) -> None:
    names = {"nvidia.com/gpu", "example.com/gpu"}
    decision = decide({"spec": spec}, scheduler_name="gputopo-scheduler", resources=["example.com/gpu"])
    current = spec.get("schedulerName", "")
    should = current in ("", "default-scheduler") and _asks(spec, names)
    assert bool(decision.patch) == should, decision.reason
    if should:
        assert (
            apply({"spec": spec}, [dict(op) for op in decision.patch])["spec"]["schedulerName"]
            == "gputopo-scheduler"
        )
    answer, reason = review(
        admission({"spec": spec}), scheduler_name="gputopo-scheduler", resources=["example.com/gpu"]
    )
    assert answer["response"]["allowed"] is True and (patch_of(answer) is not None) == should
    assert reason == decision.reason


# ---------------------------------------------------------------------------- the process


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "scheduler", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--webhook", "--webhook-tls-dir", "/nonexistent"], "/nonexistent/tls.crt"),
        (["--webhook", "--webhook-scheduler-name", "Not A Name"], "not a valid scheduler name"),
        (["--webhook-listen", "nowhere"], "expected HOST:PORT"),
    ],
)
def test_bad_webhook_flags_exit_2_with_one_line(args: list[str], message: str) -> None:
    res = run("--cluster", "/nonexistent/never-read.yaml", *args)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], res.stderr


def test_a_key_that_does_not_match_exits_2(tmp_path: Path, tls: tuple[Path, Path]) -> None:
    _, other_key = make_cert(tmp_path / "other")
    res = run("--webhook", "--webhook-cert-file", str(tls[0]), "--webhook-key-file", str(other_key))
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "do not load" in res.stderr, res.stderr


def test_the_sidecar_serves_the_webhook_when_asked(tmp_path: Path) -> None:
    crt, _ = make_cert(tmp_path / "webhook-tls")
    cluster = tmp_path / "c.yaml"
    cluster.write_text("nodes:\n  - name: a1\n    gpus: dgx-a100\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduler", "--cluster", str(cluster), "--listen", "127.0.0.1:0",
         "--webhook", "--webhook-listen", "127.0.0.1:0", "--webhook-tls-dir", str(tmp_path / "webhook-tls"),
         "--webhook-scheduler-name", "team-a-gpus"],
        cwd=ROOT, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        url = None
        deadline = time.monotonic() + 30
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            doc = json.loads(line)
            if doc["event"] == "webhook_listening":
                url = doc["url"]
                assert doc["scheduler_name"] == "team-a-gpus"
        assert url is not None and url.startswith("https://127.0.0.1:") and url.endswith(MUTATE_PATH)
        port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=client_context(crt), timeout=10)
        conn.request("POST", MUTATE_PATH, body=json.dumps(admission(pod())).encode())
        answer = json.loads(conn.getresponse().read())
        conn.close()
        assert patch_of(answer) == [{"op": "add", "path": "/spec/schedulerName", "value": "team-a-gpus"}]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.returncode == 0
