"""The sidecar at scale on the real components: kube-apiserver with etcd, and kube-scheduler calling it.

    .venv/bin/python bench/bench_realk8s.py [--nodes 5000] [--singles 100] [--gang 64x8]

Needs the binaries `realk8s/build.sh` builds (`make real-build`); tests/realk8s.py starts them
as `make test-real` does (etcd, kube-apiserver 1.37 with HTTPS and RBAC, kube-scheduler with
deploy/'s KubeSchedulerConfiguration: percentageOfNodesToScore 100, the sidecar as its extender).

Steps, each timed:
  nodes     `--nodes` Node objects created through the API (bench_extender's generated fat
            tree: 20 nodes a leaf, 25 leaves a spine, DGX A100 / HGX H100 / DGX-1 in 2:1:1,
            30 % partly busy, their GPUs held by pods bound by name and named in each node's
            plugin annotation), 16 clients in parallel
  ready     `python -m scheduler` started in live mode until its /readyz answers, against
            `json.load` of the same NodeList as the API server serves it (the baseline; issue
            30's target is at most 3x)
  singles   `--singles` pods of 1/2/4/8 GPUs created at once until kube-scheduler has bound all
            of them through the sidecar: pods per second, and the sidecar's own filter and
            prioritize latency (its gputopo_extender_request_seconds histogram: mean and the
            bucket holding p50 / p99)
  gang      a PodGroup gang (`--gang`, 64 pods of 8 GPUs) from its gates' lift to its last bind

The sidecar's CPU seconds (from /proc) are printed beside the wall clock: on a shared machine
they are the figure to compare. Nothing here is asserted; the numbers go to docs/scheduler.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gputopo.network.annotation import encode, make  # noqa: E402
from gputopo.network.cluster import generate_cluster  # noqa: E402
from tests import realk8s as rk  # noqa: E402

MIX = {"dgx-a100": 2.0, "hgx-h100": 1.0, "dgx1-v100": 1.0}
NS = "bench"


def _nodes(size: int) -> tuple[list[dict[str, Any]], list[tuple[str, int]]]:
    """The fat tree's Node objects, and (node, GPUs held) for each partly busy node."""
    snap = generate_cluster(max(1, size // 500), 25, 20, MIX, 0, busy_fraction=0.3)
    now = time.time()
    out, busy = [], []
    for n in snap.nodes[:size]:
        assert n.topology is not None
        obj = rk.node(n.name, n.labels[rk.LEAF], n.labels[rk.SPINE], gpus=n.gpu_count, preset=None)
        text = encode(
            make(n.name, n.topology, generated_at=now, plugin_version="0.1.0", allocated=sorted(n.allocated))
        )
        obj["metadata"]["annotations"] = {rk.TOPOLOGY_KEY: text}
        out.append(obj)
        if n.allocated:
            busy.append((n.name, len(n.allocated)))
    return out, busy


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _histogram(port: int, verb: str) -> tuple[list[tuple[float, float]], float, float]:
    """(le, cumulative count) buckets, sum and count of the sidecar's request histogram for `verb`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    buckets, total, count = [], 0.0, 0.0
    for line in text.splitlines():
        if not line.startswith("gputopo_extender_request_seconds") or f'verb="{verb}"' not in line:
            continue
        value = float(line.rsplit(" ", 1)[1])
        if "_bucket" in line:
            le = re.search(r'le="([^"]+)"', line)
            assert le is not None
            buckets.append((float(le.group(1)), value))
        elif "_sum" in line:
            total = value
        elif "_count" in line:
            count = value
    return buckets, total, count


def _latency(before: tuple, after: tuple) -> str:
    """Mean and the buckets holding p50 / p99 of the requests between two scrapes, in ms."""
    (b0, s0, c0), (b1, s1, c1) = before, after
    n = c1 - c0
    if n <= 0:
        return "no requests"
    counts = [(le, c - dict(b0).get(le, 0.0)) for le, c in b1]

    def bucket(q: float) -> str:
        le = next(le for le, c in counts if c >= q * n)
        return f"≤ {le * 1000:g}"

    return f"mean {(s1 - s0) / n * 1000:.1f} ms, p50 {bucket(0.5)} ms, p99 {bucket(0.99)} ms ({n:.0f} calls)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--singles", type=int, default=100)
    ap.add_argument("--gang", default="64x8", help="COUNTxGPUS (default 64x8)")
    args = ap.parse_args()
    count, gpus = (int(x) for x in args.gang.split("x"))
    bindir = rk.binaries()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        procs = rk.Procs(folder)
        try:
            cluster = rk.Cluster(procs, folder, bindir)
            cluster.start_api()
            cluster.namespace(NS)
            nodes, busy = _nodes(args.nodes)
            t = time.perf_counter()
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(cluster.add_nodes, nodes))
                held = [rk.pod(f"held-{name}", k) for name, k in busy]
                for p, (name, _) in zip(held, busy, strict=True):
                    p["spec"]["nodeName"] = name
                list(pool.map(lambda p: cluster.add_pods(NS, p), held))
            print(
                f"nodes {len(nodes):,} created in {time.perf_counter() - t:.1f} s ({len(busy)} partly busy)"
            )

            listed = folder / "nodes.json"
            listed.write_text(json.dumps(cluster.api.get("/api/v1/nodes")))
            t = time.perf_counter()
            with open(listed) as f:
                json.load(f)
            json_load_s = time.perf_counter() - t

            t = time.perf_counter()
            cluster.start_sidecar()
            ready_s = time.perf_counter() - t
            assert cluster.sidecar is not None
            pid, port = cluster.sidecar.popen.pid, cluster.sidecar_port
            print(
                f"ready      {ready_s:7.2f} s (sidecar CPU {_cpu_s(pid):.2f} s); json.load of the NodeList "
                f"{json_load_s:.2f} s: {ready_s / json_load_s:.1f}x [target ≤ 3x]"
            )
            cluster.start_scheduler(bindir)

            f0, p0, c0 = _histogram(port, "filter"), _histogram(port, "prioritize"), _cpu_s(pid)
            names = [f"single-{i:04d}" for i in range(args.singles)]
            t = time.perf_counter()
            cluster.add_pods(NS, *(rk.pod(n, (1, 2, 4, 8)[i % 4]) for i, n in enumerate(names)))
            cluster.wait_bound(NS, names, timeout=600)
            took = time.perf_counter() - t
            f1, p1, c1 = _histogram(port, "filter"), _histogram(port, "prioritize"), _cpu_s(pid)
            print(
                f"singles    {args.singles / took:7.1f} pods/s ({args.singles} bound in {took:.1f} s; "
                f"sidecar CPU {c1 - c0:.2f} s)"
            )
            print(f"  filter     {_latency(f0, f1)}")
            print(f"  prioritize {_latency(p0, p1)}")

            members = [rk.pod(f"big-{i:02d}", gpus, gang="big") for i in range(count)]
            c0 = _cpu_s(pid)
            t = time.perf_counter()
            cluster.add_gang(NS, "big", *members)
            cluster.wait_bound(NS, [m["metadata"]["name"] for m in members], timeout=600)
            took = time.perf_counter() - t
            print(f"gang {args.gang:<6}{took:7.2f} s to the last bind (sidecar CPU {_cpu_s(pid) - c0:.2f} s)")
        finally:
            procs.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
