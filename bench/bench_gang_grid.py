"""The gang objective's grid (docs/objective.md, "Gangs by predicted job time"): gputopo against
gang-only (its own ablation: no network planner) and every peer, on throughput and on mean
queueing per GPU asked, cell by cell.

Cells: the generator at each --pods x --seeds x --clusters x --mixes, and each replayed trace
(Helios, Philly; the first --limit jobs) at each --replay-loads ("own": the trace's own times)
x --clusters, on the default mix and seed 0. Every policy of the catalog runs on each cell's
arrivals, built as `gputopo simulate` builds them (gputopo.sim.cli.prepare).

Noise. The simulator is deterministic for a seed, but kube-scheduler's random choice among
equal scores is part of every policy, so a figure one draw of those choices gives is not exact:
gputopo runs a second time on each cell with only the policies' random stream changed (the run
seed + 7919; same arrivals, same profiles). The relative difference of the two is the cell's
noise; the grid's 90th percentile of it is the tolerance of the verdict: gputopo meets a cell
when its throughput is at least (1 - tolerance) x the best other policy's and its queueing per
GPU at most (1 + tolerance) x the best other's plus one second. Both are printed.

Run: .venv/bin/python bench/bench_gang_grid.py [--pods 2000,5000,20000] [--seeds 0,1,2]
     [--clusters default,mixed-leaf,gb200-nvl] [--mixes default,cnn,llm] [--traces-only]
     [--replay-loads 0.3,0.6,own] [--limit 4000] [--declared-share 0] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from gputopo.sim.cli import add_arguments, prepare
from gputopo.sim.metrics import Summary
from gputopo.sim.policies.catalog import POLICIES
from gputopo.sim.run import compare, simulate

ROOT = Path(__file__).resolve().parent.parent
TRACES = {
    "helios": "helios-excerpt-15k/helios_jobs_15k.csv",
    "philly": "philly-excerpt-15k/philly_jobs_15k.csv",
}
SELF, ABLATION = "gputopo", "gang-only"
NOISE_SEED = 7919


def cells(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """(name, `gputopo simulate` arguments) of every cell."""
    out: list[tuple[str, list[str]]] = []
    policies = ["--policies", ",".join(POLICIES)]
    extra = ["--declared-share", str(args.declared_share)] if args.declared_share else []
    if not args.traces_only:
        for pods in args.pods.split(","):
            for cluster in args.clusters.split(","):
                for mix in args.mixes.split(","):
                    for seed in args.seeds.split(","):
                        name = f"generator/{pods}/{cluster}/{mix}/s{seed}"
                        argv = [
                            "--pods",
                            pods,
                            "--cluster-preset",
                            cluster,
                            "--profile-mix",
                            mix,
                            "--seed",
                            seed,
                        ]
                        out.append((name, [*argv, *policies, *extra]))
    for trace, path in TRACES.items():
        file = Path(args.traces) / path
        for load in args.replay_loads.split(","):
            for cluster in args.clusters.split(","):
                argv = ["--trace", str(file), "--limit", str(args.limit), "--cluster-preset", cluster]
                if load != "own":
                    argv += ["--replay-load", load]
                out.append((f"{trace}/{load}/{cluster}", [*argv, *policies, *extra]))
    return out


def figures(s: Summary) -> tuple[float | None, float | None]:
    """(throughput of multi-GPU jobs vs kubelet-default, mean queueing per GPU asked in s)."""
    return s.throughput_vs_baseline, s.queue_delay_mean_per_gpu


def run_cell(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="gputopo simulate")
    add_arguments(parser)
    cluster, jobs, _header, config, names = prepare(parser.parse_args(argv))
    results = compare(cluster, jobs, names, config)
    by = {r.policy: figures(r) for r in results}
    # the noise draw: gputopo again with only the policies' random stream changed
    again = simulate(cluster, jobs, SELF, replace(config, seed=config.seed + NOISE_SEED))
    base = next(r for r in results if r.policy == "kubelet-default")
    thr = again.efficiency / base.efficiency if base.efficiency and again.efficiency else None
    return {"policies": by, "noise": (thr, again.queue_delay_mean_per_gpu)}


def _rel(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    return abs(a - b) / max(abs(b), 1e-9)


def verdicts(rows: list[dict[str, Any]]) -> tuple[float, float]:
    """Fill each row's verdict; returns the tolerances (throughput, queueing) used."""
    thr_noise, queue_noise = [], []
    for row in rows:
        own = row["policies"][SELF]
        n_thr, n_queue = row["noise"]
        row["noise_rel"] = (_rel(n_thr, own[0]), _rel(n_queue, own[1]) if (own[1] or 0) > 60 else None)
        if row["noise_rel"][0] is not None:
            thr_noise.append(row["noise_rel"][0])
        if row["noise_rel"][1] is not None:
            queue_noise.append(row["noise_rel"][1])
    t_tol = float(np.percentile(thr_noise, 90)) if thr_noise else 0.0
    q_tol = float(np.percentile(queue_noise, 90)) if queue_noise else 0.0
    for row in rows:
        own = row["policies"][SELF]
        others = {k: v for k, v in row["policies"].items() if k != SELF}
        thr = [(v[0], k) for k, v in others.items() if v[0] is not None]
        queue = [(v[1], k) for k, v in others.items() if v[1] is not None]
        best_t = max(thr) if thr else None
        best_q = min(queue) if queue else None
        row["best_throughput"], row["best_queue"] = best_t, best_q
        row["throughput_met"] = (
            None if best_t is None or own[0] is None else own[0] >= best_t[0] * (1 - t_tol) - 1e-12
        )
        row["queue_met"] = (
            None if best_q is None or own[1] is None else own[1] <= best_q[0] * (1 + q_tol) + 1.0
        )
    return t_tol, q_tol


def _secs(v: float | None) -> str:
    if v is None:
        return "n/a"
    if v < 60:
        return f"{v:.0f} s"
    if v < 3600:
        return f"{v / 60:.1f} min"
    return f"{v / 3600:.1f} h"


def render(rows: list[dict[str, Any]], t_tol: float, q_tol: float) -> str:
    lines = [
        f"tolerance (90th percentile of gputopo's own noise over the grid): throughput {t_tol:.2%}, "
        f"queueing per GPU {q_tol:.2%}",
        f"{'cell':<36}{'gputopo':>9}{'gang-only':>10}{'best other':>24}  {'met':<4}"
        f"{'gputopo q':>11}{'gang-only q':>12}{'best other q':>26}  met",
    ]
    met_t = met_q = total = 0
    for row in rows:
        own, abl = row["policies"][SELF], row["policies"].get(ABLATION, (None, None))
        bt, bq = row["best_throughput"], row["best_queue"]
        t = "-" if row["throughput_met"] is None else ("yes" if row["throughput_met"] else "NO")
        q = "-" if row["queue_met"] is None else ("yes" if row["queue_met"] else "NO")
        total += 1
        met_t += row["throughput_met"] is not False
        met_q += row["queue_met"] is not False
        lines.append(
            f"{row['cell']:<36}{own[0] or 0:>9.3f}{abl[0] or 0:>10.3f}"
            f"{(f'{bt[1]} {bt[0]:.3f}' if bt else 'n/a'):>24}  {t:<4}"
            f"{_secs(own[1]):>11}{_secs(abl[1]):>12}{(f'{bq[1]} {_secs(bq[0])}' if bq else 'n/a'):>26}  {q}"
        )
    lines.append(f"met: throughput {met_t}/{total}, queueing {met_q}/{total}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", default="2000,5000,20000")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--clusters", default="default,mixed-leaf,gb200-nvl")
    parser.add_argument("--mixes", default="default,cnn,llm")
    parser.add_argument("--replay-loads", default="0.3,0.6,own")
    parser.add_argument("--limit", type=int, default=4000, help="jobs of each replayed trace (default 4000)")
    parser.add_argument("--traces-only", action="store_true")
    parser.add_argument("--no-traces", action="store_true")
    parser.add_argument("--declared-share", type=float, default=0.0)
    parser.add_argument("--traces", default=str(ROOT.parent / "shared" / "traces"))
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    todo = cells(args)
    if args.no_traces:
        todo = [c for c in todo if c[0].startswith("generator/")]
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    for name, argv in todo:
        t0 = time.perf_counter()
        row = {"cell": name, **run_cell(argv)}
        rows.append(row)
        own = row["policies"][SELF]
        print(f"{name}: gputopo {own[0]} / {_secs(own[1])} ({time.perf_counter() - t0:.1f} s)", flush=True)
    t_tol, q_tol = verdicts(rows)
    print(render(rows, t_tol, q_tol))
    print(f"{len(rows)} cells in {time.perf_counter() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"tolerance": [t_tol, q_tol], "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
