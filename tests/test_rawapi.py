"""gputopo_kube.rawapi: the API calls without the typed classes, answered as those answer them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes.client.rest import ApiException

from gputopo_kube.rawapi import RawApi
from scheduler.live.reflector import raw_json
from tests import fake_apiserver as fk

ROOT = Path(__file__).resolve().parent.parent


def test_lists_pages_with_the_servers_query_names() -> None:
    with fk.running() as (api, _, api_client):
        for k in range(3):
            api.put("nodes", fk.node(f"n{k}"))
        raw = RawApi(api_client)
        first = raw_json(raw.list_node(limit=2, _preload_content=False, _request_timeout=5))
        assert [o["metadata"]["name"] for o in first["items"]] == ["n0", "n1"]
        token = first["metadata"]["continue"]
        rest = raw_json(raw.list_node(limit=2, _continue=token))
        assert [o["metadata"]["name"] for o in rest["items"]] == ["n2"]
        assert not rest["metadata"].get("continue")


def test_a_non_2xx_status_raises_api_exception_with_it() -> None:
    with fk.running() as (_, _, api_client):
        raw = RawApi(api_client)
        with pytest.raises(ApiException) as e:
            raw.list_cluster_custom_object("example.com", "v1", "widgets")
        assert e.value.status == 404
        with pytest.raises(ApiException) as e:
            raw.read_namespaced_pod("absent", "default")
        assert e.value.status == 404


def test_an_argument_the_typed_methods_lack_is_refused() -> None:
    with fk.running() as (_, _, api_client), pytest.raises(TypeError, match="sort_by"):
        RawApi(api_client).list_node(sort_by="name")


def test_the_binding_body_is_what_the_typed_client_sent() -> None:
    with fk.running() as (api, _, api_client):
        api.put("pods", fk.pod("ns", "p", 1))
        resp = RawApi(api_client).create_namespaced_pod_binding(
            "p",
            "ns",
            {"metadata": {"name": "p", "namespace": "ns"}, "target": {"kind": "Node", "name": "n0"}},
        )
        resp.release_conn()
        assert api.bindings == [("ns/p", "n0")]


def test_live_mode_starts_without_importing_the_typed_api_classes(tmp_path: Path) -> None:
    """Their import costs seconds of CPU at start-up (CoreV1Api alone ~1.4 s in client 37)."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    code = (
        "import sys\n"
        "from scheduler.__main__ import _live_state\n"
        "from scheduler.report.metrics import Metrics\n"
        f"_live_state({str(kubeconfig)!r}, 60.0, Metrics())\n"
        "print(sorted(m for m in sys.modules if m.startswith('kubernetes.client.api.')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": f"{ROOT}:{ROOT / 'proto'}", "PATH": "/usr/bin:/bin"},
        check=True,
    )
    assert out.stdout.strip() == "[]", out.stderr
