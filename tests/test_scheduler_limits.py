"""The sidecar's HTTP server stays bounded, whatever clients do: idle connections are closed,
connections past the cap get a 503 without a thread, bodies over the in-flight budget get a 503
unread, a stalled body a 408, an oversized one a 413. All over real HTTP on a real port."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gputopo.network.cluster import parse_cluster
from scheduler import defaults
from scheduler.extender import Extender
from scheduler.picture.feed import from_cluster
from scheduler.web.server import Limits, Server
from tests import fake_apiserver as fk
from tests.kubelet_fake import eventually

NODES = [{"name": "a1", "gpus": "dgx-a100"}, {"name": "a2", "gpus": "dgx1-v100"}]
FILTER = json.dumps({"Pod": fk.pod("ml", "p", 1), "Nodes": None, "NodeNames": ["a1", "a2"]}).encode()


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[Server] = []

    def start(**limits: Any) -> Server:
        state = from_cluster(parse_cluster({"nodes": NODES}))
        ext = Extender(state, defaults.DEFAULT_LEVELS, clock=lambda: 1000.0)
        server = Server(ext, "127.0.0.1", 0, limits=Limits(**limits))
        server.start()
        servers.append(server)
        return server

    yield start
    for s in servers:
        s.stop()


def connect(server: Server) -> socket.socket:
    sock = socket.create_connection(server.address, timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def request(body: bytes, length: int | None = None, path: str = "/filter") -> bytes:
    size = len(body) if length is None else length
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {size}\r\n\r\n"
    )
    return head.encode() + body


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], Any]:
    """One HTTP/1.1 response off a raw socket (Content-Length framed)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a full response: {data!r}")
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    size = int(headers["content-length"])
    while len(rest) < size:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return int(lines[0].split()[1]), headers, json.loads(rest[:size]) if size else None


def closed_by_peer(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_idle_connections_are_closed_and_their_threads_end(serve) -> None:
    server = serve(idle_timeout=5.0, max_connections=400)
    before = threading.active_count()
    socks = [connect(server) for _ in range(300)]
    try:
        assert eventually(lambda: threading.active_count() >= before + 250, 10)
        # all of them closed by the server once idle for 5 s, and their threads gone
        assert all(closed_by_peer(s, 15) for s in socks)
        assert eventually(lambda: threading.active_count() <= before + 2, 10), threading.active_count()
    finally:
        for s in socks:
            s.close()


def test_a_kept_alive_connection_is_reused_within_the_idle_timeout(serve) -> None:
    """kube-scheduler reuses its connections: calls closer together than the idle timeout go
    over the same connection; past it the server closes it cleanly (FIN, no stray bytes), which
    Go's transport sees and answers by dialing anew."""
    server = serve(idle_timeout=1.0)
    sock = connect(server)
    try:
        for _ in range(3):
            sock.sendall(request(FILTER))
            code, headers, doc = read_response(sock)
            assert code == 200 and doc["NodeNames"] == ["a1", "a2"]
            assert headers.get("connection", "").lower() != "close"
            time.sleep(0.3)
        assert closed_by_peer(sock, 5)
    finally:
        sock.close()
    sock = connect(server)  # and a new connection is served as usual
    try:
        sock.sendall(request(FILTER))
        assert read_response(sock)[0] == 200
    finally:
        sock.close()


def test_connections_past_the_cap_get_a_503_and_no_thread(serve) -> None:
    server = serve(max_connections=8, idle_timeout=30)
    before = threading.active_count()
    held = [connect(server) for _ in range(8)]
    try:
        assert eventually(lambda: threading.active_count() >= before + 8, 10)
        extra = [connect(server) for _ in range(300)]
        try:
            for s in extra[:20]:
                code, headers, doc = read_response(s)
                assert code == 503 and "too many open connections" in doc["Error"]
                assert headers["connection"].lower() == "close"
            assert threading.active_count() <= before + 8 + 2, threading.active_count()
        finally:
            for s in extra:
                s.close()
    finally:
        for s in held:
            s.close()

    # the held ones gone, the server serves again
    def served() -> bool:
        sock = connect(server)
        try:
            sock.sendall(request(FILTER))
            return read_response(sock)[0] == 200
        finally:
            sock.close()

    assert eventually(served, 10)
    text = metrics(server)
    assert 'gputopo_extender_refused_total{reason="connections"}' in text


def metrics(server: Server) -> str:
    sock = connect(server)
    try:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while b"# EOF" not in data and b"gputopo_binds" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
            if len(data) > 4 * 1024 * 1024:
                break
        return data.decode(errors="replace")
    finally:
        sock.close()


def test_bodies_past_the_in_flight_budget_are_refused_unread(serve) -> None:
    """Six clients each announcing a 1 MiB body against a 2 MiB budget: two are read, four get
    a 503 at once, before sending a byte of their body; nothing is buffered for them."""
    mib = 1024 * 1024
    server = serve(max_body=mib, max_inflight_body=2 * mib, body_timeout=30)
    socks = [connect(server) for _ in range(6)]
    try:
        for s in socks:
            s.sendall(request(b"{", length=mib))  # headers and one byte of the body
        refused = []
        for s in socks:
            s.settimeout(1.0)
            try:
                refused.append(read_response(s))
            except TimeoutError:
                pass
        assert len(refused) == 4
        assert all(code == 503 and "in flight" in doc["Error"] for code, _, doc in refused)
        assert server.httpd.inflight_body_bytes == 2 * mib
        admitted = [s for s in socks if s.gettimeout() == 1.0 and not closed_by_peer(s, 0.05)]
        assert len(admitted) == 2
        for s in admitted:  # the rest of each admitted body arrives: bad JSON, a plain 400
            s.settimeout(10)
            s.sendall(b" " * (mib - 1))
            code, _, doc = read_response(s)
            assert code == 400 and "malformed JSON" in doc["Error"]
        assert eventually(lambda: server.httpd.inflight_body_bytes == 0, 5)
    finally:
        for s in socks:
            s.close()
    sock = connect(server)
    try:
        sock.sendall(request(FILTER))
        assert read_response(sock)[0] == 200
    finally:
        sock.close()


def test_a_stalled_body_is_a_408_and_frees_its_budget(serve) -> None:
    server = serve(body_timeout=0.5, idle_timeout=1.0)
    sock = connect(server)
    try:
        sock.sendall(request(FILTER[:10], length=len(FILTER)))
        code, _, doc = read_response(sock)
        assert code == 408 and "request body" in doc["Error"]
        assert eventually(lambda: server.httpd.inflight_body_bytes == 0, 5)  # freed after the answer
    finally:
        sock.close()
    # a slow drip (each byte inside the idle timeout) still ends at the body deadline
    sock = connect(server)
    try:
        sock.sendall(request(b"", length=len(FILTER)))
        start = time.monotonic()
        for i in range(len(FILTER)):
            try:
                sock.sendall(FILTER[i : i + 1])
            except OSError:
                break
            if time.monotonic() - start > 0.8:
                break
            time.sleep(0.1)
        code, _, doc = read_response(sock)
        assert code == 408 and "within 0.5 s" in doc["Error"]
    finally:
        sock.close()


def test_an_oversized_body_is_a_413_without_reading_it(serve) -> None:
    server = serve(max_body=1000)
    sock = connect(server)
    try:
        sock.sendall(request(b"", length=10**9))  # announces 1 GB, sends nothing of it
        code, headers, doc = read_response(sock)
        assert code == 413 and "exceeds 1000" in doc["Error"]
        assert headers["connection"].lower() == "close"
    finally:
        sock.close()


def test_defaults_are_documented() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "scheduler.md").read_text()
    for value in (
        f"{defaults.IDLE_TIMEOUT_S:g} s",
        f"{defaults.BODY_TIMEOUT_S:g} s",
        f"{defaults.MAX_CONNECTIONS} connections",
        f"{defaults.MAX_INFLIGHT_BODY_BYTES // 2**20} MiB",
    ):
        assert value in doc, value
