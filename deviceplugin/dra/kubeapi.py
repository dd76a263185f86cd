"""ResourceSlices and ResourceClaims through the API server, as plain dicts.

The official client's generic object calls (CustomObjectsApi) serve `resource.k8s.io/v1` like
any group: the daemon builds its slices as dicts (gputopo.node.draslices) and reads claims as dicts,
so no typed model can drop a field the client release does not know yet (sharedCounters and
consumesCounters are newer than many client releases). Everything read here is untrusted: the
callers validate every field they use.
"""

from __future__ import annotations

from typing import Any, Protocol

GROUP = "resource.k8s.io"
VERSION = "v1"


class DraApi(Protocol):
    """The calls the DRA daemon makes; tests pass a client pointed at a stand-in."""

    def list_slices(self, node_name: str, driver: str) -> list[dict[str, Any]]: ...

    def create_slice(self, body: dict[str, Any]) -> dict[str, Any]: ...

    def replace_slice(self, name: str, body: dict[str, Any]) -> dict[str, Any]: ...

    def delete_slice(self, name: str) -> None: ...

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]: ...


class KubeDraApi:
    """DraApi over `kubernetes.client.CustomObjectsApi` (in-cluster or a kubeconfig)."""

    def __init__(self, api_client: Any, request_timeout_s: float = 10.0) -> None:
        from kubernetes import client

        self._api = client.CustomObjectsApi(api_client)
        self._timeout = request_timeout_s

    def list_slices(self, node_name: str, driver: str) -> list[dict[str, Any]]:
        doc = self._api.list_cluster_custom_object(
            GROUP,
            VERSION,
            "resourceslices",
            field_selector=f"spec.nodeName={node_name},spec.driver={driver}",
            _request_timeout=self._timeout,
        )
        items = doc.get("items") if isinstance(doc, dict) else None
        return [i for i in items or [] if isinstance(i, dict)]

    def create_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        return _object(
            self._api.create_cluster_custom_object(
                GROUP, VERSION, "resourceslices", body, _request_timeout=self._timeout
            )
        )

    def replace_slice(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return _object(
            self._api.replace_cluster_custom_object(
                GROUP, VERSION, "resourceslices", name, body, _request_timeout=self._timeout
            )
        )

    def delete_slice(self, name: str) -> None:
        self._api.delete_cluster_custom_object(
            GROUP, VERSION, "resourceslices", name, _request_timeout=self._timeout
        )

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        return _object(
            self._api.get_namespaced_custom_object(
                GROUP, VERSION, namespace, "resourceclaims", name, _request_timeout=self._timeout
            )
        )


def _object(doc: object) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise ValueError("the API server answered something that is not a JSON object")
    return doc


def for_cluster(kubeconfig: str | None = None) -> KubeDraApi:
    """In-cluster config (the plugin's ServiceAccount), or a kubeconfig (`gputopo_kube`)."""
    from gputopo_kube import api_client

    return KubeDraApi(api_client(kubeconfig))
