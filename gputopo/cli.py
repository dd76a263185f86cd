"""`gputopo`, the node-level debug CLI: the link matrix, what the plugin would pick and why,
and the running plugin's status. Every subcommand works without a GPU through `--topology`.

Commands that need the node itself (`status`, and the NVML probe behind `topo`/`prefer`
without --topology) come from the device-plugin package through entry points
(`gputopo.commands`): this module imports no daemon, gRPC or NVML code.

Exit codes: 0 success, 1 runtime failure (e.g. the plugin is not reachable), 2 bad input
(one line on stderr, never a traceback).
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Sequence
from typing import Any, NoReturn

from gputopo.commands import Missing, UsageError, local_topology, plugin_commands
from gputopo.node.allocator import (
    DISRUPTION_SIZES,
    MAX_GPUS,
    AllocationError,
    Allocator,
    AllocatorPool,
    Choice,
)
from gputopo.node.policy import DEFAULT_POLICY, POLICY_NAMES, UnknownPolicyError, check_name, policy_by_name
from gputopo.node.topofile import HostColumns
from gputopo.node.topology import Topology, TopologyError
from gputopo.numerals import ascii_uint
from gputopo.output import add_output_arguments, add_version_argument, dump, is_machine


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag as one line (not usage + message) with exit code 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _load(source: str | None) -> Topology:
    """A topology the allocator can take, from a preset/file, or from NVML when no --topology."""
    return _load_detail(source)[0]


def _load_detail(source: str | None) -> tuple[Topology, HostColumns | None]:
    """`_load`, with the NIC and affinity columns of `nvidia-smi topo -m` text (else None)."""
    topo, host = _read_topology(source)
    if topo.n > MAX_GPUS:  # a valid file, but every subcommand needs the allocator
        where = "--topology " + source if source is not None else "NVML"
        raise UsageError(f"{where}: {topo.n} GPUs; nodes of more than {MAX_GPUS} GPUs are not supported")
    return topo, host


def _read_topology(source: str | None) -> tuple[Topology, HostColumns | None]:
    if source is not None:
        from gputopo.node.topofile import load_topology_detail

        try:
            return load_topology_detail(source)
        except (TopologyError, OSError) as e:
            text = str(e)  # the loader's message usually names the file already
            raise UsageError(text if source in text else f"--topology {source}: {text}") from None
    return local_topology(), None  # NVML, through the plugin package's entry point


def _ids(text: str | None, topo: Topology, what: str) -> list[int] | None:
    """Comma-separated GPU indices or UUIDs -> indices; duplicates and unknowns are errors."""
    if text is None:
        return None
    out: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        idx = ascii_uint(part)  # not isdigit(): "²" is a digit that int() refuses
        if idx is not None:
            if idx >= topo.n:
                raise UsageError(f"--{what}: GPU index {idx} is not in 0..{topo.n - 1}")
        elif part in topo.index_by_uuid:
            idx = topo.index_by_uuid[part]
        else:
            raise UsageError(f"--{what}: unknown GPU {part!r} (use indices 0..{topo.n - 1} or UUIDs)")
        if idx in out:
            raise UsageError(f"--{what}: GPU {part} listed twice")
        out.append(idx)
    return out


# ---------------------------------------------------------------------------- topo


def topo_document(topo: Topology, host: HostColumns | None = None) -> dict[str, Any]:
    alloc = Allocator(topo)
    doc = topo.to_dict()
    doc["bandwidth_gbps"] = [[topo.gbps(i, j) for j in range(topo.n)] for i in range(topo.n)]
    doc["best_ring_gbps"] = {str(k): alloc.best_ring_mbps(k) / 1000 for k in range(2, topo.n + 1)}
    if host is not None:
        doc["nics"] = [
            {"label": label, "device": device, "links": [row[k] for row in host.gpu_nic]}
            for k, (label, device) in enumerate(host.nics)
        ]
        doc["affinity"] = [dict(zip(host.affinity_columns, row, strict=True)) for row in host.affinity]
    return doc


#: The widest line the default output of every `gputopo` command prints: wider lines wrap in
#: most terminals and in every code review, and a wrapped matrix cannot be read along its rows.
MAX_WIDTH = 120


def render_topo(topo: Topology, host: HostColumns | None = None, *, wide: bool = False) -> str:
    """`nvidia-smi topo -m` layout with each cell's GB/s, plus NUMA, model and best rings; from
    `topo -m` text also its NIC columns (link code to each NIC) and its affinity columns.

    When a row would pass MAX_WIDTH (16 GPUs, or NIC and affinity columns beside the matrix)
    the default output puts the matrix in blocks of GPU columns and the per-GPU columns in a
    table of their own below it; `-o wide` keeps one row per GPU, however long."""
    alloc = Allocator(topo)
    n = topo.n
    cells = [
        ["X" if i == j else f"{topo.code(i, j)}/{topo.gbps(i, j):g}" for j in range(n)] for i in range(n)
    ]
    width = max(7, *(len(c) + 1 for row in cells for c in row))
    nics = [label for label, _ in host.nics] if host else []
    nic_w = max([5, *(len(c) + 1 for row in (host.gpu_nic if host else ()) for c in row)])
    aff_cols = list(host.affinity_columns) if host else []
    aff_w = (
        [max(len(c), *(len(row[k]) for row in host.affinity)) + 2 for k, c in enumerate(aff_cols)]
        if host
        else []
    )
    side_header = (
        "".join(label.ljust(max(nic_w, len(label) + 1)) for label in nics)
        + "NUMA  "
        + "".join(c.ljust(w) for c, w in zip(aff_cols, aff_w, strict=True))
        + "Model"
        + ("  (then UUID, PCI bus id)" if wide else "")
    )

    def side(i: int) -> str:
        numa = "-" if topo.gpus[i].numa is None else str(topo.gpus[i].numa)
        nic_cells = host.gpu_nic[i] if host else ()
        aff_cells = host.affinity[i] if host else ()
        return (
            "".join(c.ljust(max(nic_w, len(label) + 1)) for c, label in zip(nic_cells, nics, strict=True))
            + numa.ljust(6)
            + "".join((c or "-").ljust(w) for c, w in zip(aff_cells, aff_w, strict=True))
            + topo.gpus[i].model
            + (f"  {topo.gpus[i].uuid}  {topo.gpus[i].pci_bus_id or '-'}" if wide else "")
        )

    lines = [
        f"{topo.name}: {n} GPUs, NVLink {topo.settings.nvlink_gbps_per_link:g} GB/s per link, "
        f"NVSwitch: {'yes' if topo.nvswitch else 'no'}   (cell = link code / GB/s one direction)",
    ]
    one_row = 7 + n * width + max(len(side_header), *(len(side(i)) for i in range(n)))
    if wide or one_row <= MAX_WIDTH:
        lines += ["", " " * 7 + "".join(f"GPU{j}".ljust(width) for j in range(n)) + side_header]
        lines += [
            (f"GPU{i}".ljust(7) + "".join(c.ljust(width) for c in cells[i]) + side(i)).rstrip()
            for i in range(n)
        ]
    else:
        per_block = max(1, (MAX_WIDTH - 7) // width)
        blocks = -(-n // per_block)
        size = -(-n // blocks)  # blocks of even size: 8 + 8 rather than 14 + 2
        for start in range(0, n, size):
            cols = range(start, min(n, start + size))
            lines += ["", " " * 7 + "".join(f"GPU{j}".ljust(width) for j in cols).rstrip()]
            lines += [
                (f"GPU{i}".ljust(7) + "".join(cells[i][j].ljust(width) for j in cols)).rstrip()
                for i in range(n)
            ]
        lines += ["", (" " * 7 + side_header).rstrip()]
        lines += [(f"GPU{i}".ljust(7) + side(i)).rstrip() for i in range(n)]
    if host and host.nics:
        lines.append("NICs: " + ", ".join(f"{label}={dev}" if dev else label for label, dev in host.nics))
    lines += ["", "Best ring bandwidth an empty node offers, by request size:"]
    rings = "  ".join(f"{k}: {alloc.best_ring_mbps(k) / 1000:g} GB/s" for k in range(2, n + 1))
    lines += textwrap.wrap(
        rings or "none: a single GPU has no ring", MAX_WIDTH, initial_indent="  ", subsequent_indent="  "
    )
    legend = ", ".join(f"{lvl} {gb:g}" for lvl, gb in topo.settings.pcie_gbps.items())
    lines += ["", f"Legend (GB/s): NV# = # x {topo.settings.nvlink_gbps_per_link:g}; {legend}"]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- prefer


def _leftover(choice: Choice) -> str:
    parts = []
    by_size = {m: (best, count) for m, best, count in choice.disruption}
    for m in DISRUPTION_SIZES:
        if m in by_size:
            best, count = by_size[m]
            parts.append(f"{m}:{best / 1000:g}x{count}")
    return " ".join(parts) or "-"


def _ring_text(choice: Choice) -> str:
    if len(choice.indices) == 1:
        return "n/a (one GPU: no ring, so least disruption decides)"
    return f"{choice.ring_mbps / 1000:g} GB/s (weakest hop of the best NCCL ring)"


def _gpus(topo: Topology, indices: Sequence[int], *, wide: bool) -> str:
    """A GPU set as its indices ("0,4"); under `-o wide` also the UUIDs, which are 40
    characters each and made the default line 360 characters long on a DGX-2."""
    text = ",".join(map(str, indices))
    return f"{text}  ({' '.join(topo.gpus[i].uuid for i in indices)})" if wide else text


def render_prefer(
    topo: Topology,
    ranked: list[Choice],
    free: list[int],
    size: int,
    must: list[int],
    chosen: Choice | None = None,
    policy: str = DEFAULT_POLICY,
    *,
    wide: bool = False,
    others: Sequence[tuple[str, Choice]] = (),
) -> str:
    """`ranked` is gputopo's order; `chosen` what `policy` picks (gputopo's first by default);
    `others` what further policies pick, shown side by side with `policy` (--policy all)."""
    chosen = chosen if chosen is not None else ranked[0]
    by = "" if policy == DEFAULT_POLICY or others else f" by {policy} (the rank below is gputopo's)"
    lines = [
        f"request: {size} GPU(s) from {len(free)} available"
        + (f", must include {','.join(map(str, must))}" if must else ""),
    ]
    if others:
        picks = [(policy, chosen), *others]
        name_w = max(len(n) for n, _ in picks) + 2
        lines += [
            "",
            "policy".ljust(name_w)
            + "gpus".ljust(20)
            + "ring GB/s  leftover (size:best x groups)   pair-sum GB/s",
        ]
        for name, c in picks:
            lines.append(
                (
                    name.ljust(name_w) + f"{','.join(map(str, c.indices)):<20}{c.ring_mbps / 1000:<11g}"
                    f"{_leftover(c):<32}{c.pair_sum_mbps / 1000:g}"
                    + (f"  {' '.join(topo.gpus[i].uuid for i in c.indices)}" if wide else "")
                ).rstrip()
            )
        lines.append("")
        lines.append(f"{policy}'s choice:")
    lines += [
        f"chosen:  GPUs {_gpus(topo, chosen.indices, wide=wide)}{by}",
        f"why:     ring {_ring_text(chosen)};",
        f"         leaves {_leftover(chosen)} (group size: best ring GB/s x disjoint groups);",
        f"         pair sum {chosen.pair_sum_mbps / 1000:g} GB/s",
        "",
        "rank  gpus                ring GB/s  leftover (size:best x groups)   pair-sum GB/s"
        + ("  uuids" if wide else ""),
    ]
    for rank, c in enumerate(ranked, 1):
        row = (
            f"{rank:<6}{','.join(map(str, c.indices)):<20}{c.ring_mbps / 1000:<11g}"
            f"{_leftover(c):<32}{c.pair_sum_mbps / 1000:<15g}"
            + (" ".join(topo.gpus[i].uuid for i in c.indices) if wide else "")
        )
        lines.append(row.rstrip())
    lines.append("")
    lines.append(
        "Keys compare left to right: ring, then leftover groups (8, 4, 2), then pair sum, then lowest indices."
    )
    return "\n".join(lines)


def _policy_names(given: Sequence[str] | None) -> list[str]:
    """--policy as given (repeated, comma lists, or `all`) -> policy names, first one first;
    one line and exit 2 for a name the registry does not know."""
    names: list[str] = []
    for text in given or [DEFAULT_POLICY]:
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            for name in POLICY_NAMES if part == "all" else (part,):
                try:
                    check_name(name)
                except UnknownPolicyError as e:
                    raise UsageError(f"--policy: {e}") from None
                if name not in names:
                    names.append(name)
    if not names:
        raise UsageError("--policy: name a policy, or all")
    return names


# ---------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gputopo", description="Topology-aware GPU scheduling: node-level debug CLI.")
    add_version_argument(parser)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("topo", help="print the link and bandwidth matrix")
    p.add_argument(
        "--topology", help="preset name, topology JSON or `nvidia-smi topo -m` text (default: NVML)"
    )
    add_output_arguments(p)

    p = sub.add_parser("prefer", help="what GetPreferredAllocation would pick, and why")
    p.add_argument(
        "--topology", help="preset name, topology JSON or `nvidia-smi topo -m` text (default: NVML)"
    )
    p.add_argument("--size", type=int, required=True, help="GPUs requested")
    p.add_argument("--available", help="comma-separated GPU indices or UUIDs offered (default: all)")
    p.add_argument("--must", help="comma-separated GPU indices or UUIDs that must be included")
    p.add_argument("--top", type=int, default=5, help="alternatives to show (default 5)")
    p.add_argument(
        "--policy",
        action="append",
        metavar="NAME[,NAME...]|all",
        help=f"in-node policy to ask, as the plugin's --policy ({', '.join(POLICY_NAMES)}; default "
        "gputopo); several (repeated, a comma list, or all) are shown side by side",
    )
    add_output_arguments(p)

    p = sub.add_parser("presets", help="list the built-in server topologies")
    add_output_arguments(p)

    from gputopo.sim import cli as sim_cli  # the simulator is part of the core: always there

    p = sub.add_parser("simulate", help="replay a workload through gputopo and today's policies")
    sim_cli.add_arguments(p)

    from gputopo import steptime as steptime_cli

    p = sub.add_parser("step-time", help="the job-time model's step time and slowdown for one job")
    steptime_cli.add_arguments(p)
    for name, command in plugin_commands(set(sub.choices)).items():
        p = sub.add_parser(name, help=command.help)
        command.add_arguments(p)
        p.set_defaults(plugin_command=command)
    return parser


def _run(args: argparse.Namespace) -> int:
    plugin = getattr(args, "plugin_command", None)
    if plugin is not None:
        return int(plugin.run(args))
    if args.command == "topo":
        topo, host = _load_detail(args.topology)
        if is_machine(args.output):
            print(dump(topo_document(topo, host), args.output))
        else:
            print(render_topo(topo, host, wide=args.output == "wide"))
        return 0
    if args.command == "prefer":
        topo = _load(args.topology)
        free = _ids(args.available, topo, "available")
        free = list(range(topo.n)) if free is None else free
        must = _ids(args.must, topo, "must") or []
        if args.top < 1:
            raise UsageError("--top must be at least 1")
        names = _policy_names(args.policy)
        try:
            pool = AllocatorPool()
            ranked = pool.get(topo).rank(free, args.size, must, top=args.top)
            picks = [(n, policy_by_name(n, topo, pool=pool).choose(free, args.size, must)) for n in names]
        except AllocationError as e:
            raise UsageError(str(e)) from None
        policy, chosen = picks[0]
        if is_machine(args.output):
            doc = {
                "topology": topo.name,
                "size": args.size,
                "available": sorted(free),
                "must": sorted(must),
                "policy": policy,
                "chosen": chosen.explain() | {"uuids": [topo.gpus[i].uuid for i in chosen.indices]},
                "alternatives": [c.explain() for c in ranked],
            }
            if len(picks) > 1:
                doc["by_policy"] = {
                    n: c.explain() | {"uuids": [topo.gpus[i].uuid for i in c.indices]} for n, c in picks
                }
            print(dump(doc, args.output))
        else:
            print(
                render_prefer(
                    topo,
                    ranked,
                    free,
                    args.size,
                    must,
                    chosen,
                    policy,
                    wide=args.output == "wide",
                    others=picks[1:],
                )
            )
        return 0
    if args.command == "presets":
        from gputopo.node.topofile import list_presets, load_preset

        rows = [load_preset(name) for name in list_presets()]
        if args.output == "json":  # one line, as before `-o` existed
            print(json.dumps([{"name": t.name, "gpus": t.n, "description": t.description} for t in rows]))
        elif args.output == "yaml":
            print(dump([{"name": t.name, "gpus": t.n, "description": t.description} for t in rows], "yaml"))
        elif args.output == "wide":
            for t in rows:
                nvlink = f"{t.settings.nvlink_gbps_per_link:g} GB/s/link"
                switch = "NVSwitch" if t.nvswitch else "-"
                print(f"{t.name:<26}{t.n:>3} GPUs  {nvlink:<16}{switch:<10}{t.description}")
        else:  # the description wrapped under itself, so the table keeps to MAX_WIDTH
            for t in rows:
                text = textwrap.wrap(t.description, MAX_WIDTH - 36) or [""]
                print(f"{t.name:<26}{t.n:>3} GPUs  {text[0]}")
                for more in text[1:]:
                    print(" " * 36 + more)
        return 0
    if args.command == "step-time":
        from gputopo import steptime as steptime_cli

        return steptime_cli.run(args, _load(args.topology))
    if args.command == "simulate":
        from gputopo.sim import cli as sim_cli

        try:
            return sim_cli.run(args)
        except getattr(sim_cli, "UsageError", UsageError) as e:
            raise UsageError(str(e)) from None
    raise UsageError(f"unknown command {args.command!r}")  # pragma: no cover - argparse guards it


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        if extra and not isinstance(getattr(args, "plugin_command", None), Missing):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        return _run(args)
    except UsageError as e:
        print(f"gputopo: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
