"""The node-side commands of `gputopo`, contributed through entry points (pyproject.toml):
`gputopo status` (ask the running plugin over its socket) and the NVML topology source that
`gputopo topo` / `prefer` use without --topology.

They live here, not in the core, because they need what only the plugin package has (its
socket layout and status client over gRPC, the NVML backend); the core `gputopo/cli.py` finds
them with `importlib.metadata` and imports nothing of this package (see gputopo/commands.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

from gputopo.commands import UsageError
from gputopo.topology import Topology


def local_topology() -> Topology:
    """The node's topology from NVML (entry point `gputopo.topology_sources: nvml`)."""
    from deviceplugin.nvml import NvmlBackend, NvmlUnavailable

    try:
        backend = NvmlBackend()
        try:
            return backend.discover()
        finally:
            backend.close()
    except NvmlUnavailable as e:
        raise UsageError(f"no --topology given and NVML is unavailable: {e}") from None


def render_status(doc: dict[str, Any]) -> str:
    """Plugin status for a person: settings, registration, then one aligned row per GPU."""
    lines = [f"{k}: {v}" for k, v in doc.items() if not isinstance(v, (list, dict))]
    for key, value in doc.items():
        if isinstance(value, dict):
            lines.append(f"{key}:")
            lines += [f"  {k}: {v}" for k, v in value.items()]
    devices = doc.get("devices") or []
    if devices:
        lines += ["devices:", f"  {'GPU':<5}{'health':<12}{'NUMA':<6}{'UUID':<42}model"]
        for d in devices:
            health = "Healthy" if d.get("healthy") else "Unhealthy"
            if d.get("health_reason"):
                health += f" ({d['health_reason']})"
            numa = "-" if d.get("numa") is None or d.get("numa", -1) < 0 else str(d["numa"])
            lines.append(
                f"  {d.get('index', '?')!s:<5}{health:<12}{numa:<6}{d.get('uuid', ''):<42}{d.get('model', '')}"
            )
    return "\n".join(lines)


class StatusCommand:
    """`gputopo status`: the running plugin's status service, over the plugin socket."""

    help = "ask the running device plugin over its socket"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--socket", help="plugin socket path (default: the kubelet dir's gputopo socket)")
        parser.add_argument("--kubelet-dir", help="kubelet device-plugin folder")
        parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait (default 3)")
        parser.add_argument("--json", action="store_true", help="machine-readable output")

    def run(self, args: argparse.Namespace) -> int:
        from deviceplugin import defaults
        from deviceplugin.status_client import StatusUnavailable, fetch_status

        if not (math.isfinite(args.timeout) and args.timeout > 0):
            raise UsageError(f"--timeout must be a positive number of seconds, got {args.timeout}")
        socket = args.socket or os.path.join(
            args.kubelet_dir or os.environ.get("GPUTOPO_KUBELET_DIR", defaults.KUBELET_DIR),
            os.environ.get("GPUTOPO_SOCKET_NAME", defaults.SOCKET_NAME),
        )
        # gRPC reads `unix://dp/x.sock` as host "dp": a relative path must become absolute first.
        socket = os.path.abspath(socket)
        try:
            doc = fetch_status(socket, timeout=args.timeout)
        except StatusUnavailable as e:
            print(f"gputopo: plugin not reachable at {socket}: {e}", file=sys.stderr)
            return 1
        print(json.dumps(doc, indent=1) if args.json else render_status(doc))
        return 0


#: Entry point `gputopo.commands: status`.
STATUS = StatusCommand()
