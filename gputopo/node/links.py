"""Link codes of `nvidia-smi topo -m` and the bandwidth each one is worth (design.md §1).

Every decision in gputopo starts from one number per GPU pair: the one-direction bandwidth of
the best path between them. The codes are the ones operators already read in `nvidia-smi topo
-m`, so a topology file, an NVML probe and a printed matrix all speak the same language.
Bandwidths are kept as integer MB/s internally so that sums and ties compare exactly.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

#: PCIe levels from nearest to farthest, as printed by nvidia-smi.
PCIE_LEVELS: tuple[str, ...] = ("PIX", "PXB", "PHB", "NODE", "SYS")

#: Default one-direction GB/s of each PCIe level (design.md §1).
DEFAULT_PCIE_GBPS: Mapping[str, float] = MappingProxyType(
    {"PIX": 24.0, "PXB": 20.0, "PHB": 16.0, "NODE": 12.0, "SYS": 6.0}
)
#: Default GB/s of one NVLink, one direction (V100 NVLink2; A100/H100 links are also 25 GB/s).
DEFAULT_NVLINK_GBPS_PER_LINK = 25.0

_NV_RE = re.compile(r"^NV(\d{1,6})$")
#: Most bonded NVLinks one GPU pair may claim (H100/B200 have 18 per GPU; 64 leaves room).
#: Bounded so that counts x GB/s stay far inside the int64 sums of the allocator.
MAX_NVLINKS = 64
_ALIASES = {"SOC": "SYS"}


class LinkError(ValueError):
    """A link code or bandwidth setting that cannot be understood."""


@dataclass(frozen=True, slots=True)
class Link:
    """One pair's connection: NVLink count (0 = none) and the PCIe level beneath it.

    `pcie` may be None when only the `topo -m` code is known and it was an NVLink code
    (nvidia-smi prints NV# in place of the PCIe level)."""

    nvlinks: int = 0
    pcie: str | None = None

    @property
    def code(self) -> str:
        """The code `nvidia-smi topo -m` prints for this pair."""
        if self.nvlinks > 0:
            return f"NV{self.nvlinks}"
        return self.pcie or "SYS"


def parse_code(code: str) -> Link:
    """Parse one matrix cell (`NV12`, `PIX`, `SOC`, …) into a Link. `X` is not a link."""
    if len(code) > 16:  # the longest real code is 4 characters: refuse before any parsing
        raise LinkError(f"link code too long ({len(code)} characters)")
    text = code.strip().upper()
    text = _ALIASES.get(text, text)
    m = _NV_RE.match(text)
    if m:
        count = int(m.group(1))
        if not 0 < count <= MAX_NVLINKS:
            raise LinkError(f"NVLink count must be 1..{MAX_NVLINKS} in {code!r}")
        return Link(nvlinks=count)
    if text in PCIE_LEVELS:
        return Link(pcie=text)
    raise LinkError(f"unknown link code {code!r} (expected NV#, PIX, PXB, PHB, NODE or SYS)")


#: Largest GB/s a link may be given (a petabyte per second). Bandwidths become integer MB/s
#: and then int64 sums; infinity or 1e300 would overflow them deep inside the allocator.
MAX_GBPS = 1_000_000.0


@dataclass(frozen=True, slots=True)
class BandwidthSettings:
    """Per-node bandwidth figures; NVLink speed differs by generation, PCIe by generation/width."""

    nvlink_gbps_per_link: float = DEFAULT_NVLINK_GBPS_PER_LINK
    pcie_gbps: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_PCIE_GBPS))

    def __post_init__(self) -> None:
        if not (0 < self.nvlink_gbps_per_link <= MAX_GBPS):
            raise LinkError(
                f"nvlink_gbps_per_link must be > 0 and at most {MAX_GBPS:g}, got {self.nvlink_gbps_per_link!r}"
            )
        merged = dict(DEFAULT_PCIE_GBPS)
        for key, value in dict(self.pcie_gbps).items():
            level = _ALIASES.get(str(key).upper(), str(key).upper())
            if level not in PCIE_LEVELS:
                raise LinkError(f"unknown PCIe level {key!r} in pcie_gbps")
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= MAX_GBPS:
                raise LinkError(
                    f"pcie_gbps[{key!r}] must be a positive number of at most {MAX_GBPS:g}, got {value!r}"
                )
            merged[level] = float(value)
        object.__setattr__(self, "pcie_gbps", MappingProxyType(merged))

    def gbps(self, link: Link) -> float:
        """One-direction GB/s of a link: NVLink if any, else its PCIe level (SYS if unknown)."""
        if link.nvlinks > 0:
            return link.nvlinks * self.nvlink_gbps_per_link
        return self.pcie_gbps[link.pcie or "SYS"]

    def mbps(self, link: Link) -> int:
        """Integer MB/s, the unit every comparison uses so ties are exact."""
        return round(self.gbps(link) * 1000)

    def to_dict(self) -> dict[str, object]:
        return {"nvlink_gbps_per_link": self.nvlink_gbps_per_link, "pcie_gbps": dict(self.pcie_gbps)}
