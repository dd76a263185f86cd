"""The two sockets of a kubelet DRA plugin: registration, and the DRA service.

kubelet's plugin watcher scans /var/lib/kubelet/plugins_registry/ (at start and on every new
file) and dials each socket there: `GetInfo` says who we are (type DRAPlugin, the driver name,
the endpoint of the DRA service, the service versions we serve), then kubelet answers through
`NotifyRegistrationStatus`. The DRA service itself listens on
/var/lib/kubelet/plugins/<driver>/dra.sock. Both are gRPC over unix sockets, one grpc.Server
each (the registration socket must carry nothing else: the watcher treats every service on it
as the registration API).

The registration socket is checked every `poll_s`: if it is gone (someone cleaned the folder),
both are served again, so kubelet finds us on its next scan. A stale socket left at our path by
a previous run is removed before serving; a non-socket there is refused, never deleted.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from concurrent import futures
from dataclasses import dataclass

import grpc

from deviceplugin.daemon import ServeError
from deviceplugin.dra.service import DraService
from deviceplugin.sockets import FileId, file_id
from gputopo import jsonlog
from gputopo_proto.dra.v1 import api_pb2_grpc as dra_grpc
from gputopo_proto.pluginregistration.v1 import api_pb2 as reg_pb2
from gputopo_proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc

log = logging.getLogger("deviceplugin.dra.registrar")

PLUGIN_TYPE = "DRAPlugin"
#: The DRA service versions this plugin serves (kubelet picks one it knows).
SUPPORTED_VERSIONS = ("v1.DRAPlugin",)


class RegistrarError(ServeError):
    """A socket cannot be served; the message says which and why."""


@dataclass
class RegistrationState:
    """What kubelet last told us through NotifyRegistrationStatus."""

    registered: bool = False
    error: str = ""
    notifications: int = 0


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(self, driver: str, endpoint: str, state: RegistrationState) -> None:
        self._driver = driver
        self._endpoint = endpoint
        self._state = state

    def GetInfo(self, request: reg_pb2.InfoRequest, context: grpc.ServicerContext) -> reg_pb2.PluginInfo:
        return reg_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=self._driver,
            endpoint=self._endpoint,
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    def NotifyRegistrationStatus(
        self, request: reg_pb2.RegistrationStatus, context: grpc.ServicerContext
    ) -> reg_pb2.RegistrationStatusResponse:
        self._state.registered = bool(request.plugin_registered)
        self._state.error = request.error[:1000]
        self._state.notifications += 1
        jsonlog.event(
            log,
            "registration_status",
            logging.INFO if request.plugin_registered else logging.ERROR,
            registered=bool(request.plugin_registered),
            reason=request.error[:500] or "kubelet accepted the DRA plugin",
        )
        return reg_pb2.RegistrationStatusResponse()


class DraServer:
    """Serves the DRA service and the registration socket; `start()` / `close()`."""

    def __init__(
        self,
        service: DraService,
        *,
        driver: str,
        registry_dir: str,
        plugin_dir: str,
        poll_s: float = 1.0,
        max_workers: int = 8,
    ) -> None:
        self.driver = driver
        self.registration_path = os.path.join(registry_dir, f"{driver}-reg.sock")
        self.dra_path = os.path.join(plugin_dir, "dra.sock")
        self.state = RegistrationState()
        self._service = service
        self._poll_s = poll_s
        self._max_workers = max_workers
        self._servers: list[grpc.Server] = []
        self._executors: list[futures.ThreadPoolExecutor] = []
        self._reg_id: FileId | None = None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        with self._lock:
            self._serve()
        self._thread = threading.Thread(target=self._watch, name="dra-registrar", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        for path in (self.dra_path, self.registration_path):
            folder = os.path.dirname(path)
            try:
                os.makedirs(folder, exist_ok=True)
            except OSError as e:
                raise RegistrarError(f"cannot create {folder}: {e.strerror or e}") from None
            _remove_stale(path)
        # the DRA service first: kubelet dials it as soon as it has read GetInfo
        dra = self._server("dra-rpc")
        dra_grpc.add_DRAPluginServicer_to_server(self._service, dra)
        self._listen(dra, self.dra_path)
        reg = self._server("dra-reg")
        reg_grpc.add_RegistrationServicer_to_server(
            _Registration(self.driver, self.dra_path, self.state), reg
        )
        self._listen(reg, self.registration_path)
        self._reg_id = file_id(self.registration_path)
        jsonlog.event(
            log,
            "serving",
            registration=self.registration_path,
            endpoint=self.dra_path,
            driver=self.driver,
            reason="kubelet's plugin watcher registers us from the registration socket",
        )

    def _server(self, prefix: str) -> grpc.Server:
        executor = futures.ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix=prefix)
        self._executors.append(executor)
        server = grpc.server(executor, options=[("grpc.optimization_target", "latency")])
        self._servers.append(server)
        return server

    def _listen(self, server: grpc.Server, path: str) -> None:
        try:
            server.add_insecure_port(f"unix://{path}")
        except RuntimeError as e:
            raise RegistrarError(f"cannot listen on {path}: {e}") from None
        server.start()

    def _stop_servers(self) -> None:
        for server in self._servers:
            server.stop(0.5).wait(1.5)
        for executor in self._executors:
            executor.shutdown(wait=False, cancel_futures=True)
        self._servers, self._executors = [], []
        for path in (self.registration_path, self.dra_path):
            try:
                if stat.S_ISSOCK(os.lstat(path).st_mode):
                    os.unlink(path)
            except OSError:
                pass

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_s):
            with self._lock:
                if self._stop.is_set():
                    return
                if file_id(self.registration_path) == self._reg_id:
                    continue
                jsonlog.event(
                    log,
                    "registration_socket_lost",
                    logging.WARNING,
                    path=self.registration_path,
                    reason="our registration socket is gone; serving again so kubelet finds us",
                )
                self.state.registered = False
                self._stop_servers()
                try:
                    self._serve()
                except RegistrarError as e:
                    jsonlog.event(log, "serve_failed", logging.ERROR, reason=str(e))

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            self._stop_servers()


def _remove_stale(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise RegistrarError(f"{path} exists and is not a socket; refusing to delete it")
    os.unlink(path)
