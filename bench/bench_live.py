"""Live mode: what a filter costs for a pod the sidecar has seen against a new one, at scale.

    .venv/bin/python bench/bench_live.py [--nodes 5000,20000] [--pods-per-node 1] [--requests 60]

An API stand-in (tests/fake_apiserver.py) runs in its own process with `--nodes` GPU nodes (each
a DGX A100 annotation, Topograph-style labels) and bound pods; the sidecar's KubeState watches
it through the official client and the Extender answers filters in this process, as
`python -m scheduler` does. After the watch is ready, the same questions side by side:

  known   one pod filtered again and again (its PodInfo already observed)
  new     a new pod each time (kube-scheduler's usual question: every pending pod is new once)

Each filter offers every node (as kube-scheduler does with percentageOfNodesToScore: 100).
Printed per size: p50/p99 of the filtering thread's CPU time (what to compare on a shared
machine) and of wall time, and new/known at p50. A new pod should cost what a known one does:
a pending pod changes no node's free GPUs, so nothing per node should be redone for it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def serve(nodes: int, pods_per_node: int) -> None:
    """Child process: fill a FakeAPI, print its URL, serve until stdin closes."""
    from gputopo.network.annotation import encode, make
    from gputopo.node.topofile import load_preset
    from tests import fake_apiserver as fk

    api = fk.FakeAPI()
    topo = load_preset("dgx-a100")
    now = time.time()
    for i in range(nodes):
        name = f"node-{i:05d}"
        labels = {
            "fabric.topograph.run/tier-0": f"leaf-{i // 20}",
            "fabric.topograph.run/tier-1": f"spine-{i // 500}",
        }
        used = tuple(range(i % 4)) if i % 10 < 3 else ()  # 30 % partly busy
        text = encode(make(name, topo, generated_at=now, plugin_version="0.1.0", allocated=used))
        api.put("nodes", fk.node(name, labels, annotations={"gputopo.io/topology": text}))
        for k in range(pods_per_node if used else 0):
            api.put("pods", fk.pod("bench", f"bound-{i:05d}-{k}", len(used), node_name=name))
    api.history.clear()
    with fk.running(api) as (_, server, _client):
        print(server.url, flush=True)
        sys.stdin.read()


def measure(url: str, requests: int) -> dict[str, object]:
    from kubernetes import client

    from scheduler.extender import Extender
    from scheduler.live.kube import KubeState
    from scheduler.model import parse_pod
    from tests import fake_apiserver as fk

    cfg = client.Configuration()
    cfg.host = url
    state = KubeState(client.ApiClient(cfg), clock=time.time, watch_timeout_s=300)
    state.start()
    while not state.ready():
        time.sleep(0.01)
    ext = Extender(state, clock=time.time)
    names = sorted(state.snapshot().nodes)

    def timed(pod: dict) -> tuple[float, float]:
        info = parse_pod(pod)
        w, c = time.perf_counter(), time.thread_time()
        ext.filter(info, names)
        return (time.thread_time() - c) * 1000, (time.perf_counter() - w) * 1000

    known_pod = fk.pod("bench", "known", 2)
    timed(known_pod)  # warm: views built, the pod observed
    known = [timed(known_pod) for _ in range(requests)]
    new = [timed(fk.pod("bench", f"new-{i}", 1 + i % 4)) for i in range(requests)]
    state.stop()
    out: dict[str, object] = {"nodes": len(names)}
    for label, rows in (("known", known), ("new", new)):
        cpu = np.array([r[0] for r in rows])
        wall = np.array([r[1] for r in rows])
        out[label] = {
            "cpu_p50": float(np.percentile(cpu, 50)),
            "cpu_p99": float(np.percentile(cpu, 99)),
            "wall_p50": float(np.percentile(wall, 50)),
            "wall_p99": float(np.percentile(wall, 99)),
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", default="5000,20000")
    ap.add_argument("--pods-per-node", type=int, default=1)
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--role", choices=["serve"], help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "serve":
        serve(args.size, args.pods_per_node)
        return 0
    print(
        f"{'nodes':>7}  {'pod':<6}{'cpu p50':>9}{'cpu p99':>9}{'wall p50':>10}{'wall p99':>10}   new/known (cpu p50)"
    )
    for size in (int(s) for s in args.nodes.split(",")):
        child = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--role",
                "serve",
                "--size",
                str(size),
                "--pods-per-node",
                str(args.pods_per_node),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None and child.stdin is not None
        url = child.stdout.readline().strip()
        try:
            got = measure(url, args.requests)
        finally:
            child.stdin.close()
            child.wait(timeout=60)
        k, n = got["known"], got["new"]
        assert isinstance(k, dict) and isinstance(n, dict)
        for label, r in (("known", k), ("new", n)):
            ratio = f"{n['cpu_p50'] / k['cpu_p50']:.2f}x" if label == "new" else ""
            print(
                f"{size:>7}  {label:<6}{r['cpu_p50']:>9.2f}{r['cpu_p99']:>9.2f}{r['wall_p50']:>10.2f}{r['wall_p99']:>10.2f}   {ratio}",
                flush=True,
            )
        print(json.dumps({"nodes": size, **got}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
