"""The node topology model: GPUs and the link between every pair (design.md §3).

A Topology is an immutable value built once (from NVML, a file, a preset or an annotation)
and handed to everything else. Validation happens here, at the edge, so the allocator can
assume a square, symmetric matrix and never has to guard against bad data on a hot path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import cached_property
from itertools import repeat
from typing import TYPE_CHECKING, Any

import numpy as np

from gputopo.node.links import PCIE_LEVELS, BandwidthSettings, Link, LinkError, parse_code


class TopologyError(ValueError):
    """A topology description that is malformed; the message says where."""


@dataclass(frozen=True, slots=True)
class GPU:
    """One physical GPU as the node sees it."""

    index: int
    uuid: str
    model: str = ""
    pci_bus_id: str = ""
    numa: int | None = None
    # The driver's minor number: the card is /dev/nvidia<minor>. NVML reports it; None means the
    # same as `index` (files and presets). Not part of the topology formats (to_dict).
    minor: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "model": self.model,
            "pci_bus_id": self.pci_bus_id,
            "numa": self.numa,
        }


def _slot_setters() -> tuple[Any, ...]:
    """The slot descriptors' setters of GPU's fields, in field order (`gpu`)."""
    return tuple(GPU.__dict__[f.name].__set__ for f in fields(GPU))


_SET_INDEX, _SET_UUID, _SET_MODEL, _SET_BUS, _SET_NUMA, _SET_MINOR = _slot_setters()


def gpu(index: int, uuid: str, model: str, pci_bus_id: str, numa: int | None) -> GPU:
    """`GPU(index, uuid, model, pci_bus_id, numa)`, made ~4x faster than through the frozen
    dataclass's `__init__` (six `object.__setattr__` calls): decoding a 60,000-node cluster's
    annotations makes ~500,000 of them. Every field is set (tests/test_topology.py compares)."""
    g = object.__new__(GPU)
    _SET_INDEX(g, index)
    _SET_UUID(g, uuid)
    _SET_MODEL(g, model)
    _SET_BUS(g, pci_bus_id)
    _SET_NUMA(g, numa)
    _SET_MINOR(g, None)
    return g


@dataclass(frozen=True)
class Topology:
    """GPUs of one node and the link of each pair. `links[i][i]` is None."""

    name: str
    gpus: tuple[GPU, ...]
    links: tuple[tuple[Link | None, ...], ...]
    nvswitch: bool = False
    settings: BandwidthSettings = field(default_factory=BandwidthSettings)
    description: str = ""

    def __post_init__(self) -> None:
        n = len(self.gpus)
        if n == 0:
            raise TopologyError("a topology needs at least one GPU")
        if [g.index for g in self.gpus] != list(range(n)):
            raise TopologyError("GPU indices must be 0..n-1 in order")
        uuids = [g.uuid for g in self.gpus]
        if len(set(uuids)) != n or any(not u for u in uuids):
            raise TopologyError("GPU UUIDs must be present and unique")
        if len(self.links) != n or any(len(row) != n for row in self.links):
            raise TopologyError(f"links must be a {n}x{n} matrix")
        for i in range(n):
            if self.links[i][i] is not None:
                raise TopologyError(f"links[{i}][{i}] must be X (self)")
            for j in range(i + 1, n):
                a, b = self.links[i][j], self.links[j][i]
                if a is None or b is None:
                    raise TopologyError(f"links[{i}][{j}] is X off the diagonal")
                if a.code != b.code:
                    raise TopologyError(
                        f"asymmetric link: links[{i}][{j}]={a.code} but links[{j}][{i}]={b.code}"
                    )

    @property
    def n(self) -> int:
        return len(self.links)  # n x n (checked): the GPUs of `with_gpu_columns` stay unmade

    if not TYPE_CHECKING:  # (mypy: no attribute of Topology is dynamic but this one)

        def __getattr__(self, name: str) -> Any:
            """`gpus` of a topology made by `with_gpu_columns`, made on first read (only
            reached when `gpus` is not set yet)."""
            columns = self.__dict__.get("_gpu_columns") if name == "gpus" else None
            if columns is None:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            uuids, models, numas = columns
            gpus = tuple(map(gpu, range(len(uuids)), uuids, models, repeat(""), numas))
            return self.__dict__.setdefault("gpus", gpus)  # one tuple, whichever thread made it

    @cached_property
    def bandwidth_mbps(self) -> np.ndarray:
        """n x n int64 matrix of one-direction MB/s, 0 on the diagonal: the input of every decision."""
        n = self.n
        out = np.zeros((n, n), dtype=np.int64)
        for i in range(n):
            for j in range(n):
                link = self.links[i][j]
                if link is not None:
                    out[i, j] = self.settings.mbps(link)
        out.setflags(write=False)
        return out

    def gbps(self, i: int, j: int) -> float:
        return float(self.bandwidth_mbps[i, j]) / 1000.0

    def code(self, i: int, j: int) -> str:
        link = self.links[i][j]
        return "X" if link is None else link.code

    @cached_property
    def index_by_uuid(self) -> Mapping[str, int]:
        return {g.uuid: g.index for g in self.gpus}

    def to_dict(self) -> dict[str, Any]:
        """The design.md §3 JSON form (plus `pcie` when the PCIe level under NVLink is known)."""
        out: dict[str, Any] = {
            "name": self.name,
            "gpus": [g.to_dict() for g in self.gpus],
            "links": [[self.code(i, j) for j in range(self.n)] for i in range(self.n)],
            "nvswitch": self.nvswitch,
            "nvlink_gbps_per_link": self.settings.nvlink_gbps_per_link,
            "pcie_gbps": dict(self.settings.pcie_gbps),
        }
        if self.description:
            out["description"] = self.description
        if any(lk is not None and lk.nvlinks and lk.pcie for row in self.links for lk in row):
            out["pcie"] = [["X" if lk is None else (lk.pcie or "SYS") for lk in row] for row in self.links]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, default_name: str = "topology") -> Topology:
        """Build and validate from the JSON form; every problem raises TopologyError with its place."""
        if not isinstance(data, Mapping):
            raise TopologyError("a topology must be a JSON object")
        gpus_raw = data.get("gpus")
        links_raw = data.get("links")
        if not isinstance(gpus_raw, Sequence) or isinstance(gpus_raw, (str, bytes)) or not gpus_raw:
            raise TopologyError("'gpus' must be a non-empty list")
        if not isinstance(links_raw, Sequence) or isinstance(links_raw, (str, bytes)):
            raise TopologyError("'links' must be a list of lists")
        gpus = [_gpu_from_dict(g, k) for k, g in enumerate(gpus_raw)]
        gpus.sort(key=lambda g: g.index)
        n = len(gpus)
        pcie_raw = data.get("pcie")
        links = _links_from_matrix(links_raw, n, pcie_raw)
        try:
            settings = BandwidthSettings(
                nvlink_gbps_per_link=float(data.get("nvlink_gbps_per_link", 25.0)),
                pcie_gbps=dict(data.get("pcie_gbps") or {}),
            )
        except (TypeError, ValueError, OverflowError) as e:  # float(10**400) overflows
            raise TopologyError(f"bandwidth settings: {e}") from None
        nvswitch = data.get("nvswitch", False)
        if not isinstance(nvswitch, bool):
            raise TopologyError("'nvswitch' must be true or false")
        name = data.get("name", default_name)
        if not isinstance(name, str) or not name:
            raise TopologyError("'name' must be a non-empty string")
        return cls(
            name=name,
            gpus=tuple(gpus),
            links=links,
            nvswitch=nvswitch,
            settings=settings,
            description=str(data.get("description", "")),
        )

    def with_gpus(self, gpus: Sequence[GPU]) -> Topology:
        """This topology's name, links and bandwidth figures with other GPUs: another server of
        the same model, whose GPUs differ by UUID only. The links were validated when this one
        was built and do not depend on the GPUs, so only the GPUs are checked here (as
        `__post_init__` checks them), and the bandwidth matrix is this one's (read-only):
        decoding 60,000 nodes' annotations spent most of its time re-parsing, re-validating
        and re-deriving the same few link matrices."""
        gpus = tuple(gpus)
        n = len(gpus)
        if n != self.n or [g.index for g in gpus] != list(range(n)):
            raise TopologyError("GPU indices must be 0..n-1 in order")
        uuids = [g.uuid for g in gpus]
        if len(set(uuids)) != n or any(not u for u in uuids):
            raise TopologyError("GPU UUIDs must be present and unique")
        return self.sharing_links(gpus)

    def sharing_links(self, gpus: tuple[GPU, ...]) -> Topology:
        """`with_gpus` for GPUs its caller checked already (`n` of them, indices 0..n-1 in
        order, UUIDs present and unique)."""
        out = object.__new__(Topology)  # the fields as the dataclass sets them, checks done by the caller
        out.__dict__.update(
            name=self.name,
            gpus=gpus,
            links=self.links,
            nvswitch=self.nvswitch,
            settings=self.settings,
            description=self.description,
            bandwidth_mbps=self.bandwidth_mbps,
        )
        return out

    def with_gpu_columns(self, uuids: list[str], models: list[str], numas: list[int | None]) -> Topology:
        """`sharing_links` with the GPUs given a field at a time (GPU k: index k, `uuids[k]`,
        `models[k]`, no PCI bus id, `numas[k]`), checked by the caller as for `sharing_links`
        (`numas` as `GPU.numa` holds them: None or >= 0). Their GPU objects are made when
        `gpus` is first read, which deciding where pods go does not do (it reads the links'
        bandwidth matrix): making them was half of decoding a node's annotation at start-up.
        Equal, hashed and shown as the topology made with them."""
        out = object.__new__(Topology)
        out.__dict__.update(
            name=self.name,
            links=self.links,
            nvswitch=self.nvswitch,
            settings=self.settings,
            description=self.description,
            bandwidth_mbps=self.bandwidth_mbps,
            _gpu_columns=(uuids, models, numas),
        )
        return out

    def with_settings(self, settings: BandwidthSettings) -> Topology:
        """The same links under other bandwidth figures (per-node overrides)."""
        return Topology(self.name, self.gpus, self.links, self.nvswitch, settings, self.description)


def _gpu_from_dict(raw: Any, pos: int) -> GPU:
    if not isinstance(raw, Mapping):
        raise TopologyError(f"gpus[{pos}] must be an object")
    index = raw.get("index", pos)
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise TopologyError(f"gpus[{pos}].index must be a non-negative integer")
    uuid = raw.get("uuid") or f"GPU-{index}"
    if not isinstance(uuid, str):
        raise TopologyError(f"gpus[{pos}].uuid must be a string")
    numa = raw.get("numa")
    if numa is not None and (not isinstance(numa, int) or isinstance(numa, bool)):
        raise TopologyError(f"gpus[{pos}].numa must be an integer or null")
    if numa is not None and numa < 0:
        numa = None
    return GPU(
        index=index,
        uuid=uuid,
        model=str(raw.get("model", "")),
        pci_bus_id=str(raw.get("pci_bus_id", "")),
        numa=numa,
    )


def _links_from_matrix(
    raw: Sequence[Any], n: int, pcie_raw: Any = None
) -> tuple[tuple[Link | None, ...], ...]:
    if len(raw) != n:
        raise TopologyError(f"'links' has {len(raw)} rows for {n} GPUs")
    if pcie_raw is not None and (not isinstance(pcie_raw, Sequence) or len(pcie_raw) != n):
        raise TopologyError(f"'pcie' must be a {n}x{n} matrix")
    rows: list[tuple[Link | None, ...]] = []
    # A matrix repeats a handful of codes (64 cells, ~4 codes on 8 GPUs): parse each once per
    # matrix. A 5,000-node snapshot with inline topologies spent most of its load in parse_code.
    parsed: dict[str, Link] = {}
    for i, row in enumerate(raw):
        if not isinstance(row, Sequence) or isinstance(row, (str, bytes)) or len(row) != n:
            raise TopologyError(f"links[{i}] must have {n} entries")
        out: list[Link | None] = []
        for j, cell in enumerate(row):
            if not isinstance(cell, str):
                raise TopologyError(f"links[{i}][{j}] must be a string code")
            if cell.strip().upper() == "X":
                if i != j:
                    raise TopologyError(f"links[{i}][{j}] is X off the diagonal")
                out.append(None)
                continue
            if i == j:
                raise TopologyError(f"links[{i}][{i}] must be X (self)")
            link = parsed.get(cell)
            if link is None:
                try:
                    link = parsed[cell] = parse_code(cell)
                except LinkError as e:
                    raise TopologyError(f"links[{i}][{j}]: {e}") from None
            if pcie_raw is not None:
                under = str(pcie_raw[i][j]).strip().upper()
                under = "SYS" if under == "SOC" else under
                if under not in PCIE_LEVELS:
                    raise TopologyError(f"pcie[{i}][{j}] must be one of {', '.join(PCIE_LEVELS)}")
                link = Link(nvlinks=link.nvlinks, pcie=under if link.nvlinks else link.pcie)
            out.append(link)
        rows.append(tuple(out))
    return tuple(rows)


def make_topology(
    codes: Sequence[Sequence[str]],
    *,
    name: str = "custom",
    numa: Sequence[int | None] | None = None,
    nvswitch: bool = False,
    settings: BandwidthSettings | None = None,
) -> Topology:
    """Convenience for tests and generators: a topology from a code matrix alone."""
    n = len(codes)
    gpus = tuple(
        GPU(index=i, uuid=f"GPU-{name}-{i}", numa=None if numa is None else numa[i]) for i in range(n)
    )
    return Topology(
        name=name,
        gpus=gpus,
        links=_links_from_matrix(codes, n),
        nvswitch=nvswitch,
        settings=settings or BandwidthSettings(),
    )
