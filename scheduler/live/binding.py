"""Binding a pod to a node through the API server's `pods/binding` subresource, idempotently.

A binding kube-scheduler retries after a lost answer meets 409 Conflict: if the pod already
sits on the node we asked for, that is success, not an error. Every other failure becomes a
`BindError` with the API server's reason, which the extender answers kube-scheduler with.
"""

from __future__ import annotations

from typing import Any

from kubernetes.client.rest import ApiException

from gputopo_kube.rawapi import RawApi
from scheduler.live.reflector import raw_json
from scheduler.model import PodInfo
from scheduler.picture.feed import BindError


def create_binding(core: RawApi, pod: PodInfo, node: str, timeout_s: float) -> None:
    """Bind `pod` to `node`; a call that hangs is cut after `timeout_s` (it would hold the pod
    "in progress" for ever). The body is what the typed client sent for a `V1Binding` of these
    fields (its unset ones left out)."""
    meta = {"name": pod.name, "namespace": pod.namespace} | ({"uid": pod.uid} if pod.uid else {})
    body = {"metadata": meta, "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    try:
        raw_json(
            core.create_namespaced_pod_binding(
                pod.name,
                pod.namespace,
                body,
                _preload_content=False,
                _request_timeout=timeout_s,
            )
        )
    except ApiException as e:
        if e.status == 409 and _bound_to(core, pod, node, timeout_s):
            return
        raise BindError(f"API server refused the binding: {e.status} {e.reason}") from None
    except Exception as e:
        raise BindError(f"binding failed: {type(e).__name__}: {e}") from None


def _bound_to(core: Any, pod: PodInfo, node: str, timeout_s: float) -> bool:
    try:
        raw = raw_json(
            core.read_namespaced_pod(
                pod.name, pod.namespace, _preload_content=False, _request_timeout=timeout_s
            )
        )
    except Exception:
        return False
    return (raw.get("spec") or {}).get("nodeName") == node
