"""A tree gang explained end to end (issue 29 items 1 and 6): a JobSet-shaped CompositePodGroup
(two PodGroups of two pods under one CompositePodGroup; each PodGroup required in one NVLink
clique, the composite in one leaf) placed by the sidecar over HTTP (fake API server <- official
client <- KubeState <- Extender -> EventEmitter), then `kubectl gputopo why` run through its CLI
entry against the same API server. The Events name each sub-group's domain; `why` prints the
tree; a tree that waits names the sub-group that cannot be placed. docs/gang.md's worked example
is this test's output, checked verbatim (`test_the_worked_example_in_docs_gang_md_is_this_output`).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes import client

from gputopo.gang import explain
from gputopo.gang.spec import Placed
from gputopo.network.levels import CLUSTER
from scheduler.extender import Extender
from scheduler.live.kube import KubeState
from scheduler.report.events import EventEmitter, gang_event
from scheduler.web.server import Server
from tests import fake_apiserver as fk
from tests import test_kubectl_gputopo as kt
from tests.test_gang_tree_sources import composite, podgroup
from tests.test_scheduler_http import Client
from tests.test_scheduler_interop import CLIQUE, gang_pods
from tests.test_scheduler_live import KEY, LEAF, NOW, annotation, args, wait_until

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "gang.md"
#: When the sidecar writes its Events (1 ms apart, in the order it decides) and when `kubectl
#: gputopo why` runs: fixed, so the AGE column of the worked example is the same on every run.
EVENTS_AT = 1_800_000_000.0
WHY_AT = EVENTS_AT + 42.0
SERVE = {"k8s-podgroups": "v1beta1", "k8s-compositepodgroups": "v1alpha3"}


def core_copy(e: dict[str, Any]) -> dict[str, Any]:
    """An events.k8s.io/v1 Event as core/v1 lists it (the API server keeps one store)."""
    if "involvedObject" in e:
        return e
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": e["metadata"],
        "involvedObject": e.get("regarding") or {},
        "reason": e.get("reason"),
        "message": e.get("note"),
        "type": e.get("type"),
        "eventTime": e.get("eventTime"),
        "reportingComponent": e.get("reportingController"),
        "count": 1,
    }


class _Handler(kt._Handler):
    """The stand-in as both the sidecar and `kubectl gputopo` read it: the Events the sidecar
    created listed back (through either API), and its served gang kinds read per namespace
    (one object, or the namespace's list: a CompositePodGroup tree's PodGroups)."""

    def do_GET(self) -> None:
        api = self.server.api
        url = urlparse(self.path)
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        with api.cond:
            api.objects["events"] = {f"{i:06d}": core_copy(e) for i, e in enumerate(api.events)}
        m = re.fullmatch(r"/apis/([^/]+)/([^/]+)/namespaces/([^/]+)/([^/]+)(?:/([^/]+))?", url.path)
        if m and m.group(1) != "events.k8s.io" and "watch" not in q:
            group, _version, ns, plural, name = m.groups()
            kind = next(
                (
                    k
                    for k, (g, _, p) in fk.EXTRA_KINDS.items()
                    if (g, p) == (group, plural) and k in api.served
                ),
                None,
            )
            with api.cond:
                objs = dict(api.objects.get(kind, {})) if kind else {}
            if name is not None:
                found = objs.get(f"{ns}/{name}")
                if found is None:
                    self._status(404, "NotFound", f'{plural}.{group} "{name}" not found')
                else:
                    self._json(200, found)
                return
            if kind is None:
                self._status(404, "NotFound", url.path)
                return
            items = [o for o in objs.values() if o["metadata"].get("namespace") == ns]
            self._json(200, {"kind": "List", "metadata": {"resourceVersion": "1"}, "items": items})
            return
        super().do_GET()


class _Server(fk.FakeServer):
    def __init__(self, api: fk.FakeAPI) -> None:
        self.api = api
        self.closing = False
        ThreadingHTTPServer.__init__(self, ("127.0.0.1", 0), _Handler)


@dataclass
class Cluster:
    api: fk.FakeAPI
    state: KubeState
    ext: Extender
    emitter: EventEmitter
    client: Client
    kubeconfig: str

    def events(self, kind: str) -> list[tuple[str, str, str]]:
        """(object name, reason, message) of every Event the sidecar wrote on objects of `kind`."""
        assert self.emitter.flush()
        views = [fk.event_view(e) for e in self.api.events]
        return [(v["name"], v["reason"], v["message"]) for v in views if v["kind"] == kind]


@contextmanager
def tree_cluster(
    tmp_path: Path,
    nodes: list[tuple[str, dict[str, str], tuple[int, ...]]],
    objects: list[tuple[str, dict]],
    pods: list[dict],
) -> Iterator[Cluster]:
    """The sidecar (Events on) over the stand-in, and a kubeconfig naming it (namespace ml)."""
    api = fk.FakeAPI(serve=SERVE)
    api.objects["events"], api.objects["custom"] = {}, {}
    server = _Server(api)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    cfg = client.Configuration()
    cfg.host = server.url
    api_client = client.ApiClient(cfg)
    for name, labels, allocated in nodes:
        api.put("nodes", fk.node(name, labels, annotations={KEY: annotation(name, allocated)}))
    for kind, obj in objects:
        api.put(kind, obj)
    for p in pods:
        api.put("pods", p)
    ticks = itertools.count()
    lock = threading.Lock()

    def event_clock() -> float:
        with lock:
            return EVENTS_AT + next(ticks) / 1000

    state = KubeState(
        api_client, clock=lambda: NOW, watch_timeout_s=5, backoff_s=(0.05, 0.2), discovery_ttl_s=0.1
    )
    state.prediction_events.clock = event_clock
    emitter = EventEmitter(api_client, pod_uid=state.pod_uid, group_ref=state.group_ref)
    emitter.writer.clock = event_clock
    ext = Extender(state, clock=lambda: NOW, events=emitter)
    sidecar = Server(ext, "127.0.0.1", 0)
    state.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": server.url}}],
                "users": [{"name": "me", "user": {"token": "t"}}],
                "contexts": [{"name": "ml", "context": {"cluster": "fake", "user": "me", "namespace": "ml"}}],
                "current-context": "ml",
            }
        )
    )
    try:
        wait_until(state.ready)
        sidecar.start()
        yield Cluster(api, state, ext, emitter, Client(sidecar), str(kubeconfig))
    finally:
        sidecar.stop()
        emitter.stop()
        state.stop()
        server.closing = True
        api.break_watches()
        server.shutdown()
        server.server_close()
        api_client.close()


def place_all(c: Cluster, pods: list[dict]) -> dict[str, str]:
    """Filter then bind every member as kube-scheduler would, each Event written before the
    next decision (so their times, and the worked example, come out in one order); pod -> node."""
    names = sorted(c.state.snapshot().nodes)
    placed = {}
    for p in pods:
        _, out = c.client.post("/filter", args(p, names))
        assert len(out["NodeNames"]) == 1, out
        assert c.emitter.flush()
        (node,) = out["NodeNames"]
        name = p["metadata"]["name"]
        body = {"PodName": name, "PodNamespace": "ml", "PodUID": p["metadata"]["uid"], "Node": node}
        assert c.client.post("/bind", body) == (200, {"Error": ""})
        assert c.emitter.flush()
        placed[name] = node
    return placed


def why(capsys: pytest.CaptureFixture[str], c: Cluster, monkeypatch, *argv: str) -> str:
    assert c.emitter.flush()
    monkeypatch.setattr("kubectl_gputopo.cli.time.time", lambda: WHY_AT)
    code, out, err = kt.run(capsys, c.kubeconfig, "why", *argv)
    assert (code, err) == (0, ""), err
    return out


def jobset() -> tuple[list[tuple[str, dict]], list[dict]]:
    """The worked example's objects: CompositePodGroup `train` (gang of both, required in one
    leaf) over PodGroups `train-0` and `train-1` (2 pods of 8 GPUs each, required in one
    NVLink clique), as JobSet's Workload integration would create them."""
    objects = [
        ("k8s-compositepodgroups", composite("train", gang=2, key=LEAF)),
        ("k8s-podgroups", podgroup("train-0", "train", 2, key=CLIQUE)),
        ("k8s-podgroups", podgroup("train-1", "train", 2, key=CLIQUE)),
    ]
    for _, obj in objects:  # only what gputopo reads (docs/scheduler.md), as the doc shows it
        del obj["spec"]["workloadRef"]
    pods = gang_pods(2, spec={"schedulingGroup": {"podGroupName": "train-0"}}, name="train-0")
    pods += gang_pods(2, spec={"schedulingGroup": {"podGroupName": "train-1"}}, name="train-1")
    return objects, pods


# Two leaves of two cliques of two nodes (8 GPUs each); n0 is fully used, so leaf-0 has 24
# free GPUs and cannot hold the 32-GPU job: the tree goes to leaf-1, one PodGroup per clique.
EXAMPLE_NODES = [
    (f"n{i}", {LEAF: f"leaf-{i // 4}", CLIQUE: f"cl.{i // 2}"}, tuple(range(8)) if i == 0 else ())
    for i in range(8)
]


def test_a_jobset_shaped_tree_names_each_sub_groups_domain_in_its_events_and_why(
    tmp_path, capsys, monkeypatch
) -> None:
    objects, pods = jobset()
    with tree_cluster(tmp_path, EXAMPLE_NODES, objects, pods) as c:
        wait_until(lambda: len(c.state.snapshot().nodes["n0"].topology.allocated) == 8)
        placed = place_all(c, pods)
        cliques = {g: {placed[f"{g}-{i}"] for i in range(2)} for g in ("train-0", "train-1")}
        assert {frozenset(v) for v in cliques.values()} == {frozenset({"n4", "n5"}), frozenset({"n6", "n7"})}
        ((name, _, note),) = [e for e in c.events("CompositePodGroup") if e[1] == "GangPlanned"]
        assert name == "train" and len(note.encode()) <= explain.MAX_NOTE
        assert note.startswith("gang ml/composite:train: tree in leaf-1 (leaf, required) on 4 nodes")
        for group, nodes in cliques.items():
            clique = f"cl.{int(min(nodes)[1:]) // 2}"
            assert f"podgroup:{group} → {clique} (gpu.clique, required) on {','.join(sorted(nodes))}" in note
        pod_note = next(m for n, r, m in c.events("Pod") if n == "train-0-0" and r == "GangPlanned")
        assert "; its sub-group podgroup:train-0 → cl." in pod_note, "describe pod shows its own sub-group"

        out = why(capsys, c, monkeypatch, "train-0-0")
        lines = out.splitlines()
        tree_at = next(i for i, line in enumerate(lines) if line.startswith("tree "))
        assert lines[tree_at] == (
            "tree CompositePodGroup/train, quorum 4: this pod is in sub-group podgroup:train-0"
        )
        assert lines[tree_at + 2].startswith(
            "    CompositePodGroup/train → leaf-1 (leaf, required) on 4 nodes"
        )
        subs = lines[tree_at + 3 : tree_at + 5]
        assert [s.split()[0] for s in subs] == ["podgroup:train-0", "podgroup:train-1"]
        assert subs[0].startswith("      podgroup:train-0 → cl.") and subs[0].endswith("<- this pod")
        members = [line.split() for line in lines if line.startswith("  train-")]
        assert [m[:2] for m in members] == [
            ["train-0-0", "podgroup:train-0"],
            ["train-0-1", "podgroup:train-0"],
            ["train-1-0", "podgroup:train-1"],
            ["train-1-1", "podgroup:train-1"],
        ], "the whole tree's members, each with its sub-group"

        doc = json.loads(why(capsys, c, monkeypatch, "train-1-1", "-o", "json"))
        tree = doc["gang"]["tree"]
        assert (tree["object"], tree["quorum"], tree["subgroup"], tree["state"]) == (
            "CompositePodGroup/train",
            4,
            "podgroup:train-1",
            "planned",
        )
        assert tree["event"] == {"reason": "GangPlanned", "object": "compositepodgroup/train"}
        assert tree["root"] == {
            "domain": "leaf-1",
            "level": "leaf",
            "how": "required",
            "why": "",
            "node_count": 4,
            "offered": 8,
        }
        assert [(g["name"], g["parent"], g["depth"], g["level"], g["how"]) for g in tree["subgroups"]] == [
            ("podgroup:train-0", "", 1, "gpu.clique", "required"),
            ("podgroup:train-1", "", 1, "gpu.clique", "required"),
        ]
        assert {g["name"]: set(g["nodes"]) for g in tree["subgroups"]} == {
            f"podgroup:{k}": v for k, v in cliques.items()
        }
        assert tree["stuck"] is None and tree["omitted"] == 0
        assert all(m["subgroup"] for m in doc["gang"]["members"])
        EXAMPLE["json"] = doc
        # kept for the worked example (docs/gang.md), checked there verbatim
        EXAMPLE["why"] = why(capsys, c, monkeypatch, "train-0-0").rstrip("\n")
        EXAMPLE["events"] = [
            (kind, name, reason, note)
            for kind in ("CompositePodGroup", "Pod")
            for name, reason, note in c.events(kind)
            if kind != "Pod" or name == "train-0-0"
        ]


EXAMPLE: dict[str, Any] = {}


def test_a_waiting_tree_names_the_sub_group_that_cannot_be_placed(
    tmp_path, capsys, monkeypatch, caplog
) -> None:
    """One leaf, cliques of three nodes, two nodes of the second busy: the leaf has room for
    the 32 GPUs, the first PodGroup gets a clique, the second finds no clique with two free
    nodes. Nothing binds; the Events and `why` name podgroup:train-1 and why."""
    nodes = [
        (f"n{i}", {LEAF: "leaf-0", CLIQUE: f"cl.{i // 3}"}, tuple(range(8)) if i in (3, 4) else ())
        for i in range(6)
    ]
    objects, pods = jobset()
    caplog.set_level(logging.INFO)
    with tree_cluster(tmp_path, nodes, objects, pods) as c:
        wait_until(lambda: len(c.state.snapshot().nodes["n4"].topology.allocated) == 8)
        names = sorted(c.state.snapshot().nodes)
        _, out = c.client.post("/filter", args(pods[0], names))
        assert out["NodeNames"] == [] and not c.api.bindings
        # the log line carries the sub-group as a field of its own
        (failed,) = [r for r in caplog.records if r.getMessage() == "plan_failed"]
        assert failed.fields["subgroup"] == "podgroup:train-1"
        ((_, _, note),) = [e for e in c.events("CompositePodGroup") if e[1] == "GangUnschedulable"]
        stuck = explain.parse_stuck(note)
        assert stuck is not None and stuck["name"] == "podgroup:train-1", note
        assert stuck["asks"] == "2 pods, 16 GPUs, required gpu.clique" and stuck["within"] == "leaf=leaf-0"
        assert "best nvidia.com/gpu.clique=cl.0 has 8 free GPUs, room for 1 of the 2 pods" in stuck["reason"]

        out = why(capsys, c, monkeypatch, "train-0-1")
        lines = out.splitlines()
        tree_at = next(i for i, line in enumerate(lines) if line.startswith("tree "))
        assert lines[tree_at] == (
            "tree CompositePodGroup/train, quorum 4: this pod is in sub-group podgroup:train-0"
        )
        assert lines[tree_at + 1].startswith(
            "  waiting (the sidecar's GangUnschedulable Event on compositepodgroup/train): "
            "sub-group podgroup:train-1 (2 pods, 16 GPUs, required gpu.clique) cannot be placed in "
            "leaf=leaf-0: no gpu.clique domain can hold"
        )
        EXAMPLE["waiting"] = "\n".join(lines[tree_at : tree_at + 2])
        doc = json.loads(why(capsys, c, monkeypatch, "train-0-1", "-o", "json"))
        assert doc["gang"]["tree"]["state"] == "waiting" and doc["gang"]["tree"]["root"] is None
        assert doc["gang"]["tree"]["stuck"]["path"] == "podgroup:train-1"
        EXAMPLE["json_waiting"] = doc


def test_a_flat_podgroup_has_no_tree_in_why(tmp_path, capsys, monkeypatch) -> None:
    """A PodGroup under no CompositePodGroup is a flat gang: `why` shows no tree and no
    SUB-GROUP column, and -o json has no `gang.tree` (its document is as before)."""
    objects = [("k8s-podgroups", podgroup("solo", None, 2, key=CLIQUE))]
    pods = gang_pods(2, spec={"schedulingGroup": {"podGroupName": "solo"}}, name="solo")
    with tree_cluster(tmp_path, EXAMPLE_NODES, objects, pods) as c:
        wait_until(lambda: "ml/solo-1" in c.state.snapshot().pods)
        place_all(c, pods)
        out = why(capsys, c, monkeypatch, "solo-0")
        assert "tree" not in out and "SUB-GROUP" not in out
        doc = json.loads(why(capsys, c, monkeypatch, "solo-0", "-o", "json"))
        assert "tree" not in doc["gang"] and all("subgroup" not in m for m in doc["gang"]["members"])


# --- the grammar, round trip, and the 1 KiB limit ------------------------------------------------


def placed(name: str, parent: str = "", nodes: int = 2, **kw: Any) -> Placed:
    fields: dict[str, Any] = {
        "level": CLIQUE,
        "domain": f"cl.{name}",
        "nodes": tuple(f"node-{name}-{i}" for i in range(nodes)),
        "asked": "required",
        "asked_level": CLIQUE,
        "gpus": 8 * nodes,
    }
    return Placed(name=name, parent=parent, **(fields | kw))


def test_a_plan_reads_back_as_written_to_any_depth() -> None:
    tree = (
        placed("", level=CLUSTER, domain="cluster", asked="", asked_level=None, nodes=6),
        placed(
            "rep", level=LEAF, domain="leaf-0", asked="preferred", asked_level=CLIQUE, why="no room | here"
        ),
        placed("tp0", "rep"),
        placed("tp1", "rep", why="predicted 12.5 s per step at gpu.clique"),
    )
    text = explain.plan_text(tree, offered=9)
    assert (
        "rep → leaf-0 (leaf, preferred gpu.clique, fell back) on node-rep-0,node-rep-1: no room / here"
        in text
    )
    doc = explain.parse_plan("gang ml/x: " + text + explain.REPLANNED_SUFFIX)
    assert doc is not None
    assert (doc["domain"], doc["level"], doc["how"], doc["node_count"], doc["offered"]) == (
        "cluster",
        "cluster",
        "no level asked",
        6,
        9,
    )
    assert [(g["path"], g["parent"], g["depth"], g["why"]) for g in doc["subgroups"]] == [
        ("rep", "", 1, "no room / here"),
        ("rep/tp0", "rep", 2, ""),
        ("rep/tp1", "rep", 2, "predicted 12.5 s per step at gpu.clique"),
    ]


def test_a_large_tree_is_summarised_within_the_event_note_limit() -> None:
    """64 sub-groups of 18 nodes: whole sub-groups while the note holds, the rest counted; what
    the API server is sent stays under 1 KiB, and reads back."""
    tree = (
        placed("", level=CLUSTER, domain="cluster", asked="", asked_level=None, nodes=0),
        *(placed(f"tp-{i}", nodes=18) for i in range(64)),
    )
    tree = (Placed(**{**tree[0].__dict__, "nodes": tuple(n for p in tree[1:] for n in p.nodes)}), *tree[1:])
    from gputopo.gang.asks import Event

    reason, note = gang_event(Event("plan", "ml/composite:big", "", "", {"tree": tree, "offered": 2000}))
    assert reason == "GangPlanned"
    assert len((note + explain.REPLANNED_SUFFIX).encode()) <= explain.MAX_NOTE
    doc = explain.parse_plan(note)
    assert doc is not None and doc["node_count"] == 64 * 18
    shown = doc["subgroups"]
    assert shown and all(g["more_nodes"] == 10 and len(g["nodes"]) == 8 for g in shown)
    assert len(shown) + doc["omitted"] == 64 and doc["omitted_nodes"] == 18 * doc["omitted"]
    assert note.endswith(f"and {doc['omitted']} more sub-groups on {doc['omitted_nodes']} nodes")


# --- docs/gang.md's worked example ----------------------------------------------------------------


def doc_block(marker: str, doc: Path = DOC) -> str:
    """The fenced block right after `<!-- marker -->` in `doc` (docs/gang.md)."""
    text = doc.read_text()
    at = text.index(f"<!-- {marker} -->")
    body = text[at:].split("```", 2)[1]
    return body.split("\n", 1)[1].rstrip("\n")


def test_the_worked_example_in_docs_gang_md_is_this_output(tmp_path, capsys, monkeypatch, caplog) -> None:
    """The `kubectl gputopo why` output and the Events docs/gang.md shows are what the code
    prints for the example's objects (regenerate with GPUTOPO_WRITE_EXAMPLE=1)."""
    if "why" not in EXAMPLE:  # run alone: make the outputs here
        (tmp_path / "planned").mkdir()
        test_a_jobset_shaped_tree_names_each_sub_groups_domain_in_its_events_and_why(
            tmp_path / "planned", capsys, monkeypatch
        )
    if "waiting" not in EXAMPLE:
        (tmp_path / "waiting").mkdir()
        test_a_waiting_tree_names_the_sub_group_that_cannot_be_placed(
            tmp_path / "waiting", capsys, monkeypatch, caplog
        )
    events = "\n".join(f"{kind}/{name}  {reason}  {note}" for kind, name, reason, note in EXAMPLE["events"])
    blocks = {
        "worked-example-why": EXAMPLE["why"],
        "worked-example-events": events,
        "worked-example-waiting": EXAMPLE["waiting"],
    }
    if os.environ.get("GPUTOPO_WRITE_EXAMPLE"):
        text = DOC.read_text()
        for marker, body in blocks.items():
            fence = re.compile(rf"(<!-- {marker} -->\n```\w*\n)(.*?)(```)", re.DOTALL)
            text = fence.sub(lambda m, body=body: m.group(1) + body + "\n" + m.group(3), text, count=1)
        DOC.write_text(text)
    for marker, body in blocks.items():
        assert doc_block(marker) == body, f"docs/gang.md's {marker} block drifted from the code's output"
    sample = doc_block("tree-sample", ROOT / "docs" / "kubectl-gputopo.md")
    assert f"\n{sample}\n" in EXAMPLE["why"], "docs/kubectl-gputopo.md's tree sample drifted from `why`"


def test_the_worked_example_yaml_is_what_the_test_places() -> None:
    """The YAML docs/gang.md shows parses to the objects this test gives the sidecar."""
    shown = list(yaml.safe_load_all(doc_block("worked-example-yaml")))
    objects, pods = jobset()

    def meta(o: dict) -> dict:
        return {k: v for k, v in o["metadata"].items() if k in ("namespace", "name")}

    assert [(o["apiVersion"], o["kind"], meta(o), o["spec"]) for o in shown[:3]] == [
        (o["apiVersion"], o["kind"], meta(o), o["spec"]) for _, o in objects
    ]
    pod = shown[3]
    assert (meta(pod), pod["spec"]["schedulingGroup"]) == (meta(pods[0]), pods[0]["spec"]["schedulingGroup"])
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 8}


def test_every_tree_field_docs_kubectl_gputopo_md_names_is_written_and_every_written_one_named(
    tmp_path, capsys, monkeypatch, caplog
) -> None:
    """docs/kubectl-gputopo.md's `gang.tree` table against what `why -o json` writes: the same
    top-level fields, and per object field (`root`, `subgroups[]`, `stuck`, `event`) the same
    keys."""
    if "json" not in EXAMPLE:
        (tmp_path / "planned").mkdir()
        test_a_jobset_shaped_tree_names_each_sub_groups_domain_in_its_events_and_why(
            tmp_path / "planned", capsys, monkeypatch
        )
    if "json_waiting" not in EXAMPLE:
        (tmp_path / "waiting").mkdir()
        test_a_waiting_tree_names_the_sub_group_that_cannot_be_placed(
            tmp_path / "waiting", capsys, monkeypatch, caplog
        )
    text = (ROOT / "docs" / "kubectl-gputopo.md").read_text()
    table = text[text.index("<!-- tree-fields -->") :].split("\n\n", 1)[0]
    rows: dict[str, str] = {}
    for line in table.splitlines()[3:]:
        first, meaning = line.split("|")[1:3]
        for name in re.findall(r"`([a-z_]+)`", first):
            rows[name] = meaning
    tree, waiting = EXAMPLE["json"]["gang"]["tree"], EXAMPLE["json_waiting"]["gang"]["tree"]
    assert set(rows) == set(tree) == set(waiting)
    written = {
        "root": tree["root"],
        "subgroups": tree["subgroups"][0],
        "event": tree["event"],
        "stuck": waiting["stuck"],
    }
    for field, value in written.items():
        named = set(re.findall(r"`([a-z_]+)`", rows[field]))
        assert named == set(value), field
    assert "subgroup" in EXAMPLE["json"]["gang"]["members"][0] and "`gang.members[].subgroup`" in text


# --- trees from other APIs, through `why`'s pure views -------------------------------------------


def kai_pod(name: str, subgroup: str, node: str = "") -> dict:
    return fk.pod(
        "ml",
        name,
        8,
        annotations={"pod-group-name": "g"},
        labels={"kai.scheduler/subgroup-name": subgroup},
        node_name=node,
    )


def test_why_prints_a_nested_kai_tree_indented_with_this_pods_sub_group_marked() -> None:
    """A KAI PodGroup's `subGroups[]` two deep: the Event on the PodGroup (as `gang_event`
    writes it) is read back into the tree, each level indented under its parent."""
    from gputopo.gang.asks import Event
    from kubectl_gputopo import views

    kai = {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"namespace": "ml", "name": "g"},
        "spec": {
            "minMember": 4,
            "subGroups": [
                {"name": "rep"},
                {"name": "tp0", "parent": "rep", "minMember": 2},
                {"name": "tp1", "parent": "rep", "minMember": 2},
            ],
        },
    }
    tree = (
        placed("", level=LEAF, domain="leaf-1", asked="", asked_level=None, nodes=4),
        placed("rep", level=LEAF, domain="leaf-1", asked="", asked_level=None, nodes=4),
        placed("tp0", "rep", level=CLIQUE, domain="cl.2"),
        placed("tp1", "rep", level=CLIQUE, domain="cl.3", why="predicted 1.20 s per step here"),
    )
    written = gang_event(Event("plan", "ml/kai:g", "", "", {"tree": tree, "offered": 8}))
    assert written is not None
    events = [kt.event("ml", "PodGroup", "g", written[0], written[1], "2027-01-15T08:00:00Z", 1)]
    pods = [kai_pod(f"w{i}", f"tp{i // 2}", f"n{i}") for i in range(4)]
    pod = pods[3]
    doc = views.why_document(pod, gang=views.gang_of(pod), gang_object=kai, members=pods, events=events)
    text = views.render_why(doc, now=NOW)
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("tree "))
    assert lines[at] == "tree PodGroup/g, quorum 4: this pod is in sub-group tp1"
    assert (
        lines[at + 2]
        == "    PodGroup/g → leaf-1 (leaf, no level asked) on 4 nodes, within the 8 nodes offered"
    )
    assert lines[at + 3 : at + 6] == [
        "      rep → leaf-1 (leaf, no level asked) on node-rep-0,node-rep-1,node-rep-2,node-rep-3",
        "        tp0 → cl.2 (gpu.clique, required) on node-tp0-0,node-tp0-1",
        "        tp1 → cl.3 (gpu.clique, required) on node-tp1-0,node-tp1-1: predicted 1.20 s per step here"
        "  <- this pod",
    ]
    assert [g["path"] for g in doc["gang"]["tree"]["subgroups"]] == ["rep", "rep/tp0", "rep/tp1"]


def test_a_tree_without_a_group_object_shows_the_pods_own_sub_group() -> None:
    """Kueue slices have no group object: the sidecar writes the tree's Event on nothing, and
    `why` shows what the pod's own GangPlanned Event says of its sub-group."""
    from gputopo.gang.spec import GangPlan
    from kubectl_gputopo import views
    from scheduler.extender import _planned_message

    labels = {"kueue.x-k8s.io/pod-group-name": "kq", "batch.kubernetes.io/job-completion-index": "1"}
    annotations = {
        "kueue.x-k8s.io/pod-group-total-count": "2",
        "kueue.x-k8s.io/podset-slice-required-topology": CLIQUE,
        "kueue.x-k8s.io/podset-slice-size": "2",
    }
    pod = fk.pod("ml", "w1", 8, labels=labels, annotations=annotations)
    tree = (
        placed("", level=CLIQUE, domain="cl.0", asked="", asked_level=None),
        Placed(**{**placed("slice0-0").__dict__, "pods": ("ml/w0", "ml/w1")}),
    )
    plan = GangPlan("ml/kueue:kq", CLIQUE, "cl.0", (), tree=tree)
    message = _planned_message(plan, "ml/kueue:kq", "node-slice0-0-1", "ml/w1")
    events = [kt.event("ml", "Pod", "w1", "GangPlanned", message, "2027-01-15T08:00:00Z", 1)]
    doc = views.why_document(pod, gang=views.gang_of(pod), gang_object=None, members=[pod], events=events)
    got = doc["gang"]["tree"]
    assert (got["object"], got["subgroup"], got["state"], got["root"]) == (None, "slice0-0", "planned", None)
    lines = views.render_why(doc, now=NOW).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("tree"))
    assert lines[at : at + 4] == [
        "tree, quorum 2: this pod is in sub-group slice0-0",
        "  planned (the sidecar's GangPlanned Event on pod/w1):",
        "    (the tree's own Event is on no group object: only this pod's sub-group is known)",
        "      slice0-0 → cl.slice0-0 (gpu.clique, required) on node-slice0-0-0,node-slice0-0-1  <- this pod",
    ]


def test_an_event_note_is_cut_to_1_kib_of_utf8_never_inside_a_character() -> None:
    """The API server counts a note's bytes; a tree's note carries "→" (3 bytes each)."""
    from gputopo_kube.events import MAX_NOTE, bounded_note, v1_event

    note = "x" + "→" * 600
    cut = bounded_note(note)
    assert len(cut.encode()) <= MAX_NOTE and note.startswith(cut) and len(cut) == 1 + (MAX_NOTE - 1) // 3
    assert bounded_note("short → note") == "short → note"
    body = v1_event(
        {"kind": "Pod", "namespace": "ml", "name": "p"},
        reason="GangPlanned",
        note=note,
        type_="Normal",
        action="Scheduling",
        controller="gputopo-scheduler",
        instance="i",
        at=NOW,
    )
    assert fk.event_problem(body, "ml", v1=True) == ""


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.sampled_from(["", "tree in ", "sub-group ", "; its sub-group "]))
def test_any_message_reads_back_as_a_tree_or_none_never_an_error(text: str, lead: str) -> None:
    """Event notes are anyone's text: the readers answer a value or None, never raise."""
    message = lead + text
    for read in (explain.parse_plan, explain.parse_stuck, explain.parse_own, explain.parse_entry):
        got = read(message)
        assert got is None or isinstance(got, dict)
