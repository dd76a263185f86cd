"""Harness for running the project under real Kubernetes components (`make test-real`).

`realk8s/build.sh` builds them from the Go modules `realk8s/go.mod` requires (k8s.io/kubernetes
v1.37.2, its staging modules, the etcd Kubernetes pins) into the ignored folder
`realk8s/.build/<version>/bin`: etcd, kube-apiserver, kube-scheduler, and `kubelet-devicemanager`
(kubelet's own device and topology managers, wired as kubelet wires them). Here they run as
subprocesses and the tests drive them as a user would: create Nodes, PodGroups and Pods over
HTTPS with a bearer token, then watch where the pods end up.

Without the binaries every test here skips with one line naming why (a newcomer's `make test`);
`make test-real` builds them first and sets GPUTOPO_REAL_REQUIRED=1, under which a missing
binary fails instead, so CI can never pass by skipping.

Every process started here is owned by a `Procs` and killed (process group, SIGKILL after a
short grace) when its fixture ends, also when a test fails. Ports are taken with port 0 and read
back from what the process prints, or (etcd, kube-apiserver, which take a port number) bound and
released just before.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import pytest
import yaml

from gputopo.network.annotation import encode, make
from gputopo.network.levels import LEAF, SPINE
from gputopo.node.topofile import load_preset

ROOT = Path(__file__).resolve().parents[1]
#: The API server stand-in of ../shared/realk8s (tests/test_dra_realk8s.py runs against it).
REALK8S = Path(os.environ.get("GPUTOPO_REALK8S", ROOT.parent / "shared" / "realk8s"))
#: The Kubernetes release under test: a folder of realk8s/.build/ (realk8s/build.sh's output).
K8S_VERSION = os.environ.get("GPUTOPO_K8S_VERSION", "v1.37.2")
BUILT = Path(os.environ.get("GPUTOPO_REALK8S_BIN", ROOT / "realk8s" / ".build" / K8S_VERSION / "bin"))
REQUIRED = os.environ.get("GPUTOPO_REAL_REQUIRED") == "1"
#: Kubernetes' own PodGroup API in that release: beta in 1.37, alpha (v1alpha2) in 1.36; both
#: behind the feature gate GenericWorkload.
GANG_API = "scheduling.k8s.io/v1alpha2" if K8S_VERSION.startswith("v1.36.") else "scheduling.k8s.io/v1beta1"
#: CompositePodGroup (alpha in 1.37, gate CompositePodGroup, which needs GenericWorkload and
#: TopologyAwareWorkloadScheduling: pkg/features/kube_features.go); None where not served
COMPOSITE_API = None if K8S_VERSION.startswith("v1.36.") else "scheduling.k8s.io/v1alpha3"
DEPLOY = ROOT / "deploy" / "base" / "scheduler"
GPU = "nvidia.com/gpu"
TOPOLOGY_KEY = "gputopo.io/topology"
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
SCHEDULER_NAME = "gputopo-scheduler"
HOLD_GATE = "example.com/created-together"
#: What the control-plane suites run; the device-plugin suite needs only the device manager.
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-scheduler")
DEVICE_MANAGER = ("kubelet-devicemanager",)

T = TypeVar("T")


# ------------------------------------------------------------------------------ binaries


def binaries(need: Sequence[str] = CONTROL_PLANE) -> Path:
    """The folder holding the built components; skips the test (fails it under
    GPUTOPO_REAL_REQUIRED=1) when one it needs is missing, naming why in one line."""
    missing = [name for name in need if not os.access(BUILT / name, os.X_OK)]
    if missing:
        why = (
            f"real Kubernetes {K8S_VERSION} not built ({', '.join(missing)} missing in {BUILT}): "
            "`make test-real` builds them with Go"
        )
        if REQUIRED:
            pytest.fail(why)
        pytest.skip(why)
    return BUILT


def free_port() -> int:
    """A loopback port free now, for the components that take a number rather than 0."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ----------------------------------------------------------------------------- processes


def wait_for(cond: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll `cond` until it returns something truthy; AssertionError naming `what` at timeout."""
    end = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.text().splitlines()[-lines:])

    def alive(self) -> bool:
        return self.popen.poll() is None


class Procs:
    """Owns subprocesses: each in its own process group, output to a log file, all killed by
    `close()` (SIGTERM, then SIGKILL after `grace` seconds)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.procs: list[Proc] = []

    def start(
        self, name: str, argv: Sequence[str], *, stdin: int | None = None, env: dict[str, str] | None = None
    ) -> Proc:
        log = self.folder / f"{name}.{len(self.procs)}.log"
        with open(log, "wb") as out:
            popen = subprocess.Popen(
                list(argv),
                stdin=stdin if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE if stdin is not None else out,
                stderr=out,
                cwd=ROOT,
                env=env,
                start_new_session=True,
            )
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def kill(self, proc: Proc, sig: int = signal.SIGKILL, grace: float = 3.0) -> None:
        if proc.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.popen.pid, sig)
            try:
                proc.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.popen.pid, signal.SIGKILL)
                proc.popen.wait(timeout=5)
        for stream in (proc.popen.stdin, proc.popen.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def close(self) -> None:
        for proc in reversed(self.procs):
            self.kill(proc, signal.SIGTERM, grace=2.0)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ({p.log.name}):\n{p.tail()}" for p in self.procs)


def _wait_line(proc: Proc, pattern: str, timeout: float) -> re.Match[str]:
    rx = re.compile(pattern)

    def found() -> re.Match[str] | None:
        if not proc.alive():
            raise AssertionError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.tail()}")
        return rx.search(proc.text())

    return wait_for(found, timeout, f"{proc.name} to print {pattern!r}")


# --------------------------------------------------------------------------- API stand-in


class ApiError(Exception):
    def __init__(self, code: int, body: str) -> None:
        super().__init__(f"HTTP {code}: {body[:300]}")
        self.code = code


class Api:
    """Plain HTTP(S)/JSON to an API server: the stand-in (HTTP, no authentication) or the real
    kube-apiserver (HTTPS with its self-signed serving certificate, a bearer token)."""

    def __init__(self, url: str, token: str | None = None) -> None:
        self.url = url
        self.token = token
        self.ctx: ssl.SSLContext | None = None
        if url.startswith("https:"):
            self.ctx = ssl.create_default_context()
            self.ctx.check_hostname = False
            self.ctx.verify_mode = ssl.CERT_NONE

    def call(self, method: str, path: str, body: Any = None, ctype: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            req.add_header("Content-Type", ctype)
        try:
            with urllib.request.urlopen(req, timeout=10, context=self.ctx) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            raise ApiError(e.code, e.read().decode(errors="replace")) from None

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def status(self, path: str) -> int:
        """The HTTP status of a GET (0 when nothing answered), for health endpoints that
        answer text."""
        req = urllib.request.Request(self.url + path)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=5, context=self.ctx) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as e:
            return int(e.code)
        except OSError:
            return 0

    def create(self, path: str, obj: dict[str, Any]) -> Any:
        return self.call("POST", path, obj)

    def patch(self, path: str, patch: dict[str, Any]) -> Any:
        return self.call("PATCH", path, patch, "application/merge-patch+json")

    def delete(self, path: str) -> None:
        """Deleted at once (grace 0): no kubelet runs to finish a bound pod's graceful deletion."""
        with contextlib.suppress(ApiError):
            self.call("DELETE", path, {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0})

    # ---- the kinds the tests use

    def pods(self, ns: str) -> dict[str, dict[str, Any]]:
        items = self.get(f"/api/v1/namespaces/{ns}/pods")["items"]
        return {p["metadata"]["name"]: p for p in items}

    def placement(self, ns: str) -> dict[str, str]:
        """pod name -> node name ('' while unbound)."""
        return {n: (p.get("spec") or {}).get("nodeName") or "" for n, p in self.pods(ns).items()}


# ------------------------------------------------------------------------ the control plane

TOKEN = "gputopo-test-admin-token"
PODGROUP_CRD = ROOT / "deploy" / "components" / "podgroup-crd" / "podgroup-crd.yaml"


@dataclass
class ControlPlane:
    """etcd and the real kube-apiserver, as a cluster's control plane runs them: HTTPS (its own
    self-signed serving certificate), RBAC with the Node authorizer, the default admission
    plugins, ServiceAccount tokens signed with a key of this run. The tests are `system:masters`
    through a static token; `gates` and `runtime_config` turn on what a test needs (1.37's
    Workload API is beta and off by default)."""

    procs: Procs
    folder: Path
    bindir: Path
    gates: Sequence[str] = ()
    runtime_config: Sequence[str] = ()
    api: Api = field(init=False)
    kubeconfig: Path = field(init=False)
    url: str = ""

    def start(self) -> None:
        etcd_port, peer_port, port = free_port(), free_port(), free_port()
        etcd_url, peer_url = f"http://127.0.0.1:{etcd_port}", f"http://127.0.0.1:{peer_port}"
        self.procs.start(
            "etcd",
            [
                str(self.bindir / "etcd"),
                f"--data-dir={self.folder / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        wait_for(lambda: _http_ok(f"{etcd_url}/health"), 30, "etcd's /health")
        key = self.folder / "sa.key"
        subprocess.run(
            ["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True, timeout=60
        )
        tokens = self.folder / "tokens.csv"
        tokens.write_text(f'{TOKEN},gputopo-test-admin,gputopo-test-admin,"system:masters"\n')
        argv = [
            str(self.bindir / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self.folder / 'certs'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={key}",
            f"--service-account-signing-key-file={key}",
            f"--token-auth-file={tokens}",
            "--authorization-mode=Node,RBAC",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--endpoint-reconciler-type=none",
        ]
        if self.gates:
            argv.append(f"--feature-gates={','.join(self.gates)}")
        if self.runtime_config:
            argv.append(f"--runtime-config={','.join(self.runtime_config)}")
        proc = self.procs.start("kube-apiserver", argv)
        self.url = f"https://127.0.0.1:{port}"
        self.api = Api(self.url, TOKEN)

        def ready() -> bool:
            if not proc.alive():
                raise AssertionError(f"kube-apiserver exited with {proc.popen.returncode}:\n{proc.tail()}")
            return self.api.status("/readyz") == 200

        wait_for(ready, 90, "kube-apiserver's /readyz", interval=0.2)
        self.kubeconfig = self.folder / "kubeconfig.yaml"
        self.kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {"name": "real", "cluster": {"server": self.url, "insecure-skip-tls-verify": True}}
                    ],
                    "users": [{"name": "admin", "user": {"token": TOKEN}}],
                    "contexts": [{"name": "real", "context": {"cluster": "real", "user": "admin"}}],
                    "current-context": "real",
                }
            )
        )

    def install_crd(self, path: Path = PODGROUP_CRD) -> None:
        """Create a CRD and wait until it is Established (served)."""
        crd = yaml.safe_load(path.read_text())
        with contextlib.suppress(ApiError):
            self.api.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        name = crd["metadata"]["name"]

        def established() -> bool:
            got = self.api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            conds = (got.get("status") or {}).get("conditions") or []
            return any(c.get("type") == "Established" and c.get("status") == "True" for c in conds)

        wait_for(established, 30, f"CRD {name} established", interval=0.2)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


# ------------------------------------------------------------------------------- objects


def annotation(name: str, preset: str = "dgx-a100", allocated: Sequence[int] = ()) -> str:
    """The `gputopo.io/topology` annotation the plugin of a node with `preset` writes now."""
    topo = load_preset(preset)
    return encode(make(name, topo, generated_at=time.time(), plugin_version="0.1.0", allocated=allocated))


def node(
    name: str,
    leaf: str,
    spine: str = "spine-1",
    *,
    gpus: int = 8,
    preset: str | None = "dgx-a100",
    allocated: Sequence[int] = (),
    unschedulable: bool = False,
    cpu: str = "96",
    taints: Sequence[dict[str, str]] = (),
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Ready GPU node as kubelet and our plugin would have published it."""
    res = {"cpu": cpu, "memory": "1024Gi", "pods": "110", GPU: str(gpus)}
    spec: dict[str, Any] = {}
    if unschedulable:
        spec["unschedulable"] = True
    if taints:
        spec["taints"] = [dict(t) for t in taints]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, LEAF: leaf, SPINE: spine, **(labels or {})},
            "annotations": {TOPOLOGY_KEY: annotation(name, preset, allocated)} if preset else {},
        },
        "spec": spec,
        "status": {
            "capacity": dict(res),
            "allocatable": dict(res),
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            "nodeInfo": {"kubeletVersion": "v1.35.4"},
        },
    }


def pod(
    name: str,
    gpus: int,
    *,
    gang: str | None = None,
    node_selector: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    res = {GPU: str(gpus), "cpu": "1", "memory": "1Gi"}
    spec: dict[str, Any] = {
        "schedulerName": SCHEDULER_NAME,
        "containers": [{"name": "main", "image": "busybox", "resources": {"requests": res, "limits": res}}],
        "restartPolicy": "Never",
    }
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {POD_GROUP_LABEL: gang} if gang else {},
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def podgroup(name: str, min_member: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"minMember": min_member},
    }


# ------------------------------------------------------------------------- the deploy config


def deploy_scheduler_config() -> dict[str, Any]:
    """The KubeSchedulerConfiguration the deploy manifests put into the scheduler's ConfigMap
    (the file kustomization.yaml's configMapGenerator names as config.yaml)."""
    kust = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    (gen,) = [g for g in kust["configMapGenerator"] if g["name"] == "gputopo-scheduler-config"]
    (entry,) = [f for f in gen["files"] if f.startswith("config.yaml=")]
    return yaml.safe_load((DEPLOY / entry.split("=", 1)[1]).read_text())


def deploy_containers() -> dict[str, dict[str, Any]]:
    dep = yaml.safe_load((DEPLOY / "deployment.yaml").read_text())
    return {c["name"]: c for c in dep["spec"]["template"]["spec"]["containers"]}


def scheduler_config(kubeconfig: Path, extender_url: str) -> dict[str, Any]:
    """The deploy config with only what must change to run here: the API connection (a
    kubeconfig instead of the in-cluster ServiceAccount), no leader election, and the
    extender's URL (our sidecar's port)."""
    cfg = deploy_scheduler_config()
    cfg["clientConnection"] = {"kubeconfig": str(kubeconfig)}
    cfg["leaderElection"] = {"leaderElect": False}
    (ext,) = cfg["extenders"]
    ext["urlPrefix"] = extender_url
    return cfg


def sidecar_args(listen_port: int) -> list[str]:
    """The extender container's args from deploy/, with its ports moved to free loopback ones."""
    out = []
    for arg in deploy_containers()["extender"].get("args", []):
        if arg.startswith("--listen="):
            arg = f"--listen=127.0.0.1:{listen_port}"
        elif arg.startswith("--metrics-listen="):
            arg = "--metrics-listen=127.0.0.1:0"
        out.append(arg)
    return out


def scheduler_flags() -> list[str]:
    """kube-scheduler's flags from deploy/ (minus --config, given per run); --secure-port=0
    because its health port 10259 may be taken on a shared machine."""
    cmd = deploy_containers()["kube-scheduler"]["command"]
    return [a for a in cmd[1:] if not a.startswith("--config")] + ["--secure-port=0"]


# ------------------------------------------------------------------------------- a cluster

_REFUSAL = re.compile(r'\] "(Unable to schedule pod; no fit; waiting|Error scheduling pod; retrying)"')
_KV = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass
class Cluster:
    """The real control plane (etcd, kube-apiserver), our sidecar and the real kube-scheduler,
    wired as deploy/ wires them. Tests put nodes and pods in a namespace of their own and clean
    up with `reset()`. `gang_api` turns on Kubernetes' own Workload/PodGroup API
    (`scheduling.k8s.io/v1beta1`, feature gate GenericWorkload) in the API server and, with it,
    kube-scheduler's GangScheduling plugin."""

    procs: Procs
    folder: Path
    bindir: Path
    gang_api: bool = False
    api: Api = field(init=False)
    kubeconfig: Path = field(init=False)
    control: ControlPlane = field(init=False)
    sidecar: Proc | None = None
    sidecar_port: int = 0
    scheduler: Proc | None = None
    _nodes: set[str] = field(default_factory=set)
    _namespaces: set[str] = field(default_factory=set)

    @property
    def gates(self) -> list[str]:
        if not self.gang_api:
            return []
        if COMPOSITE_API is None:
            return ["GenericWorkload=true"]
        return ["GenericWorkload=true", "TopologyAwareWorkloadScheduling=true", "CompositePodGroup=true"]

    def start_api(self) -> None:
        runtime = [f"{GANG_API}=true"] if self.gang_api else []
        if self.gang_api and COMPOSITE_API is not None:
            runtime.append(f"{COMPOSITE_API}=true")
        self.control = ControlPlane(self.procs, self.folder, self.bindir, self.gates, runtime)
        self.control.start()
        self.control.install_crd()
        self.api = self.control.api
        self.kubeconfig = self.control.kubeconfig

    def start_sidecar(self) -> None:
        """`python -m scheduler` in live mode; the first start takes a free port (0) and every
        restart the same one, since kube-scheduler's config names it."""
        proc = self.procs.start(
            "sidecar",
            [
                sys.executable,
                "-m",
                "scheduler",
                *sidecar_args(self.sidecar_port),
                "--kubeconfig",
                str(self.kubeconfig),
            ],
        )
        m = _wait_line(proc, r'"event":"listening".*?"url":"http://127\.0\.0\.1:(\d+)"', 30)
        self.sidecar_port = int(m.group(1))
        self.sidecar = proc
        wait_for(lambda: self._ready(self.sidecar_port), 30, "the sidecar's /readyz")

    @staticmethod
    def _ready(port: int) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def kill_sidecar(self) -> None:
        assert self.sidecar is not None
        self.procs.kill(self.sidecar, signal.SIGKILL)
        self.sidecar = None

    def start_scheduler(self, bindir: Path) -> None:
        cfg = scheduler_config(self.kubeconfig, f"http://127.0.0.1:{self.sidecar_port}")
        path = self.folder / "kube-scheduler-config.yaml"
        path.write_text(yaml.safe_dump(cfg))
        gates = [f"--feature-gates={','.join(self.gates)}"] if self.gates else []
        self.scheduler = self.procs.start(
            "kube-scheduler", [str(bindir / "kube-scheduler"), f"--config={path}", *scheduler_flags(), *gates]
        )
        # the scheduling loop runs once the informers of the two kinds it schedules with synced
        for kind in ("Node", "Pod"):
            _wait_line(self.scheduler, rf'Caches populated" type="\*v1\.{kind}"', 30)

    # ---- objects

    def namespace(self, ns: str) -> str:
        """A namespace with its `default` ServiceAccount, which the ServiceAccount admission
        plugin requires of every pod and which no controller-manager runs here to create."""
        with contextlib.suppress(ApiError):
            self.api.create("/api/v1/namespaces", {"metadata": {"name": ns}})
        with contextlib.suppress(ApiError):
            self.api.create(f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": "default"}})
        self._namespaces.add(ns)
        return ns

    def add_nodes(self, *nodes: dict[str, Any]) -> None:
        """Create Ready nodes. The API server's TaintNodesByCondition admission taints every new
        Node `node.kubernetes.io/not-ready` until the node lifecycle controller sees it Ready;
        no controller-manager runs here, so the test lifts it as that controller would."""
        for n in nodes:
            made = self.api.create("/api/v1/nodes", n)
            self._nodes.add(n["metadata"]["name"])
            want = (n.get("spec") or {}).get("taints") or []
            if ((made.get("spec") or {}).get("taints") or []) != want:
                self.api.patch(f"/api/v1/nodes/{n['metadata']['name']}", {"spec": {"taints": want or None}})

    def patch_node(self, name: str, patch: dict[str, Any]) -> None:
        self.api.patch(f"/api/v1/nodes/{name}", patch)

    def add_podgroup(self, ns: str, name: str, min_member: int) -> None:
        self.api.create(
            f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups", podgroup(name, min_member)
        )

    def add_pods(self, ns: str, *pods: dict[str, Any]) -> None:
        for p in pods:
            self.api.create(f"/api/v1/namespaces/{ns}/pods", p)

    def add_gang(self, ns: str, group: str, *pods: dict[str, Any]) -> None:
        """A PodGroup (minMember = len(pods)) and its pods, all created before kube-scheduler
        may try any: each is created behind a scheduling gate, then every gate is lifted. A
        member tried while its peers are still being created is refused "waiting for members"
        and parked, and the later members' adds are no cluster event that brings it back."""
        self.add_podgroup(ns, group, len(pods))
        for p in pods:
            gated = json.loads(json.dumps(p))
            gated["spec"]["schedulingGates"] = [{"name": HOLD_GATE}]
            self.api.create(f"/api/v1/namespaces/{ns}/pods", gated)
        for p in pods:
            self.api.patch(
                f"/api/v1/namespaces/{ns}/pods/{p['metadata']['name']}", {"spec": {"schedulingGates": None}}
            )

    def wait_until(
        self, ns: str, cond: Callable[[dict[str, str]], bool], timeout: float = 20.0, what: str = ""
    ) -> dict[str, str]:
        """The namespace's placement (pod -> node, '' while unbound) once `cond` holds of it;
        AssertionError with the placement so far and the components' log tails at `timeout`."""
        last: dict[str, str] = {}

        def done() -> bool:
            last.clear()
            last.update(self.api.placement(ns))
            return cond(last)

        try:
            wait_for(done, timeout, what or "the placement", interval=0.1)
        except AssertionError as e:
            raise AssertionError(f"{e}; placement {last}\n{self.procs.logs()}") from None
        return dict(last)

    def wait_bound(
        self, ns: str, names: Sequence[str], timeout: float = 20.0, forbidden: set[str] = frozenset()
    ) -> dict[str, str]:
        """Where each of `names` was bound, once all are. A pod bound to a `forbidden` node fails
        at once (AssertionError naming it), without waiting for the others."""

        def cond(placed: dict[str, str]) -> bool:
            wrong = {p: n for p, n in placed.items() if n in forbidden}
            if wrong:
                raise AssertionError(f"bound to a node it must not use: {wrong}")
            return all(placed.get(n) for n in names)

        placed = self.wait_until(ns, cond, timeout, f"{list(names)} bound")
        return {n: placed[n] for n in names}

    def refusals(self, ns: str, pod: str) -> list[str]:
        """Why kube-scheduler's cycles for `pod` ended without a node, one message per cycle, from
        its log (-v=2, deploy's verbosity, prints each): "no fit" (the filters and the extender's
        reasons) or "retrying" (an error, e.g. the extender unreachable). The API's Events carry
        only the first messages: later ones are folded into an event series."""
        assert self.scheduler is not None
        out = []
        for line in self.scheduler.text().splitlines():
            if _REFUSAL.search(line):
                fields = dict(_KV.findall(line))
                if fields.get("pod") == f"{ns}/{pod}":
                    out.append(fields.get("err", "").replace('\\"', '"'))
        return out

    def wait_refused(
        self, ns: str, names: Sequence[str], match: str = "", timeout: float = 20.0
    ) -> dict[str, list[str]]:
        """`refusals()` of each of `names`, once each has one matching the regular expression
        `match`; AssertionError with what was seen and the log tails at `timeout`."""
        got: dict[str, list[str]] = {}
        rx = re.compile(match)

        def done() -> bool:
            got.clear()
            got.update({n: self.refusals(ns, n) for n in names})
            return all(any(rx.search(m) for m in got[n]) for n in names)

        try:
            wait_for(done, timeout, f"kube-scheduler refusing {list(names)} with {match!r}", 0.2)
        except AssertionError as e:
            raise AssertionError(f"{e}; refusals {got}\n{self.procs.logs()}") from None
        return got

    def reset(self) -> None:
        """Delete what the tests created (pods first, so no bind races a deleted node)."""
        for ns in sorted(self._namespaces):
            for name in self.api.pods(ns):
                self.api.delete(f"/api/v1/namespaces/{ns}/pods/{name}")
            groups = ["scheduling.x-k8s.io/v1alpha1"] + ([GANG_API] if self.gang_api else [])
            for gv in groups:
                for g in self.api.get(f"/apis/{gv}/namespaces/{ns}/podgroups")["items"]:
                    self.api.delete(f"/apis/{gv}/namespaces/{ns}/podgroups/{g['metadata']['name']}")
            if self.gang_api and COMPOSITE_API is not None:
                path = f"/apis/{COMPOSITE_API}/namespaces/{ns}/compositepodgroups"
                for g in self.api.get(path)["items"]:
                    self.api.delete(f"{path}/{g['metadata']['name']}")
        for name in sorted(self._nodes):
            self.api.delete(f"/api/v1/nodes/{name}")
        self._nodes.clear()


@contextlib.contextmanager
def cluster(folder: Path, *, gang_api: bool = False) -> Iterator[Cluster]:
    """A running cluster (etcd, kube-apiserver, sidecar, kube-scheduler) torn down whatever
    happens."""
    bindir = binaries()
    procs = Procs(folder)
    c = Cluster(procs, folder, bindir, gang_api=gang_api)
    try:
        c.start_api()
        c.start_sidecar()
        c.start_scheduler(bindir)
        yield c
    finally:
        procs.close()


# ------------------------------------------------------------------------- the DRA daemon


def dra_daemon(procs: Procs, kubeconfig: Path, node: str, preset: str, folder: Path) -> Proc:
    """`python -m deviceplugin --mode dra` for `node` as its DaemonSet runs it (NODE_NAME from the
    downward API), publishing to the API server of `kubeconfig`, kubelet's folders in `folder`."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": f"{ROOT}:{ROOT / 'proto'}",
        "NODE_NAME": node,
    }
    argv = [sys.executable, "-m", "deviceplugin", "--mode", "dra", "--topology", preset]
    argv += ["--kubeconfig", str(kubeconfig), "--registry-dir", str(folder / "registry")]
    argv += ["--plugins-dir", str(folder / "plugins"), "--metrics-port", "0"]
    return procs.start(f"dra-{node}", argv, env=env)


# ------------------------------------------------------------------- kubelet device manager


class DeviceManager:
    """`kubelet-devicemanager`: kubelet's device and topology managers, one JSON command per
    stdin line, one JSON answer per stdout line."""

    def __init__(
        self, procs: Procs, bindir: Path, folder: Path, *, policy: str = "none", numa: int = 2
    ) -> None:
        self.procs = procs
        self.proc = procs.start(
            "kubelet",
            [
                str(bindir / "kubelet-devicemanager"),
                "--dir",
                str(folder),
                "--resource",
                GPU,
                "--policy",
                policy,
                "--numa",
                str(numa),
            ],
            stdin=subprocess.PIPE,
        )
        started = self.read(30)
        if started.get("event") != "started":
            raise AssertionError(f"kubelet-devicemanager did not start: {started}\n{self.proc.tail()}")

    def ask(self, command: dict[str, Any], timeout: float = 15.0) -> dict[str, Any]:
        stdin: IO[bytes] | None = self.proc.popen.stdin
        assert stdin is not None
        stdin.write(json.dumps(command).encode() + b"\n")
        stdin.flush()
        return self.read(timeout, command)

    def read(self, timeout: float, command: object = "its start") -> dict[str, Any]:
        stdout: IO[bytes] | None = self.proc.popen.stdout
        assert stdout is not None
        line = _readline(stdout, timeout)
        if not line:
            raise AssertionError(f"kubelet-devicemanager gave no answer to {command}:\n{self.proc.tail()}")
        return json.loads(line)

    def stop(self) -> None:
        with contextlib.suppress(OSError, AssertionError, ValueError):
            self.ask({"op": "quit"}, timeout=5)
        self.procs.kill(self.proc, signal.SIGTERM)


def _readline(stream: IO[bytes], timeout: float) -> bytes:
    import selectors

    fd = stream.fileno()
    buf = b""
    end = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while not buf.endswith(b"\n"):
            left = end - time.monotonic()
            if left <= 0 or not sel.select(left):
                return b""
            chunk = os.read(fd, 1)
            if not chunk:
                return buf
            buf += chunk
    return buf
