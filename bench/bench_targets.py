"""Issue 10's targets: every workload x every cluster preset, every policy on the same arrivals.

For each (workload, cluster) the harness builds the run exactly as `gputopo simulate` does
(gputopo.sim.cli.prepare: same parser, same workload construction, same seed for every
policy), compares the policies with gputopo.sim.run.compare, and prints one compact table:
rows are policies; columns are the four target figures (throughput of multi-GPU jobs vs
kubelet-default, share of multi-GPU pods at their node's best ring, gangs inside one leaf,
mean queueing delay) plus the share of GPU demand placed (the fill mode's figure). A verdict
line follows: gputopo against the best *peer* on each target — at least the best peer's
throughput, ring share and leaf share, and a mean queueing delay within 5 % of the best peer's.
Peers are every policy run except gputopo and gang-only: gang-only is gputopo itself with the
network-aware gang planner switched off (its ablation), not a system anyone would pick instead.

The policy list is gputopo.sim.policies.catalog.POLICIES as it is when the harness runs, so policies
added there are compared without touching this file.

Run: .venv/bin/python bench/bench_targets.py [--workloads generator,helios,philly,openb-fill]
     [--clusters default,mixed-leaf,gb200-nvl] [--policies ...] [--pods 20000] [--json out.json]
     [--profile-mix default|cnn|encoder|llm]  (the job-time model's profiles, docs/jobtime.md)
     [--load 0.5] [--load-basis cluster|ideal]  (the generator's load, at the cluster's speed)
     [--replay-load F]  (pace the Helios/Philly replays to load F; default: their own times)
     [--gang-spill-after SECONDS]  (the opt-in wait)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from gputopo.jobtime.profiles import PROFILE_MIXES
from gputopo.sim import report
from gputopo.sim.cli import UsageError, add_arguments, prepare
from gputopo.sim.clusters import TARGET_PRESETS
from gputopo.sim.engine import QUEUE_ORDERS
from gputopo.sim.metrics import Summary
from gputopo.sim.policies.catalog import POLICIES
from gputopo.sim.run import compare

ROOT = Path(__file__).resolve().parent.parent
#: Trace files by workload name, relative to --traces; the generator needs none.
TRACES: dict[str, str | None] = {
    "generator": None,
    "helios": "helios-excerpt-15k/helios_jobs_15k.csv",
    "philly": "philly-excerpt-15k/philly_jobs_15k.csv",
    "openb-fill": "alibaba-gpu-v2023/openb_pod_list_multigpu50.csv",
}
SELF = "gputopo"
ABLATION = "gang-only"  # gputopo without the network-aware gang planner: not a peer
QUEUE_TOLERANCE = 0.05  # "within 5 % of the best peer's mean queueing delay"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"bench_targets: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _names(text: str, known: Sequence[str], flag: str, parser: _Parser) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        parser.error(f"{flag}: name at least one")
    for n in names:
        if n not in known:
            parser.error(f"{flag}: unknown {n!r} (known: {', '.join(known)})")
    return names


def _sim_args(workload: str, cluster: str, policies: Sequence[str], args: argparse.Namespace) -> list[str]:
    """The `gputopo simulate` command line of one cell of the matrix."""
    argv = ["--cluster-preset", cluster, "--policies", ",".join(policies), "--seed", str(args.seed)]
    argv += ["--profile-mix", args.profile_mix]
    if args.gang_spill_after is not None:  # the opt-in wait, for gangs and multi-GPU pods alike
        argv += ["--gang-spill-after", str(args.gang_spill_after)]
    if args.queue_order != "arrival" and workload != "openb-fill":  # a fill has no queue
        argv += ["--queue-order", args.queue_order]
    trace = TRACES[workload]
    if trace is None:
        return [*argv, "--pods", str(args.pods), "--load", str(args.load), "--load-basis", args.load_basis]
    path = Path(args.traces) / trace
    if not path.is_file():
        raise UsageError(f"--traces {args.traces}: {workload} trace {trace} not found")
    if args.replay_load is not None and workload != "openb-fill":
        argv += ["--replay-load", str(args.replay_load)]
    return [*argv, "--trace", str(path)]


_ratio, _pct, _secs = report.ratio, report.pct, report.secs  # the table's own wording


#: (column, value, formatted) of the table; `value` feeds the verdict (None = undefined).
COLUMNS = (
    ("throughput vs kubelet", lambda s: s.throughput_vs_baseline, _ratio),
    ("pods at best ring", lambda s: s.best_ring_share, _pct),
    ("gangs in one leaf", lambda s: s.gangs_one_leaf, _pct),
    ("mean queueing", lambda s: s.queue_delay_mean, _secs),
    ("per GPU asked", lambda s: s.queue_delay_mean_per_gpu, _secs),
    ("demand placed", lambda s: s.demand_placed, _pct),
    ("in use at end (fill)", lambda s: s.allocated_at_end, _pct),
)


def verdict(results: Sequence[Summary]) -> dict[str, Any]:
    """gputopo against the best peer on each target: {target: {"met", "gputopo", "peer",
    "best_peer"}}; "met" is None where the figure is undefined (no gangs, no queue in fill)."""
    own = next((r for r in results if r.policy == SELF), None)
    peers = [r for r in results if r.policy not in (SELF, ABLATION)]
    if own is None or not peers:
        return {}
    out: dict[str, Any] = {}
    # throughput: the ratio to kubelet-default where it ran, else the efficiency it divides
    # (ideal/actual GPU time of multi-GPU jobs), which orders the policies alike
    ratio = all(r.throughput_vs_baseline is not None for r in results)
    throughput = "throughput_vs_baseline" if ratio else "efficiency"
    higher = (("throughput", throughput), ("ring", "best_ring_share"), ("leaf", "gangs_one_leaf"))
    for target, field in higher:
        mine = getattr(own, field)
        theirs = [(getattr(p, field), p.policy) for p in peers if getattr(p, field) is not None]
        if mine is None or not theirs:
            out[target] = {"met": None, "gputopo": mine, "peer": None, "best_peer": None}
            continue
        best, who = max(theirs)
        out[target] = {"met": mine >= best - 1e-12, "gputopo": mine, "peer": who, "best_peer": best}
    out["throughput"]["figure"] = throughput
    mine = own.queue_delay_mean
    theirs = [(p.queue_delay_mean, p.policy) for p in peers if p.queue_delay_mean is not None]
    if mine is None or not theirs:
        out["queueing"] = {"met": None, "gputopo": mine, "peer": None, "best_peer": None}
    else:
        best, who = min(theirs)
        met = mine <= best * (1 + QUEUE_TOLERANCE) + 1e-9
        out["queueing"] = {"met": met, "gputopo": mine, "peer": who, "best_peer": best}
    return out


def _efficiency(v: float) -> str:
    return f"efficiency {v:.3f}"


def _mark(v: dict[str, Any], fmt: Any) -> str:
    if v["met"] is None:
        return "n/a"
    sign = "✓" if v["met"] else "✗"
    return f"{sign} ({fmt(v['gputopo'])} vs {v['peer']} {fmt(v['best_peer'])})"


def render(
    workload: str, cluster: str, header: dict[str, Any], results: Sequence[Summary], seconds: float
) -> str:
    lines = [
        f"== {workload} on {cluster}: {header['cluster']}",
        f"   {header['workload']}; {header['pods']} pods, mode {header['mode']}; "
        f"{seconds:.1f} s for {len(results)} policies",
    ]
    width = max(len(r.policy) for r in results) + 2
    cols = [max(len(name), *(len(fmt(get(r))) for r in results)) + 2 for name, get, fmt in COLUMNS]
    lines.append(
        "policy".ljust(width) + "".join(n.rjust(w) for (n, _, _), w in zip(COLUMNS, cols, strict=True))
    )
    for r in results:
        lines.append(
            r.policy.ljust(width)
            + "".join(fmt(get(r)).rjust(w) for (_, get, fmt), w in zip(COLUMNS, cols, strict=True))
        )
    v = verdict(results)
    ratio = bool(v) and v["throughput"]["figure"] == "throughput_vs_baseline"
    if v:
        lines.append(
            "gputopo vs best peer: "
            f"throughput {_mark(v['throughput'], _ratio if ratio else _efficiency)}, "
            f"ring {_mark(v['ring'], _pct)}, leaf {_mark(v['leaf'], _pct)}, "
            f"queueing within 5 % {_mark(v['queueing'], _secs)}"
        )
        lines.append(f"   (peers: every policy but {SELF} and {ABLATION}, which is {SELF}'s own ablation)")
    else:
        lines.append(f"no verdict: needs {SELF} and at least one peer among the policies")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(description="issue 10 targets: workloads x cluster presets x policies")
    parser.add_argument("--workloads", default=",".join(TRACES), help=f"comma list of {', '.join(TRACES)}")
    parser.add_argument(
        "--clusters", default=",".join(TARGET_PRESETS), help=f"comma list of {', '.join(TARGET_PRESETS)}"
    )
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma list (default: every policy)")
    parser.add_argument("--pods", type=int, default=20000, help="pods of the generator (default 20000)")
    parser.add_argument(
        "--load",
        type=float,
        default=0.5,
        help="offered load of the generator at the cluster's speed (gputopo simulate --load; default 0.5)",
    )
    parser.add_argument(
        "--load-basis",
        choices=("cluster", "ideal"),
        default="cluster",
        help="what --load counts work at (gputopo simulate --load-basis; ideal: the rounds before)",
    )
    parser.add_argument(
        "--replay-load",
        type=float,
        metavar="F",
        help="pace the Helios and Philly replays to offer load F at each cluster's speed (gputopo "
        "simulate --replay-load; default: the traces' own times, overloading every preset)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--gang-spill-after",
        type=float,
        metavar="SECONDS",
        help="the opt-in wait of gangs and multi-GPU pods for a better domain (gputopo simulate "
        "--gang-spill-after; default: the shipped 0, no wait)",
    )
    parser.add_argument(
        "--queue-order",
        choices=QUEUE_ORDERS,
        default="arrival",
        help="the replays' queue order, the same for every policy (gputopo simulate --queue-order)",
    )
    parser.add_argument(
        "--profile-mix",
        choices=tuple(PROFILE_MIXES),
        default="default",
        help="workload profiles of the jobs (gputopo simulate --profile-mix): default, or the "
        "comm-light cnn / comm-heavy llm extremes",
    )
    parser.add_argument(
        "--traces", default=str(ROOT.parent / "shared" / "traces"), help="folder of the shared traces"
    )
    parser.add_argument("--json", metavar="FILE", help="also write every result into this JSON file")
    args = parser.parse_args(argv)
    workloads = _names(args.workloads, list(TRACES), "--workloads", parser)
    clusters = _names(args.clusters, list(TARGET_PRESETS), "--clusters", parser)
    policies = _names(args.policies, POLICIES, "--policies", parser)
    if args.json and not Path(args.json).resolve().parent.is_dir():
        parser.error(f"--json {args.json}: folder {Path(args.json).parent} does not exist")
    sim = _Parser(prog="gputopo simulate")
    add_arguments(sim)
    runs: list[dict[str, Any]] = []
    started = time.perf_counter()
    try:  # every cell's command line first: a missing trace is reported before any run
        cells = [(w, c, sim.parse_args(_sim_args(w, c, policies, args))) for w in workloads for c in clusters]
        for workload, cluster, sim_args in cells:
            t0 = time.perf_counter()
            topo, jobs, header, config, names = prepare(sim_args)
            results = compare(topo, jobs, names, config)
            seconds = time.perf_counter() - t0
            print(render(workload, cluster, header, results, seconds) + "\n", flush=True)
            runs.append(
                {
                    "workload": workload,
                    "cluster": cluster,
                    "seconds": seconds,
                    "run": header,
                    "verdict": verdict(results),
                    "results": [r.to_dict() for r in results],
                }
            )
    except UsageError as e:
        print(f"bench_targets: error: {e}", file=sys.stderr)
        return 2
    print(_summary(runs, time.perf_counter() - started))
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    return 0


def _summary(runs: Sequence[dict[str, Any]], seconds: float) -> str:
    """One line per cell: which targets gputopo meets (✓), misses (✗) or cannot be judged on."""
    marks = {True: "✓", False: "✗", None: "n/a"}
    lines = [f"targets (gputopo vs best peer), {len(runs)} runs in {seconds:.0f} s:"]
    met = total = 0
    for run in runs:
        v = run["verdict"]
        if not v:
            continue
        cells = []
        for target in ("throughput", "ring", "leaf", "queueing"):
            m = v[target]["met"]
            cells.append(f"{target} {marks[m]}")
            met += m is True
            total += m is not None
        lines.append(f"  {run['workload']:<11} {run['cluster']:<11} " + ", ".join(cells))
    lines.append(f"met {met} of {total} judged targets")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
