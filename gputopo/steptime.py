"""`gputopo step-time`: the job-time model's answer for one job (docs/jobtime.md).

    gputopo step-time --topology PRESET|FILE --gpus-per-node 8[,8,...]
        [--level hostname|accelerator|leaf|spine|core|zone] [--nic-gbps 200 --nics-per-node 8]
        (--profile NAME [--grad-bytes B] [--compute-s S] [--overlap F]
         | --grad-bytes B --compute-s S --overlap F
         | --tp-profile NAME [--tensor-parallel T] [--data-parallel D] [--overlap F]) [-o json]

prints the all-reduce bus bandwidth, the communication time, the step time (in ms, each beside
its value on one ideal domain) and the slowdown against the same job on one ideal domain (every GPU in one NVLink domain at the best ring the
server offers). Inside a node the GPUs are the allocator's best set of that size
(gputopo.node.allocator), as the device plugin would hand them out. Bad input raises UsageError
(one line, exit code 2), like every `gputopo` subcommand.
"""

from __future__ import annotations

import argparse
import math
import textwrap
from typing import Any

from gputopo.commands import UsageError
from gputopo.jobtime.model import (
    FABRICS,
    FALLBACK_NICS,
    PRESET_NICS,
    JobTimeError,
    Nics,
    placement_step_time,
)
from gputopo.jobtime.parallel import MAX_PARALLEL, PARALLEL_PROFILES, ParallelProfile, parallel_step_time
from gputopo.jobtime.profiles import PROFILES
from gputopo.network.levels import ACCELERATOR, CORE, HOSTNAME, LEAF, SPINE, ZONE
from gputopo.node.allocator import AllocationError
from gputopo.node.topology import Topology
from gputopo.output import add_output_arguments, dump, is_machine

#: --level's short names and the label keys they stand for.
LEVELS: dict[str, str] = {
    "hostname": HOSTNAME,
    "accelerator": ACCELERATOR,
    "leaf": LEAF,
    "spine": SPINE,
    "core": CORE,
    "zone": ZONE,
}
#: Most nodes one question may name (a gang of 4,096 nodes is already far past any trace).
MAX_NODES = 4096


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", required=True, help="server preset name or topology file")
    p.add_argument(
        "--gpus-per-node", required=True, metavar="G[,G...]", help="the job's GPUs on each node, e.g. 8,8"
    )
    p.add_argument(
        "--level",
        choices=tuple(LEVELS),
        default=None,
        help="smallest network level holding every node (default: hostname for one node, else leaf)",
    )
    p.add_argument("--nic-gbps", type=float, default=None, help="line rate of one NIC, Gb/s")
    p.add_argument("--nics-per-node", type=int, default=None, help="NICs per node for collective traffic")
    p.add_argument(
        "--fabric",
        choices=tuple(FABRICS),
        default=None,
        help="transport of the NICs (default: the preset's, ib)",
    )
    p.add_argument("--profile", choices=tuple(PROFILES), default=None, help="a workload profile")
    p.add_argument(
        "--grad-bytes",
        type=float,
        default=None,
        help="bytes all-reduced per step (with --profile: replaces its figure)",
    )
    p.add_argument(
        "--compute-s",
        type=float,
        default=None,
        help="compute seconds per step (with --profile: replaces its figure)",
    )
    p.add_argument(
        "--overlap",
        type=float,
        default=None,
        help="share of compute hiding communication, 0..1 (with --profile: replaces its figure)",
    )
    p.add_argument(
        "--tp-profile",
        choices=tuple(PARALLEL_PROFILES),
        default=None,
        help="a tensor x data parallel LLM profile: tensor-parallel traffic inside each group, "
        "gradient all-reduce across the replicas",
    )
    p.add_argument(
        "--tensor-parallel",
        type=int,
        default=None,
        metavar="T",
        help="tensor-parallel size (with --tp-profile)",
    )
    p.add_argument(
        "--data-parallel",
        type=int,
        default=None,
        metavar="D",
        help="data-parallel replicas (with --tp-profile; default: the job's GPUs / T, and T x D must equal them)",
    )
    add_output_arguments(p)


def _gpus_per_node(text: str, topo: Topology) -> list[int]:
    parts = [t.strip() for t in text.split(",")]
    if not parts or len(parts) > MAX_NODES:
        raise UsageError(f"--gpus-per-node: give 1 to {MAX_NODES} comma-separated counts")
    out: list[int] = []
    for t in parts:
        if not t.isdigit() or len(t) > 4:
            raise UsageError(f"--gpus-per-node: {t!r} is not a GPU count")
        g = int(t)
        if not 1 <= g <= topo.n:
            raise UsageError(f"--gpus-per-node: {g} GPUs on one node, but {topo.name} has {topo.n}")
        out.append(g)
    return out


def _workload(args: argparse.Namespace) -> tuple[float, float, float, str, list[str]]:
    """Bytes, compute seconds, overlap, the profile's name and the flags that override it.

    A named profile is a starting point: `--profile llm --overlap 0.5` asks "llm, if it hid
    half its communication", the what-if an operator means, so the explicit flags replace
    that profile's fields instead of being refused. Without --profile all three are needed."""
    custom = {"grad_bytes": args.grad_bytes, "compute_s": args.compute_s, "overlap": args.overlap}
    given = [k for k, v in custom.items() if v is not None]
    if args.profile is not None:
        p = PROFILES[args.profile]
        base = {"grad_bytes": p.grad_bytes, "compute_s": p.compute_s, "overlap": p.overlap}
        merged = {k: float(custom[k]) if k in given else base[k] for k in base}
        return merged["grad_bytes"], merged["compute_s"], merged["overlap"], p.name, given
    if len(given) < 3:
        raise UsageError("give --profile NAME, or all of --grad-bytes, --compute-s and --overlap")
    return float(args.grad_bytes), float(args.compute_s), float(args.overlap), "custom", []


def _nics(args: argparse.Namespace, topo: Topology) -> Nics:
    base = PRESET_NICS.get(topo.name, FALLBACK_NICS)
    try:
        return Nics(
            base.count if args.nics_per_node is None else args.nics_per_node,
            base.gbps if args.nic_gbps is None else args.nic_gbps,
            base.fabric if args.fabric is None else args.fabric,
        )
    except JobTimeError as e:
        raise UsageError(f"--nic-gbps/--nics-per-node: {e}") from None


def _level(args: argparse.Namespace, per_node: list[int]) -> tuple[str, str]:
    level_name = args.level or ("hostname" if len(per_node) == 1 else "leaf")
    if len(per_node) > 1 and level_name == "hostname":
        raise UsageError("--level hostname: a job on several nodes spans at least the accelerator level")
    return level_name, LEVELS[level_name]


def _parallel_profile(args: argparse.Namespace, total: int) -> ParallelProfile:
    """The --tp-profile with --tensor-parallel / --overlap applied; checks T x D = the job's GPUs."""
    given = [
        f
        for f, v in (
            ("--profile", args.profile),
            ("--grad-bytes", args.grad_bytes),
            ("--compute-s", args.compute_s),
        )
        if v is not None
    ]
    if given:
        raise UsageError(f"--tp-profile takes no {', '.join(given)} (it has its own workload)")
    profile = PARALLEL_PROFILES[args.tp_profile]
    t = profile.tensor_parallel if args.tensor_parallel is None else args.tensor_parallel
    if not 1 <= t <= MAX_PARALLEL:
        raise UsageError(f"--tensor-parallel must be 1..{MAX_PARALLEL}, got {t}")
    if total % t:
        raise UsageError(f"--tensor-parallel {t}: the job's {total} GPUs do not split into groups of {t}")
    if args.data_parallel is not None and args.data_parallel * t != total:
        raise UsageError(
            f"--data-parallel {args.data_parallel} x --tensor-parallel {t} is "
            f"{args.data_parallel * t} GPUs, but --gpus-per-node places {total}"
        )
    try:
        profile = profile.with_tensor_parallel(t)
        return profile if args.overlap is None else profile.with_overlap(float(args.overlap))
    except JobTimeError as e:
        raise UsageError(str(e)) from None


def parallel_answer(args: argparse.Namespace, topo: Topology) -> dict[str, Any]:
    """The model's answer for a tensor x data parallel job; UsageError for input it cannot use."""
    per_node = _gpus_per_node(args.gpus_per_node, topo)
    profile = _parallel_profile(args, sum(per_node))
    level_name, level = _level(args, per_node)
    nics = _nics(args, topo)
    try:
        result = parallel_step_time(topo, per_node, level, nics, profile)
    except (JobTimeError, AllocationError) as e:
        raise UsageError(str(e)) from None
    doc: dict[str, Any] = result.to_dict()
    doc.update(
        {
            "topology": topo.name,
            "gpus_per_node": per_node,
            "level": level_name,
            "nics": nics.to_dict(),
            "tp_profile": profile.to_dict(),
        }
    )
    return doc


def answer(args: argparse.Namespace, topo: Topology) -> dict[str, Any]:
    """The model's answer as a document; UsageError for input it cannot use."""
    if args.tp_profile is None and (args.tensor_parallel is not None or args.data_parallel is not None):
        raise UsageError("--tensor-parallel and --data-parallel need --tp-profile NAME")
    if args.tp_profile is not None:
        return parallel_answer(args, topo)
    per_node = _gpus_per_node(args.gpus_per_node, topo)
    grad, compute, overlap, profile, overridden = _workload(args)
    level_name, level = _level(args, per_node)
    nics = _nics(args, topo)
    try:
        result = placement_step_time(topo, per_node, level, nics, grad, compute, overlap)
    except (JobTimeError, AllocationError) as e:
        raise UsageError(str(e)) from None
    ideal = result.ideal_busbw_gbps
    doc: dict[str, Any] = result.to_dict()
    doc.update(
        {
            "ideal_busbw_gbps": None if math.isinf(ideal) else round(ideal, 3),
            "ideal_step_s": result.ideal_step_s,
            "topology": topo.name,
            "gpus_per_node": per_node,
            "level": level_name,
            "nics": nics.to_dict(),
            "profile": profile,
            "overridden": overridden,
            "grad_bytes": grad,
            "compute_s": compute,
            "overlap": overlap,
        }
    )
    return doc


def _time(seconds: float) -> str:
    """A step's time as a person reads it: milliseconds below 1 s, three figures."""
    if not math.isfinite(seconds):
        return "n/a"
    return f"{seconds * 1000:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def render(doc: dict[str, Any]) -> str:
    """The answer in lines of at most 120 characters: the job, then each figure beside the
    same figure on one ideal domain, so the slowdown can be checked by eye."""
    bw = doc["busbw_gbps"]
    ideal_bw = None if bw is None else doc["ideal_busbw_gbps"]  # one GPU all-reduces nothing
    nics = doc["nics"]
    name = doc["profile"]
    if doc.get("overridden"):
        name += " with " + ", ".join(f"--{k.replace('_', '-')} {doc[k]:g}" for k in doc["overridden"])
    job = (
        f"job: {name} ({doc['grad_bytes'] / 1e9:.3g} GB all-reduced per step, {_time(doc['compute_s'])} "
        f"compute, overlap {doc['overlap']:g}) on {'+'.join(map(str, doc['gpus_per_node']))} GPU{'s' if sum(doc['gpus_per_node']) > 1 else ''} of "
        f"{doc['topology']}, level {doc['level']}, {nics['count']} x {nics['gbps']:g} Gb/s {nics['fabric']}"
    )
    ideal_step = doc["ideal_step_s"]
    lines = [
        *textwrap.wrap(job, 120, subsequent_indent="     ", break_on_hyphens=False),
        "",
        f"{'':<26}{'this placement':>16}{'one ideal domain':>20}",
        f"{'all-reduce bus bandwidth':<26}{_gbps(bw):>16}{_gbps(ideal_bw):>20}",
        f"{'communication per step':<26}{_time(doc['comm_s']):>16}",
        f"{'step time':<26}{_time(doc['step_s']):>16}{_time(ideal_step):>20}",
        f"slowdown vs one ideal domain: {doc['slowdown']:.3f}x (step time / ideal step time)",
        "",
        "one ideal domain: the same GPUs in one NVLink domain at the best ring the server offers",
    ]
    return "\n".join(
        textwrap.fill(line, 120, subsequent_indent="  ") if len(line) > 120 else line for line in lines
    )


def _gbps(v: float | None) -> str:
    return "n/a (one GPU)" if v is None else f"{v:g} GB/s"


def _bw(v: float | None) -> str:
    return "-" if v is None else f"{v:g} GB/s"


def render_parallel(doc: dict[str, Any]) -> str:
    """A tensor x data parallel answer in lines of at most 120 characters: the tensor-parallel
    part, the data-parallel part and the step, each beside the same job with its tensor-parallel
    groups inside one NVLink domain and on one ideal domain."""
    p = doc["tp_profile"]
    nics = doc["nics"]
    t, d = doc["tensor_parallel"], doc["data_parallel"]
    job = (
        f"job: {p['name']} ({p['params'] / 1e9:g} B parameters, {p['layers']} layers, hidden {p['hidden']}, "
        f"{p['tokens']} tokens per replica step, {_time(p['compute_s'] / t)} compute per GPU, overlap "
        f"{p['overlap']:g}), tensor parallel {t} x data parallel {d} on "
        f"{'+'.join(map(str, doc['gpus_per_node']))} GPUs of {doc['topology']}, level {doc['level']}, "
        f"{nics['count']} x {nics['gbps']:g} Gb/s {nics['fabric']}"
    )
    groups = d
    head = f"{'':<34}{'this placement':>16}{'TP inside NVLink':>18}{'one ideal domain':>18}"
    ideal_bw = _bw(doc["ideal_busbw_gbps"])
    lines = [
        *textwrap.wrap(job, 120, subsequent_indent="     ", break_on_hyphens=False),
        "",
        head,
        f"{'tensor-parallel bus bandwidth':<34}{_bw(doc['tp_busbw_gbps']):>16}"
        f"{_bw(doc['inside_tp_busbw_gbps']):>18}{ideal_bw if t > 1 else '-':>18}",
        f"{'tensor-parallel per step':<34}{_time(doc['tp_comm_s']):>16}",
        f"{'data-parallel bus bandwidth':<34}{_bw(doc['dp_busbw_gbps']):>16}"
        f"{_bw(doc['dp_busbw_gbps']):>18}{ideal_bw if d > 1 else '-':>18}",
        f"{'data-parallel per step':<34}{_time(doc['dp_comm_s']):>16} ({_time(doc['dp_exposed_s'])} not hidden)",
        f"{'step time':<34}{_time(doc['step_s']):>16}{_time(doc['inside_step_s']):>18}"
        f"{_time(doc['ideal_step_s']):>18}",
        f"tensor-parallel groups straddling NVLink domains: {doc['straddling_groups']} of {groups}; "
        f"slowdown vs the groups inside one: {doc['straddle_slowdown']:.3f}x",
        f"slowdown vs one ideal domain: {doc['slowdown']:.3f}x (step time / ideal step time)",
        "",
        "TP inside NVLink: the same placement with every tensor-parallel group inside one NVLink domain;",
        "one ideal domain: every GPU in one NVLink domain at the best ring the server offers",
    ]
    return "\n".join(
        textwrap.fill(line, 120, subsequent_indent="  ") if len(line) > 120 else line for line in lines
    )


def run(args: argparse.Namespace, topo: Topology) -> int:
    doc = answer(args, topo)
    if is_machine(args.output):
        print(dump(doc, args.output))
    else:
        print(render_parallel(doc) if "tp_profile" in doc else render(doc))
    return 0
