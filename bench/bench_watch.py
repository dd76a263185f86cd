"""Sidecar start-up at scale: list+watch of 20,000 nodes against the API stand-in.

    .venv/bin/python bench/bench_watch.py [--nodes 20000] [--pods 30000] [--finished 0.33]

An API stand-in (tests/fake_apiserver.py) runs in its own process with `--nodes` GPU nodes
(each with a real `gputopo.io/topology` annotation of a DGX A100 and Topograph-style labels)
and `--pods` pods, a share of them finished. Each configuration then starts a fresh
KubeState process through the official client and measures, until `ready()`:

  start-up  wall time from start() to ready (every kind listed, watches open)
  pages     list requests of Nodes (limit/continue pages)
  RSS       resident memory after ready minus before start, and the process's peak RSS
  pods      pods held (finished ones are left out by the API server's field selector)

Rows, side by side against the same server: unpaginated lists (`limit` 0: one response per
kind, the baseline), and pages of 500 (the default) and 2,000. The ratio columns compare each
row with the baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def serve(nodes: int, pods: int, finished: float) -> None:
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
            "accelerator.topograph.run/domain": f"nvl-{i // 8}",
            "fabric.topograph.run/tier-0": f"leaf-{i // 32}",
            "fabric.topograph.run/tier-1": f"spine-{i // 512}",
        }
        text = encode(make(name, topo, generated_at=now, plugin_version="0.1.0"))
        api.put("nodes", fk.node(name, labels, annotations={"gputopo.io/topology": text}))
    for i in range(pods):
        p = fk.pod("bench", f"pod-{i:05d}", 1 + i % 8, node_name=f"node-{i % max(nodes, 1):05d}")
        if i < pods * finished:
            p["status"]["phase"] = "Succeeded"
        api.put("pods", p)
    api.history.clear()  # the watch history is not part of what a list costs
    with fk.running(api) as (_, server, _client):
        print(server.url, flush=True)
        sys.stdin.read()


def measure(url: str, page_size: int) -> None:
    """Child process: start a KubeState against `url`, report one JSON line."""
    from kubernetes import client

    from scheduler.live.kube import KubeState

    cfg = client.Configuration()
    cfg.host = url
    api_client = client.ApiClient(cfg)
    before = rss_mib()
    state = KubeState(api_client, clock=time.time, page_size=page_size, watch_timeout_s=300)
    profile = os.environ.get("BENCH_WATCH_PROFILE")  # a file: where the reflectors' time goes
    if profile:
        import yappi  # type: ignore[import-not-found]  # threads included; optional

        yappi.start()
    t0 = time.perf_counter()
    state.start()
    while not state.ready():
        time.sleep(0.005)
    elapsed = time.perf_counter() - t0
    if profile:
        yappi.stop()
        yappi.get_func_stats().save(profile, type="pstat")
    snap = state.snapshot()
    after = rss_mib()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {
        "page_size": page_size,
        "startup_s": round(elapsed, 2),
        "node_pages": state.reflectors[0].pages,
        "pod_pages": state.reflectors[1].pages,
        "nodes": len(snap.nodes),
        "pods": len(snap.pods),
        "rss_mib": round(after - before, 1),
        "peak_rss_mib": round(peak, 1),
    }
    print(json.dumps(out), flush=True)
    os._exit(0)  # watches are open; the numbers are taken


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=20_000)
    ap.add_argument("--pods", type=int, default=30_000)
    ap.add_argument("--finished", type=float, default=0.33)
    ap.add_argument("--pages", default="0,500,2000", help="page sizes; 0 = unpaginated (baseline)")
    ap.add_argument("--role", choices=["serve", "measure"], help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--page-size", type=int, default=500, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "serve":
        serve(args.nodes, args.pods, args.finished)
        return 0
    if args.role == "measure":
        measure(args.url, args.page_size)
        return 0
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    me = [sys.executable, __file__]
    t0 = time.perf_counter()
    server = subprocess.Popen(
        [
            *me,
            "--role",
            "serve",
            "--nodes",
            str(args.nodes),
            "--pods",
            str(args.pods),
            "--finished",
            str(args.finished),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert server.stdout is not None
    url = server.stdout.readline().strip()
    print(
        f"stand-in: {args.nodes} nodes, {args.pods} pods ({args.finished:.0%} finished), "
        f"filled in {time.perf_counter() - t0:.0f}s at {url}"
    )
    rows = []
    try:
        for size in (int(s) for s in args.pages.split(",")):
            res = subprocess.run(
                [*me, "--role", "measure", "--url", url, "--page-size", str(size)],
                capture_output=True,
                text=True,
                env=env,
                timeout=900,
                check=True,
            )
            rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
    finally:
        server.stdin.close()  # type: ignore[union-attr]
        server.wait(timeout=30)
    base = rows[0]
    print()
    print(
        "| lists | start-up s | node pages | pod pages | nodes | pods kept | RSS after ready MiB | peak RSS MiB | start-up vs baseline |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        name = "unpaginated (baseline)" if r["page_size"] == 0 else f"pages of {r['page_size']}"
        ratio = base["startup_s"] / r["startup_s"] if r["startup_s"] else float("nan")
        print(
            f"| {name} | {r['startup_s']} | {r['node_pages']} | {r['pod_pages']} | {r['nodes']} | {r['pods']} | "
            f"{r['rss_mib']} | {r['peak_rss_mib']} | {ratio:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
