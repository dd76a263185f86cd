"""The reads `kubectl gputopo` makes, through the official client, as plain API JSON.

Responses are taken raw (`_preload_content=False`) and parsed as JSON: the commands read a few
fields of each object, and the client's model classes would refuse objects that a newer or an
older API server shapes differently. Every failure becomes one `ApiError` whose message is the
API server's own (`pods "x" not found`) or the transport's, on one line.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gputopo.gang.sources import Api

#: Nodes per list request, and the most pages `nodes` reads (a bound, not a cluster limit).
PAGE = 500
MAX_PAGES = 400


class ApiError(Exception):
    """The API server could not answer; the message says why, on one line. `status` is the
    HTTP status when the server answered (404: no such object, or no such API)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _api_message(e: ApiException) -> str:
    try:
        doc = json.loads(e.body or b"{}")
    except (ValueError, TypeError):
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("message"), str) and doc["message"]:
        return _one_line(doc["message"])
    return f"HTTP {e.status} {_one_line(str(e.reason or ''))}".strip()


class Reader:
    """Reads Nodes, Pods, Events and gang objects; `timeout` bounds every request (seconds)."""

    def __init__(self, api_client: client.ApiClient, timeout: float = 10.0) -> None:
        self.core = client.CoreV1Api(api_client)
        self.events_v1 = client.EventsV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.timeout = timeout

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            resp = fn(*args, _preload_content=False, _request_timeout=self.timeout, **kwargs)
            return json.loads(resp.data)
        except ApiException as e:
            raise ApiError(_api_message(e), status=e.status) from None
        except ValueError as e:
            raise ApiError(f"the API server answered something that is not JSON ({e})") from None
        except Exception as e:  # urllib3: connection refused, TLS, timeouts
            reason = getattr(e, "reason", None) or e
            raise ApiError(f"cannot reach the API server: {_one_line(str(reason))}") from None

    def nodes(self, selector: str | None = None) -> list[dict[str, Any]]:
        """Every node, in pages of PAGE (limit/continue), so 20,000 nodes are 40 small answers
        rather than one large one the API server must hold in memory at once."""
        kwargs: dict[str, Any] = {"label_selector": selector} if selector else {}
        out: list[dict[str, Any]] = []
        token = ""
        for _ in range(MAX_PAGES):
            page = _obj(self._call(self.core.list_node, limit=PAGE, _continue=token or None, **kwargs))
            out += _items(page)
            token = (page.get("metadata") or {}).get("continue") or ""
            if not isinstance(token, str) or not token:
                return out
        raise ApiError(f"more than {MAX_PAGES * PAGE} nodes: narrow the listing with -l")

    def node(self, name: str) -> dict[str, Any]:
        return _obj(self._call(self.core.read_node, name))

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        return _obj(self._call(self.core.read_namespaced_pod, name, namespace))

    def pods(self, namespace: str) -> list[dict[str, Any]]:
        return _items(self._call(self.core.list_namespaced_pod, namespace))

    def events(self, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
        """The Events about this object, read through both APIs: core/v1 (`involvedObject`)
        and events.k8s.io/v1 (`regarding`; `eventTime` and `series` in microseconds, as
        kube-scheduler writes them). The API server keeps one store, so an Event usually comes
        back from both: each is kept once (by uid, else by name), the core/v1 copy first. An
        events.k8s.io list the server does not serve (404) or this user may not read (403)
        leaves the core/v1 answer."""
        core = _items(
            self._call(
                self.core.list_namespaced_event,
                namespace,
                field_selector=f"involvedObject.kind={kind},involvedObject.name={name}",
            )
        )
        try:
            v1 = _items(
                self._call(
                    self.events_v1.list_namespaced_event,
                    namespace,
                    field_selector=f"regarding.kind={kind},regarding.name={name}",
                )
            )
        except ApiError as e:
            if e.status not in (403, 404):
                raise
            v1 = []
        seen: set[str] = set()
        out: list[dict[str, Any]] = []
        for event in core + v1:
            raw = event.get("metadata")
            meta: dict[str, Any] = raw if isinstance(raw, dict) else {}
            key = str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")
            if key not in seen:
                seen.add(key)
                out.append(event)
        return out

    def gputopo_node_events(self, components: tuple[str, ...]) -> list[dict[str, Any]]:
        """gputopo's own Events on Nodes (namespace default, as kubelet's): why a plugin cannot
        publish, why the sidecar refuses an annotation. One selector per component (field
        selectors cannot say "or"); each daemon writes them only when the cause changes, so
        these lists are short. A reader not allowed to list Events in default loses only the
        explanations: [] for a 403."""
        out: list[dict[str, Any]] = []
        for component in components:
            selector = f"involvedObject.kind=Node,reportingComponent={component}"
            try:
                out += _items(
                    self._call(
                        self.core.list_namespaced_event, "default", field_selector=selector, limit=PAGE
                    )
                )
            except ApiError as e:
                if e.status != 403:
                    raise
        return out

    def events_by_reason(self, namespace: str, kind: str, reason: str) -> list[dict[str, Any]]:
        """The Events of one reason on objects of one kind in a namespace (every gang member's
        GPUsPredicted in one call, not one call per member)."""
        selector = f"involvedObject.kind={kind},reason={reason}"
        return _items(self._call(self.core.list_namespaced_event, namespace, field_selector=selector))

    def gang_object(self, api: Api, namespace: str, name: str) -> dict[str, Any] | None:
        """A gang's group object (a PodGroup / Workload of the API its gang source names, at
        that API's preferred version), or None when it (or its whole API group) does not exist."""
        group, version = api.group, api.versions[0]
        try:
            return _obj(
                self._call(
                    self.custom.get_namespaced_custom_object, group, version, namespace, api.plural, name
                )
            )
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def gang_objects(self, api: Api, namespace: str) -> list[dict[str, Any]]:
        """Every object of a gang API in the namespace (a tree's PodGroups and
        CompositePodGroups, which name their parents), [] when the API is not served (404) or
        this user may not list it (403): `why` then shows the pod's own group only."""
        try:
            return _items(
                self._call(
                    self.custom.list_namespaced_custom_object,
                    api.group,
                    api.versions[0],
                    namespace,
                    api.plural,
                )
            )
        except ApiError as e:
            if e.status in (403, 404):
                return []
            raise


def _obj(doc: Any) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise ApiError("the API server answered a JSON value that is not an object")
    return doc


def _items(doc: Any) -> list[dict[str, Any]]:
    items = _obj(doc).get("items")
    if not isinstance(items, list):
        raise ApiError("the API server answered a list without items")
    return [i for i in items if isinstance(i, dict)]
