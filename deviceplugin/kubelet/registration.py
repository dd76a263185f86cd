"""Registration with kubelet, and the watch over kubelet's folder that keeps it valid.

Kubelet gives no signal when it restarts except in its folder: kubelet.sock is removed and
created again, and every other socket there (ours) is deleted. The watcher polls the folder
(every ~150 ms, cheaper and more portable than inotify, and well inside the one-second
re-registration target) and reacts to exactly two facts:

* our socket is gone or replaced -> serve again on a fresh socket, then register again;
* kubelet.sock appeared or is a different file than before -> the registration we had is
  void; register again now (back-off reset, since a new kubelet is likely listening).

Register is only ever sent while our server is serving, because kubelet dials the plugin back
inside Register and refuses a plugin it cannot reach. Failed attempts back off exponentially
(0.2 s doubling to 5 s), so a stale kubelet.sock nobody listens on costs almost nothing.

The folder stays watched while a Register is in flight: kubelet answers only once its dial
back succeeds or times out (10 s). When kubelet starts twice in a row, the second start deletes
the socket we just served while our Register waits on the first kubelet's dial, which can then
never succeed; waiting it out left kubelet without our devices for 10 s (issue 9 item 12). So
an attempt whose socket or kubelet.sock changes under it is cancelled at the next poll and the
watch goes on at once (serve again, register with the new kubelet).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import grpc

from deviceplugin import settings
from deviceplugin.kubelet.api import RegistrationInfo, plugin_options
from deviceplugin.metrics import Metrics
from deviceplugin.settings import PluginConfig
from deviceplugin.sockets import FileId, file_id
from gputopo import jsonlog
from gputopo_proto.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

if TYPE_CHECKING:
    from deviceplugin.kubelet.server import PluginServer

log = logging.getLogger("deviceplugin.registration")


_UNSEEN: FileId = (-1, -1, -1)


def register_request(config: PluginConfig) -> api_pb2.RegisterRequest:
    return api_pb2.RegisterRequest(
        version=settings.API_VERSION,
        endpoint=config.socket_name,
        resource_name=config.resource_name,
        options=plugin_options(),
    )


def register_with_kubelet(config: PluginConfig, timeout: float = settings.REGISTER_TIMEOUT_SECONDS) -> None:
    """One Register call; raises grpc.RpcError when kubelet refuses or cannot be reached."""
    with grpc.insecure_channel(f"unix://{config.kubelet_socket}") as channel:
        api_pb2_grpc.RegistrationStub(channel).Register(register_request(config), timeout=timeout)


class _Abandoned(Exception):
    """A Register in flight that can no longer succeed (the folder changed under it)."""


def _kubelet_change(before: FileId | None, now: FileId | None) -> str:
    if now is None:
        return (
            "kubelet.sock absent: waiting for kubelet"
            if before in (None, _UNSEEN)
            else ("kubelet.sock removed (kubelet stopped): waiting for it to come back")
        )
    if before in (None, _UNSEEN):
        return "kubelet.sock present: registering"
    return "kubelet.sock recreated (kubelet restarted): registering again"


class KubeletWatcher:
    """Keeps the plugin served and registered across kubelet restarts; `step()` is one poll."""

    def __init__(
        self,
        config: PluginConfig,
        server: PluginServer,
        metrics: Metrics,
        register: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        interval: float = settings.WATCH_INTERVAL_SECONDS,
        backoff: tuple[float, float] = settings.REGISTER_BACKOFF_SECONDS,
    ) -> None:
        self._config = config
        self._server = server
        self._metrics = metrics
        self._register = register or self._register_watching
        self._clock = clock
        self._wall = wall
        self._interval = interval
        self._backoff_first, self._backoff_max = backoff
        self._delay = self._backoff_first
        self._next_attempt = 0.0
        self._kubelet_id: FileId | None = _UNSEEN  # so the first poll always logs what it finds
        self._info = RegistrationInfo()
        self._serving_lost = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def info(self) -> RegistrationInfo:
        return self._info

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="kubelet-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            # A Register in flight may wait for kubelet up to its timeout; the thread is a daemon
            # thread and touches nothing but its own state, so shutdown need not wait for it.
            self._thread.join(timeout=1.0)
            self._thread = None

    def _run(self) -> None:
        last_error = ""
        while not self._stop.is_set():
            try:
                self.step()
                last_error = ""
            except Exception as e:  # keep watching whatever happens; the next poll may succeed
                reason = f"{type(e).__name__}: {e}"
                if reason != last_error:  # once per distinct failure, not every 150 ms
                    jsonlog.event(log, "watch_failed", logging.ERROR, reason=reason + "; retrying")
                    last_error = reason
            self._stop.wait(self._interval)

    def _unregistered(self) -> None:
        if self._info.registered:
            self._info = replace(self._info, registered=False)

    def step(self) -> None:
        if not self._server.socket_intact():
            if not self._serving_lost:  # log the loss once, however many polls it takes to recover
                jsonlog.event(
                    log,
                    "plugin_socket_lost",
                    socket=self._server.path,
                    reason="our socket was deleted or replaced (kubelet restart?): serving again",
                )
            self._serving_lost = True
            self._unregistered()  # kubelet cannot reach us now, whatever happens next
            self._server.restart()  # raises while the path stays blocked; the next poll retries
            self._serving_lost = False
            self._next_attempt = self._clock()
        kid = file_id(self._config.kubelet_socket)
        if kid != self._kubelet_id:
            jsonlog.event(
                log,
                "kubelet_socket_changed",
                socket=self._config.kubelet_socket,
                present=kid is not None,
                reason=_kubelet_change(self._kubelet_id, kid),
            )
            self._kubelet_id = kid
            self._unregistered()
            self._delay = self._backoff_first
            self._next_attempt = self._clock()
        if kid is None or self._info.registered or self._clock() < self._next_attempt:
            return
        self._attempt()

    def _register_watching(self) -> None:
        """One Register, as `register_with_kubelet`, polling the folder while it is in flight:
        raises `_Abandoned` (after cancelling it) when our socket or kubelet.sock changed."""
        config = self._config
        with grpc.insecure_channel(f"unix://{config.kubelet_socket}") as channel:
            call = api_pb2_grpc.RegistrationStub(channel).Register.future(
                register_request(config), timeout=settings.REGISTER_TIMEOUT_SECONDS
            )
            while True:
                try:
                    call.result(timeout=self._interval)
                    return
                except grpc.FutureTimeoutError:
                    pass
                if self._stop.is_set():
                    why = "the plugin is stopping"
                elif not self._server.socket_intact():
                    why = "our socket was deleted or replaced while kubelet dialled it back (kubelet restarted again)"
                elif file_id(config.kubelet_socket) != self._kubelet_id:
                    why = "kubelet.sock changed while Register was in flight (kubelet restarted again)"
                else:
                    continue
                call.cancel()
                raise _Abandoned(why)

    def _attempt(self) -> None:
        try:
            self._register()
        except _Abandoned as e:
            # not a failure of kubelet's: no back-off, the next poll serves and registers again
            jsonlog.event(log, "register_abandoned", kubelet=self._config.kubelet_socket, reason=str(e))
            return
        except grpc.RpcError as e:
            reason = f"{e.code().name}: {e.details()}" if isinstance(e, grpc.Call) else str(e)
            self._failed(reason)
            return
        except Exception as e:
            self._failed(f"{type(e).__name__}: {e}")
            return
        self._info = RegistrationInfo(
            registered=True,
            last_registration_unix=self._wall(),
            count=self._info.count + 1,
        )
        self._delay = self._backoff_first
        self._metrics.registrations.labels("ok").inc()
        jsonlog.event(
            log,
            "registered",
            kubelet=self._config.kubelet_socket,
            endpoint=self._config.socket_name,
            resource=self._config.resource_name,
            count=self._info.count,
            reason="kubelet accepted Register",
        )

    def _failed(self, reason: str) -> None:
        self._info = replace(
            self._info, registered=False, last_error=reason, failed_attempts=self._info.failed_attempts + 1
        )
        self._metrics.registrations.labels("error").inc()
        jsonlog.event(
            log,
            "register_failed",
            logging.WARNING,
            kubelet=self._config.kubelet_socket,
            attempt=self._info.failed_attempts,
            retry_in_s=round(self._delay, 3),
            reason=reason,
        )
        self._next_attempt = self._clock() + self._delay
        self._delay = min(self._delay * 2, self._backoff_max)
