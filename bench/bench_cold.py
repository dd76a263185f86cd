"""The sidecar's filter at 5,000 / 20,000 / 60,000 nodes: start-up, warm, after one node's
annotation rewrite, after 1 % of the nodes changed, and cold; each against its target.

    .venv/bin/python bench/bench_cold.py [--rounds 30] [--sizes 5000,20000,60000] [--decode]

Cluster: bench_extender's generated fat tree (20 nodes a leaf, 25 leaves a spine; DGX A100 /
HGX H100 / DGX-1 in 2:1:1, 30 % of nodes partly busy), every node with its own
`gputopo.io/topology` annotation (each GPU its own UUID, as on real servers), in a NodeList
body as the API server's list returns it. The Extender `python -m scheduler` runs is called in
process (no HTTP: bench_extender times that part); single pods of 1/2/4/8 GPUs offered every
node. Times are the filtering thread's CPU time (what to compare on a shared machine), wall
clock beside it where it says so.

  json.load   CPU time of json.loads of that NodeList body (the yardstick for start-up)
  ready       decoding every node as the live store does (`scheduler.live.objects.node_info`,
              `same_topology`, one `Shapes` for the store) plus the first filter
  warm        filters on the unchanged cluster (`--rounds`)
  one         the filter right after one node's annotation was rewritten (each bind's
              re-published annotation); ratio to the warm p99
  1 %         the filter right after 1 % of the nodes were rewritten (`--rounds` // 3)
  cold        the filter right after every node was rewritten (`--rounds` // 3)
  RSS         the process's peak resident set after the size (sizes run smallest first)

Targets (issue 30): warm p99 <= 5 ms at 20,000 and <= 15 ms at 60,000; one <= 1.5 x warm
p99; 1 % <= 50 ms at 60,000; ready <= 3 x json.load; peak RSS <= 1 GiB at 60,000.
A rewrite keeps each node's Topology object, as the live store does (`same_topology`);
`--decode` sends every rewrite through encode/decode and that function instead.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import resource
import time
from dataclasses import replace
from typing import Any

import numpy as np
from bench_extender import MIX, pod  # run as a script: bench/ is on the path

from gputopo.network.annotation import NodeTopology, decode, encode
from gputopo.network.cluster import ClusterSnapshot, generate_cluster
from scheduler.extender import Extender
from scheduler.model import NodeInfo, parse_pod
from scheduler.picture.feed import FileState, from_cluster

try:  # the code before this change had neither (the side-by-side "before" run)
    from gputopo.network.annotation import Shapes
    from scheduler.live.objects import listed_nodes
except ImportError:  # pragma: no cover
    Shapes = None  # type: ignore[assignment,misc]
    listed_nodes = None  # type: ignore[assignment]
from scheduler.live.objects import node_info, same_topology
from scheduler.nodeguard import NodeGuard

KEY = "gputopo.io/topology"
RESOURCE = "nvidia.com/gpu"
Samples = dict[str, list[float]]


def node_list(snap: ClusterSnapshot) -> bytes:
    """The cluster as the API server lists it: each node with its plugin's annotation."""
    items = []
    for k, n in enumerate(snap.nodes):
        t = n.topology
        assert t is not None
        gpus = tuple(replace(g, uuid=f"GPU-{k:06x}-{g.index:02d}-5b7e-4e2b-9c4d-{k:012x}") for g in t.gpus)
        published = NodeTopology(
            n.name, replace(t, gpus=gpus), frozenset(), frozenset(n.allocated), 1.0, "0.1.0"
        )
        items.append(
            {
                "metadata": {
                    "name": n.name,
                    "labels": dict(n.labels),
                    "annotations": {KEY: encode(published)},
                },
                "status": {"allocatable": {RESOURCE: str(t.n)}},
            }
        )
    return json.dumps({"kind": "NodeList", "items": items}).encode()


def read_nodes(items: list[dict[str, Any]]) -> list[NodeInfo]:
    """Every node decoded as the live store's list does (`KubeState._replace_nodes`)."""
    guard = NodeGuard()
    kw: dict[str, Any] = {"shapes": Shapes()} if Shapes is not None else {}

    def read(obj: dict[str, Any]) -> NodeInfo:
        return node_info(obj, resource=RESOURCE, annotation_key=KEY, clock=lambda: 2.0, guard=guard, **kw)

    if listed_nodes is not None:
        return listed_nodes(items, {}, read)
    return [same_topology(None, read(obj)) for obj in items]  # the code before this change


def rewrite(state: FileState, rng: random.Random, names: list[str], via_decode: bool = False) -> None:
    """These nodes' plugins report a new in-use set (what the watch delivers), told node by node
    where the state can take it (`FileState._changed(names=...)`)."""
    nodes = state._nodes  # the bench stands in for the watch: it writes the nodes directly
    for name in names:
        info = nodes[name]
        topo = info.topology
        if topo is None:
            continue
        used = frozenset(g for g in range(topo.topology.n) if rng.random() < 0.4)
        if via_decode:
            text = encode(replace(topo, allocated=used, generated_at=1.0))
            nodes[name] = same_topology(info, replace(info, topology=decode(text, now=2.0, max_age_s=1e9)))
        else:
            nodes[name] = replace(info, topology=replace(topo, allocated=used))
    try:
        state._changed(nodes=True, names=names)
    except TypeError:  # the code before this change: any change redoes every node
        state._changed(nodes=True)


def bench(size: int, rounds: int, seed: int, via_decode: bool) -> dict[str, Any]:
    snap = generate_cluster(max(1, size // 500), 25, 20, MIX, seed, busy_fraction=0.3)
    body = node_list(snap)
    loads = []
    for _ in range(3):
        c0 = time.thread_time()
        items = json.loads(body)["items"]
        loads.append(time.thread_time() - c0)
    del body
    c0, t0 = time.thread_time(), time.perf_counter()
    infos = read_nodes(items)
    decode_cpu, decode_wall = time.thread_time() - c0, time.perf_counter() - t0
    del items
    base = from_cluster(snap)  # the pods and levels; nodes as decoded
    state = FileState(infos, base._pods.values(), levels=snap.levels)
    del infos, base
    names = sorted(state._nodes)
    rng = random.Random(seed)
    ext = Extender(state, snap.levels, clock=time.time)
    c1, t1 = time.thread_time(), time.perf_counter()
    ext.filter(parse_pod(pod("start", 1)), names)
    first_cpu, first_wall = time.thread_time() - c1, time.perf_counter() - t1
    out: dict[str, Any] = {
        "json.load": float(np.median(loads)) * 1000,
        "decode": decode_cpu * 1000,
        "first": first_cpu * 1000,
        "ready": (decode_cpu + first_cpu) * 1000,
        "ready wall": (decode_wall + first_wall) * 1000,
    }
    for k in (1, 2, 4, 8):  # each size's first answer: warm means asked before
        ext.filter(parse_pod(pod(f"size-{k}", k)), names)

    def timed(label: str) -> tuple[float, float]:
        info = parse_pod(pod(f"{label}-{rng.random()}", rng.choice([1, 2, 4, 8])))
        c, w = time.thread_time(), time.perf_counter()
        ext.filter(info, names)
        return (time.thread_time() - c) * 1000, (time.perf_counter() - w) * 1000

    samples: dict[str, list[tuple[float, float]]] = {"warm": [], "one": [], "1 %": [], "cold": []}
    for _ in range(rounds):
        samples["warm"].append(timed("warm"))
        rewrite(state, rng, [rng.choice(names)], via_decode)
        samples["one"].append(timed("one"))
    for _ in range(max(3, rounds // 3)):
        rewrite(state, rng, rng.sample(names, max(1, size // 100)), via_decode)
        samples["1 %"].append(timed("pct"))
    for _ in range(max(3, rounds // 3)):
        rewrite(state, rng, names, via_decode)
        samples["cold"].append(timed("cold"))
        timed("after-cold")  # each size's answer redone once, as after any cold filter
    for label, rows in samples.items():
        cpu = [r[0] for r in rows]
        wall = [r[1] for r in rows]
        out[label] = (float(np.percentile(cpu, 50)), float(np.percentile(cpu, 99)))
        out[label + " wall"] = (float(np.percentile(wall, 50)), float(np.percentile(wall, 99)))
    out["rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


WARM_TARGET = {20_000: 5.0, 60_000: 15.0}  # ms, warm filter p99 (CPU)
PCT_TARGET = {60_000: 50.0}  # ms, filter after 1 % changed, p99 (CPU)
RSS_TARGET = {60_000: 1024.0}  # MiB


def verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("met" if ok else "UNMET")


def report(size: int, got: dict[str, Any]) -> None:
    warm50, warm99 = got["warm"]
    one50, one99 = got["one"]
    pct50, pct99 = got["1 %"]
    cold50, cold99 = got["cold"]
    ready, loads = got["ready"], got["json.load"]
    w = WARM_TARGET.get(size)
    p = PCT_TARGET.get(size)
    r = RSS_TARGET.get(size)
    rows: list[tuple[str, str, str]] = [
        (
            "warm p50 / p99",
            f"{warm50:.2f} / {warm99:.2f} ms (wall {got['warm wall'][1]:.2f})",
            f"<= {w} ms: {verdict(warm99 <= w)}" if w else "-",
        ),
        (
            "one node rewritten p50 / p99",
            f"{one50:.2f} / {one99:.2f} ms = {one99 / warm99:.2f}x warm p99 (wall {got['one wall'][1]:.2f})",
            f"<= 1.5x: {verdict(one99 <= 1.5 * warm99)}",
        ),
        (
            "1 % rewritten p50 / p99",
            f"{pct50:.2f} / {pct99:.2f} ms (wall {got['1 % wall'][1]:.2f})",
            f"<= {p} ms: {verdict(pct99 <= p)}" if p else "-",
        ),
        ("cold p50 / p99", f"{cold50:.1f} / {cold99:.1f} ms (wall {got['cold wall'][1]:.1f})", "-"),
        (
            "ready (decode + first filter)",
            f"{ready / 1000:.2f} s = {ready / loads:.2f}x json.load ({loads / 1000:.2f} s); "
            f"decode {got['decode'] / 1000:.2f} s, first filter {got['first']:.0f} ms "
            f"(wall {got['ready wall'] / 1000:.2f} s)",
            f"<= 3x: {verdict(ready <= 3 * loads)}",
        ),
        ("peak RSS", f"{got['rss']:.0f} MiB", f"<= {r:.0f} MiB: {verdict(got['rss'] <= r)}" if r else "-"),
    ]
    print(f"\n{size:,} nodes")
    for name, value, target in rows:
        print(f"  {name:<32} {value:<78} {target}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--sizes", default="5000,20000,60000")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--decode", action="store_true", help="every rewrite through encode/decode")
    ap.add_argument("--json", action="store_true", help="also print each size's figures as JSON")
    args = ap.parse_args()
    logging.disable(logging.INFO)  # decision logs off: we time the decisions, not the log sink
    print("filter CPU time of the filtering thread, ms, in process (wall clock beside it)")
    for size in (int(s) for s in args.sizes.split(",")):
        got = bench(size, args.rounds, args.seed, args.decode)
        report(size, got)
        if args.json:
            print(json.dumps({"nodes": size, **got}))


if __name__ == "__main__":
    main()
