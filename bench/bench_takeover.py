"""The cost of a takeover: a standby sidecar's first call at 2,000 nodes with gangs left part-bound.

    .venv/bin/python bench/bench_takeover.py [--gangs 50] [--members 8] [--singles 2000] [--runs 5]

Cluster: the generated fat tree of bench_extender.py (4 spines x 25 leaves x 20 nodes, DGX
A100 / HGX H100 / DGX-1 in 2:1:1, 30 % of nodes partly busy), held in memory (file mode). A
first Extender (the old leader) binds `--singles` single pods, then plans `--gangs` gangs of
`--members` x 8 GPUs and binds half of each. A second Extender over the same cluster state,
with nothing in memory (the new leader), is then asked about one single pod: that first call
runs the takeover pass (`Extender._take_over`: demand mix seeded, every part-bound gang
planned beside its bound members and reserved) before it answers. Printed: that first call,
the same call without anything to adopt (a fresh Extender on a cluster with no gangs left
part-bound), and a steady filter of the new leader afterwards, in ms (median of `--runs`).
docs/operator.md "Failover" cites these numbers.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

from bench_extender import MIX, pod  # run as a script: bench/ is on the path

from gputopo.network.cluster import generate_cluster, parse_cluster
from scheduler.extender import Extender
from scheduler.model import parse_pod
from scheduler.picture.feed import FileState, from_cluster


def old_leader(
    state: FileState, levels: tuple[str, ...], names: list[str], singles: int, gangs: int, members: int
) -> int:
    """Bind singles, then half of every gang, through an Extender that is then thrown away."""
    ext = Extender(state, levels, clock=time.time)
    for i in range(singles):
        p = parse_pod(pod(f"single-{i}", [1, 2, 4][i % 3]))
        state.observe(p)
        ok = ext.filter(p, names).node_names
        if ok:
            ext.bind("bench", p.name, p.uid, sorted(ok)[0])
    part = 0
    for g in range(gangs):
        labels = {
            "pod-group.scheduling.sigs.k8s.io/name": f"g{g}",
            "pod-group.scheduling.sigs.k8s.io/min-available": str(members),
        }
        ms = [parse_pod(pod(f"g{g}-{i}", 8, labels)) for i in range(members)]
        for m in ms:
            state.observe(m)
        bound = 0
        for m in ms[: members // 2]:
            res = ext.filter(m, names)
            if res.node_names:
                ext.bind("bench", m.name, m.uid, res.node_names[0])
                bound += 1
        part += bound > 0
    return part


def first_call(
    state: FileState, levels: tuple[str, ...], names: list[str], tag: str
) -> tuple[float, float, int]:
    ext = Extender(state, levels, clock=time.time)
    p = parse_pod(pod(f"probe-{tag}", 2))
    t0 = time.perf_counter()
    ext.filter(p, names)
    first = (time.perf_counter() - t0) * 1000
    q = parse_pod(pod(f"probe2-{tag}", 2))
    t0 = time.perf_counter()
    ext.filter(q, names)
    steady = (time.perf_counter() - t0) * 1000
    return first, steady, len(ext.plans)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gangs", type=int, default=50)
    ap.add_argument("--members", type=int, default=8)
    ap.add_argument("--singles", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    logging.disable(logging.INFO)
    snap = generate_cluster(4, 25, 20, MIX, args.seed, busy_fraction=0.3)
    names = [n.name for n in snap.nodes]
    levels = tuple(snap.levels)
    with_gangs = from_cluster(parse_cluster(snap.to_dict()))
    part = old_leader(with_gangs, levels, names, args.singles, args.gangs, args.members)
    without = from_cluster(parse_cluster(snap.to_dict()))
    old_leader(without, levels, names, args.singles, 0, args.members)
    rows = {"takeover, gangs part-bound": [], "takeover, nothing to adopt": []}
    adopted = 0
    for r in range(args.runs):
        f, s, adopted = first_call(with_gangs, levels, names, f"a{r}")
        rows["takeover, gangs part-bound"].append((f, s))
        f, s, _ = first_call(without, levels, names, f"b{r}")
        rows["takeover, nothing to adopt"].append((f, s))
    print(
        f"{len(names)} nodes, {args.singles} single pods bound, {part} gangs of {args.members} x 8 part-bound; adopted plans: {adopted}"
    )
    for name, samples in rows.items():
        first = statistics.median(x for x, _ in samples)
        steady = statistics.median(y for _, y in samples)
        print(f"{name:30s} first call {first:8.1f} ms   next call {steady:6.1f} ms")


if __name__ == "__main__":
    main()
