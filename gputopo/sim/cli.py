"""`gputopo simulate`: argument parsing and wiring; the dispatcher in gputopo/cli.py calls
`add_arguments` and `run`. Every bad input raises UsageError (one line, exit code 2) before
any simulation starts, so a typo never costs a minute of waiting."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn, TextIO

import numpy as np

from gputopo.output import add_output_arguments, dump, is_machine
from gputopo.sim.comm import CommModel
from gputopo.sim.engine import QUEUE_ORDERS, Progress, RunConfig
from gputopo.sim.plot import PlotUnavailable, check_available, write_plot
from gputopo.sim.policies.catalog import POLICIES
from gputopo.sim.policies.sidecar import Lifecycle
from gputopo.sim.report import document, render_table
from gputopo.sim.run import compare
from gputopo.sim.state import SimCluster
from gputopo.sim.traces import TraceError, read_trace
from gputopo.sim.workload import GANG_POD_GPUS, Job, generate, timed_arrivals

#: Largest generated workload; a mistyped --pods should not eat the machine's memory.
MAX_PODS = 5_000_000


class UsageError(Exception):
    """Bad input from the user: reported as one line, exit code 2."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("workload")
    g.add_argument(
        "--trace",
        metavar="FILE",
        help="Alibaba openb pod list, or a Helios/Philly job CSV (default: embedded generator)",
    )
    g.add_argument("--pods", type=int, default=20000, help="pods the generator makes (default 20000)")
    g.add_argument(
        "--load",
        type=float,
        default=0.5,
        help="offered load of the generator and of --mode arrivals, share of cluster GPUs at ideal placement (default 0.5)",
    )
    g.add_argument(
        "--limit", type=int, default=None, metavar="N", help="use only the first N jobs of --trace"
    )
    g.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        metavar="F",
        help="multiply trace submit times by F (<1 packs arrivals tighter; default 1)",
    )
    g.add_argument(
        "--mode",
        choices=("auto", "replay", "fill", "arrivals"),
        default="auto",
        help="replay: trace times; fill: FGD-style, no departures; arrivals: untimed list with "
        "Poisson arrivals at --load and Alibaba run times (auto: fill for untimed lists)",
    )
    g = parser.add_argument_group("cluster and policies")
    g.add_argument(
        "--cluster",
        metavar="FILE",
        help="cluster snapshot (design.md §4); default: 2 spines x 4 leaves x 8 mixed nodes",
    )
    g.add_argument(
        "--cluster-preset",
        metavar="NAME",
        help=f"a named cluster shape instead of a snapshot: {', '.join(_preset_names())} "
        "(docs/simulator.md; default: the default preset)",
    )
    g.add_argument(
        "--policies", default=",".join(POLICIES), help=f"comma list (default: {','.join(POLICIES)})"
    )
    g.add_argument("--seed", type=int, default=0, help="seed of the generator, fill order and kubelet order")
    g.add_argument(
        "--gpu-sharing",
        action="store_true",
        help="fractional openb pods (gpu_milli < 1000) share GPUs under the policies whose systems "
        "share (kubelet-default, best-combo, fgd); GPU figures then count milli-GPUs (default: off)",
    )
    g.add_argument(
        "--queue-order",
        choices=QUEUE_ORDERS,
        default="arrival",
        help="which waiting job a replay tries first, the same for every policy: arrival (oldest "
        "first, as kube-scheduler and Kueue; default) or smallest (fewest GPUs first, as Slurm's "
        "PriorityFavorSmall): a what-if for the queue discipline",
    )
    g = parser.add_argument_group("gang lifecycle (gputopo policy: the sidecar's path over time)")
    g.add_argument(
        "--gang-spread",
        type=float,
        default=Lifecycle.arrival_spread_s,
        metavar="S",
        help=f"a gang's members are created within S seconds (default {Lifecycle.arrival_spread_s:g})",
    )
    g.add_argument(
        "--reservation-ttl",
        type=float,
        default=Lifecycle.reservation_ttl_s,
        metavar="S",
        help=f"a plan's reservations lapse after S seconds without a bind (default {Lifecycle.reservation_ttl_s:g})",
    )
    g.add_argument(
        "--bind-failure-rate",
        type=float,
        default=Lifecycle.bind_failure_rate,
        metavar="P",
        help="share of gang member binds the API server refuses, 0 <= P < 1 (default 0)",
    )
    g.add_argument(
        "--gang-spill-after",
        type=float,
        default=Lifecycle.spill_after_s,
        metavar="SECONDS",
        help="how long a gang waits for one domain of its own level before it takes a slower one, "
        "and a pod of 2+ GPUs for a node at its best ring (0: at once, the behaviour before; default %(default)g)",
    )
    g = parser.add_argument_group("communication model")
    g.add_argument(
        "--allreduce-gb", type=float, default=1.0, help="all-reduce payload per step, GB (default 1)"
    )
    g.add_argument("--compute-s", type=float, default=0.2, help="compute time per step, s (default 0.2)")
    g = parser.add_argument_group("output")
    add_output_arguments(g)  # wide: the table, then the communication model's constants
    g.add_argument("--plot", metavar="PNG", help="also draw the comparison into this PNG (needs matplotlib)")
    g.add_argument("--progress", action="store_true", help="show a progress bar even when stderr is no TTY")


def run(args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Validate, simulate every policy on the same arrivals, print; raises UsageError on bad input."""
    out = out or sys.stdout
    err = err or sys.stderr
    cluster, jobs, header, config, policies = prepare(args)
    comm = config.comm
    total_pods = sum(len(j.pods) for j in jobs)
    results = compare(cluster, jobs, policies, config, progress=_progress_factory(args, err, total_pods))
    if is_machine(args.output):
        out.write(dump(document(results, header, comm), args.output) + "\n")
    else:
        out.write(render_table(results, header) + "\n")
        if args.output == "wide":
            model = document(results, header, comm)["comm_model"]
            levels = ", ".join(f"{k.rsplit('/', 1)[-1]} {v:g}" for k, v in model.pop("level_gbps").items())
            constants = ", ".join(f"{k} {v:g}" for k, v in model.items() if isinstance(v, (int, float)))
            out.write(f"communication model: {constants}; GB/s per GPU by level: {levels}\n")
    if args.plot is not None:
        try:
            write_plot(results, args.plot, f"{header['workload']} on {header['cluster']}")
        except OSError as e:  # the folder exists (checked up front) but does not take the file
            raise UsageError(f"--plot {args.plot}: cannot write: {e.strerror or e}") from None
        if not is_machine(args.output):
            out.write(f"plot written to {args.plot}\n")
    return 0


def prepare(args: argparse.Namespace) -> tuple[SimCluster, list[Job], dict[str, Any], RunConfig, list[str]]:
    """Everything a comparison needs, validated: the cluster, the jobs (same arrivals for
    every policy), the table's header, the run's configuration and the policies. `run` and
    bench/bench_targets.py both start here, so the harness measures what the CLI prints."""
    policies = _policies(args.policies)
    if args.seed < 0:
        raise UsageError(f"--seed must be a non-negative integer, got {args.seed}")
    if args.pods > MAX_PODS:
        raise UsageError(f"--pods must be at most {MAX_PODS:,}, got {args.pods:,}")
    comm = _comm(args)
    lifecycle = _lifecycle(args)
    if args.plot is not None:  # `--plot ""` is a mistake to report, not "no plot"
        _check_plot_path(args.plot)
    preset = getattr(args, "cluster_preset", None)
    cluster = _cluster(args.cluster, preset)
    if not _usable(cluster):
        raise UsageError(f"--cluster {args.cluster}: every GPU of the cluster is allocated; nothing can run")
    jobs, header, mode = _workload(args, cluster)
    if preset is not None:
        header["cluster"] = f"preset {preset}: {header['cluster']}"
    header["gang lifecycle"] = (
        f"members created within {lifecycle.arrival_spread_s:g} s, reservation TTL "
        f"{lifecycle.reservation_ttl_s:g} s, bind failure rate {lifecycle.bind_failure_rate:g}, "
        f"waits for its own level up to {lifecycle.spill_after_s:g} s"
    )
    sharing = bool(getattr(args, "gpu_sharing", False))
    if sharing:
        header["gpu sharing"] = _sharing_line(policies)
    order = getattr(args, "queue_order", "arrival")
    if order != "arrival":
        if mode != "replay":
            raise UsageError(f"--queue-order {order}: a fill places jobs in list order and has no queue")
        header["queue order"] = f"{order} first (the same for every policy)"
    config = RunConfig(
        mode=mode, seed=args.seed, comm=comm, lifecycle=lifecycle, gpu_sharing=sharing, queue_order=order
    )
    return cluster, jobs, header, config, policies


def _sharing_line(policies: list[str]) -> str:
    """The header line of a --gpu-sharing run: who shares, who counts a share as a whole GPU."""
    from gputopo.sim.sharing import shares

    share = [p for p in policies if shares(p)]
    whole = [p for p in policies if not shares(p)]
    parts = [f"fractional pods take gpu_milli of one GPU under {', '.join(share)}"] if share else []
    if whole:
        parts.append(f"{', '.join(whole)} hand out whole GPUs (a fractional pod takes one)")
    return (
        "on: " + "; ".join(parts) + "; GPU counts in milli-GPUs (free share of a partly used GPU unallocated)"
    )


def _policies(text: str) -> list[str]:
    names = [p.strip() for p in (text or "").split(",") if p.strip()]
    if not names:
        raise UsageError("--policies: name at least one policy")
    for name in names:
        if name not in POLICIES:
            raise UsageError(f"--policies: unknown policy {name!r} (known: {', '.join(POLICIES)})")
    if len(set(names)) != len(names):
        raise UsageError("--policies: a policy is listed twice")
    return names


def _positive(value: float, flag: str) -> float:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise UsageError(f"{flag} must be a positive number, got {value}")
    return float(value)


def _comm(args: argparse.Namespace) -> CommModel:
    gb = _positive(args.allreduce_gb, "--allreduce-gb")
    compute = _positive(args.compute_s, "--compute-s")
    return CommModel(allreduce_bytes=gb * 1e9, compute_s=compute)


def _lifecycle(args: argparse.Namespace) -> Lifecycle:
    spread, ttl, rate = args.gang_spread, args.reservation_ttl, args.bind_failure_rate
    if not (math.isfinite(spread) and 0 <= spread <= 86_400):
        raise UsageError(f"--gang-spread must be between 0 and 86400 seconds, got {spread}")
    if not (math.isfinite(ttl) and 0 < ttl <= 86_400):
        raise UsageError(f"--reservation-ttl must be more than 0 and at most 86400 seconds, got {ttl}")
    if not (math.isfinite(rate) and 0 <= rate <= 0.9):
        raise UsageError(f"--bind-failure-rate must be between 0 and 0.9, got {rate}")
    spill = args.gang_spill_after
    if not (math.isfinite(spill) and 0 <= spill <= 10 * 365 * 86_400):
        raise UsageError(f"--gang-spill-after must be between 0 and 315360000 seconds, got {spill}")
    return Lifecycle(
        arrival_spread_s=spread, reservation_ttl_s=ttl, bind_failure_rate=rate, spill_after_s=spill
    )


def _check_plot_path(path: str) -> None:
    try:
        check_available()
    except PlotUnavailable as e:
        raise UsageError(str(e)) from None
    target = Path(path)
    if not path.strip():
        raise UsageError("--plot: give a PNG file name")
    if target.is_dir():
        raise UsageError(f"--plot {path}: is a directory")
    if target.exists() and not target.is_file():  # a FIFO would block the write, a device eat it
        raise UsageError(f"--plot {path}: exists and is not a regular file")
    if not target.parent.exists():
        raise UsageError(f"--plot {path}: directory {target.parent} does not exist")


def _preset_names() -> list[str]:
    from gputopo.sim.clusters import CLUSTER_PRESETS

    return list(CLUSTER_PRESETS)


def _cluster(path: str | None, preset: str | None = None) -> SimCluster:
    from gputopo.sim.clusters import CLUSTER_PRESETS, default_cluster, load_cluster_file, preset_cluster

    if preset is not None:
        if path is not None:
            raise UsageError("--cluster and --cluster-preset: give one of them, not both")
        if preset not in CLUSTER_PRESETS:
            raise UsageError(
                f"--cluster-preset {preset!r}: unknown preset (known: {', '.join(CLUSTER_PRESETS)})"
            )
        return preset_cluster(preset)
    if path is None:
        return default_cluster()
    try:
        return load_cluster_file(path)
    except (OSError, ValueError) as e:
        raise UsageError(f"--cluster {path}: {e}") from None


def _workload(args: argparse.Namespace, cluster: SimCluster) -> tuple[list[Job], dict[str, Any], str]:
    rng = np.random.default_rng(args.seed)
    header: dict[str, Any] = {
        "cluster": _describe(cluster),
        "seed": args.seed,
    }
    if args.limit is not None and args.limit <= 0:
        raise UsageError(f"--limit must be positive, got {args.limit}")
    scale = _positive(args.time_scale, "--time-scale")
    load = _positive(args.load, "--load")
    sharing = bool(getattr(args, "gpu_sharing", False))
    if args.trace is None:
        if sharing:
            raise UsageError(
                "--gpu-sharing applies to Alibaba openb pod lists (--trace with gpu_milli); "
                "the generator makes whole-GPU jobs"
            )
        if scale != 1.0:
            raise UsageError(
                "--time-scale applies to replaying a timed --trace, not to the generator (use --load)"
            )
        if args.pods <= 0:
            raise UsageError(f"--pods must be positive, got {args.pods}")
        if args.mode in ("fill", "arrivals"):
            raise UsageError(
                f"--mode {args.mode} applies to pod lists (--trace); the generator always replays"
            )
        jobs = generate(
            args.pods, capacity_gpus=_usable(cluster), load=load, rng=rng, max_gpus=_largest_job(cluster)
        )
        header["workload"] = f"generator (Helios sizes/durations), {args.pods:,} pods, load {load:g}"
        mode = "replay"
        header["mode"] = mode
    else:
        try:
            trace = read_trace(args.trace)
        except TraceError as e:
            raise UsageError(str(e)) from None
        if sharing and trace.format == "jobs":
            raise UsageError(
                f"--trace {args.trace}: a job list has no gpu_milli; --gpu-sharing applies to "
                "Alibaba openb pod lists"
            )
        jobs = list(trace.jobs)
        if args.limit is not None:
            jobs = jobs[: args.limit]
        mode = args.mode if args.mode != "auto" else ("replay" if trace.timed else "fill")
        if mode == "replay" and not trace.timed:
            raise UsageError(f"--trace {args.trace}: has no times; use --mode fill or --mode arrivals")
        label = mode
        if scale != 1.0 and mode != "replay":
            raise UsageError(
                f"--time-scale applies to --mode replay, not {mode} (arrival times are not the trace's)"
            )
        if mode in ("fill", "arrivals"):
            order = rng.permutation(len(jobs))
            jobs = [
                Job(id=jobs[k].id, submit=float(i), duration=math.inf, pods=jobs[k].pods, milli=jobs[k].milli)
                for i, k in enumerate(order)
            ]
        if mode == "arrivals":
            jobs = timed_arrivals(jobs, capacity_gpus=_usable(cluster), load=load, rng=rng)
            mode = "replay"
            label = f"arrivals (shuffled, Poisson at load {load:g}, Alibaba default-list run times)"
        elif mode == "replay" and scale != 1.0:
            jobs = [replace(j, submit=j.submit * scale) for j in jobs]
            label = f"replay, time scale {scale:g}"
        header["workload"] = (
            f"{Path(args.trace).name} ({trace.format}, {len(jobs):,} GPU jobs; "
            f"{trace.skipped_cpu_only:,} CPU-only skipped, {trace.fractional_as_whole:,} fractional "
            + ("shared)" if sharing else "as whole)")
        )
        header["mode"] = label
    header["pods"] = f"{sum(len(j.pods) for j in jobs):,}"
    return jobs, header, mode


def _free(cluster: SimCluster) -> list[int]:
    """GPUs per node the run can use: a snapshot's allocated GPUs stay taken throughout."""
    return [cluster.topologies[n.topology].n - len(n.allocated) for n in cluster.nodes]


def _usable(cluster: SimCluster) -> int:
    return sum(_free(cluster))


def _largest_job(cluster: SimCluster) -> int:
    """The biggest job the cluster can ever run: as many 8-GPU gang pods as fit, or one node."""
    sizes = _free(cluster)
    slots = sum(s // GANG_POD_GPUS for s in sizes)
    return GANG_POD_GPUS * slots if slots else max(sizes)


def _describe(cluster: SimCluster) -> str:
    counts: dict[str, int] = {}
    for node in cluster.nodes:
        name = cluster.topologies[node.topology].name
        counts[name] = counts.get(name, 0) + 1
    kinds = ", ".join(f"{v} x {k}" for k, v in counts.items())
    usable = _usable(cluster)
    free = f", {usable} free" if usable != cluster.capacity else ""
    return f"{len(cluster.nodes)} nodes / {cluster.capacity} GPUs{free} ({kinds})"


def _progress_factory(args: argparse.Namespace, err: TextIO, total: int) -> Callable[[str], Progress] | None:
    """A tqdm bar per policy on stderr, only on a TTY or with --progress (and only if tqdm exists)."""
    if not (args.progress or (hasattr(err, "isatty") and err.isatty())):
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None

    def factory(name: str) -> Progress:
        bar = tqdm(total=total, desc=f"{name:>17}", unit="pod", file=err, leave=True)

        def update(done: int) -> None:
            bar.update(max(0, min(done, total) - bar.n))
            if done >= total:
                bar.close()

        return update

    return factory


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag as one line (not usage + message), like `gputopo`."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def main(argv: list[str] | None = None) -> int:
    """`python -m gputopo.sim` until (and besides) the `gputopo simulate` dispatcher."""
    parser = _Parser(
        prog="gputopo simulate",
        description="replay a workload through gputopo and the allocators people run today",
    )
    add_arguments(parser)
    try:
        return run(parser.parse_args(argv))
    except UsageError as e:
        print(f"gputopo simulate: error: {e}", file=sys.stderr)
        return 2
