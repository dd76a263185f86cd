"""`gputopo step-time`: the job-time model's answer for one job (docs/jobtime.md).

    gputopo step-time --topology PRESET|FILE --gpus-per-node 8[,8,...]
        [--level hostname|accelerator|leaf|spine|core|zone] [--nic-gbps 200 --nics-per-node 8]
        (--profile NAME | --grad-bytes B --compute-s S --overlap F) [-o json]

prints the all-reduce bus bandwidth, the communication time, the step time and the slowdown
against the same job on one ideal domain (every GPU in one NVLink domain at the best ring the
server offers). Inside a node the GPUs are the allocator's best set of that size
(gputopo.node.allocator), as the device plugin would hand them out. Bad input raises UsageError
(one line, exit code 2), like every `gputopo` subcommand.
"""

from __future__ import annotations

import argparse
import math
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
    p.add_argument("--grad-bytes", type=float, default=None, help="bytes all-reduced per step")
    p.add_argument("--compute-s", type=float, default=None, help="compute seconds per step")
    p.add_argument("--overlap", type=float, default=None, help="share of compute hiding communication, 0..1")
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


def _workload(args: argparse.Namespace) -> tuple[float, float, float, str]:
    custom = (args.grad_bytes, args.compute_s, args.overlap)
    if args.profile is not None:
        if any(v is not None for v in custom):
            raise UsageError("--profile and --grad-bytes/--compute-s/--overlap: give one of them")
        p = PROFILES[args.profile]
        return p.grad_bytes, p.compute_s, p.overlap, p.name
    if any(v is None for v in custom):
        raise UsageError("give --profile NAME, or all of --grad-bytes, --compute-s and --overlap")
    return float(args.grad_bytes), float(args.compute_s), float(args.overlap), "custom"


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


def answer(args: argparse.Namespace, topo: Topology) -> dict[str, Any]:
    """The model's answer as a document; UsageError for input it cannot use."""
    per_node = _gpus_per_node(args.gpus_per_node, topo)
    grad, compute, overlap, profile = _workload(args)
    level_name = args.level or ("hostname" if len(per_node) == 1 else "leaf")
    level = LEVELS[level_name]
    if len(per_node) > 1 and level == HOSTNAME:
        raise UsageError("--level hostname: a job on several nodes spans at least the accelerator level")
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
            "grad_bytes": grad,
            "compute_s": compute,
            "overlap": overlap,
        }
    )
    return doc


def render(doc: dict[str, Any]) -> str:
    bw = doc["busbw_gbps"]
    nics = doc["nics"]
    lines = [
        f"job: {doc['profile']} ({doc['grad_bytes']:.4g} B all-reduced, {doc['compute_s']:g} s compute, "
        f"overlap {doc['overlap']:g}) on {'+'.join(map(str, doc['gpus_per_node']))} GPUs of "
        f"{doc['topology']}, level {doc['level']}, {nics['count']} x {nics['gbps']:g} Gb/s {nics['fabric']}",
        f"all-reduce bus bandwidth: {'n/a (one GPU)' if bw is None else f'{bw:g} GB/s'}",
        f"communication per step:   {doc['comm_s']:.6g} s",
        f"step time:                {doc['step_s']:.6g} s",
        f"slowdown vs one ideal domain: {doc['slowdown']:.4f}x",
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace, topo: Topology) -> int:
    doc = answer(args, topo)
    print(dump(doc, args.output) if is_machine(args.output) else render(doc))
    return 0
