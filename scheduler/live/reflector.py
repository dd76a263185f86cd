"""One kind of the API server, mirrored: list (remember resourceVersion), then watch from there.

client-go's reflector, for `scheduler.live.kube.KubeState`: a broken watch resumes from the last
resourceVersion seen, a 410 Gone relists, a missing CRD (PodGroups) is retried later, and API
errors back off; lists are paged (`limit`/`continue`) and a kind our RBAC may not read (403) is
absent, logged once. Objects stay raw JSON dicts (no model deserialisation). Never raises out of
its thread.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

import orjson
from kubernetes import watch
from kubernetes.client.rest import ApiException

from gputopo import jsonlog
from scheduler.nodeguard import describe

log = logging.getLogger("gputopo.scheduler.kube")

#: Objects per list page (`limit`): bounds each response the API server builds and sends.
PAGE_SIZE = 500


def raw_json(resp: Any) -> Any:
    """The JSON body of a `_preload_content=False` response. orjson reads a node list ~2x faster
    than json (at start-up the sidecar reads every node); what it refuses (NaN, integers past 64
    bits, lone surrogates) json reads as before, and the values are the same either way."""
    try:
        data = resp.data
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            return json.loads(data)
    finally:
        resp.release_conn()


class Reflector:
    """List then watch one kind, forever, until stopped; never raises out of its thread."""

    def __init__(
        self,
        kind: str,
        list_fn: Callable[..., Any],
        replace_all: Callable[[list[dict[str, Any]]], None],
        apply: Callable[[str, dict[str, Any]], None],
        stop: threading.Event,
        *,
        watch_timeout_s: int,
        backoff_s: tuple[float, float],
        on_listed: Callable[[], None],
        absent_ok: bool = False,
        page_size: int = PAGE_SIZE,
    ) -> None:
        self.kind = kind
        self.list_fn = list_fn
        self.replace_all = replace_all
        self.apply = apply
        self.stop = stop
        self.watch_timeout_s = watch_timeout_s
        self.backoff_s = backoff_s
        self.on_listed = on_listed
        self.absent_ok = absent_ok
        self.page_size = page_size
        self.pages = 0  # list pages read, all lists together
        self._absent = False  # logged as absent already: say it once, not every retry
        self.resource_version = ""
        self.lists = 0
        self.watches = 0
        self._current: watch.Watch | None = None

    def interrupt(self) -> None:
        """Unblock a watch waiting for events (used by stop)."""
        w = self._current
        if w is not None:
            w.stop()
            resp = getattr(w, "_resp", None)
            shutdown = getattr(resp, "shutdown", None)
            if shutdown is not None:  # urllib3 >= 2.3: unblocks a read in another thread
                try:
                    shutdown()
                except Exception:
                    pass

    def run(self) -> None:
        delay = self.backoff_s[0]
        need_list = True
        while not self.stop.is_set():
            try:
                if need_list:
                    self._list()
                    need_list = False
                self._watch()
                delay = self.backoff_s[0]
            except ApiException as e:
                if e.status == 410:
                    jsonlog.event(log, "watch_expired", kind=self.kind, reason="410 Gone: relisting")
                    need_list = True
                    continue
                if e.status in (403, 404) and self.absent_ok:
                    # 403: our RBAC lacks the kind (an older chart); serve without it, say why
                    if not self._absent:
                        why = "not served" if e.status == 404 else "forbidden: RBAC lacks get/list/watch"
                        jsonlog.event(log, "kind_absent", kind=self.kind, reason=f"{why}; retried quietly")
                        self.replace_all([])  # a CRD removed takes its objects with it
                    self._absent = True
                    self.on_listed()
                    need_list = True
                    self.stop.wait(self.backoff_s[1])
                    continue
                jsonlog.event(
                    log,
                    "api_error",
                    logging.WARNING,
                    kind=self.kind,
                    status=e.status,
                    reason=str(e.reason),
                    retry_in_s=delay,
                )
                self.stop.wait(delay)
                delay = min(delay * 2, self.backoff_s[1])
            except Exception as e:  # broken connection, bad JSON: resume, never die
                jsonlog.event(
                    log,
                    "watch_broken",
                    logging.WARNING,
                    kind=self.kind,
                    reason=f"{type(e).__name__}: {e}",
                    resume_from=self.resource_version,
                    retry_in_s=delay,
                )
                self.stop.wait(delay)
                delay = min(delay * 2, self.backoff_s[1])

    def _list(self) -> None:
        """Page by page (`limit`/`continue`); an expired continue token is a 410: relist."""
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            kw: dict[str, Any] = {"limit": self.page_size} if self.page_size > 0 else {}
            if token:
                kw["_continue"] = token
            body = raw_json(self.list_fn(_preload_content=False, **kw))
            self.pages += 1
            items.extend(body.get("items") or [])
            meta = body.get("metadata") or {}
            token = meta.get("continue") or ""
            if not token or self.stop.is_set():
                break
        self.resource_version = meta.get("resourceVersion", "")
        if self._absent:
            jsonlog.event(log, "kind_present", kind=self.kind, reason="served now")
            self._absent = False
        self.replace_all(items)
        self.lists += 1
        jsonlog.event(log, "listed", kind=self.kind, count=len(items), resource_version=self.resource_version)
        self.on_listed()

    def _watch(self) -> None:
        self.watches += 1
        w = self._current = watch.Watch()
        if self.stop.is_set():
            return
        kwargs: dict[str, Any] = {"timeout_seconds": self.watch_timeout_s, "allow_watch_bookmarks": True}
        if self.resource_version:
            kwargs["resource_version"] = self.resource_version

        # A wrapper without a docstring: the client then finds no model type and hands us plain
        # dicts (raw_object) instead of deserialising every object into models.
        def raw_list(**kw: Any) -> Any:
            return self.list_fn(**kw)

        for event in w.stream(raw_list, **kwargs):
            if self.stop.is_set():
                w.stop()
                return
            obj = event.get("raw_object") or {}
            rv = (obj.get("metadata") or {}).get("resourceVersion") if isinstance(obj, dict) else None
            if event.get("type") != "BOOKMARK":
                try:
                    self.apply(event.get("type", ""), obj)
                except Exception as e:  # one object must never make the watch replay it for ever
                    jsonlog.event(
                        log,
                        "event_dropped",
                        logging.ERROR,
                        kind=self.kind,
                        resource_version=rv,
                        reason=describe(e),
                    )
            if rv:
                self.resource_version = rv
