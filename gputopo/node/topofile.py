"""Topologies from the outside world: JSON files, `nvidia-smi topo -m` text and named presets.

Every way a node's layout can arrive without NVML (a file handed to the device plugin, a
fixture, a snapshot for the simulator, text an operator pasted from `nvidia-smi topo -m`) ends
up here and becomes the same validated `Topology`. The parsers are pure functions of their
input; only `load_topology` / `load_preset` touch the file system, so the rest of the core can
stay free of I/O.

Choices for the `nvidia-smi topo -m` text form, which carries less than the JSON form:

* Only GPU rows and columns become the topology. NIC rows and columns (`NIC0` with a
  `NIC Legend`, or old raw names such as `mlx4_0`) are read past and listed in the
  description, never counted as GPUs.
* NUMA node of a GPU: the `NUMA Affinity` column when it holds a single integer. When the text
  has no such column, GPUs are grouped by their `CPU Affinity` string: distinct strings, in
  order of first appearance, become NUMA 0, 1, ... That matches the socket split of every
  two-socket server we know of, but the numbers are positions, not the kernel's node ids. With
  neither column (or `N/A`) the NUMA node is unknown (None). `GPU NUMA ID` is the NUMA node of
  the GPU's *own* memory (Grace systems), not the host affinity, so it is not used.
* UUIDs are not printed by `topo -m`; each GPU gets the stable synthetic `GPU-<name>-<index>`,
  where `<name>` is the topology name, so the same text always yields the same IDs.
* Cells are split on whitespace, so space-aligned and TAB-separated layouts (including the
  empty cells that runs of tabs leave) read the same way. Terminal colour codes and any lines
  before the header (a prompt, a title) are ignored.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from gputopo.node.links import Link, LinkError, parse_code
from gputopo.node.topology import GPU, Topology, TopologyError
from gputopo.numerals import ascii_uint
from gputopo.userfile import MAX_TOPOLOGY_BYTES, UserFileError, read_text

#: Header columns after the device columns, longest first so multi-word names win.
AFFINITY_COLUMNS: tuple[str, ...] = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")

_GPU_RE = re.compile(r"^GPU(\d+)$")
_NIC_LEGEND_RE = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # colour codes some nvidia-smi versions print on a TTY
_UNKNOWN = frozenset({"", "N/A", "NA", "-"})


def parse_topology_json(source: str | bytes | Mapping[str, Any], *, name: str = "topology") -> Topology:
    """The design.md §3 JSON form, as text or as an already decoded object."""
    if isinstance(source, (str, bytes)):
        try:
            data = json.loads(source)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise TopologyError(f"{name}: not valid JSON: {e}") from None
    else:
        data = source
    if not isinstance(data, Mapping):
        raise TopologyError(f"{name}: a topology must be a JSON object")
    try:
        return Topology.from_dict(data, default_name=name)
    except TopologyError as e:
        raise TopologyError(f"{name}: {e}") from None


@dataclass(frozen=True)
class HostColumns:
    """What `nvidia-smi topo -m` text says beyond the GPU matrix, kept for `gputopo topo` to show:
    the NICs (label and, from the NIC Legend, device name), each GPU's link code to each NIC, and
    each GPU's affinity columns as printed (`CPU Affinity`, `NUMA Affinity`, `GPU NUMA ID`)."""

    nics: tuple[tuple[str, str], ...]  # (label, device name or "" when the legend lacks it)
    gpu_nic: tuple[tuple[str, ...], ...]  # [gpu][nic] -> code as printed (PIX, SYS, ...)
    affinity_columns: tuple[str, ...]
    affinity: tuple[tuple[str, ...], ...]  # [gpu][column] -> cell as printed ("" when missing)


def parse_topo_text(text: str, *, name: str = "topo-m") -> Topology:
    """The plain text printed by `nvidia-smi topo -m` (see the module docstring for the rules)."""
    return parse_topo_text_detail(text, name=name)[0]


def parse_topo_text_detail(text: str, *, name: str = "topo-m") -> tuple[Topology, HostColumns]:
    """`parse_topo_text`, plus the NIC and affinity columns the topology itself does not keep."""
    lines = _ANSI_RE.sub("", text).splitlines()
    start = _find_header(lines, name)
    header = lines[start].split()
    row_tokens: list[list[str]] = []
    for line in lines[start + 1 :]:
        tokens = line.split()
        if not tokens or tokens[0].rstrip(":").lower() == "legend":
            break
        row_tokens.append(tokens)
    labels = [t[0] for t in row_tokens]
    devices = _device_columns(header, set(labels), name)
    extra_columns = _extra_columns(header[len(devices) :], name)

    gpu_labels = [d for d in devices if _GPU_RE.match(d)]
    if not gpu_labels:
        raise TopologyError(f"{name}: no GPU columns in the header")
    expected = [f"GPU{i}" for i in range(len(gpu_labels))]
    if gpu_labels != expected:
        raise TopologyError(
            f"{name}: GPU columns must be GPU0..GPU{len(gpu_labels) - 1} in order, got {gpu_labels}"
        )
    rows: dict[str, list[str]] = {}
    for tokens in row_tokens:
        label = tokens[0]
        if label in rows:
            raise TopologyError(f"{name}: row {label} appears twice")
        if len(tokens) - 1 < len(devices):
            raise TopologyError(
                f"{name}: row {label} has {len(tokens) - 1} cells,"
                f" the header has {len(devices)} device columns"
            )
        rows[label] = tokens[1:]
    missing = [g for g in gpu_labels if g not in rows]
    if missing:
        raise TopologyError(f"{name}: no row for {', '.join(missing)}")

    col = {d: k for k, d in enumerate(devices)}
    links = tuple(tuple(_cell_link(rows[a][col[b]], a, b, name) for b in gpu_labels) for a in gpu_labels)
    extras = [
        dict(zip(extra_columns, rows[g][len(devices) : len(devices) + len(extra_columns)], strict=False))
        for g in gpu_labels
    ]
    numa = _numa_nodes(extras)
    gpus = tuple(GPU(index=i, uuid=f"GPU-{name}-{i}", numa=numa[i]) for i in range(len(gpu_labels)))
    nics = [d for d in devices if not _GPU_RE.match(d)]
    legend = _nic_legend(lines)
    description = "parsed from nvidia-smi topo -m"
    if nics:
        description += "; NICs: " + ", ".join(f"{n}={legend[n]}" if n in legend else n for n in nics)
    host = HostColumns(
        nics=tuple((n, legend.get(n, "")) for n in nics),
        gpu_nic=tuple(tuple(rows[g][col[n]] for n in nics) for g in gpu_labels),
        affinity_columns=tuple(extra_columns),
        affinity=tuple(tuple(e.get(c, "") for c in extra_columns) for e in extras),
    )
    try:
        return Topology(name=name, gpus=gpus, links=links, description=description), host
    except TopologyError as e:
        raise TopologyError(f"{name}: {e}") from None


def format_topo_text(topology: Topology, *, sep: str = "    ", nics: Sequence[str] = ()) -> str:
    """The `nvidia-smi topo -m` layout of a topology, the form operators compare against.

    `sep="\t"` gives the tab-separated variant. `nics` adds NIC rows and columns (all SYS) so
    the printed text exercises the same paths as a real node's; the NUMA column is `N/A` when
    unknown. Parsing the result gives back the same links and NUMA nodes."""
    devices = [f"GPU{g.index}" for g in topology.gpus] + [f"NIC{k}" for k in range(len(nics))]
    width = max(len(d) for d in devices)

    def cell(text: str) -> str:
        return text if sep == "\t" else text.ljust(width)

    lines = [sep.join([cell(""), *(cell(d) for d in devices), "CPU Affinity", "NUMA Affinity"])]
    for row, name in enumerate(devices):
        cells = [
            "X" if row == col else (topology.code(row, col) if max(row, col) < topology.n else "SYS")
            for col in range(len(devices))
        ]
        extra: list[str] = []
        if row < topology.n:
            numa = topology.gpus[row].numa
            cpus = "N/A" if sep == "\t" else "N/A".ljust(len("CPU Affinity"))
            extra = [cpus, "N/A" if numa is None else str(numa)]
        lines.append(sep.join([cell(name), *(cell(c) for c in cells), *extra]).rstrip())
    lines += ["", "Legend:", "", "  X    = Self", "  NV#  = Connection traversing a bonded set of # NVLinks"]
    if nics:
        lines += ["", "NIC Legend:", ""] + [f"  NIC{k}: {nic}" for k, nic in enumerate(nics)]
    return "\n".join(lines) + "\n"


def _find_header(lines: Sequence[str], name: str) -> int:
    """The header is the first line starting with GPU0 whose next cell is not a link (rows say `X`)."""
    for k, line in enumerate(lines):
        tokens = line.split()
        if tokens and tokens[0] == "GPU0" and (len(tokens) == 1 or not _is_cell(tokens[1])):
            return k
    raise TopologyError(f"{name}: no `nvidia-smi topo -m` header (a line of GPU0 GPU1 ... columns)")


def _is_cell(token: str) -> bool:
    if token.upper() == "X":
        return True
    try:
        parse_code(token)
    except LinkError:
        return False
    return True


def _device_columns(header: Sequence[str], labels: set[str], name: str) -> list[str]:
    """Device columns are the leading header cells that are GPUs or also label a row (NICs)."""
    devices: list[str] = []
    for token in header:
        if token not in labels and not _GPU_RE.match(token):
            break
        devices.append(token)
    if not devices:
        raise TopologyError(f"{name}: header columns do not match any row label")
    return devices


def _extra_columns(tokens: Sequence[str], name: str) -> list[str]:
    """Re-join the multi-word affinity column names that whitespace splitting tore apart."""
    out: list[str] = []
    k = 0
    while k < len(tokens):
        for column in AFFINITY_COLUMNS:
            words = column.split()
            if list(tokens[k : k + len(words)]) == words:
                out.append(column)
                k += len(words)
                break
        else:
            raise TopologyError(
                f"{name}: unknown header column {tokens[k]!r} (a device column must also label a row;"
                f" other columns are {', '.join(AFFINITY_COLUMNS)})"
            )
    return out


def _cell_link(cell: str, row: str, column: str, name: str) -> Link | None:
    if cell.upper() == "X":
        if row != column:
            raise TopologyError(f"{name}: {row}/{column} is X off the diagonal")
        return None
    if row == column:
        raise TopologyError(f"{name}: {row}/{column} must be X (self), got {cell!r}")
    try:
        return parse_code(cell)
    except LinkError as e:
        raise TopologyError(f"{name}: {row}/{column}: {e}") from None


def _numa_nodes(extras: Sequence[Mapping[str, str]]) -> list[int | None]:
    if any("NUMA Affinity" in e for e in extras):
        return [_single_int(e.get("NUMA Affinity", "")) for e in extras]
    groups: dict[str, int] = {}
    out: list[int | None] = []
    for e in extras:
        cpus = e.get("CPU Affinity", "")
        if cpus.upper() in _UNKNOWN:
            out.append(None)
            continue
        out.append(groups.setdefault(cpus, len(groups)))
    return out


def _single_int(value: str) -> int | None:
    """A NUMA affinity such as `0`; ranges, lists and N/A mean "not one node" and give None."""
    return ascii_uint(value)  # not isdigit(): a NUMA cell of "²" was a ValueError traceback


def _nic_legend(lines: Sequence[str]) -> dict[str, str]:
    return {m.group(1): m.group(2) for line in lines if (m := _NIC_LEGEND_RE.match(line))}


def parse_topology(text: str, *, name: str = "topology") -> Topology:
    """JSON or `topo -m` text, told apart by the first non-blank character (after any byte
    order mark a Windows editor left, which is not whitespace to str.strip)."""
    text = text.removeprefix("\ufeff")
    if text.lstrip().startswith("{"):
        return parse_topology_json(text, name=name)
    return parse_topo_text(text, name=name)


def list_presets() -> list[str]:
    """Names of the bundled server layouts (gputopo/node/presets/*.json), sorted."""
    folder = resources.files("gputopo.node") / "presets"
    return sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json"))


def load_preset(name: str) -> Topology:
    """A bundled layout by name; an unknown name lists the known ones."""
    if name not in list_presets():
        raise TopologyError(f"unknown preset {name!r}; presets: {', '.join(list_presets())}")
    text = (resources.files("gputopo.node") / "presets" / f"{name}.json").read_text(encoding="utf-8")
    return parse_topology_json(text, name=name)


def load_topology(source: str) -> Topology:
    """A preset name, a JSON file or a `topo -m` text file (see `load_topology_detail`)."""
    return load_topology_detail(source)[0]


def load_topology_detail(source: str) -> tuple[Topology, HostColumns | None]:
    """A preset name, a JSON file or a `topo -m` text file, with the text's NIC and affinity
    columns (None for presets and JSON, which have none).

    A bare word that names a preset is the preset, even if a file of that name sits in the
    working directory; anything else is a path whose content (not its extension) decides the
    format. The topology name of a file is its base name without extension."""
    if not source or not source.strip():
        raise TopologyError("empty topology source: give a preset name or a file path")
    if os.sep not in source and source in list_presets():
        return load_preset(source), None
    if not os.path.lexists(source):
        hint = "" if os.sep in source or "." in source else f"; presets: {', '.join(list_presets())}"
        raise TopologyError(f"topology {source!r} is neither a preset nor a readable file{hint}")
    try:  # a FIFO, a device or a huge file is refused here, never read (gputopo.userfile)
        text = read_text(source, MAX_TOPOLOGY_BYTES)
    except UserFileError as e:
        raise TopologyError(f"cannot read topology file {e}") from None
    base = os.path.splitext(os.path.basename(source))[0] or "topology"
    try:
        text = text.removeprefix("\ufeff")
        if text.lstrip().startswith("{"):
            return parse_topology_json(text, name=base), None
        return parse_topo_text_detail(text, name=base)
    except TopologyError as e:
        raise TopologyError(f"{source}: {e}") from None
