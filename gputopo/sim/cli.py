"""`gputopo simulate`: argument parsing and wiring; the dispatcher in gputopo/cli.py calls
`add_arguments` and `run`. Every bad input raises UsageError (one line, exit code 2) before
any simulation starts, so a typo never costs a minute of waiting."""

from __future__ import annotations

import argparse
import math
import shutil
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn, TextIO

import numpy as np

from gputopo.jobtime.model import DEFAULT_OVERSUBSCRIPTION
from gputopo.jobtime.profiles import PROFILE_MIXES, Profile
from gputopo.network.levels import ACCELERATOR, CORE, LEAF, SPINE, ZONE, short_name
from gputopo.node.allocator import AllocatorPool
from gputopo.output import add_output_arguments, dump, is_machine
from gputopo.sim.engine import QUEUE_ORDERS, Progress, RunConfig
from gputopo.sim.jobmodel import JobModel, JobTimer
from gputopo.sim.plot import PlotUnavailable, check_available, write_plot
from gputopo.sim.policies.catalog import POLICIES
from gputopo.sim.policies.sidecar import Lifecycle
from gputopo.sim.policies.trees import TREE_POLICIES
from gputopo.sim.report import MAX_WIDTH, document, render_table, render_tree_table, wrap
from gputopo.sim.run import compare
from gputopo.sim.state import SimCluster
from gputopo.sim.traces import TraceError, read_trace
from gputopo.sim.workload import (
    GANG_POD_GPUS,
    Job,
    at_cluster_speed,
    generate,
    offered_load,
    timed_arrivals,
)

#: --jobs: what a job of the workload is (gputopo.sim.trees for "tree").
JOB_SHAPES = ("flat", "tree")

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
        help="offered load of the generator and of --mode arrivals: share of the cluster's GPUs its "
        "jobs keep busy at the cluster's own speed (see --load-basis; default 0.5)",
    )
    g.add_argument(
        "--load-basis",
        choices=("cluster", "ideal"),
        default="cluster",
        help="what --load counts a job's work at: cluster (default): its time on an average GPU of "
        "this cluster, best set, fewest nodes; ideal: its time on the cluster's best servers (on a "
        "cluster of mostly PCIe servers this offers more work than --load says)",
    )
    g.add_argument(
        "--replay-load",
        type=float,
        default=None,
        metavar="F",
        help="scale a replayed trace's submit times so it offers load F at the cluster's speed "
        "(its burstiness kept; default: the trace's own times, whatever load that is)",
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
    g.add_argument(
        "--jobs",
        choices=JOB_SHAPES,
        default="flat",
        help="flat (default): a job is one pod, or a gang of 8-GPU pods; tree: a job of more than 4 "
        "GPUs is a tree of 4-GPU pods (one GB200 tray each) in tensor-parallel groups of k trays "
        "(k in 2..18, by the job's size) and data-parallel replicas, compared under gputopo's tree "
        f"planner and {', '.join(list(TREE_POLICIES)[1:])} (use with --cluster-preset nvl72; "
        'docs/simulator.md "Jobs as trees on NVL72")',
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
        help="opt-in wait: how long a gang waits for one domain of its own level before it takes a "
        "larger one, and a pod of 2+ GPUs for a node at its best ring (default %(default)g: placed "
        "now, as the sidecar's default)",
    )
    g = parser.add_argument_group("job-time model (docs/jobtime.md)")
    g.add_argument(
        "--profile-mix",
        choices=tuple(PROFILE_MIXES),
        default="default",
        help="workload profiles the jobs get, seeded by --seed: default (40 %% cnn, 40 %% encoder, "
        "20 %% llm), or every job one profile: cnn (comm-light), encoder, llm (comm-heavy)",
    )
    g.add_argument(
        "--allreduce-gb",
        type=float,
        default=None,
        help="instead of a mix, every job all-reduces this many GB per step (with --compute-s, --overlap)",
    )
    g.add_argument("--compute-s", type=float, default=None, help="compute per step of that custom job, s")
    g.add_argument(
        "--overlap", type=float, default=None, help="share of compute hiding communication, 0..1 (default 0)"
    )
    g.add_argument(
        "--declared-share",
        type=float,
        default=0.0,
        metavar="F",
        help="share of jobs whose pods declare what they train (gputopo.io/profile), 0..1: gputopo "
        "weighs their placements by that profile instead of the mix (default 0)",
    )
    g.add_argument(
        "--oversubscription",
        metavar="LEVEL=R[,...]",
        default=None,
        help="the fabric's oversubscription above a level, e.g. spine=2,core=4 (levels: accelerator, "
        "leaf, spine, core, zone; default: 1 up to the spine, 2 above, docs/jobtime.md)",
    )
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
    if getattr(args, "jobs", "flat") == "tree":
        return _run_trees(args, out, err, cluster, jobs, header, config, policies)
    total_pods = sum(len(j.pods) for j in jobs)
    results = compare(cluster, jobs, policies, config, progress=_progress_factory(args, err, total_pods))
    if is_machine(args.output):
        out.write(dump(document(results, header, comm), args.output) + "\n")
    else:
        wide = args.output == "wide"
        width = table_width(wide=wide)
        out.write(render_table(results, header, wide=wide, width=width) + "\n")
        if wide:
            model = comm.describe()
            profiles = "; ".join(
                f"{name}: {p['grad_bytes']:.3g} B, {p['compute_s']:g} s, overlap {p['overlap']:.2f}"
                for name, p in model["profiles"].items()  # type: ignore[attr-defined]
            )
            over = ", ".join(
                f"{k.rsplit('/', 1)[-1]} {v:g}:1"
                for k, v in model["oversubscription"].items()  # type: ignore[attr-defined]
            )
            text = f"job-time model (docs/jobtime.md): {profiles}; oversubscription {over}"
            out.write("\n".join(wrap(text, width)) + "\n")
    if args.plot is not None:
        try:
            write_plot(results, args.plot, f"{header['workload']} on {header['cluster']}")
        except OSError as e:  # the folder exists (checked up front) but does not take the file
            raise UsageError(f"--plot {args.plot}: cannot write: {e.strerror or e}") from None
        if not is_machine(args.output):
            out.write(f"plot written to {args.plot}\n")
    return 0


def _run_trees(
    args: argparse.Namespace,
    out: TextIO,
    err: TextIO,
    cluster: SimCluster,
    jobs: list[Job],
    header: dict[str, Any],
    config: RunConfig,
    policies: list[str],
) -> int:
    """`--jobs tree`: the same arrivals as trees (gputopo.sim.trees), every tree policy."""
    from gputopo.sim.treerun import compare_trees
    from gputopo.sim.trees import as_trees

    jobs, trees = as_trees(jobs)
    shapes: dict[tuple[int, int], int] = {}
    for t in trees.values():
        shapes[(t.tp, t.replicas)] = shapes.get((t.tp, t.replicas), 0) + 1
    common = ", ".join(f"{n} x {k}x{d}" for (k, d), n in sorted(shapes.items(), key=lambda x: -x[1])[:4])
    header["jobs"] = (
        f"{len(trees):,} trees of 4-GPU pods (most common TP trays x replicas: {common}), "
        f"{len(jobs) - len(trees):,} single pods"
    )
    header["pods"] = f"{sum(len(j.pods) for j in jobs):,}"
    header.pop("gang lifecycle", None)  # the flat gangs' sidecar lifecycle: not run here
    header["job-time model"] = (
        "trees: gputopo.jobtime.parallel, the llama-70b shape at TP = 4k GPUs (docs/jobtime.md); "
        "single pods: " + str(header.get("job-time model", ""))
    )
    total = sum(len(j.pods) for j in jobs)
    results = compare_trees(
        cluster, jobs, trees, policies, config, progress=_progress_factory(args, err, total)
    )
    if is_machine(args.output):
        out.write(dump(document(results, header, config.comm), args.output) + "\n")
    else:
        out.write(render_tree_table(results, header, width=table_width(wide=args.output == "wide")) + "\n")
    if args.plot is not None and not is_machine(args.output):
        out.write("--plot draws the flat comparison only; no plot for --jobs tree\n")
    return 0


def table_width(*, wide: bool) -> int:
    """The width the table keeps to: the terminal's (COLUMNS first, as `shutil` reads it), at
    most MAX_WIDTH by default so a piped or pasted table stays readable; `-o wide` may use a
    wider terminal. Never below 60, where no row of the table fits anyway."""
    columns = shutil.get_terminal_size((MAX_WIDTH, 24)).columns
    return max(60, columns if wide else min(columns, MAX_WIDTH))


def prepare(args: argparse.Namespace) -> tuple[SimCluster, list[Job], dict[str, Any], RunConfig, list[str]]:
    """Everything a comparison needs, validated: the cluster, the jobs (same arrivals for
    every policy), the table's header, the run's configuration and the policies. `run` and
    bench/bench_targets.py both start here, so the harness measures what the CLI prints."""
    tree = getattr(args, "jobs", "flat") == "tree"
    policies = _tree_policies(args.policies) if tree else _policies(args.policies)
    if tree:
        if getattr(args, "gpu_sharing", False):
            raise UsageError("--jobs tree places whole GPUs; --gpu-sharing does not apply")
        if getattr(args, "mode", "auto") in ("fill", "arrivals"):
            raise UsageError(f"--jobs tree replays arrivals; --mode {args.mode} does not apply")
        if getattr(args, "queue_order", "arrival") != "arrival":
            raise UsageError("--jobs tree keeps arrival order; --queue-order does not apply")
    if args.seed < 0:
        raise UsageError(f"--seed must be a non-negative integer, got {args.seed}")
    if args.pods > MAX_PODS:
        raise UsageError(f"--pods must be at most {MAX_PODS:,}, got {args.pods:,}")
    comm = _comm(args)
    lifecycle = _lifecycle(args, comm)
    if args.plot is not None:  # `--plot ""` is a mistake to report, not "no plot"
        _check_plot_path(args.plot)
    preset = getattr(args, "cluster_preset", None)
    cluster = _cluster(args.cluster, preset)
    if not _usable(cluster):
        raise UsageError(f"--cluster {args.cluster}: every GPU of the cluster is allocated; nothing can run")
    jobs, header, mode = _workload(args, cluster, comm)
    if preset is not None:
        header["cluster"] = f"preset {preset}: {header['cluster']}"
    desc = comm.describe()
    header["job-time model"] = (
        f"profile mix {desc['profile_mix']} ("
        + ", ".join(f"{k} {100 * v:.0f} %" for k, v in desc["shares"].items())  # type: ignore[attr-defined]
        + "), measured model of docs/jobtime.md"
    )
    header["gang lifecycle"] = (
        f"members created within {lifecycle.arrival_spread_s:g} s, reservation TTL "
        f"{lifecycle.reservation_ttl_s:g} s, bind failure rate {lifecycle.bind_failure_rate:g}, "
        + (
            f"waits for its own level up to {lifecycle.spill_after_s:g} s"
            if lifecycle.spill_after_s > 0
            else "placed now in the smallest level that holds it (no wait)"
        )
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


def _tree_policies(text: str) -> list[str]:
    """--policies under --jobs tree: the tree policies (all of them when the flag was left at
    its default, the flat list)."""
    if text == ",".join(POLICIES):
        return list(TREE_POLICIES)
    names = [p.strip() for p in (text or "").split(",") if p.strip()]
    if not names:
        raise UsageError("--policies: name at least one policy")
    for name in names:
        if name not in TREE_POLICIES:
            raise UsageError(
                f"--policies: {name!r} is no tree policy (known with --jobs tree: {', '.join(TREE_POLICIES)})"
            )
    if len(set(names)) != len(names):
        raise UsageError("--policies: a policy is listed twice")
    return names


def _positive(value: float, flag: str) -> float:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise UsageError(f"{flag} must be a positive number, got {value}")
    return float(value)


def _comm(args: argparse.Namespace) -> JobModel:
    """The job-time model: the profile mix, or one custom profile from --allreduce-gb."""
    gb = getattr(args, "allreduce_gb", None)
    compute = getattr(args, "compute_s", None)
    overlap = getattr(args, "overlap", None)
    mix = getattr(args, "profile_mix", "default")
    table = _oversubscription(getattr(args, "oversubscription", None))
    declared = getattr(args, "declared_share", 0.0)
    if not (isinstance(declared, (int, float)) and math.isfinite(declared) and 0 <= declared <= 1):
        raise UsageError(f"--declared-share must be between 0 and 1, got {declared}")
    if gb is None and compute is None and overlap is None:
        return JobModel(mix=mix, seed=args.seed, oversubscription=table, declared_share=float(declared))
    if gb is not None:
        gb = _positive(gb, "--allreduce-gb")
    if compute is not None:
        compute = _positive(compute, "--compute-s")
    if gb is None or compute is None:
        raise UsageError(
            "--allreduce-gb and --compute-s go together (a custom profile instead of --profile-mix)"
        )
    if mix != "default":
        raise UsageError("--profile-mix and --allreduce-gb: give one of them, not both")
    share = 0.0 if overlap is None else overlap
    if not (isinstance(share, (int, float)) and math.isfinite(share) and 0 <= share <= 1):
        raise UsageError(f"--overlap must be between 0 and 1, got {overlap}")
    try:
        custom = Profile("custom", grad_bytes=gb * 1e9, compute_s=compute, overlap=float(share))
    except ValueError as e:
        raise UsageError(str(e)) from None
    return JobModel(seed=args.seed, custom=custom, oversubscription=table, declared_share=float(declared))


#: --oversubscription's level names and the label keys they stand for.
_LEVEL_NAMES = {short_name(level): level for level in (ACCELERATOR, LEAF, SPINE, CORE, ZONE)}


def _oversubscription(text: str | None) -> dict[str, float]:
    """The default table with the levels `text` names (`spine=2,core=4`) replaced."""
    table = dict(DEFAULT_OVERSUBSCRIPTION)
    if text is None:
        return table
    for part in text.split(","):
        name, eq, value = part.strip().partition("=")
        if not eq or name not in _LEVEL_NAMES:
            raise UsageError(
                f"--oversubscription: {part.strip()!r} is not LEVEL=RATIO (levels: {', '.join(_LEVEL_NAMES)})"
            )
        try:
            ratio = float(value)
        except ValueError:
            ratio = math.nan
        if not (math.isfinite(ratio) and 1 <= ratio <= 1000):
            raise UsageError(
                f"--oversubscription {name}: the ratio must be between 1 and 1000, got {value!r}"
            )
        table[_LEVEL_NAMES[name]] = ratio
    return table


def _lifecycle(args: argparse.Namespace, comm: JobModel | None = None) -> Lifecycle:
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
        arrival_spread_s=spread,
        reservation_ttl_s=ttl,
        bind_failure_rate=rate,
        spill_after_s=spill,
        declares=comm if comm is not None and comm.declared_share > 0 else None,
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


def _workload(
    args: argparse.Namespace, cluster: SimCluster, comm: JobModel
) -> tuple[list[Job], dict[str, Any], str]:
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
        if scale != 1.0 or getattr(args, "replay_load", None) is not None:
            raise UsageError(
                f"{_replay_flag(args)} applies to replaying a timed --trace, not to the generator (use --load)"
            )
        if args.pods <= 0:
            raise UsageError(f"--pods must be positive, got {args.pods}")
        if args.mode in ("fill", "arrivals"):
            raise UsageError(
                f"--mode {args.mode} applies to pod lists (--trace); the generator always replays"
            )
        tree = getattr(args, "jobs", "flat") == "tree"
        # a tree is 4-GPU pods: its largest job is as many of them as the cluster holds
        largest = 4 * sum(f // 4 for f in _free(cluster)) if tree else _largest_job(cluster)
        jobs = generate(args.pods, capacity_gpus=_usable(cluster), load=load, rng=rng, max_gpus=largest)
        jobs, pace = _paced(jobs, args, cluster, comm)
        made = sum(len(j.pods) for j in jobs)
        # The generator adds whole jobs until it has --pods pods, so a last gang may add a
        # few more: say so, or "2,000 pods" above "pods: 2,001" reads as a bug.
        asked = "" if made == args.pods else f" (--pods {args.pods:,} rounded up to whole jobs)"
        header["workload"] = (
            f"generator (Helios sizes/durations), {len(jobs):,} jobs, {made:,} pods{asked}, load {load:g}{pace}"
        )
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
        if (scale != 1.0 or getattr(args, "replay_load", None) is not None) and mode != "replay":
            raise UsageError(
                f"{_replay_flag(args)} applies to --mode replay, not {mode} (arrival times are not the trace's)"
            )
        if mode in ("fill", "arrivals"):
            order = rng.permutation(len(jobs))
            jobs = [
                Job(id=jobs[k].id, submit=float(i), duration=math.inf, pods=jobs[k].pods, milli=jobs[k].milli)
                for i, k in enumerate(order)
            ]
        if mode == "arrivals":
            jobs = timed_arrivals(jobs, capacity_gpus=_usable(cluster), load=load, rng=rng)
            jobs, pace = _paced(jobs, args, cluster, comm)
            mode = "replay"
            label = f"arrivals (shuffled, Poisson at load {load:g}{pace}, Alibaba default-list run times)"
        else:
            if mode == "replay":
                jobs, label, offered = _replayed(jobs, args, cluster, comm, label)
                header["offered load"] = f"{offered:.2f} at this cluster's speed"
        header["workload"] = (
            f"{Path(args.trace).name} ({trace.format}, {len(jobs):,} GPU jobs; "
            f"{trace.skipped_cpu_only:,} CPU-only skipped, {trace.fractional_as_whole:,} fractional "
            + ("shared)" if sharing else "as whole)")
        )
        header["mode"] = label
    header["pods"] = f"{sum(len(j.pods) for j in jobs):,}"
    return jobs, header, mode


def _replay_flag(args: argparse.Namespace) -> str:
    """The replay-only flag the user gave, for the error that it does not apply."""
    return "--replay-load" if getattr(args, "replay_load", None) is not None else "--time-scale"


def _speed(cluster: SimCluster, comm: JobModel) -> Callable[[Job], float]:
    """Each job's time on an average GPU of the cluster over its ideal (JobTimer.typical_stretch)."""
    pool = AllocatorPool()
    timer = JobTimer(comm, cluster, [pool.get(t) for t in cluster.topologies])
    return lambda j: timer.typical_stretch(j.id, j.pods)


def _paced(
    jobs: list[Job], args: argparse.Namespace, cluster: SimCluster, comm: JobModel
) -> tuple[list[Job], str]:
    """Generated arrivals paced for --load-basis, and the header's words for it."""
    if getattr(args, "load_basis", "cluster") == "ideal":
        return jobs, " at ideal placement"
    if getattr(args, "jobs", "flat") == "tree":  # a tree's ideal (every TP group in a rack) is reachable
        return jobs, " at ideal placement (--jobs tree)"
    paced, factor = at_cluster_speed(jobs, _speed(cluster, comm))
    return paced, f" at this cluster's speed (work {factor:.2f}x its ideal)"


def _replayed(
    jobs: list[Job], args: argparse.Namespace, cluster: SimCluster, comm: JobModel, label: str
) -> tuple[list[Job], str, float]:
    """A trace replay at its own times (times --time-scale), or paced by --replay-load, its mode
    label, and the load it offers this cluster (the header's "offered load": an overloaded
    replay should read as one)."""
    scale = float(args.time_scale)
    target = getattr(args, "replay_load", None)
    speed = _speed(cluster, comm)
    capacity = _usable(cluster)
    if target is not None:
        target = _positive(target, "--replay-load")
        if scale != 1.0:
            raise UsageError("--replay-load and --time-scale: give one of them, not both")
        own = offered_load(jobs, capacity, speed)
        if not (math.isfinite(own) and own > 0):
            raise UsageError("--replay-load needs a trace whose jobs arrive over a span of time")
        scale = own / target
    if scale != 1.0:
        jobs = [replace(j, submit=j.submit * scale) for j in jobs]
        label = f"replay, time scale {scale:.3g}"
    return jobs, label, offered_load(jobs, capacity, speed)


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
