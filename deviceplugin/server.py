"""Lifecycle of the plugin's gRPC server on its unix socket in the kubelet folder.

Kubelet owns the folder: when it restarts it deletes every socket there, ours included. So a
server generation is tied to one socket file (its inode), and `restart()` makes a fresh one.
The socket is removed on stop only if it is still the one this server created, so a stop can
never delete a file someone else put there since.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Callable
from concurrent import futures

import grpc

from deviceplugin.config import PluginConfig
from deviceplugin.metrics import Metrics
from deviceplugin.registration import FileId, RegistrationInfo, file_id
from deviceplugin.service import DevicePluginService, StatusService
from deviceplugin.state import SnapshotStore
from gputopo import jsonlog
from gputopo_proto.deviceplugin.v1beta1 import api_pb2_grpc
from gputopo_proto.status.v1 import status_pb2_grpc

log = logging.getLogger("deviceplugin.server")


class ServerError(RuntimeError):
    """The plugin socket cannot be served (folder not writable, path taken by a non-socket, …)."""


class PluginServer:
    """Serves DevicePlugin and Status on `config.socket_path`; one grpc.Server per generation."""

    def __init__(
        self,
        config: PluginConfig,
        store: SnapshotStore,
        metrics: Metrics,
        registration: Callable[[], RegistrationInfo],
        max_workers: int = 16,
        allocated: Callable[[], None] = lambda: None,
    ) -> None:
        self._allocated = allocated
        self._config = config
        self._store = store
        self._metrics = metrics
        self._registration = registration
        self._max_workers = max_workers
        self._server: grpc.Server | None = None
        self._service: DevicePluginService | None = None
        self._stopping = threading.Event()
        self._socket_id: FileId | None = None
        # start/stop/restart come from the folder watcher and from shutdown at once: one at a
        # time, and nothing starts again after close()
        self._lifecycle = threading.RLock()
        self._closed = False
        self.generation = 0

    @property
    def path(self) -> str:
        return self._config.socket_path

    def watchers(self) -> int:
        return self._service.watchers if self._service is not None else 0

    def start(self) -> None:
        with self._lifecycle:
            if self._closed:
                raise ServerError(f"server on {self.path} was stopped for good; not serving again")
            self._start()

    def _start(self) -> None:
        folder = self._config.kubelet_dir
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as e:
            raise ServerError(f"cannot create kubelet folder {folder}: {e.strerror or e}") from None
        self._remove_stale()
        self._stopping = threading.Event()
        service = DevicePluginService(
            self._store,
            self._config,
            self._metrics,
            self._stopping,
            allocated=self._allocated,
            # half the threads at most for streams: the other half always answers unary RPCs
            max_streams=max(1, self._max_workers // 2),
        )
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix="plugin-rpc"),
            # kubelet waits on every call during pod admission: favour latency over throughput
            options=[("grpc.optimization_target", "latency")],
        )
        api_pb2_grpc.add_DevicePluginServicer_to_server(service, server)
        status_pb2_grpc.add_StatusServicer_to_server(
            StatusService(self._store, self._config, self._registration, self.watchers), server
        )
        try:
            server.add_insecure_port(f"unix://{self.path}")
        except RuntimeError as e:
            raise ServerError(f"cannot listen on {self.path}: {e}") from None
        server.start()
        self._server, self._service = server, service
        self._socket_id = file_id(self.path)
        self.generation += 1
        jsonlog.event(
            log,
            "serving",
            socket=self.path,
            generation=self.generation,
            reason="plugin socket ready; registration may proceed",
        )

    def _remove_stale(self) -> None:
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        except OSError as e:
            raise ServerError(f"cannot inspect {self.path}: {e.strerror or e}") from None
        if not stat.S_ISSOCK(st.st_mode):
            raise ServerError(f"{self.path} exists and is not a socket; refusing to delete it")
        try:
            os.unlink(self.path)
        except OSError as e:
            raise ServerError(f"cannot remove stale socket {self.path}: {e.strerror or e}") from None
        jsonlog.event(
            log,
            "stale_socket_removed",
            socket=self.path,
            reason="a socket was left at our path (previous run or kubelet restart)",
        )

    def socket_intact(self) -> bool:
        """True while the socket this generation created is still in place."""
        return (
            self._server is not None and self._socket_id is not None and file_id(self.path) == self._socket_id
        )

    def stop(self, grace: float = 1.0) -> None:
        """End streams, stop serving, remove our socket (only if it is still ours)."""
        with self._lifecycle:
            self._stop(grace)

    def close(self, grace: float = 1.0) -> None:
        """The final stop: a restart racing it (the folder watcher) can no longer serve."""
        with self._lifecycle:
            self._closed = True
            self._stop(grace)

    def _stop(self, grace: float) -> None:
        self._stopping.set()
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace).wait(grace + 1.0)
        if self._socket_id is not None and file_id(self.path) == self._socket_id:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        self._socket_id = None

    def restart(self) -> None:
        with self._lifecycle:
            self.stop(grace=0.5)
            self.start()
