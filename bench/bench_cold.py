"""Cold vs warm filter latency at 5,000 and 20,000 nodes: the first filter after every node's
free set changed, against a filter on an unchanged cluster.

    .venv/bin/python bench/bench_cold.py [--rounds 30] [--sizes 5000,20000] [--decode]

Cluster: bench_extender's generated fat tree (20 nodes a leaf, 25 leaves a spine; DGX A100 /
HGX H100 / DGX-1 in 2:1:1, 30 % of nodes partly busy), in memory (file mode), the Extender
`python -m scheduler` runs, called in process (no HTTP: bench_extender times that part).
Each round first gives every node a new in-use set (as if every node's annotation had been
rewritten since the last call: the worst case of "many free-set changes"), then times one
filter of a new single pod offered every node (cold), then `--warm` more on the unchanged
cluster (warm). Printed: p50/p99 ms per size, wall clock and the filtering thread's CPU time
(the latter is what to compare on a shared machine), and the process's peak RSS after the size;
and, once per size, the first filter after start ("first"), on nodes that each hold their own
Topology object as the live store does (each node's annotation encoded and decoded); then
"one cpu": the CPU time of a filter right after a single node's annotation was rewritten (what
each bind's re-published annotation costs the next filter), `--rounds` times.

By default a rewrite keeps each node's Topology object, as the live store does since it
compares a re-decoded topology with the one it holds (`scheduler.kubeobjects.same_topology`);
`--decode` sends every rewrite through encode/decode and that function instead (slow to set up,
and on code before it: what a rewrite cost the filter when every decode gave a new object).
"""

from __future__ import annotations

import argparse
import logging
import random
import resource
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
from bench_extender import MIX, pod  # run as a script: bench/ is on the path

from gputopo.network.annotation import decode, encode
from gputopo.network.cluster import generate_cluster
from scheduler.extender import Extender
from scheduler.model import NodeInfo, parse_pod
from scheduler.state import FileState, from_cluster

Keep = Callable[[NodeInfo | None, NodeInfo], NodeInfo]
try:
    from scheduler.kubeobjects import same_topology

    keep: Keep = same_topology
except ImportError:  # the code before it (for the side-by-side "before" run): a decode is new

    def keep(prev: NodeInfo | None, info: NodeInfo) -> NodeInfo:
        return info


def decoded(info: NodeInfo, prev: NodeInfo | None, allocated: frozenset[int]) -> NodeInfo:
    """`info` with `allocated` in use, as the live store reads it: annotation text decoded into
    a new NodeTopology (and Topology), then kept against what the store held (`keep`)."""
    assert info.topology is not None
    text = encode(replace(info.topology, node=info.name, allocated=allocated, generated_at=1.0))
    return keep(prev, replace(info, topology=decode(text, now=2.0, max_age_s=1e9)))


def as_live(state: FileState) -> None:
    """Every node with its own Topology object, as after the live store's first list."""
    nodes = state._nodes
    for name, info in nodes.items():
        if info.topology is not None:
            nodes[name] = decoded(info, None, info.topology.allocated)
    state._changed(nodes=True)


def rewrite_annotations(state: FileState, rng: random.Random, via_decode: bool = False) -> None:
    """Every node's plugin reports a new in-use set (what a busy cluster's watch delivers)."""
    nodes = state._nodes  # the bench stands in for the watch: it writes the nodes directly
    for name, info in nodes.items():
        topo = info.topology
        if topo is None:
            continue
        n = topo.topology.n
        used = frozenset(g for g in range(n) if rng.random() < 0.4)
        if via_decode:
            nodes[name] = decoded(info, info, used)
        else:
            nodes[name] = replace(info, topology=replace(topo, allocated=used))
    state._changed(nodes=True)


def rewrite_one(state: FileState, rng: random.Random, name: str) -> None:
    """One node's plugin reports a new in-use set (one bind's re-published annotation)."""
    info = state._nodes[name]
    if info.topology is not None:
        used = frozenset(g for g in range(info.topology.topology.n) if rng.random() < 0.4)
        state._nodes[name] = replace(info, topology=replace(info.topology, allocated=used))
    state._changed(nodes=True, names=(name,))


Samples = dict[str, list[float]]


def bench(nodes: int, rounds: int, warm: int, seed: int, via_decode: bool) -> Samples:
    snap = generate_cluster(max(1, nodes // 500), 25, 20, MIX, seed, busy_fraction=0.3)
    names = [n.name for n in snap.nodes]
    state = from_cluster(snap)
    as_live(state)
    ext = Extender(state, snap.levels, clock=time.time)
    rng = random.Random(seed)
    out: Samples = {"cold": [], "warm": [], "cold cpu": [], "warm cpu": []}
    t0, c0 = time.perf_counter(), time.thread_time()
    ext.filter(parse_pod(pod("start", 1)), names)  # allocator tables, first views
    out["first"] = [(time.perf_counter() - t0) * 1000, (time.thread_time() - c0) * 1000]
    for r in range(rounds):
        rewrite_annotations(state, rng, via_decode)
        for i in range(warm + 1):
            info = parse_pod(pod(f"p-{r}-{i}", rng.choice([1, 2, 4, 8])))
            t0, c0 = time.perf_counter(), time.thread_time()
            ext.filter(info, names)
            kind = "warm" if i else "cold"
            out[kind].append((time.perf_counter() - t0) * 1000)
            out[kind + " cpu"].append((time.thread_time() - c0) * 1000)
    out["one cpu"] = []
    for r in range(rounds):
        rewrite_one(state, rng, rng.choice(names))
        info = parse_pod(pod(f"one-{r}", rng.choice([1, 2, 4, 8])))
        c0 = time.thread_time()
        ext.filter(info, names)
        out["one cpu"].append((time.thread_time() - c0) * 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--sizes", default="5000,20000")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--decode", action="store_true", help="every rewrite through encode/decode")
    args = ap.parse_args()
    logging.disable(logging.INFO)  # decision logs off: we time the decisions, not the log sink
    print("filter latency, ms, in process; cold = first filter after every node's free set changed")
    print("(wall clock, and the filtering thread's CPU time: the machine may be shared)")
    kinds = ("cold", "warm", "cold cpu", "warm cpu")
    head = " ".join(f"{k + ' p50':>13} {'p99':>7}" for k in kinds)
    print(
        f"{'nodes':>7} {head} {'peak RSS MiB':>13} {'first ms':>9} {'cpu':>7} {'one cpu p50':>12} {'p99':>7}"
    )
    for size in (int(s) for s in args.sizes.split(",")):
        got = bench(size, args.rounds, args.warm, args.seed, args.decode)
        pcts = [np.percentile(got[k], [50, 99]) for k in kinds]
        cells = " ".join(f"{p50:>13.2f} {p99:>7.2f}" for p50, p99 in pcts)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        first, first_cpu = got["first"]
        one50, one99 = np.percentile(got["one cpu"], [50, 99])
        print(f"{size:>7,} {cells} {rss:>13.0f} {first:>9.1f} {first_cpu:>7.1f} {one50:>12.2f} {one99:>7.2f}")


if __name__ == "__main__":
    main()
