"""A kubelet stand-in for the plugin's tests, built on our own proto/ stubs.

It plays the parts of kubelet's device manager the plugin depends on, over real unix
sockets: it serves Registration on <dir>/kubelet.sock, checks each RegisterRequest the way
kubelet does (version, extended resource name), dials the plugin back inside Register and
asks GetDevicePluginOptions (so a plugin that registers before it serves is refused), and
restarts the way kubelet does: its socket goes away, every socket in the folder is deleted,
and kubelet.sock comes back.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc

from gputopo_proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

_RESOURCE_RE = re.compile(r"^[a-z0-9.-]+/[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class Registration:
    at: float  # time.monotonic() when kubelet accepted it
    request: api_pb2.RegisterRequest
    options: api_pb2.DevicePluginOptions  # what GetDevicePluginOptions answered during Register


def short_tmpdir(prefix: str = "gt-") -> Path:
    """A folder with a short path: unix socket paths are limited to 107 bytes."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


class FakeKubelet:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.sock = folder / "kubelet.sock"
        self.registrations: list[Registration] = []
        self.refusals: list[str] = []
        self.refuse_next = 0  # refuse this many Register calls with UNAVAILABLE
        # when set, Register waits for `hold` before dialling back (kubelet's dial of a plugin
        # socket that is gone waits up to 10 s); `held` tells the test a Register is waiting
        self.hold: threading.Event | None = None
        self.held = threading.Event()
        self._cv = threading.Condition()
        self._server: grpc.Server | None = None

    # --- the Registration service -------------------------------------------------------------
    def Register(self, request: api_pb2.RegisterRequest, context: grpc.ServicerContext) -> api_pb2.Empty:
        if self.hold is not None:
            self.held.set()
            self.hold.wait(30)
        with self._cv:
            if self.refuse_next > 0:
                self.refuse_next -= 1
                self.refusals.append("refused on purpose")
                context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet is not ready")
        if request.version != "v1beta1":
            self._refuse(context, f"unsupported version {request.version!r}")
        if not _RESOURCE_RE.match(request.resource_name):
            self._refuse(context, f"invalid resource name {request.resource_name!r}")
        if not request.endpoint or "/" in request.endpoint:
            self._refuse(context, f"endpoint must be a file name, got {request.endpoint!r}")
        try:
            with grpc.insecure_channel(f"unix://{self.folder / request.endpoint}") as ch:
                options = api_pb2_grpc.DevicePluginStub(ch).GetDevicePluginOptions(api_pb2.Empty(), timeout=5)
        except grpc.RpcError as e:
            self._refuse(context, f"cannot dial the plugin back: {e.code().name}")
        with self._cv:
            self.registrations.append(Registration(time.monotonic(), request, options))
            self._cv.notify_all()
        return api_pb2.Empty()

    def _refuse(self, context: grpc.ServicerContext, why: str) -> None:
        with self._cv:
            self.refusals.append(why)
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, why)

    # --- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        if self.sock.exists():
            self.sock.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        generic = grpc.method_handlers_generic_handler(
            "v1beta1.Registration",
            {
                "Register": grpc.unary_unary_rpc_method_handler(
                    self.Register,
                    request_deserializer=api_pb2.RegisterRequest.FromString,
                    response_serializer=api_pb2.Empty.SerializeToString,
                )
            },
        )
        server.add_generic_rpc_handlers((generic,))
        server.add_insecure_port(f"unix://{self.sock}")
        server.start()
        self._server = server

    def stop(self, delete_sockets: bool = True) -> None:
        """Go away like kubelet on restart: drop kubelet.sock and (by default) every plugin socket."""
        if self._server is not None:
            self._server.stop(0).wait()
            self._server = None
        if self.sock.exists():
            self.sock.unlink()
        if delete_sockets:
            for entry in self.folder.iterdir():
                if stat.S_ISSOCK(entry.lstat().st_mode):
                    entry.unlink()

    def restart(self, delete_sockets: bool = True) -> float:
        """Stop and start again; returns the monotonic time kubelet.sock came back."""
        self.stop(delete_sockets)
        self.start()
        return time.monotonic()

    def wait(self, count: int, timeout: float = 10.0) -> Registration | None:
        """The `count`-th accepted registration, waiting up to `timeout` seconds for it."""
        with self._cv:
            self._cv.wait_for(lambda: len(self.registrations) >= count, timeout)
            return self.registrations[count - 1] if len(self.registrations) >= count else None


@contextmanager
def fake_kubelet(folder: Path, start: bool = True) -> Iterator[FakeKubelet]:
    kubelet = FakeKubelet(folder)
    if start:
        kubelet.start()
    try:
        yield kubelet
    finally:
        kubelet.stop(delete_sockets=False)


@contextmanager
def plugin_channel(path: Path | str, timeout: float = 10.0) -> Iterator[api_pb2_grpc.DevicePluginStub]:
    with grpc.insecure_channel(f"unix://{os.fspath(path)}") as channel:
        grpc.channel_ready_future(channel).result(timeout=timeout)
        yield api_pb2_grpc.DevicePluginStub(channel)


@contextmanager
def running_daemon(folder: Path, topology: str = "dgx1-v100", **settings: object) -> Iterator[object]:
    """The plugin in this process (file backend, no metrics port), stopped afterwards.

    Only the objects are shared with the test; every call still goes over the unix socket."""
    from deviceplugin.hardware.filebackend import FileBackend
    from deviceplugin.kubelet.daemon import Daemon
    from deviceplugin.settings import PluginConfig

    health_file = settings.pop("health_file", None)
    config = PluginConfig(
        kubelet_dir=str(folder), topology=topology, health_file=health_file, metrics_port=0, **settings
    )
    daemon = Daemon(config, FileBackend(topology, health_file, poll_interval=0.05), health_tick_seconds=0.05)
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.stop()


def eventually(check: object, timeout: float = 5.0, interval: float = 0.02) -> bool:
    """Poll `check()` until it is truthy or `timeout` passes; the last result decides."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():  # type: ignore[operator]
            return True
        time.sleep(interval)
    return bool(check())  # type: ignore[operator]
