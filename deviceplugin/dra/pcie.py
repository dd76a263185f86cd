"""PCIe root complexes from sysfs, for the standard `resource.kubernetes.io/pcieRoot` attribute.

The attribute names the root complex a device hangs under as `pci<domain>:<bus>`, which is the
name of the top folder of the device's sysfs path (/sys/devices/pci0000:00/…/0000:07:00.0). A
GPU whose path cannot be read gets no attribute: an unknown root is better left out than
guessed (two GPUs under one guessed root would match a `matchAttribute` they should not)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from deviceplugin.state import Snapshot
from gputopo.node.draslices import pci_bus_id

_ROOT = re.compile(r"pci[0-9a-f]{4,8}:[0-9a-f]{2}")


def pcie_root(bdf: str, sysfs: str = "/sys") -> str | None:
    """`pci<domain>:<bus>` of the device at `bdf` (extended BDF), or None if sysfs says nothing."""
    norm = pci_bus_id(bdf)
    if norm is None:
        return None
    try:
        real = os.path.realpath(os.path.join(sysfs, "bus", "pci", "devices", norm), strict=True)
    except OSError:
        return None
    for part in real.split(os.sep):
        if _ROOT.fullmatch(part):
            return part
    return None


def roots_for(snapshot: Snapshot, sysfs: str = "/sys") -> Mapping[int, str]:
    """Index -> root for every GPU of the snapshot whose root sysfs tells."""
    out = {}
    for g in snapshot.topology.gpus:
        root = pcie_root(g.pci_bus_id, sysfs) if g.pci_bus_id else None
        if root:
            out[g.index] = root
    return out
