"""The few API server calls the daemons make, without the client's typed API classes.

`kubernetes.client.CoreV1Api` and its siblings (client 37: pydantic-generated) import and
build a validator for every model they name when first touched: ~1.4 s of CPU for CoreV1Api
alone, ~0.5 s for each of EventsV1Api, ApisApi and CustomObjectsApi, more than the sidecar's
whole start-up at 5,000 nodes otherwise. The daemons never use those models: they send dicts and
read raw JSON (`_preload_content=False`). `RawApi` sends the same requests through the same
`ApiClient` (its configuration, credentials, TLS, connection pool and timeouts), and answers as
the typed methods do with `_preload_content=False`: the urllib3 response, or `ApiException`
raised for a non-2xx status. Each method takes the typed method's keyword names (what
`kubernetes.watch.Watch.stream` passes too: `watch`, `resource_version`, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

#: Query parameters as the typed methods name them -> as the API server does.
QUERY_NAMES = {
    "pretty": "pretty",
    "allow_watch_bookmarks": "allowWatchBookmarks",
    "_continue": "continue",
    "field_selector": "fieldSelector",
    "label_selector": "labelSelector",
    "limit": "limit",
    "resource_version": "resourceVersion",
    "resource_version_match": "resourceVersionMatch",
    "send_initial_events": "sendInitialEvents",
    "timeout_seconds": "timeoutSeconds",
    "watch": "watch",
}
#: What every typed method accepts beside its query (and ignored here as the typed ones do when
#: `_preload_content` is False: the raw response is always answered).
_CALL_OPTIONS = ("_preload_content", "_request_timeout")


class RawApi:
    """GET and POST through an `ApiClient`, answering raw responses."""

    def __init__(self, api_client: ApiClient) -> None:
        self.api_client = api_client

    def request(
        self,
        method: str,
        path: str,
        path_params: Mapping[str, str] | None = None,
        *,
        body: Any = None,
        **kw: Any,
    ) -> Any:
        """`path` with its `{name}` placeholders filled from `path_params` (quoted as the typed
        client quotes them), the query from `kw` (`QUERY_NAMES`), `_request_timeout` as the
        typed methods take it."""
        timeout = kw.get("_request_timeout")
        unknown = set(kw) - set(QUERY_NAMES) - set(_CALL_OPTIONS)
        if unknown:
            raise TypeError(f"unexpected arguments: {', '.join(sorted(unknown))}")
        query = [(QUERY_NAMES[k], v) for k, v in kw.items() if k in QUERY_NAMES and v is not None]
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        req = self.api_client.param_serialize(
            method=method,
            resource_path=path,
            path_params=dict(path_params or {}),
            query_params=query,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        resp = self.api_client.call_api(*req, _request_timeout=timeout)
        if not 200 <= resp.status <= 299:
            resp.read()
            raise ApiException.from_response(http_resp=resp, body=None, data=None)
        return resp.response

    # GET: lists (and watches: `watch=True`)

    def list_node(self, **kw: Any) -> Any:
        return self.request("GET", "/api/v1/nodes", **kw)

    def list_pod_for_all_namespaces(self, **kw: Any) -> Any:
        return self.request("GET", "/api/v1/pods", **kw)

    def list_cluster_custom_object(self, group: str, version: str, plural: str, **kw: Any) -> Any:
        params = {"group": group, "version": version, "plural": plural}
        return self.request("GET", "/apis/{group}/{version}/{plural}", params, **kw)

    def get_api_versions(self, **kw: Any) -> Any:
        return self.request("GET", "/apis/", **kw)

    def read_namespaced_pod(self, name: str, namespace: str, **kw: Any) -> Any:
        params = {"name": name, "namespace": namespace}
        return self.request("GET", "/api/v1/namespaces/{namespace}/pods/{name}", params, **kw)

    # POST: the body is the object as a dict

    def create_namespaced_pod_binding(self, name: str, namespace: str, body: Any, **kw: Any) -> Any:
        params = {"name": name, "namespace": namespace}
        path = "/api/v1/namespaces/{namespace}/pods/{name}/binding"
        return self.request("POST", path, params, body=body, **kw)

    def create_namespaced_event(self, namespace: str, body: Any, **kw: Any) -> Any:
        """core/v1 Events."""
        path = "/api/v1/namespaces/{namespace}/events"
        return self.request("POST", path, {"namespace": namespace}, body=body, **kw)

    def create_events_v1_event(self, namespace: str, body: Any, **kw: Any) -> Any:
        """events.k8s.io/v1 Events."""
        path = "/apis/events.k8s.io/v1/namespaces/{namespace}/events"
        return self.request("POST", path, {"namespace": namespace}, body=body, **kw)


__all__ = ["QUERY_NAMES", "RawApi"]
