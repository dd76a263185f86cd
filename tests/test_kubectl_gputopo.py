"""`kubectl gputopo` against the API server stand-in over HTTP, through the official client and
a kubeconfig as a user has one: nodes, topo and why, every output format, and every failure
as one line with its exit code."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gputopo.network.annotation import encode, make
from gputopo.node.allocator import AllocatorPool
from gputopo.node.topofile import load_preset
from kubectl_gputopo import views
from kubectl_gputopo.cli import main
from tests import fake_apiserver as fk

NOW = 1_800_000_000.0
KEY = "gputopo.io/topology"
GROUP = "scheduling.x-k8s.io/pod-group"


class _Handler(fk._Handler):
    """The stand-in, plus the reads only `kubectl gputopo` makes: one node, the pods of a
    namespace, Events by field selector, a namespaced PodGroup, and label selectors on nodes."""

    def do_GET(self) -> None:
        api = self.server.api
        url = urlparse(self.path)
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        path = url.path
        if path == "/api/v1/nodes" and "watch" not in q:
            want = dict(part.split("=", 1) for part in q.get("labelSelector", "").split(",") if part)
            with api.cond:
                items = sorted(
                    (n for n in api.objects["nodes"].values()
                     if all(n["metadata"]["labels"].get(k) == v for k, v in want.items())),
                    key=lambda n: n["metadata"]["name"],
                )  # fmt: skip
            start = int(q.get("continue") or 0)
            limit = int(q.get("limit") or len(items) or 1)
            meta = {"resourceVersion": "1"}
            if start + limit < len(items):
                meta["continue"] = str(start + limit)
            api.requests.append(("list:nodes", q.get("continue", "")))
            self._json(200, {"kind": "NodeList", "metadata": meta, "items": items[start : start + limit]})
            return
        if m := re.fullmatch(r"/api/v1/nodes/([^/]+)", path):
            node = api.objects["nodes"].get(m.group(1))
            if node is None:
                self._status(404, "NotFound", f'nodes "{m.group(1)}" not found')
            else:
                self._json(200, node)
            return
        if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods", path):
            items = [p for p in api.objects["pods"].values() if p["metadata"]["namespace"] == m.group(1)]
            self._json(200, {"kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": items})
            return
        if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/events", path):
            fields = dict(part.split("=", 1) for part in q.get("fieldSelector", "").split(",") if part)
            items = [
                e for e in api.objects["events"].values()
                if e["metadata"]["namespace"] == m.group(1)
                and all(e["involvedObject"].get(k.split(".", 1)[1]) == v for k, v in fields.items())
            ]  # fmt: skip
            self._json(200, {"kind": "EventList", "metadata": {"resourceVersion": "1"}, "items": items})
            return
        if m := re.fullmatch(r"/apis/([^/]+)/([^/]+)/namespaces/([^/]+)/([^/]+)/([^/]+)", path):
            group, version, ns, plural, name = m.groups()
            obj = api.objects["custom"].get(f"{group}/{version}/{plural}/{ns}/{name}")
            if obj is None:
                self._status(404, "NotFound", f'{plural}.{group} "{name}" not found')
            else:
                self._json(200, obj)
            return
        m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)", path)
        if m and f"{m.group(1)}/{m.group(2)}" not in api.objects["pods"]:
            self._status(404, "NotFound", f'pods "{m.group(2)}" not found')
            return
        super().do_GET()


class _Server(fk.FakeServer):
    def __init__(self, api: fk.FakeAPI) -> None:
        self.api = api
        self.closing = False
        ThreadingHTTPServer.__init__(self, ("127.0.0.1", 0), _Handler)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[fk.FakeAPI, str]]:
    """The stand-in on a loopback port and a kubeconfig naming it (context namespace `ml`)."""
    api = fk.FakeAPI()
    api.objects["events"] = {}
    api.objects["custom"] = {}
    server = _Server(api)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": server.url}}],
                "users": [{"name": "me", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "ml", "context": {"cluster": "fake", "user": "me", "namespace": "ml"}},
                    {"name": "other", "context": {"cluster": "fake", "user": "me"}},
                ],
                "current-context": "ml",
            }
        )
    )
    try:
        yield api, str(kubeconfig)
    finally:
        server.closing = True
        api.break_watches()
        server.shutdown()
        server.server_close()


def ann(name: str, preset: str = "dgx-a100", *, at: float, allocated=(), unhealthy=(), policy=None) -> str:
    text = encode(
        make(
            name,
            load_preset(preset),
            generated_at=at,
            plugin_version="0.1.0",
            allocated=allocated,
            unhealthy=unhealthy,
        )
    )
    if policy is not None:
        doc = json.loads(text)
        doc["policy"] = policy
        text = json.dumps(doc)
    return text


def run(capsys: pytest.CaptureFixture[str], kubeconfig: str, *args: str) -> tuple[int, str, str]:
    code = main(["--kubeconfig", kubeconfig, *args])
    out, err = capsys.readouterr()
    return code, out, err


def event(ns: str, kind: str, name: str, reason: str, message: str, at: str, n: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"namespace": ns, "name": f"{name}.{n}"},
        "involvedObject": {"kind": kind, "name": name, "namespace": ns},
        "reason": reason,
        "message": message,
        "type": "Normal" if "Wait" not in reason else "Warning",
        "source": {"component": "gputopo-scheduler"},
        "lastTimestamp": at,
        "count": 1,
    }


# ---------------------------------------------------------------------------- nodes


def test_nodes_lists_every_gpu_node_and_one_bad_annotation_costs_one_row(
    cluster, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    api, kubeconfig = cluster
    monkeypatch.setattr("kubectl_gputopo.cli.time.time", lambda: NOW)
    api.put(
        "nodes",
        fk.node(
            "a100-1", {"pool": "a"}, annotations={KEY: ann("a100-1", at=NOW - 180, allocated=(0, 1, 2, 3))}
        ),
    )
    api.put(
        "nodes",
        fk.node(
            "h100-1",
            {"pool": "h"},
            annotations={
                KEY: ann("h100-1", "hgx-h100", at=NOW - 30, unhealthy=(7,), policy="best-effort-pairs")
            },
        ),
    )
    api.put(
        "nodes",
        fk.node(
            "gb200-1", {"pool": "g"}, gpus=4, annotations={KEY: ann("gb200-1", "gb200-tray", at=NOW - 3600)}
        ),
    )
    api.put("nodes", fk.node("bad-1", {"pool": "a"}, annotations={KEY: "{corrupt"}))
    api.put("nodes", fk.node("plain-1", {"pool": "a"}))  # GPUs, no annotation
    cpu = fk.node("cpu-1", {"pool": "c"})
    cpu["status"] = {"allocatable": {"cpu": "96"}}
    api.put("nodes", cpu)
    code, out, err = run(capsys, kubeconfig, "nodes")
    assert code == 0 and err == ""
    rows = {
        line.split()[0]: line.split() for line in out.splitlines()[1:] if line and not line.startswith("RING")
    }
    assert set(rows) == {"a100-1", "bad-1", "gb200-1", "h100-1", "plain-1"}, "CPU-only nodes are left out"
    header = out.splitlines()[0].split()
    assert header == ["NODE", "GPUS", "FREE", "HEALTHY", "RING2", "RING4", "RING8", "AGE", "STATUS"]
    # dgx-a100 with 0-3 taken: 4 free, NV12 x 25 = 300 GB/s rings, no 8 left
    assert rows["a100-1"][1:8] == ["8", "4", "8", "300", "300", "-", "3m"]
    assert rows["h100-1"][1:8] == ["8", "7", "7", "450", "450", "-", "30s"]  # GPU 7 unhealthy: not free
    assert rows["gb200-1"][1:7] == ["4", "4", "4", "900", "900", "-"] and "stale" in " ".join(rows["gb200-1"])
    assert "invalid: annotation is not JSON" in next(
        line for line in out.splitlines() if line.startswith("bad-1")
    )
    assert "no annotation" in next(line for line in out.splitlines() if line.startswith("plain-1"))

    code, out, _ = run(capsys, kubeconfig, "nodes", "-o", "json")
    doc = {r["name"]: r for r in json.loads(out)}
    assert doc["h100-1"]["best_ring_gbps"] == {"2": 450.0, "4": 450.0, "8": None}
    assert doc["h100-1"]["unhealthy"] == [7] and doc["h100-1"]["policy"] == "best-effort-pairs"
    assert doc["a100-1"]["annotation_age_s"] == 180 and doc["a100-1"]["allocated"] == [0, 1, 2, 3]
    assert doc["bad-1"]["gpus"] == 8 and doc["bad-1"]["free"] is None
    _, out_yaml, _ = run(capsys, kubeconfig, "nodes", "-o", "yaml")
    _, out_alias, _ = run(capsys, kubeconfig, "nodes", "--json")
    assert yaml.safe_load(out_yaml) == json.loads(out_alias) == json.loads(out)

    code, out, _ = run(capsys, kubeconfig, "nodes", "-o", "wide", "-l", "pool=h")
    assert code == 0 and out.splitlines()[0].split()[8:13] == [
        "TOPOLOGY",
        "NVLINK",
        "PLUGIN",
        "POLICY",
        "UNHEALTHY",
    ]
    assert out.splitlines()[1].split()[8:13] == ["hgx-h100", "25", "0.1.0", "best-effort-pairs", "7"]
    assert len([line for line in out.splitlines() if line.startswith("h100")]) == 1


# ---------------------------------------------------------------------------- topo


def test_topo_prints_the_nodes_matrix_as_gputopo_topo_does(cluster, capsys, monkeypatch) -> None:
    api, kubeconfig = cluster
    monkeypatch.setattr("kubectl_gputopo.cli.time.time", lambda: NOW)
    api.put(
        "nodes", fk.node("v100-1", annotations={KEY: ann("v100-1", "dgx1-v100", at=NOW - 42, allocated=(1,))})
    )
    code, out, err = run(capsys, kubeconfig, "topo", "v100-1")
    assert code == 0 and err == ""
    local = subprocess.run(
        [sys.executable, "-m", "gputopo", "topo", "--topology", "dgx1-v100"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert out.startswith(local.replace("dgx1-v100:", "dgx1-v100:", 1).rstrip("\n")), "the core's rendering"
    assert (
        "node v100-1: annotation 42 s ago (plugin 0.1.0); free 0,2,3,4,5,6,7; allocated 1; unhealthy none"
        in out
    )
    code, out, _ = run(capsys, kubeconfig, "topo", "node/v100-1", "-o", "json")
    doc = json.loads(out)
    assert doc["allocated"] == [1] and doc["topology"]["bandwidth_gbps"][0][3] == 50.0
    assert doc["topology"]["best_ring_gbps"]["8"] == 50.0


def test_topo_of_a_node_without_a_usable_annotation_is_one_line(cluster, capsys) -> None:
    api, kubeconfig = cluster
    api.put("nodes", fk.node("bare"))
    assert run(capsys, kubeconfig, "topo", "bare")[::2] == (
        1,
        "kubectl gputopo: node bare: gputopo.io/topology: annotation missing\n",
    )
    code, out, err = run(capsys, kubeconfig, "topo", "nope")
    assert (code, out, err) == (1, "", 'kubectl gputopo: nodes "nope" not found\n')


# ---------------------------------------------------------------------------- why


def test_why_a_gang_member_waits_with_the_latest_reason(cluster, capsys, monkeypatch) -> None:
    api, kubeconfig = cluster
    monkeypatch.setattr("kubectl_gputopo.cli.time.time", lambda: NOW)
    api.objects["custom"]["scheduling.x-k8s.io/v1alpha1/podgroups/ml/train"] = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"namespace": "ml", "name": "train"},
        "spec": {"minMember": 3},
    }
    labels = {GROUP: "train"}
    api.put(
        "pods",
        fk.pod(
            "ml",
            "train-0",
            8,
            labels=labels,
            node_name="n1",
            annotations={"gputopo.io/predicted-gpus": "0,1,2,3,4,5,6,7"},
        ),
    )
    leaf = {"gputopo.io/required-topology": "network.topology.nvidia.com/leaf"}
    api.put("pods", fk.pod("ml", "train-1", 8, labels=labels, annotations=leaf))
    api.put("pods", fk.pod("ml", "train-2", 8, labels=labels))
    api.put("pods", fk.pod("ml", "solo", 1))
    api.put("pods", fk.pod("other", "train-9", 8, labels=labels))  # another namespace: not a member
    ev = api.objects["events"]
    ev["1"] = event(
        "ml",
        "PodGroup",
        "train",
        "GangWaiting",
        "2 of 3 members seen; waiting for quorum",
        "2027-01-15T07:59:00Z",
        1,
    )
    ev["2"] = event(
        "ml",
        "Pod",
        "train-1",
        "GangRefused",
        "no leaf has 3 nodes with 8 free GPUs",
        "2027-01-15T07:59:50Z",
        2,
    )
    ev["3"] = event("ml", "Pod", "solo", "Planned", "not in this gang", "2027-01-15T07:59:55Z", 3)
    code, out, err = run(capsys, kubeconfig, "why", "train-1")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "pod ml/train-1: Pending, waits: GangRefused: no leaf has 3 nodes with 8 free GPUs"
    assert lines.pop(1) == "asks for: gputopo.io/required-topology=network.topology.nvidia.com/leaf"
    assert lines[1].startswith(
        "gang ml/train (from label scheduling.x-k8s.io/pod-group; PodGroup found): 1 of 3"
    )
    assert "quorum 3" in lines[1]
    members = [line.split() for line in lines if line.startswith("  train-")]
    assert members == [
        ["train-0", "Pending", "n1", "0,1,2,3,4,5,6,7"],
        ["train-1", "Pending", "-", "-"],
        ["train-2", "Pending", "-", "-"],
    ]
    events = [line.split() for line in lines[lines.index("events (oldest first):") + 1 :]]
    assert events[0][:2] == ["AGE", "OBJECT"] and [e[1] for e in events[1:]] == [
        "podgroup/train",
        "pod/train-1",
    ]
    reasons = [e[3] for e in events[1:]]
    assert reasons == ["GangWaiting", "GangRefused"], "oldest first; another pod's events are not shown"
    code, out, _ = run(capsys, kubeconfig, "why", "pod/train-0", "-o", "yaml")
    doc = yaml.safe_load(out)
    assert doc["decision"] == "bound to n1" and doc["predicted_gpus"] == "0,1,2,3,4,5,6,7"
    assert doc["gang"]["min_member"] == 3 and doc["gang"]["bound"] == 1
    assert doc["annotations"] == {"gputopo.io/predicted-gpus": "0,1,2,3,4,5,6,7"}


def test_why_a_single_pod_in_the_namespace_flag_and_context(cluster, capsys) -> None:
    api, kubeconfig = cluster
    api.put("pods", fk.pod("default", "p", 2))
    api.put("pods", fk.pod("ml", "p", 2, node_name="n3"))
    code, out, _ = run(capsys, kubeconfig, "why", "p", "-o", "json")
    assert code == 0 and json.loads(out)["pod"] == "ml/p", "the context's namespace"
    assert json.loads(out)["decision"] == "bound to n3"
    code, out, _ = run(capsys, kubeconfig, "-n", "default", "why", "p")
    assert out.splitlines()[0] == "pod default/p: Pending, waits: no Event yet (nothing decided or reported)"
    assert (
        "events: none" in out
        and json.loads(run(capsys, kubeconfig, "--context", "other", "why", "p", "--json")[1])["pod"]
        == "default/p"
    )
    assert run(capsys, kubeconfig, "why", "missing")[::2] == (
        1,
        'kubectl gputopo: pods "missing" not found\n',
    )


# ---------------------------------------------------------------------------- failures


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["why", "Bad_Name"], "is not a valid Kubernetes name"),
        (["topo", "a/b"], "is not a valid Kubernetes name"),
        (["why", "p", "-n", "NS!"], "is not a valid Kubernetes namespace"),
        (["nodes", "-o", "xml"], "invalid choice"),
        (["nodes", "--max-age", "nan"], "--max-age must be a positive"),
        (["nodes", "--request-timeout", "-1"], "--request-timeout must be a positive"),
        (["frobnicate"], "invalid choice"),
        ([], "required"),
        (["--context", "nope", "nodes"], "nope"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(cluster, capsys, argv: list[str], message: str) -> None:
    api, kubeconfig = cluster
    code, out, err = run(capsys, kubeconfig, *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err, err
    assert err.startswith("kubectl gputopo: error: ")
    assert api.requests == [], "bad input makes no request"


def test_unreachable_api_server_and_broken_kubeconfig(tmp_path: Path, capsys) -> None:
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    code, out, err = run(capsys, str(cfg), "nodes", "--request-timeout", "2")
    assert (
        code == 1
        and out == ""
        and err.startswith("kubectl gputopo: cannot reach the API server")
        and err.count("\n") == 1
    )
    cfg.write_text("{")
    code, _, err = run(capsys, str(cfg), "nodes")
    assert code == 2 and err.count("\n") == 1 and str(cfg) in err


def test_the_console_script_kubectl_finds(cluster) -> None:
    """kubectl runs `kubectl-gputopo` from PATH: the script is declared, and the module runs as a
    process with the same flags, `--version` on every command."""
    _, kubeconfig = cluster
    scripts = {ep.name: ep.value for ep in entry_points(group="console_scripts")}
    assert scripts.get("kubectl-gputopo") == "kubectl_gputopo.cli:main"
    for command in ([], ["nodes"], ["topo"], ["why"]):
        out = subprocess.run(
            [sys.executable, "-m", "kubectl_gputopo", *command, "--version"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0 and out.stdout.strip().endswith("0.1.0"), out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "kubectl_gputopo", "--kubeconfig", kubeconfig, "nodes"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "No GPU nodes found" in out.stdout and out.stderr == ""


# ---------------------------------------------------------------------------- totality

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)


def shaped(keys: list[str]) -> st.SearchStrategy[dict]:
    """Objects with the keys the views read, holding anything."""
    return st.fixed_dictionaries({}, optional={k: JSON for k in keys})


@settings(max_examples=300, deadline=None)
@given(
    meta=shaped(["name", "labels", "annotations"]),
    status=JSON,
    text=st.one_of(st.text(max_size=40), JSON.map(json.dumps)),
)
def test_any_node_is_a_row_or_none(meta: dict, status: object, text: str) -> None:
    meta = dict(meta)
    if isinstance(meta.get("annotations"), dict):
        meta["annotations"] = {**meta["annotations"], KEY: text}
    row = views.node_row(
        {"metadata": meta, "status": status},
        now=NOW,
        max_age_s=900,
        pool=AllocatorPool(),
        resource="nvidia.com/gpu",
    )
    if row is not None:
        assert row["status"] and views.render_nodes([row], wide=True).count("\n") == 3


GANG_KEYS = [
    views.POD_GROUP_LABEL,
    views.LIGHT_GROUP_LABEL,
    views.LIGHT_MIN_LABEL,
    views.VOLCANO_GROUP_ANNOTATION,
]
POD = st.fixed_dictionaries(
    {},
    optional={
        "metadata": st.fixed_dictionaries(
            {},
            optional={
                "name": JSON,
                "namespace": JSON,
                "labels": st.dictionaries(st.sampled_from(GANG_KEYS), JSON) | JSON,
                "annotations": st.dictionaries(
                    st.sampled_from([*GANG_KEYS, views.PREDICTED_ANNOTATION]), JSON
                )
                | JSON,
            },
        ),
        "spec": shaped(["nodeName", "schedulingGroup", "workloadRef"]),
        "status": shaped(["phase"]),
    },
)
GANG_OBJECT = st.none() | st.fixed_dictionaries(
    {}, optional={"kind": JSON, "spec": shaped(["minMember", "schedulingPolicy", "podGroups"])}
)


@settings(max_examples=300, deadline=None)
@given(
    pod=POD,
    events=st.lists(
        shaped(["involvedObject", "reason", "message", "type", "lastTimestamp", "count", "source"]),
        max_size=3,
    ),
    obj=GANG_OBJECT,
)
def test_any_pod_and_events_give_a_decision(pod: dict, events: list[dict], obj: dict | None) -> None:
    gang = views.gang_of(pod)
    doc = views.why_document(pod, gang=gang, gang_object=obj, members=[pod], events=events)
    assert doc["decision"].startswith(("bound to ", "waits: "))
    views.render_why(doc, now=NOW, wide=True)


@settings(max_examples=500, deadline=None)
@given(obj=GANG_OBJECT, pod_group=JSON)
def test_any_gang_object_gives_a_quorum_or_none(obj: dict | None, pod_group: object) -> None:
    quorum = views.min_member({"pod_group": pod_group}, obj)
    assert quorum is None or (type(quorum) is int and quorum > 0)


def test_nodes_are_listed_in_pages(cluster, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    api, kubeconfig = cluster
    monkeypatch.setattr("kubectl_gputopo.api.PAGE", 2)
    for i in range(5):
        api.put("nodes", fk.node(f"n{i}", annotations={KEY: ann(f"n{i}", at=NOW)}))
    code, out, _ = run(capsys, kubeconfig, "nodes", "-o", "json")
    assert code == 0 and [r["name"] for r in json.loads(out)] == [f"n{i}" for i in range(5)]
    assert [c for k, c in api.requests if k == "list:nodes"] == ["", "2", "4"], "limit/continue pages"
    monkeypatch.setattr("kubectl_gputopo.api.MAX_PAGES", 2)
    code, out, err = run(capsys, kubeconfig, "nodes")
    assert (code, out) == (1, "") and "more than 4 nodes: narrow the listing with -l" in err
