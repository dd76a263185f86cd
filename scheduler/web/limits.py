"""The sidecar HTTP server's bounds: the limits, the refusal they raise, the in-flight body
budget shared by all connections, and the canned answer of the accept loop (docs/scheduler.md
"Server bounds")."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any

import orjson

from scheduler import defaults


class Refused(Exception):
    """A request refused by the server's own limits: answered with `code` and the reason."""

    def __init__(self, code: int, reason: str, metric: str) -> None:
        super().__init__(reason)
        self.code = code
        self.metric = metric


class Budget:
    """Bytes of request bodies being read, decoded and answered, all connections together."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._taken = 0

    @property
    def taken(self) -> int:
        return self._taken

    def reserve(self, size: int) -> bool:
        """Take `size` bytes; False (taking nothing) if that would pass the limit."""
        with self._lock:
            if self._taken + size > self.limit:
                return False
            self._taken += size
            return True

    def release(self, size: int) -> None:
        with self._lock:
            self._taken -= size


_BUSY_BODY = orjson.dumps({"Error": "busy: too many open connections; retry"})
BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
    b"Connection: close\r\nContent-Length: " + str(len(_BUSY_BODY)).encode() + b"\r\n\r\n" + _BUSY_BODY
)


@dataclass(frozen=True, slots=True)
class Limits:
    """The server's bounds; defaults in scheduler/defaults.py, explained in docs/scheduler.md."""

    max_body: int = defaults.MAX_BODY_BYTES
    max_inflight_body: int = defaults.MAX_INFLIGHT_BODY_BYTES
    max_connections: int = defaults.MAX_CONNECTIONS
    idle_timeout: float = defaults.IDLE_TIMEOUT_S
    body_timeout: float = defaults.BODY_TIMEOUT_S


class ConnectionCap(ThreadingMixIn):
    """One thread per connection, but only `max_connections` of them at once: past that the
    accept loop calls `refuse(request)` (which may answer on the socket) and closes the
    connection, no thread started. Both of the sidecar's servers (the extender's and the opt-in
    webhook's) are bounded this way, so a flood of connections costs sockets, not threads."""

    def cap_connections(self, max_connections: int) -> None:
        self._connections = threading.BoundedSemaphore(max_connections)

    def refuse(self, request: Any) -> None:
        """What a connection past the cap gets before it is closed (nothing by default)."""

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._connections.acquire(blocking=False):
            self.refuse(request)
            self.shutdown_request(request)  # type: ignore[attr-defined]
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._connections.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._connections.release()
