"""Which of our GPUs are in use, as kubelet itself records it (PodResources API v1).

kubelet keeps the device assignment of every running container in its checkpoint and serves it
on the pod-resources socket. Reading it (rather than remembering our own Allocate calls) is what
makes the published in-use set right after a plugin restart, and after pods end.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc

from deviceplugin import settings
from gputopo_proto.podresources.v1 import api_pb2, api_pb2_grpc

#: kubelet's own limit on a PodResources reply (16 MiB).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class PodResourcesError(RuntimeError):
    """kubelet's PodResources API could not be read; the message says why."""


def devices_in(reply: api_pb2.ListPodResourcesResponse, resource: str) -> frozenset[str]:
    """Device IDs of `resource` assigned to any container (init containers included) of any pod."""
    out: set[str] = set()
    for pod in reply.pod_resources:
        for container in pod.containers:
            for dev in container.devices:
                if dev.resource_name == resource:
                    out.update(dev.device_ids)
    return frozenset(out)


def devices_by_pod(reply: api_pb2.ListPodResourcesResponse, resource: str) -> dict[str, frozenset[str]]:
    """Device IDs of `resource` per pod ("namespace/name"), pods holding none left out: what
    the annotation's pod map is made of, so the sidecar can free a pod's GPUs when it ends."""
    out: dict[str, set[str]] = {}
    for pod in reply.pod_resources:
        for container in pod.containers:
            for dev in container.devices:
                if dev.resource_name == resource and dev.device_ids:
                    out.setdefault(f"{pod.namespace}/{pod.name}", set()).update(dev.device_ids)
    return {k: frozenset(v) for k, v in out.items()}


class PodResourcesClient:
    """A `List` client on kubelet's pod-resources unix socket; one channel, reused."""

    def __init__(
        self,
        socket_path: str = settings.POD_RESOURCES_SOCKET,
        resource: str = settings.RESOURCE_NAME,
        timeout_s: float = 5.0,
    ) -> None:
        self.socket_path = socket_path
        self.resource = resource
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(
            f"unix://{socket_path}",
            options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)],
        )
        self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)

    def in_use(self) -> frozenset[str]:
        """The device IDs of our resource that kubelet has assigned to containers."""
        return devices_in(self._list(), self.resource)

    def assignments(self) -> dict[str, frozenset[str]]:
        """The device IDs of our resource per pod ("namespace/name")."""
        return devices_by_pod(self._list(), self.resource)

    def _list(self) -> api_pb2.ListPodResourcesResponse:
        try:
            reply = self._stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            name = code.name if code is not None else "UNKNOWN"
            details = e.details() if hasattr(e, "details") else str(e)
            raise PodResourcesError(f"PodResources List on {self.socket_path}: {name}: {details}") from None
        return reply

    def close(self) -> None:
        self._channel.close()


def ids_to_uuids(ids: Iterable[str]) -> frozenset[str]:
    """Device IDs as the plugin advertises them are GPU UUIDs; replicas (`UUID::n`) map back."""
    return frozenset(i.split("::", 1)[0] for i in ids)
