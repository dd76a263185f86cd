"""Kubelet's device IDs in, GPU indices to the allocator, device IDs out.

This module only translates: device IDs to GPU indices and back. What can only be seen in IDs
(duplicates, must-include IDs not offered or unknown) is checked here; everything about the
request itself (size, must-include count, enough free GPUs) is the node policy's to check, once,
and its `AllocationError` is reworded in kubelet's field names. Either way a malformed request
becomes a `RequestError` whose message is the reason the client reads in INVALID_ARGUMENT;
nothing here can raise anything else for any input, so no request can crash the daemon.

Choices:

* Unknown offered IDs (a GPU gone since kubelet's last list) are dropped before choosing and
  reported in `PreferredAnswer.ignored`; an error would fail the pod's admission for nothing.
  If too few known IDs remain, the request is refused.
* Unhealthy offered IDs are treated as offered: kubelet only offers devices it believes
  healthy and is the authority on what it may allocate, and our health view may simply be
  newer or older than kubelet's. Refusing would fail admission; choosing around them would
  second-guess kubelet. The decision log records them (`unhealthy_offered`) so it is visible.
* The answer is the node policy's set (`--policy`, the exact allocator by default); it depends
  on the set of IDs offered, never on their order (indices are sorted before the policy sees
  them, and answers are listed by index).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from deviceplugin.settings import MAX_REQUEST_IDS
from deviceplugin.state import Snapshot
from gputopo.node.allocator import MAX_GPUS, AllocationError, Choice


class RequestError(ValueError):
    """A request kubelet should not have sent; the message is the reason given back."""


@dataclass(frozen=True, slots=True)
class PreferredAnswer:
    """One container's preferred devices and why."""

    device_ids: tuple[str, ...]
    choice: Choice
    ignored: tuple[str, ...]  # offered IDs this plugin does not know
    unhealthy_offered: tuple[str, ...]  # offered IDs we currently see as unhealthy


def _duplicates(ids: Sequence[str]) -> list[str]:
    """IDs listed more than once, in first-repeat order; linear (sets, not list scans)."""
    seen: set[str] = set()
    dups: dict[str, None] = {}  # insertion-ordered set
    for i in ids:
        if i in seen:
            dups[i] = None
        seen.add(i)
    return list(dups)


def _bounded(field: str, ids: Sequence[str]) -> None:
    """No node offers more than MAX_GPUS devices, so a longer list is not kubelet's: refuse
    it before any per-ID work (MAX_REQUEST_IDS is 4 x MAX_GPUS, see deviceplugin/settings.py)."""
    if len(ids) > MAX_REQUEST_IDS:
        raise RequestError(
            f"{field} lists {len(ids)} devices; at most {MAX_REQUEST_IDS} are accepted "
            f"(a node has at most {MAX_GPUS} GPUs)"
        )


def _clip(device_id: str, width: int = 64) -> str:
    """Real IDs are at most 63 characters; anything longer is cut so the reason still fits the
    client's 8 KiB limit on gRPC trailers (past it the client sees RESOURCE_EXHAUSTED instead)."""
    return device_id if len(device_id) <= width else f"{device_id[:width]}... ({len(device_id)} chars)"


def _short(ids: Sequence[str], limit: int = 4) -> str:
    shown = ", ".join(_clip(i) for i in ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


def preferred(snap: Snapshot, available: Sequence[str], must: Sequence[str], size: int) -> PreferredAnswer:
    """Translate one ContainerPreferredAllocationRequest and ask the node policy (which
    validates sizes); lists longer than a node could offer are refused before any per-ID work."""
    _bounded("available_deviceIDs", available)
    _bounded("must_include_deviceIDs", must)
    if dups := _duplicates(available):
        raise RequestError(f"available_deviceIDs lists {_short(dups)} more than once")
    if dups := _duplicates(must):
        raise RequestError(f"must_include_deviceIDs lists {_short(dups)} more than once")
    offered = set(available)
    if missing := [m for m in must if m not in offered]:
        raise RequestError(f"must_include_deviceIDs {_short(missing)} not among available_deviceIDs")
    if unknown_must := [m for m in must if snap.index_of(m) is None]:
        raise RequestError(f"must_include_deviceIDs {_short(unknown_must)} unknown to this plugin")
    ignored = tuple(a for a in available if snap.index_of(a) is None)
    unknown = set(ignored)  # membership below is per offered ID: a set keeps it linear
    free = sorted(i for a in available if (i := snap.index_of(a)) is not None)
    must_idx = sorted(i for m in must if (i := snap.index_of(m)) is not None)
    try:
        choice = snap.allocator.choose(free, size, must_idx)
    except AllocationError as e:
        raise RequestError(_refusal(e, size, len(must), len(available), len(free), ignored)) from None
    gpus = snap.gpus
    return PreferredAnswer(
        device_ids=tuple(gpus[i].uuid for i in sorted(choice.indices)),
        choice=choice,
        ignored=ignored,
        unhealthy_offered=tuple(a for a in available if a not in unknown and not snap.healthy(a)),
    )


def _refusal(
    e: AllocationError, size: int, n_must: int, n_offered: int, n_known: int, ignored: Sequence[str]
) -> str:
    """The policy's refusal in the request's own terms (kubelet's field names)."""
    if e.kind == "size":
        return f"allocation_size must be positive, got {size}"
    if e.kind == "must_over_size":
        return f"{n_must} must_include_deviceIDs exceed allocation_size {size}"
    if e.kind == "too_few" and ignored:
        return (
            f"allocation_size {size} exceeds the {n_known} known available devices "
            f"(unknown: {_short(list(ignored))})"
        )
    if e.kind == "too_few":
        return f"allocation_size {size} exceeds the {n_offered} available devices"
    return f"no allocation possible: {e}"


def allocate_ids(snap: Snapshot, ids: Sequence[str]) -> tuple[str, ...]:
    """Validate one ContainerAllocateRequest; the IDs in GPU index order."""
    if not ids:
        raise RequestError("devices_ids is empty")
    _bounded("devices_ids", ids)
    if dups := _duplicates(ids):
        raise RequestError(f"devices_ids lists {_short(dups)} more than once")
    if unknown := [i for i in ids if snap.index_of(i) is None]:
        raise RequestError(f"unknown device IDs {_short(unknown)}")
    return tuple(sorted(ids, key=lambda u: snap.index_of(u) or 0))
