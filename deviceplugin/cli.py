"""The node-side commands of `gputopo`, contributed through entry points. They are `gputopo
status` (ask the running plugin over its socket) and the NVML topology source that `gputopo
topo` / `prefer` use without --topology (pyproject.toml names both).

They live here, not in the core, because they need what only the plugin package has (its
socket layout and status client over gRPC, the NVML backend); the core `gputopo/cli.py` finds
them with `importlib.metadata` and imports nothing of this package (see gputopo/commands.py).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Any

from gputopo.commands import UsageError
from gputopo.node.topology import Topology
from gputopo.output import add_output_arguments, ago, dump, is_machine, table, yes_no


def local_topology() -> Topology:
    """The node's topology from NVML (entry point `gputopo.topology_sources: nvml`)."""
    from deviceplugin.hardware.nvml import NvmlBackend, NvmlUnavailable

    try:
        backend = NvmlBackend()
        try:
            return backend.discover()
        finally:
            backend.close()
    except NvmlUnavailable as e:
        raise UsageError(f"no --topology given and NVML is unavailable: {e}") from None


#: Reasons longer than this are cut in the table (`-o wide` prints them whole).
REASON_WIDTH = 60


def render_status(doc: dict[str, Any], *, now: float, wide: bool = False) -> str:
    """Plugin status for a person: version, settings, registration with times as "3 min ago",
    then one row per GPU aligned on its widest cell, the health reason (free text) last."""
    reg = doc.get("registration") or {}
    folder = str(doc.get("kubelet_dir", ""))
    lines = [
        f"plugin version: {doc.get('version') or 'unknown (this plugin does not report it)'}",
        f"node: {doc.get('node_name') or '-'}",
        f"resource: {doc.get('resource_name', '')}",
        f"backend: {doc.get('backend', '')}  topology: {doc.get('topology_name', '')}",
        f"device list strategy: {doc.get('device_list_strategy', '')}",
        f"socket: {os.path.join(folder, str(doc.get('socket_name', '')))}",
        f"kubelet streams: {doc.get('watchers', 0)}",
    ]
    last = float(reg.get("last_registration_unix") or 0.0)
    registered = f"registered: {yes_no(reg.get('registered'))}"
    if last > 0:
        count = int(reg.get("count") or 0)
        registered += f" (last {ago(now - last)}, {count} time{'' if count == 1 else 's'} since start)"
    lines.append(registered)
    if reg.get("last_error"):
        failed = int(reg.get("failed_attempts") or 0)
        lines.append(
            f"registration error: {reg['last_error']} ({failed} failed attempt{'' if failed == 1 else 's'})"
        )
    devices = doc.get("devices") or []
    if devices:
        header = ["GPU", "health", "NUMA", "UUID", "model", *(["PCI bus id"] if wide else []), "reason"]
        rows = []
        for d in devices:
            numa = d.get("numa")
            reason = str(d.get("health_reason") or "")
            if not wide and len(reason) > REASON_WIDTH:
                reason = reason[: REASON_WIDTH - 1] + "…"
            rows.append(
                [
                    str(d.get("index", "?")),
                    "Healthy" if d.get("healthy") else "Unhealthy",
                    "-" if numa is None or numa < 0 else str(numa),
                    str(d.get("uuid", "")),
                    str(d.get("model") or "-"),
                    *([str(d.get("pci_bus_id") or "-")] if wide else []),
                    reason or "-",
                ]
            )
        lines += ["devices:", *table(header, rows, indent="  ")]
    return "\n".join(lines)


class StatusCommand:
    """`gputopo status`: the running plugin's status service, over the plugin socket."""

    help = "ask the running device plugin over its socket"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--socket", help="plugin socket path (default: the kubelet dir's gputopo socket)")
        parser.add_argument("--kubelet-dir", help="kubelet device-plugin folder")
        parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait (default 3)")
        add_output_arguments(parser)

    def run(self, args: argparse.Namespace) -> int:
        from deviceplugin import settings
        from deviceplugin.kubelet.status_client import StatusUnavailable, fetch_status

        if not (math.isfinite(args.timeout) and args.timeout > 0):
            raise UsageError(f"--timeout must be a positive number of seconds, got {args.timeout}")
        socket = args.socket or os.path.join(
            args.kubelet_dir or os.environ.get("GPUTOPO_KUBELET_DIR", settings.KUBELET_DIR),
            os.environ.get("GPUTOPO_SOCKET_NAME", settings.SOCKET_NAME),
        )
        # gRPC reads `unix://dp/x.sock` as host "dp": a relative path must become absolute first.
        socket = os.path.abspath(socket)
        try:
            doc = fetch_status(socket, timeout=args.timeout)
        except StatusUnavailable as e:
            print(f"gputopo: {e}", file=sys.stderr)
            return 1
        if is_machine(args.output):
            print(dump(doc, args.output))
        else:
            print(render_status(doc, now=time.time(), wide=args.output == "wide"))
        return 0


#: Entry point `gputopo.commands: status`.
STATUS = StatusCommand()
