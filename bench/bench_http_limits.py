"""What the sidecar's server bounds buy: threads held by idle connections and peak memory under
concurrent large bodies, unbounded (the first cut's behaviour) vs bounded, side by side.

    python bench/bench_http_limits.py [--idle 300] [--bodies 6] [--body-mib 60] [--idle-timeout 2]

Each configuration runs the extender in its own process (so its peak RSS is its own, read from
/proc/<pid>/status VmHWM); this process is the client:

* idle: open N connections and send nothing; report the server's thread count while they are
  held, and again about --idle-timeout + 1 s later (bounded: the idle timeout is set to --idle-timeout
  so the run stays short; the shipped default is 60 s);
* bodies: send K bodies of M MiB at once (a NodeNames list) and report the HTTP status of each
  and the server's peak RSS.

unbounded = no idle timeout, no connection cap, no in-flight budget (what the first cut had);
bounded = scheduler/defaults.py's limits (idle timeout shortened as said).
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = r"""
import sys, time
sys.path.insert(0, {repo!r})
from gputopo.network.cluster import parse_cluster
from scheduler import defaults
from scheduler.extender import Extender
from scheduler.web.limits import Limits
from scheduler.web.server import Server
from scheduler.picture.feed import from_cluster
state = from_cluster(parse_cluster({{"nodes": [{{"name": "a1", "gpus": "dgx-a100"}}]}}))
limits = Limits(**{limits!r})
s = Server(Extender(state, defaults.DEFAULT_LEVELS, clock=time.time), "127.0.0.1", 0, limits=limits)
s.start()
print(s.address[1], flush=True)
time.sleep(3600)
"""


def status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return -1


def start(limits: dict) -> tuple[subprocess.Popen[str], int]:
    code = CHILD.format(repo=str(REPO), limits=limits)
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def idle(limits: dict, n: int, wait: float) -> tuple[int, int, int]:
    proc, port = start(limits)
    try:
        base = status(proc.pid, "Threads")
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
        time.sleep(0.3)
        held = status(proc.pid, "Threads")
        time.sleep(wait + 1.0)
        later = status(proc.pid, "Threads")
        for s in socks:
            s.close()
        return base, held, later
    finally:
        proc.kill()
        proc.wait()


def bodies(limits: dict, k: int, mib: int) -> tuple[list[str], int]:
    proc, port = start(limits)
    names = [f"node-{i:09d}" for i in range(mib * 1024 * 1024 // 18)]
    pod = {"metadata": {"name": "p", "namespace": "d", "uid": "u"}, "spec": {"containers": []}}
    body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode()
    codes: list[str] = []

    def send() -> None:
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(f"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode())
        try:
            s.sendall(body)
        except OSError:
            pass
        try:
            line = s.recv(64).split(b"\r\n")[0].decode()
            codes.append(line.split(" ", 2)[1] if " " in line else "closed")
        except OSError:
            codes.append("reset")
        s.close()

    try:
        threads = [threading.Thread(target=send) for _ in range(k)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sorted(codes), status(proc.pid, "VmHWM") // 1024
    finally:
        proc.kill()
        proc.wait()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--idle", type=int, default=300)
    ap.add_argument("--bodies", type=int, default=6)
    ap.add_argument("--body-mib", type=int, default=60)
    ap.add_argument("--idle-timeout", type=float, default=3.0)
    args = ap.parse_args(argv)
    unbounded = {"idle_timeout": None, "max_connections": 1 << 30, "max_inflight_body": 1 << 62}
    bounded = {"idle_timeout": args.idle_timeout}
    print(
        f"{args.idle} idle connections: server threads (before / while held / {args.idle_timeout + 1:g} s later)"
    )
    for name, lim in (("unbounded", unbounded), ("bounded", bounded)):
        base, held, later = idle(lim, args.idle, args.idle_timeout)
        print(f"  {name:<10} {base:>4} / {held:>4} / {later:>4}")
    print(f"{args.bodies} concurrent {args.body_mib} MiB bodies: HTTP statuses, server peak RSS")
    for name, lim in (("unbounded", unbounded), ("bounded", bounded)):
        codes, peak = bodies(lim, args.bodies, args.body_mib)
        print(f"  {name:<10} {','.join(codes):<28} {peak:>6} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
