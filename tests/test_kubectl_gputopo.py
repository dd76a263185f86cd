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

from gputopo.gang import sources as gangsources
from gputopo.network.annotation import encode, make
from gputopo.node.allocator import AllocatorPool
from gputopo.node.topofile import load_preset
from kubectl_gputopo import views
from kubectl_gputopo.cli import main
from scheduler.model import BadInput, parse_pod
from tests import fake_apiserver as fk

NOW = 1_800_000_000.0
KEY = "gputopo.io/topology"
GROUP = "scheduling.x-k8s.io/pod-group"
LEAF = "network.topology.nvidia.com/leaf"


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

            def field(e: dict[str, Any], key: str) -> Any:  # involvedObject.kind, reason, reportingComponent
                head, _, rest = key.partition(".")
                return e.get(head, {}).get(rest) if rest else e.get(head)

            items = [
                e for e in api.objects["events"].values()
                if e["metadata"]["namespace"] == m.group(1)
                and all(field(e, k) == v for k, v in fields.items())
            ]  # fmt: skip
            api.requests.append(("list:events", f"{m.group(1)}?{q.get('fieldSelector', '')}"))
            self._json(200, {"kind": "EventList", "metadata": {"resourceVersion": "1"}, "items": items})
            return
        if m := re.fullmatch(r"/apis/events\.k8s\.io/v1/namespaces/([^/]+)/events", path):
            api.requests.append(("list:events.k8s.io", f"{m.group(1)}?{q.get('fieldSelector', '')}"))
            if not api.events_v1:
                self._status(404, "NotFound", "the server could not find the requested resource")
                return
            fields = dict(part.split("=", 1) for part in q.get("fieldSelector", "").split(",") if part)
            items = [
                v1 for v1 in map(as_events_v1, api.objects["events"].values())
                if v1["metadata"]["namespace"] == m.group(1)
                and all(v1["regarding"].get(k.split(".", 1)[1]) == v for k, v in fields.items())
            ]  # fmt: skip
            self._json(200, {"kind": "EventList", "apiVersion": "events.k8s.io/v1", "items": items})
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


def as_events_v1(e: dict[str, Any]) -> dict[str, Any]:
    """A stored Event as events.k8s.io/v1 lists it (the API server's conversion of core/v1)."""
    if "regarding" in e:
        return e
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": e["metadata"],
        "eventTime": e.get("eventTime"),
        "series": e.get("series"),
        "reportingController": e.get("reportingComponent"),
        "reason": e.get("reason"),
        "regarding": e.get("involvedObject") or {},
        "note": e.get("message"),
        "type": e.get("type"),
        "deprecatedSource": e.get("source"),
        "deprecatedLastTimestamp": e.get("lastTimestamp"),
        "deprecatedCount": e.get("count"),
    }


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


def prediction_event(ns: str, pod: str, gpus: str, node: str, at: str) -> dict[str, Any]:
    """The sidecar's GPUsPredicted Event, written through events.k8s.io/v1, as core/v1 lists it:
    eventTime with microseconds, no first/lastTimestamp, reportingComponent."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"namespace": ns, "name": f"{pod}.{at}"},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod, "namespace": ns},
        "reason": "GPUsPredicted",
        "message": f"gputopo predicts GPUs {gpus} on node {node}",
        "type": "Normal",
        "eventTime": at,
        "firstTimestamp": None,
        "lastTimestamp": None,
        "action": "Binding",
        "reportingComponent": "gputopo-scheduler",
        "reportingInstance": "sched-0",
    }


def node_event(node: str, component: str, reason: str, note: str, at: str, n: int) -> dict[str, Any]:
    """A daemon's Event on a Node (namespace default, uid = the node's name), as core/v1 lists it."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"namespace": "default", "name": f"{node}.{n}"},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
        "reason": reason,
        "message": note,
        "type": "Warning" if "Not" in reason or "Rejected" in reason else "Normal",
        "eventTime": at,
        "action": "Publishing",
        "reportingComponent": component,
        "reportingInstance": node,
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
    table_lines = out.split("\n\n")[0].splitlines()
    rows = {line.split()[0]: line.split() for line in table_lines[1:]}
    assert set(rows) == {"a100-1", "bad-1", "gb200-1", "h100-1", "plain-1"}, "CPU-only nodes are left out"
    assert out.splitlines()[-1] == (
        "3 of 5 GPU nodes without a usable annotation: the scheduler counts their GPUs from allocatable, "
        "with no topology (STATUS says why)."
    )
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
        "GangUnschedulable",
        "no leaf has 3 nodes with 8 free GPUs",
        "2027-01-15T07:59:50Z",
        2,
    )
    ev["3"] = event("ml", "Pod", "solo", "Planned", "not in this gang", "2027-01-15T07:59:55Z", 3)
    # what the sidecar writes at bind (events.k8s.io/v1, as core/v1 lists it)
    ev["4"] = prediction_event("ml", "train-0", "0,1,2,3,4,5,6,7", "n1", "2027-01-15T07:58:00.250000Z")
    ev["5"] = prediction_event(
        "ml", "train-0", "9,9", "n9", "2027-01-15T07:57:00.000001Z"
    )  # older: not shown
    code, out, err = run(capsys, kubeconfig, "why", "train-1")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert (
        lines[0] == "pod ml/train-1: Pending, waits: GangUnschedulable: no leaf has 3 nodes with 8 free GPUs"
    )
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
    assert reasons == ["GangWaiting", "GangUnschedulable"], "oldest first; another pod's events are not shown"
    predicted_calls = [r for r in api.requests if r[0] == "list:events" and "reason=GPUsPredicted" in r[1]]
    assert len(predicted_calls) == 1, "every member's prediction in one call"
    code, out, _ = run(capsys, kubeconfig, "why", "pod/train-0")
    assert (
        out.splitlines()[1]
        == "predicted GPUs: 0,1,2,3,4,5,6,7 on n1 (the sidecar's GPUsPredicted Event at bind)"
    )
    code, out, _ = run(capsys, kubeconfig, "why", "pod/train-0", "-o", "yaml")
    doc = yaml.safe_load(out)
    assert doc["decision"] == "bound to n1" and doc["predicted_gpus"] == "0,1,2,3,4,5,6,7"
    assert doc["predicted_node"] == "n1"
    assert doc["gang"]["min_member"] == 3 and doc["gang"]["bound"] == 1
    assert doc["annotations"] == {}


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


def test_why_explains_a_kueue_gang_and_a_kai_gang(cluster, capsys) -> None:
    """Kueue's plain-pod group (quorum from the pod's total-count annotation, no group object)
    and KAI Scheduler's (the pod grouper's `pod-group-name`, quorum from its PodGroup): the same
    gang, members and quorum the sidecar counts; a pod that names another source first, or the
    same name in another API, is not a member."""
    api, kubeconfig = cluster
    kq = {gangsources.KUEUE_GROUP_LABEL: "kq"}
    total = {gangsources.KUEUE_TOTAL_ANNOTATION: "3", "kueue.x-k8s.io/podset-preferred-topology": LEAF}
    api.put("pods", fk.pod("ml", "kq-0", 4, labels=kq, annotations=total, node_name="n1"))
    api.put("pods", fk.pod("ml", "kq-1", 4, labels=kq, annotations=total))
    # scheduler-plugins' label comes first: this pod is in PodGroup kq, not in Kueue's kq
    api.put("pods", fk.pod("ml", "kq-x", 4, labels={**kq, GROUP: "kq"}, annotations=total))
    code, out, err = run(capsys, kubeconfig, "why", "kq-1")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert f"asks for: kueue.x-k8s.io/podset-preferred-topology={LEAF}" in lines
    (gang,) = [line for line in lines if line.startswith("gang ")]
    assert gang == (
        "gang ml/kq (from label kueue.x-k8s.io/pod-group-name; kueue pod group, no gang object): "
        "1 of 2 members bound, quorum 3 (annotation kueue.x-k8s.io/pod-group-total-count)"
    )
    assert [line.split()[0] for line in lines if line.startswith("  kq-")] == ["kq-0", "kq-1"]

    api.objects["custom"]["scheduling.run.ai/v2alpha2/podgroups/ml/kj"] = {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"namespace": "ml", "name": "kj"},
        "spec": {"minMember": 2, "topologyConstraint": {"requiredTopologyLevel": LEAF}},
    }
    kai = {gangsources.KAI_GROUP_ANNOTATION: "kj"}
    api.put("pods", fk.pod("ml", "kj-0", 8, annotations=kai))
    api.put("pods", fk.pod("ml", "kj-1", 8, annotations=kai))
    api.put(
        "pods", fk.pod("ml", "kj-v", 8, annotations={"scheduling.k8s.io/group-name": "kj"})
    )  # Volcano's kj
    api.objects["events"]["1"] = event(
        "ml", "PodGroup", "kj", "GangWaiting", "1 of 2", "2027-01-15T07:59:00Z", 1
    )
    code, out, err = run(capsys, kubeconfig, "why", "kj-0", "-o", "json")
    doc = json.loads(out)
    assert (code, err, doc["gang_error"]) == (0, "", None)
    assert {k: doc["gang"][k] for k in ("name", "source", "api", "object", "min_member", "quorum_from")} == {
        "name": "ml/kj",
        "source": "annotation pod-group-name",
        "api": "scheduling.run.ai PodGroup",
        "object": "PodGroup",
        "min_member": 2,
        "quorum_from": "PodGroup spec.minMember, or what spec.minSubGroup and spec.subGroups[] give",
    }
    assert [m["name"] for m in doc["gang"]["members"]] == ["kj-0", "kj-1"]
    assert doc["gang"]["object_levels"] == {"required": LEAF}, (
        "KAI's topologyConstraint, as the sidecar reads it"
    )
    assert f"  its PodGroup asks for: required {LEAF} (unless gputopo.io annotations set the levels)" in (
        run(capsys, kubeconfig, "why", "kj-1")[1].splitlines()
    )
    assert [e["reason"] for e in doc["events"]] == ["GangWaiting"], "the KAI PodGroup's Events"
    del api.objects["custom"]["scheduling.run.ai/v2alpha2/podgroups/ml/kj"]
    code, out, _ = run(capsys, kubeconfig, "why", "kj-0")
    assert "(from annotation pod-group-name; no gang object found): 0 of 2 members bound, quorum ?" in out


def test_why_names_the_unusable_gang_field_the_sidecar_refuses(cluster, capsys) -> None:
    api, kubeconfig = cluster
    api.put("pods", fk.pod("ml", "bad", 1, labels={gangsources.KUEUE_GROUP_LABEL: "kq"}))
    code, out, err = run(capsys, kubeconfig, "why", "bad")
    assert (code, err) == (0, "")
    assert (
        "gang: unusable, the sidecar refuses this pod: annotation kueue.x-k8s.io/pod-group-total-count "
        "must be a positive integer, got ''"
    ) in out.splitlines()
    with pytest.raises(BadInput, match="pod-group-total-count must be a positive integer"):
        parse_pod(api.objects["pods"]["ml/bad"])


NAMES = st.sampled_from(["a", "b", "a/b", " a", ""])


@settings(max_examples=300, deadline=None)
@given(
    labels=st.dictionaries(
        st.sampled_from(
            [
                gangsources.POD_GROUP_LABEL,
                gangsources.LIGHT_GROUP_LABEL,
                gangsources.LIGHT_MIN_LABEL,
                gangsources.KUEUE_GROUP_LABEL,
            ]
        ),
        NAMES | st.sampled_from(["2", "0", "x"]),
    ),
    annotations=st.dictionaries(
        st.sampled_from(
            [
                *gangsources.VOLCANO_GROUP_ANNOTATIONS,
                gangsources.KUEUE_TOTAL_ANNOTATION,
                gangsources.KAI_GROUP_ANNOTATION,
            ]
        ),
        NAMES | st.sampled_from(["2", "0", "x"]),
    ),
    spec=st.fixed_dictionaries(
        {},
        optional={
            "schedulingGroup": st.fixed_dictionaries({"podGroupName": NAMES}),
            "workloadRef": st.fixed_dictionaries(
                {"name": NAMES, "podGroup": NAMES}, optional={"podGroupReplicaKey": NAMES}
            ),
        },
    ),
)
def test_kubectl_reads_every_gang_as_the_sidecar_does(labels: dict, annotations: dict, spec: dict) -> None:
    """`why` and the sidecar decide a pod's gang with one function: same key, same quorum, same
    refusals, for any mix of every source's fields."""
    pod = fk.pod("ml", "p", 1, labels=labels, annotations=annotations)
    pod["spec"].update(spec)
    try:
        sidecar = parse_pod(pod).gang
    except BadInput as e:
        with pytest.raises(gangsources.SourceError) as refused:
            views.gang_of(pod)
        assert str(refused.value) == str(e)
        return
    mine = views.gang_of(pod)
    if sidecar is None:
        assert mine is None
        return
    assert mine is not None
    assert (f"ml/{mine.key}", mine.min_member, mine.source.label) == (
        sidecar.key,
        sidecar.min_member,
        sidecar.source,
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
        unusable = row["status"] != "ok" and not row["status"].startswith("rings unavailable")
        assert row["status"] and views.render_nodes([row], wide=True).count("\n") == 3 + unusable


GANG_KEYS = [
    gangsources.POD_GROUP_LABEL,
    gangsources.LIGHT_GROUP_LABEL,
    gangsources.LIGHT_MIN_LABEL,
    *gangsources.VOLCANO_GROUP_ANNOTATIONS,
    gangsources.KUEUE_GROUP_LABEL,
    gangsources.KUEUE_TOTAL_ANNOTATION,
    gangsources.KAI_GROUP_ANNOTATION,
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
                    st.sampled_from([*GANG_KEYS, "gputopo.io/required-topology"]), JSON
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
        shaped(
            [
                "involvedObject",
                "regarding",
                "reason",
                "message",
                "note",
                "type",
                "lastTimestamp",
                "eventTime",
                "series",
                "count",
                "source",
                "reportingComponent",
            ]
        ),
        max_size=3,
    ),
    obj=GANG_OBJECT,
)
def test_any_pod_and_events_give_a_decision(pod: dict, events: list[dict], obj: dict | None) -> None:
    try:
        gang, error = views.gang_of(pod), None
    except gangsources.SourceError as e:
        gang, error = None, str(e)
    doc = views.why_document(pod, gang=gang, gang_object=obj, members=[pod], events=events, gang_error=error)
    assert doc["decision"].startswith(("bound to ", "waits: "))
    views.render_why(doc, now=NOW, wide=True)


@settings(max_examples=500, deadline=None)
@given(
    obj=GANG_OBJECT,
    meta=st.fixed_dictionaries({}, optional={"name": JSON, "namespace": JSON}),
    source=st.sampled_from([s for s in gangsources.SOURCES if s.api is not None]),
    pod_group=st.sampled_from(["pg", "other"]),
)
def test_any_gang_object_gives_a_quorum_or_none(
    obj: dict | None, meta: dict, source: gangsources.GangSource, pod_group: str
) -> None:
    named = gangsources.Named(source, "g", "field", "g", pod_group=pod_group)
    quorum = gangsources.quorum(named, "ml", None if obj is None else {**obj, "metadata": meta})
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


def test_nodes_says_why_a_gpu_node_has_no_usable_annotation(cluster, capsys, monkeypatch) -> None:
    """Plugins that run but cannot publish (PodResources unreachable, a 403) and annotations the
    sidecar refuses are explained per node from the daemons' Node Events: the latest Event of
    each daemon decides (a later TopologyPublished / TopologyAccepted clears it, ordered by
    microseconds within one second); every node listing the GPU resource is shown, even "0"."""
    api, kubeconfig = cluster
    monkeypatch.setattr("kubectl_gputopo.cli.time.time", lambda: NOW)
    plugin, sidecar = "gputopo-device-plugin", "gputopo-scheduler"
    api.put("nodes", fk.node("np-1"))  # plugin running, kubelet's PodResources unreachable
    api.put("nodes", fk.node("np-2", annotations={KEY: ann("np-2", at=NOW - 3600)}))  # 403 since
    api.put("nodes", fk.node("rej-1", annotations={KEY: ann("rej-1", at=NOW - 10)}))
    api.put("nodes", fk.node("acc-1", annotations={KEY: ann("acc-1", at=NOW - 10)}))
    api.put("nodes", fk.node("zero-1", gpus=0))  # registered, nothing advertised (yet)
    pr = "gputopo.io/topology not published: cannot read the GPUs in use from kubelet's PodResources: connection refused"
    forbidden = (
        "gputopo.io/topology not published: the API server refused the annotation patch (HTTP 403): "
        'nodes "np-2" is forbidden: User "system:serviceaccount:gputopo-system:gputopo-device-plugin" '
        'cannot patch resource "nodes"'
    )
    refused = (
        "gputopo-scheduler ignores this node's topology annotation (allocatable): annotation describes 8 "
        "healthy GPUs but the Node's allocatable nvidia.com/gpu is 4; its GPUs are counted from allocatable, "
        "with a neutral score"
    )
    ev = api.objects["events"]
    ev["n1"] = node_event("np-1", plugin, "TopologyNotPublished", pr, "2027-01-15T07:00:00.000001Z", 1)
    ev["n2a"] = node_event(
        "np-2", plugin, "TopologyPublished", "published again", "2027-01-15T06:00:00.5Z", 2
    )
    ev["n2b"] = node_event(
        "np-2", plugin, "TopologyNotPublished", forbidden, "2027-01-15T07:10:00.000002Z", 3
    )
    ev["r1"] = node_event("rej-1", sidecar, "TopologyRejected", refused, "2027-01-15T07:59:00.200000Z", 4)
    ev["r2"] = node_event(
        "rej-1", plugin, "TopologyPublished", "published again", "2027-01-15T07:59:10.0Z", 5
    )
    ev["a1"] = node_event("acc-1", sidecar, "TopologyRejected", refused, "2027-01-15T07:59:00.900000Z", 6)
    ev["a2"] = node_event(
        "acc-1", sidecar, "TopologyAccepted", "used again", "2027-01-15T07:59:00.950000Z", 7
    )
    ev["k"] = node_event(
        "np-1", "kubelet", "NodeNotReady", "not a gputopo Event", "2027-01-15T07:59:59.0Z", 8
    )
    code, out, err = run(capsys, kubeconfig, "nodes")
    assert code == 0 and err == ""
    status = {
        line.split()[0]: line[out.splitlines()[0].index("STATUS") :]
        for line in out.split("\n\n")[0].splitlines()[1:]
    }
    assert status == {
        "acc-1": "ok",
        "np-1": f"no annotation: plugin says: {pr}",
        "np-2": f"stale (older than 15 min: the sidecar ignores it); plugin says: {forbidden}",
        "rej-1": f"refused by the scheduler: {refused}",
        "zero-1": "no annotation (no gputopo plugin has published here: is it running? see its log)",
    }
    doc = {r["name"]: r for r in json.loads(run(capsys, kubeconfig, "nodes", "-o", "json")[1])}
    assert doc["np-1"]["plugin_problem"] == pr and doc["np-1"]["scheduler_problem"] is None
    assert doc["rej-1"]["scheduler_problem"] == refused and doc["rej-1"]["plugin_problem"] is None
    assert doc["zero-1"]["gpus"] == 0
    lists = [r[1] for r in api.requests if r[0] == "list:events"]
    assert sorted(lists) == sorted(
        [
            "default?involvedObject.kind=Node,reportingComponent=gputopo-device-plugin",
            "default?involvedObject.kind=Node,reportingComponent=gputopo-scheduler",
        ]
        * 2
    ), "two calls per listing, whatever the number of nodes"


def test_no_gpu_node_at_all_is_one_line(cluster, capsys) -> None:
    api, kubeconfig = cluster
    cpu = fk.node("cpu-1")
    cpu["status"] = {"allocatable": {"cpu": "96"}}
    api.put("nodes", cpu)
    code, out, _ = run(capsys, kubeconfig, "nodes", "--resource", "example.com/gpu")
    assert code == 0 and out == (
        "No GPU nodes found (no node lists example.com/gpu in its allocatable or capacity, "
        "nor has a gputopo.io/topology annotation).\n"
    )


def test_gpu_labelled_nodes_that_list_no_gpus_are_named(cluster, capsys) -> None:
    """An install whose DaemonSet selects no node (or whose plugin never started) is not
    silent: nodes labelled as GPU nodes that advertise no GPUs are named, with what to check."""
    api, kubeconfig = cluster
    for name, labels in (
        ("gpu-a", {"nvidia.com/gpu.present": "true"}),
        ("gpu-b", {"feature.node.kubernetes.io/pci-10de.present": "true"}),
        ("cpu-1", {"nvidia.com/gpu.present": "false"}),
    ):
        node = fk.node(name)
        node["metadata"]["labels"] = labels
        node["status"] = {"allocatable": {"cpu": "96"}}
        api.put("nodes", node)
    code, out, _ = run(capsys, kubeconfig, "nodes")
    first, second = out.splitlines()
    assert code == 0 and first.startswith("No GPU nodes found")
    assert (
        second.startswith("2 node(s) labelled as GPU nodes")
        and "list no nvidia.com/gpu: gpu-a, gpu-b." in second
    )
    assert "cpu-1" not in out
    code, out, _ = run(capsys, kubeconfig, "nodes", "-o", "json")
    assert code == 0 and json.loads(out) == []


def test_nodes_the_plugin_skips_on_purpose_are_shown_as_such(cluster, capsys) -> None:
    """A GPU Operator node (its own plugin runs: nvidia.com/gpu.deploy.device-plugin=true) and
    a node labelled gputopo.io/device-plugin=false are left out by the DaemonSet's node
    affinity on purpose: they are shown as skipped, with the label that says why, never asked
    "is it running?". A node moved over to gputopo (the operator's label false) that has not
    published, and a GPU node that lists no GPUs, still are."""
    api, kubeconfig = cluster
    operator = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.deploy.device-plugin": "true"}
    opted_out = {"nvidia.com/gpu.present": "true", "gputopo.io/device-plugin": "false"}
    api.put("nodes", fk.node("op-1", operator))  # the operator's plugin advertises its GPUs
    api.put("nodes", fk.node("moved-1", {**operator, "nvidia.com/gpu.deploy.device-plugin": "false"}))
    for name, labels in (
        ("out-1", opted_out),
        ("op-2", operator),
        ("gpu-a", {"nvidia.com/gpu.present": "true"}),
    ):
        node = fk.node(name, labels)
        node["status"] = {"allocatable": {"cpu": "96"}}
        api.put("nodes", node)
    out_with_gpus = fk.node("out-2", opted_out, gpus=4)
    api.put("nodes", out_with_gpus)
    code, out, err = run(capsys, kubeconfig, "nodes")
    assert code == 0 and err == ""
    table_text, _, notes = out.partition("\n\n")
    status = {
        line.split()[0]: line[table_text.splitlines()[0].index("STATUS") :]
        for line in table_text.splitlines()[1:]
    }
    operator_why = "skipped on purpose: the GPU Operator's own device plugin runs here (nvidia.com/gpu.deploy.device-plugin=true)"
    opted_out_why = (
        "skipped on purpose: opted out of gputopo's device plugin (gputopo.io/device-plugin=false)"
    )
    assert status == {
        "moved-1": "no annotation (no gputopo plugin has published here: is it running? see its log)",
        "op-1": operator_why,
        "out-2": opted_out_why,
    }
    (running,) = [line for line in notes.splitlines() if "Is the device plugin running there?" in line]
    assert (
        running.startswith("1 node(s) labelled as GPU nodes") and "list no nvidia.com/gpu: gpu-a." in running
    )
    (skipped,) = [line for line in notes.splitlines() if line.startswith("2 GPU node(s) skipped on purpose")]
    assert "op-2 (the GPU Operator's own device plugin runs here" in skipped
    assert "out-1 (opted out of gputopo's device plugin (gputopo.io/device-plugin=false))" in skipped
    assert "1 of 3 GPU nodes without a usable annotation" in notes, (
        "skipped nodes are not counted as unusable"
    )
    doc = {r["name"]: r for r in json.loads(run(capsys, kubeconfig, "nodes", "-o", "json")[1])}
    assert doc["op-1"]["skipped"] == operator_why.removeprefix("skipped on purpose: ")
    assert doc["moved-1"]["skipped"] is None


def test_kubectl_skips_exactly_the_nodes_the_charts_daemonset_leaves_out() -> None:
    """The labels `kubectl gputopo nodes` reads as "skipped on purpose" are the ones the
    chart's DaemonSet node affinity excludes GPU nodes by (tests/manifests.NODES)."""
    from tests.manifests import NODES, node_selected, one, render_chart

    spec = one(render_chart({}), "DaemonSet")["spec"]["template"]["spec"]
    for what, (labels, runs) in NODES.items():
        if not any(labels.get(k) == "true" for k in views.GPU_NODE_LABELS):
            continue  # not a GPU node: nothing to explain
        assert node_selected(spec, labels) is runs
        assert (views.skipped_on_purpose({"metadata": {"labels": labels}}) is None) is runs, what


def test_why_orders_events_by_their_finest_time(cluster, capsys, monkeypatch) -> None:
    """kube-scheduler writes FailedScheduling through events.k8s.io/v1 (eventTime in
    microseconds); the sidecar's Events carry microseconds too now, so one written 0.3 s after
    it, in the same second, is shown after it. A core/v1 Event with whole seconds sorts at the
    start of its second; a repeated Event (series) sorts at its last occurrence."""
    api, kubeconfig = cluster
    monkeypatch.setattr("kubectl_gputopo.cli.time.time", lambda: NOW)
    api.put("pods", fk.pod("ml", "p", 8))
    failed = prediction_event("ml", "p", "0", "n", "2027-01-15T07:59:50.100000Z")
    failed |= {
        "reason": "FailedScheduling",
        "message": "0/4 nodes are available",
        "reportingComponent": "default-scheduler",
    }
    ours = prediction_event("ml", "p", "0", "n", "2027-01-15T07:59:50.400000Z")
    ours |= {"reason": "GangUnschedulable", "message": "does not fit", "type": "Warning"}
    legacy = event("ml", "Pod", "p", "GangWaiting", "old style", "2027-01-15T07:59:50Z", 9)
    again = prediction_event("ml", "p", "0", "n", "2027-01-15T07:59:40.000000Z")
    again |= {
        "reason": "Repeated",
        "message": "seen 3 times",
        "series": {"count": 3, "lastObservedTime": "2027-01-15T07:59:55.000000Z"},
    }
    for i, e in enumerate((ours, again, failed, legacy)):
        e["metadata"]["name"] = f"p.{i}"
        api.objects["events"][str(i)] = e
    doc = json.loads(run(capsys, kubeconfig, "why", "p", "-o", "json")[1])
    assert [e["reason"] for e in doc["events"]] == [
        "GangWaiting",
        "FailedScheduling",
        "GangUnschedulable",
        "Repeated",
    ]
    assert doc["events"][-1]["count"] == 3
    assert doc["decision"] == "waits: Repeated: seen 3 times"
    assert doc["events"][1]["from"] == "default-scheduler"


@pytest.mark.parametrize("served", [True, False])
def test_why_reads_both_event_apis_and_shows_each_event_once(cluster, capsys, served: bool) -> None:
    """Events come back from core/v1 and events.k8s.io/v1 (one store): each is shown once, in
    either spelling; a server without events.k8s.io/v1 (404) leaves the core/v1 answer."""
    api, kubeconfig = cluster
    api.events_v1 = served
    api.put("pods", fk.pod("ml", "p", 8))
    api.objects["events"]["a"] = event(
        "ml", "Pod", "p", "GangWaiting", "core spelling", "2027-01-15T07:59:00Z", 1
    )
    only_v1 = {  # as events.k8s.io/v1 lists it: regarding, note, deprecated* fields
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"namespace": "ml", "name": "p.v1"},
        "eventTime": None,
        "regarding": {"kind": "Pod", "name": "p", "namespace": "ml"},
        "reason": "FailedScheduling",
        "note": "0/4 nodes are available",
        "type": "Warning",
        "reportingController": "default-scheduler",
        "deprecatedLastTimestamp": "2027-01-15T07:59:30Z",
        "deprecatedCount": 4,
    }
    api.objects["events"]["b"] = only_v1
    doc = json.loads(run(capsys, kubeconfig, "why", "p", "-o", "json")[1])
    rows = [(e["reason"], e["message"], e["from"], e["count"]) for e in doc["events"]]
    if served:
        assert rows == [
            ("GangWaiting", "core spelling", "gputopo-scheduler", 1),
            ("FailedScheduling", "0/4 nodes are available", "default-scheduler", 4),
        ]
    else:
        assert rows == [("GangWaiting", "core spelling", "gputopo-scheduler", 1)]
    assert [r for r in api.requests if r[0] == "list:events.k8s.io"] == [
        ("list:events.k8s.io", "ml?regarding.kind=Pod,regarding.name=p")
    ]
