"""Harness for running the project under the real Kubernetes components in `../shared/realk8s/`.

The real kube-scheduler (v1.35) and kubelet's real device manager (v1.32) are the clients our two
daemons serve in a user's cluster; here they run as subprocesses against the API server stand-in
of that folder, and the tests drive them as a user would: create Nodes, PodGroups and Pods over
HTTP, then watch where the pods end up. Everything skips cleanly when the folder is absent (a
newcomer's clone) or its binaries do not unpack; CI has it.

Every process started here is owned by a `Procs` and killed (process group, SIGKILL after a
short grace) when its fixture ends, also when a test fails. Ports are taken with port 0 and read
back from what the process prints, never guessed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
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
REALK8S = Path(os.environ.get("GPUTOPO_REALK8S", ROOT.parent / "shared" / "realk8s"))
DEPLOY = ROOT / "deploy" / "base" / "scheduler"
GPU = "nvidia.com/gpu"
TOPOLOGY_KEY = "gputopo.io/topology"
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
SCHEDULER_NAME = "gputopo-scheduler"
HOLD_GATE = "example.com/created-together"

T = TypeVar("T")


# ------------------------------------------------------------------------------ binaries


_BIN: list[Path | str] = []


def binaries() -> Path:
    """The folder holding `kube-scheduler` and `kubelet-devicemanager`; skips the test when
    `../shared/realk8s` is absent or its `unpack` fails (once per session, the answer cached)."""
    if not _BIN:
        _BIN.append(_unpack())
    found = _BIN[0]
    if isinstance(found, str):
        pytest.skip(found)
    return found


def _unpack() -> Path | str:
    unpack = REALK8S / "unpack"
    if not unpack.is_file():
        return f"real Kubernetes components not present ({REALK8S})"
    try:
        out = subprocess.run(
            ["sh", str(unpack)], capture_output=True, text=True, timeout=120, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"{unpack} failed: {e}"
    folder = Path(out.splitlines()[-1]) if out else Path()
    for name in ("kube-scheduler", "kubelet-devicemanager"):
        if not os.access(folder / name, os.X_OK):
            return f"{unpack} did not produce {name} in {folder!s}"
    return folder


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
    """Plain HTTP/JSON to the stand-in (the one content type it speaks)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def call(self, method: str, path: str, body: Any = None, ctype: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", ctype)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            raise ApiError(e.code, e.read().decode(errors="replace")) from None

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def create(self, path: str, obj: dict[str, Any]) -> Any:
        return self.call("POST", path, obj)

    def patch(self, path: str, patch: dict[str, Any]) -> Any:
        return self.call("PATCH", path, patch, "application/merge-patch+json")

    def delete(self, path: str) -> None:
        with contextlib.suppress(ApiError):
            self.call("DELETE", path)

    # ---- the kinds the tests use

    def pods(self, ns: str) -> dict[str, dict[str, Any]]:
        items = self.get(f"/api/v1/namespaces/{ns}/pods")["items"]
        return {p["metadata"]["name"]: p for p in items}

    def placement(self, ns: str) -> dict[str, str]:
        """pod name -> node name ('' while unbound)."""
        return {n: (p.get("spec") or {}).get("nodeName") or "" for n, p in self.pods(ns).items()}


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
    """The deploy config with only what must change to run here (../shared/realk8s/README.md):
    the API connection (the stand-in's kubeconfig, JSON, which it speaks instead of protobuf), no
    leader election, and the extender's URL (our sidecar's port)."""
    cfg = deploy_scheduler_config()
    cfg["clientConnection"] = {"kubeconfig": str(kubeconfig), "contentType": "application/json"}
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
    """The stand-in API server, our sidecar and the real kube-scheduler, wired as deploy/ wires
    them. Tests put nodes and pods in a namespace of their own and clean up with `reset()`."""

    procs: Procs
    folder: Path
    api: Api = field(init=False)
    kubeconfig: Path = field(init=False)
    sidecar: Proc | None = None
    sidecar_port: int = 0
    scheduler: Proc | None = None
    _nodes: set[str] = field(default_factory=set)
    _namespaces: set[str] = field(default_factory=set)

    def start_api(self) -> None:
        self.kubeconfig = self.folder / "kubeconfig.json"
        proc = self.procs.start(
            "apiserver",
            [
                sys.executable,
                str(REALK8S / "apiserver_standin.py"),
                "--port",
                "0",
                "--kubeconfig",
                str(self.kubeconfig),
            ],
        )
        port = int(_wait_line(proc, r"fake apiserver on 127\.0\.0\.1:(\d+)", 20).group(1))
        self.api = Api(f"http://127.0.0.1:{port}")

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
        self.scheduler = self.procs.start(
            "kube-scheduler", [str(bindir / "kube-scheduler"), f"--config={path}", *scheduler_flags()]
        )
        # the scheduling loop runs once the informers of the two kinds it schedules with synced
        for kind in ("Node", "Pod"):
            _wait_line(self.scheduler, rf'Caches populated" type="\*v1\.{kind}"', 30)

    # ---- objects

    def namespace(self, ns: str) -> str:
        with contextlib.suppress(ApiError):
            self.api.create("/api/v1/namespaces", {"metadata": {"name": ns}, "status": {"phase": "Active"}})
        self._namespaces.add(ns)
        return ns

    def add_nodes(self, *nodes: dict[str, Any]) -> None:
        for n in nodes:
            self.api.create("/api/v1/nodes", n)
            self._nodes.add(n["metadata"]["name"])

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
            for g in self.api.get(f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups")["items"]:
                self.api.delete(
                    f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups/{g['metadata']['name']}"
                )
        for name in sorted(self._nodes):
            self.api.delete(f"/api/v1/nodes/{name}")
        self._nodes.clear()


@contextlib.contextmanager
def cluster(folder: Path) -> Iterator[Cluster]:
    """A running cluster (stand-in, sidecar, kube-scheduler) torn down whatever happens."""
    bindir = binaries()
    procs = Procs(folder)
    c = Cluster(procs, folder)
    try:
        c.start_api()
        c.start_sidecar()
        c.start_scheduler(bindir)
        yield c
    finally:
        procs.close()


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
