"""The sidecar's list+watch at scale-friendly settings, through the official client against the
API stand-in: paginated lists, finished pods left out by the API server, watch bookmarks."""

from __future__ import annotations

from urllib.parse import parse_qs

from scheduler.live.kube import ACTIVE_PODS, KubeState
from tests import fake_apiserver as fk
from tests.test_scheduler_live import NOW, wait_until


def start(api_client, **kw) -> KubeState:
    state = KubeState(api_client, clock=lambda: NOW, watch_timeout_s=5, backoff_s=(0.05, 0.2), **kw)
    state.start()
    wait_until(state.ready)
    return state


def test_lists_are_paginated_with_limit_and_continue() -> None:
    with fk.running() as (api, _, api_client):
        for i in range(1234):
            api.put("nodes", fk.node(f"n{i:04d}"))
        state = start(api_client, page_size=500)
        try:
            assert len(state.snapshot().nodes) == 1234
            pages = [parse_qs(q) for q in api.list_requests("nodes")]
            assert [p["limit"] for p in pages] == [["500"]] * 3
            assert "continue" not in pages[0] and all("continue" in p for p in pages[1:])
            assert state.reflectors[0].pages == 3 and state.reflectors[0].lists == 1
        finally:
            state.stop()


def test_an_expired_continue_token_relists_from_the_start() -> None:
    with fk.running() as (api, _, api_client):
        for i in range(30):
            api.put("nodes", fk.node(f"n{i:02d}"))
        original = fk._Handler._list

        def expire_after_first_page(self, kind, q, selector):
            original(self, kind, q, selector)
            if kind == "nodes" and not q.get("continue") and not getattr(api, "expired_once", False):
                api.expired_once = True
                api.expire_continue_tokens()

        fk._Handler._list = expire_after_first_page
        try:
            state = start(api_client, page_size=10)
        finally:
            fk._Handler._list = original
        try:
            assert len(state.snapshot().nodes) == 30
            firsts = [q for q in api.list_requests("nodes") if "continue" not in parse_qs(q)]
            assert len(firsts) == 2, "the 410 on the second page started the list again"
        finally:
            state.stop()


def test_finished_pods_are_left_out_by_the_api_server() -> None:
    with fk.running() as (api, _, api_client):
        api.put("nodes", fk.node("n1"))
        done = fk.pod("ml", "done", 2, node_name="n1")
        done["status"]["phase"] = "Succeeded"
        api.put("pods", done)
        api.put("pods", fk.pod("ml", "running", 2, node_name="n1"))
        state = start(api_client)
        try:
            (query,) = api.list_requests("pods")
            assert parse_qs(query)["fieldSelector"] == [ACTIVE_PODS]
            assert set(state.snapshot().pods) == {"ml/running"}
            assert state.snapshot().pod_gpus == {"n1": 2}
            finished = fk.pod("ml", "running", 2, node_name="n1")
            finished["status"]["phase"] = "Failed"
            api.put("pods", finished)  # leaves the selection: the watch says DELETED
            wait_until(lambda: "ml/running" not in state.snapshot().pods)
            assert state.snapshot().pod_gpus == {}
        finally:
            state.stop()


def test_watches_ask_for_bookmarks_and_resume_from_them() -> None:
    """Nodes are quiet while pods change: bookmarks move the node watch's resourceVersion on,
    so a broken node watch resumes from a recent version instead of an old one (which the
    real API server may have compacted away, forcing a full relist of every node)."""
    with fk.running() as (api, _, api_client):
        api.put("nodes", fk.node("n1"))
        state = start(api_client)
        try:
            watches = [parse_qs(q) for _, q in api.watch_queries]
            assert watches and all(w["allowWatchBookmarks"] == ["true"] for w in watches)
            node_rv = state.reflectors[0].resource_version
            for i in range(5):
                api.put("pods", fk.pod("ml", f"p{i}", 1))
            latest = api.rv
            wait_until(lambda: state.reflectors[0].resource_version == str(latest))
            assert int(node_rv) < latest
            api.break_watches()
            wait_until(lambda: api.watch_requests("nodes")[-1] == str(latest))
            assert state.reflectors[0].lists == 1
        finally:
            state.stop()


def test_an_optional_kind_our_rbac_cannot_read_is_absent_not_fatal(caplog) -> None:
    """An older chart without the new RBAC rules: 403 on a kind is logged once, and the
    sidecar becomes ready and serves without it."""
    import logging

    caplog.set_level(logging.INFO, logger="gputopo.scheduler")
    with fk.running(fk.FakeAPI(serve=("volcano-podgroups",))) as (api, _, api_client):
        api.put("nodes", fk.node("n1"))
        api.inject("list:volcano-podgroups", *([403] * 50))
        state = start(api_client, discovery_ttl_s=0.1)
        try:
            wait_until(lambda: len(api.list_requests("volcano-podgroups")) >= 3)
            absent = [r.fields for r in caplog.records if r.getMessage() == "kind_absent"]
            mine = [f for f in absent if f["kind"] == "volcano-podgroups"]
            assert len(mine) == 1 and "forbidden" in mine[0]["reason"]
            assert state.ready() and "n1" in state.snapshot().nodes
        finally:
            state.stop()
