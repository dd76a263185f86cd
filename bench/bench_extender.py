"""Extender latency: filter + prioritize at 1,000 and 5,000 nodes, and gang planning on 5,000.

    .venv/bin/python bench/bench_extender.py [--requests 200] [--baseline-requests 15] [--gang-runs 15]

Cluster: a generated fat tree (spines x 25 leaves x 20 nodes; DGX A100 / HGX H100 / DGX-1 in
2:1:1, 30 % of nodes partly busy), served from memory (file mode), the same Extender and HTTP
server `python -m scheduler` runs. Each request is a new single pod (1, 2, 4 or 8 GPUs) offered
every node, as kube-scheduler does with `percentageOfNodesToScore: 100`; prioritize gets the
filter's survivors. Three ways, same process, same pods:

  in-process   Extender.filter / .prioritize called directly (no JSON, no socket)
  http cache   POST /filter and /prioritize with NodeNames (nodeCacheCapable: true)
  http full    the same with a full v1.NodeList in and out (nodeCacheCapable: false): baseline

Gang planning: a PodGroup of 16 x 8 and one of 128 x 8 GPUs, all members known; the time of
the filter call that plans the whole gang (through the extender: views, plan, reservations),
the plan dropped between runs. Target: p99 < 10 ms for a 5,000-node filter; 128 x 8 < 100 ms.
Printed: p50/p99 ms, and the speed-up of each way over the baseline at the same percentile.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import random
import socket
import time
from typing import Any

import numpy as np

from gputopo.network.cluster import generate_cluster
from scheduler.extender import Extender
from scheduler.model import parse_pod
from scheduler.picture.feed import from_cluster
from scheduler.web.server import Server

MIX = {"dgx-a100": 2.0, "hgx-h100": 1.0, "dgx1-v100": 1.0}
GROUP = "scheduling.x-k8s.io/pod-group"


def pod(name: str, gpus: int, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "bench", "uid": f"uid-{name}", "labels": labels or {}},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus), "cpu": "8"}},
                }
            ]
        },
        "status": {"phase": "Pending"},
    }


def node_object(name: str, labels: dict[str, str]) -> dict[str, Any]:
    """A v1.Node about the size kube-scheduler sends (labels, conditions, addresses, images)."""
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "12345",
            "labels": {**labels, "kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": "dgx"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"podCIDR": "10.0.0.0/24", "providerID": f"metal://{name}"},
        "status": {
            "capacity": {"cpu": "256", "memory": "2113407168Ki", "nvidia.com/gpu": "8", "pods": "110"},
            "allocatable": {"cpu": "255", "memory": "2100000000Ki", "nvidia.com/gpu": "8", "pods": "110"},
            "conditions": [
                {
                    "type": t,
                    "status": "False",
                    "reason": f"No{t}",
                    "message": f"kubelet has no {t}",
                    "lastHeartbeatTime": "2026-11-29T07:00:00Z",
                    "lastTransitionTime": "2026-11-01T00:00:00Z",
                }
                for t in ("MemoryPressure", "DiskPressure", "PIDPressure")
            ],
            "addresses": [
                {"type": "InternalIP", "address": "10.1.2.3"},
                {"type": "Hostname", "address": name},
            ],
            "nodeInfo": {
                "kubeletVersion": "v1.31.2",
                "containerRuntimeVersion": "containerd://1.7.22",
                "kernelVersion": "6.8.0-45-generic",
                "osImage": "Ubuntu 24.04.1 LTS",
                "architecture": "amd64",
                "operatingSystem": "linux",
            },
            "images": [
                {"names": [f"nvcr.io/nvidia/pytorch@sha256:{i:064x}"], "sizeBytes": 9_000_000_000}
                for i in range(8)
            ],
        },
    }


class Client:
    def __init__(self, server: Server) -> None:
        self.conn = http.client.HTTPConnection(*server.address, timeout=60)
        self.conn.connect()
        # Go's net/http (kube-scheduler) sets TCP_NODELAY; without it Nagle stalls the body
        self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def post(self, path: str, body: bytes) -> Any:
        self.conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = self.conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{path}: {resp.status} {data[:200]!r}")
        return json.loads(data)


def pct(samples: list[float]) -> tuple[float, float]:
    arr = np.array(samples)
    return float(np.percentile(arr, 50)), float(np.percentile(arr, 99))


def bench_size(spines: int, requests: int, baseline_requests: int, seed: int) -> dict[str, dict[str, tuple]]:
    snap = generate_cluster(spines, 25, 20, MIX, seed, busy_fraction=0.3)
    names = [n.name for n in snap.nodes]
    labels = {n.name: dict(n.labels) for n in snap.nodes}
    node_list = {
        "kind": "NodeList",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": "1"},
        "items": [node_object(n, labels[n]) for n in names],
    }
    state = from_cluster(snap)
    ext = Extender(state, snap.levels, clock=time.time)
    server = Server(ext, "127.0.0.1", 0)
    server.start()
    client = Client(server)
    # kube-scheduler's own JSON encoding is not ours to time: the node part is encoded once
    names_json = json.dumps(names).encode()
    list_json = json.dumps(node_list).encode()
    rng = random.Random(seed)
    sizes = [rng.choice([1, 2, 4, 8]) for _ in range(requests)]
    out: dict[str, dict[str, tuple]] = {}
    try:
        ext.filter(parse_pod(pod("warm", 1)), names)  # allocator tables, first views
        for way in ("in-process", "http cache", "http full"):
            n = baseline_requests if way == "http full" else requests
            filt: list[float] = []
            both: list[float] = []
            for i in range(n):
                p = pod(f"{way.replace(' ', '-')}-{i}", sizes[i])
                t0 = time.perf_counter()
                if way == "in-process":
                    info = parse_pod(p)
                    survivors = ext.filter(info, names).node_names
                    t1 = time.perf_counter()
                    ext.prioritize(info, survivors)
                elif way == "http cache":
                    res = client.post(
                        "/filter",
                        b'{"Pod":%s,"Nodes":null,"NodeNames":%s}' % (json.dumps(p).encode(), names_json),
                    )
                    t1 = time.perf_counter()
                    client.post(
                        "/prioritize",
                        json.dumps({"Pod": p, "Nodes": None, "NodeNames": res["NodeNames"]}).encode(),
                    )
                else:
                    res = client.post(
                        "/filter",
                        b'{"Pod":%s,"Nodes":%s,"NodeNames":null}' % (json.dumps(p).encode(), list_json),
                    )
                    t1 = time.perf_counter()
                    client.post(
                        "/prioritize",
                        json.dumps({"Pod": p, "Nodes": res["Nodes"], "NodeNames": None}).encode(),
                    )
                t2 = time.perf_counter()
                filt.append((t1 - t0) * 1000)
                both.append((t2 - t0) * 1000)
            out[way] = {"filter": pct(filt), "filter+prioritize": pct(both)}
    finally:
        client.conn.close()
        server.stop()
    return out


def bench_gangs(runs: int, seed: int) -> dict[str, tuple[float, float, str]]:
    snap = generate_cluster(10, 25, 20, MIX, seed, busy_fraction=0.3)
    names = [n.name for n in snap.nodes]
    results = {}
    for count in (16, 128):
        key = f"g{count}"
        groups = [{"namespace": "bench", "name": key, "minMember": count}]
        from gputopo.network.cluster import parse_cluster

        state = from_cluster(parse_cluster({**snap.to_dict(), "podgroups": groups}))
        ext = Extender(state, snap.levels, clock=time.time)
        members = [parse_pod(pod(f"{key}-{i}", 8, {GROUP: key})) for i in range(count)]
        for m in members:
            state.observe(m)
        samples = []
        where = ""
        for r in range(runs + 1):
            ext._drop_plan(f"bench/{key}", "benchmark run")
            t0 = time.perf_counter()
            res = ext.filter(members[r % count], names)
            elapsed = (time.perf_counter() - t0) * 1000
            if r:
                samples.append(elapsed)
            plan = ext.plans.get(f"bench/{key}")
            where = (
                f"{plan.level.rpartition('/')[2]} {plan.domain}"
                if plan
                else next(iter(res.unresolvable.values()))
            )
        results[f"{count}x8"] = (*pct(samples), where)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--baseline-requests", type=int, default=15)
    ap.add_argument("--gang-runs", type=int, default=15)
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args()
    logging.disable(logging.INFO)  # decision logs off: we time the decisions, not the log sink
    print("extender latency, ms (p50 / p99); speed-up = baseline / way at the same percentile")
    print(
        f"{'nodes':>6} {'way':<11} {'filter p50':>10} {'p99':>8} {'f+prio p50':>10} {'p99':>8} "
        f"{'speed-up p50':>12} {'p99':>6}"
    )
    for spines, label in ((2, "1000"), (10, "5000")):
        res = bench_size(spines, args.requests, args.baseline_requests, args.seed)
        base = res["http full"]["filter+prioritize"]
        for way, r in res.items():
            f50, f99 = r["filter"]
            b50, b99 = r["filter+prioritize"]
            print(
                f"{label:>6} {way:<11} {f50:>10.2f} {f99:>8.2f} {b50:>10.2f} {b99:>8.2f} "
                f"{base[0] / b50:>11.1f}x {base[1] / b99:>5.1f}x"
            )
    print()
    print("gang planning through the extender, 5,000 nodes, ms")
    print(f"{'gang':<7} {'p50':>8} {'p99':>8}  placed in")
    for gang, (p50, p99, where) in bench_gangs(args.gang_runs, args.seed).items():
        print(f"{gang:<7} {p50:>8.2f} {p99:>8.2f}  {where}")


if __name__ == "__main__":
    main()
