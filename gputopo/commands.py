"""How other packages join the `gputopo` command: entry points, as pytest plugins do.

The core answers for what it can decide alone (`topo`, `prefer`, `presets`, `simulate`). What
needs the node (a running plugin's socket, NVML) belongs to the device-plugin package, and the
core never imports it (import-linter checks that): that package declares, in its
distribution's metadata,

    [project.entry-points."gputopo.commands"]
    status = "deviceplugin.cli:STATUS"          # a Command: a subcommand of its own
    [project.entry-points."gputopo.topology_sources"]
    nvml = "deviceplugin.cli:local_topology"    # the topology `topo`/`prefer` probe without --topology

and `gputopo` finds them with `importlib.metadata` when it starts. With the core installed
alone, the commands are not there (argparse says "invalid choice", exit 2) and `topo` without
--topology says no local source is installed. A declared command whose package cannot be
imported still answers its name, with one line and exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from typing import Protocol, runtime_checkable

from gputopo.node.topology import Topology

#: Entry-point group of subcommands: name = the subcommand, value = a `Command` object.
COMMANDS_GROUP = "gputopo.commands"
#: Entry-point group of local topology sources: value = a callable returning the node's Topology.
TOPOLOGY_SOURCES_GROUP = "gputopo.topology_sources"


class UsageError(Exception):
    """Bad input from the user, or a command that cannot run here: one line, exit code 2."""


@runtime_checkable
class Command(Protocol):
    """A subcommand contributed through COMMANDS_GROUP."""

    help: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Declare the subcommand's flags (argparse errors become UsageError)."""

    def run(self, args: argparse.Namespace) -> int:
        """Do it; the exit code (raise UsageError for bad input)."""


#: A local topology source: the node's topology, or UsageError saying why there is none.
TopologySource = Callable[[], Topology]


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _entry_points(group: str) -> list[EntryPoint]:
    """The group's entry points, one per name (the first distribution wins), in name order."""
    seen: dict[str, EntryPoint] = {}
    for ep in entry_points(group=group):
        seen.setdefault(ep.name, ep)
    return [seen[name] for name in sorted(seen)]


class Missing:
    """Stands in for a declared command whose package cannot be loaded: any arguments, one line."""

    def __init__(self, name: str, ep: EntryPoint, error: BaseException) -> None:
        self.name = name
        self.help = f"(unavailable: {ep.module} cannot be imported)"
        self._why = f"'{name}' needs {ep.module}, which cannot be imported here ({_one_line(error)})"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        pass  # the caller lets unknown arguments through to `run`, which refuses anyway

    def run(self, args: argparse.Namespace) -> int:
        raise UsageError(self._why)


def plugin_commands(taken: set[str]) -> dict[str, Command | Missing]:
    """Every declared subcommand not in `taken` (the core's own names win), loaded."""
    out: dict[str, Command | Missing] = {}
    for ep in _entry_points(COMMANDS_GROUP):
        if ep.name in taken:
            continue
        try:
            command = ep.load()
        except Exception as e:  # an ImportError, or anything the module raises on import
            out[ep.name] = Missing(ep.name, ep, e)
            continue
        if not isinstance(command, Command):
            out[ep.name] = Missing(ep.name, ep, TypeError(f"{ep.value} is not a gputopo command"))
            continue
        out[ep.name] = command
    return out


def local_topology() -> Topology:
    """The node's own topology from the first installed source (NVML, with the plugin package)."""
    sources = _entry_points(TOPOLOGY_SOURCES_GROUP)
    if not sources:
        raise UsageError(
            "no --topology given and no local topology source is installed "
            "(NVML discovery comes with the device plugin package)"
        )
    ep = sources[0]
    try:
        source: TopologySource = ep.load()
    except Exception as e:
        raise UsageError(f"no --topology given and NVML support is missing ({_one_line(e)})") from None
    return source()
