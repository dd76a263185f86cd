"""Where a pod's gang and its placement constraints come from: the APIs users already write.

A pod can name its gang through Kubernetes' own Workload API, scheduler-plugins, Volcano,
Kueue or KAI Scheduler, and its topology level through gputopo's, Kueue's or KAI Scheduler's
annotations. The gang sources, their precedence and their group objects' parsers are the core's
one table (gputopo/gang/sources.py, which `kubectl gputopo why` reads too); this module adds the
levels and the pod's own wait, so a pod spec is scheduled as its authors wrote it, with no
gputopo-specific annotation (docs/scheduler.md "Gang sources").

It also parses Kueue / KAI `Topology` objects (a level list) the same way: pure functions from
API JSON to values, every field checked, garbage -> None.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gputopo.gang import sources as gangsources
from gputopo.gang.planner import SubGroup
from gputopo.gang.sources import LEVEL_ANNOTATIONS, SourceError, dig
from gputopo.network.levels import HOSTNAME, is_label_key
from gputopo.numerals import duration_s

#: How long this pod waits for its best topology before it takes what there is, overriding the
#: sidecar's --gang-spill-after: a gang for one domain of its own level (gputopo/gang/levelwait.py), a
#: multi-GPU pod for a node at its best ring (gputopo/pod/ringwait.py). A duration ("300s", "30m",
#: "1h30m") or seconds; Slurm's `--switches=count@max-time` is the same per-job bound.
LEVEL_WAIT_ANNOTATION = "gputopo.io/topology-wait"
#: The longest wait a pod may ask for (the sidecar's own flag has the same bound).
MAX_LEVEL_WAIT_S = 30 * 86_400.0


@dataclass(frozen=True)
class PodGang:
    """What a pod says about its gang: key, the member count if the pod carries it, levels."""

    key: str
    source: str  # which API named the gang, for logs and `why`
    min_member: int | None
    required_level: str | None
    preferred_level: str | None
    level_source: str  # "gputopo", "kueue", "kai" or "" (none: the group object may set one)
    #: the pod's leaf sub-group ("" none), the sub-groups the pod declares (its path from the
    #: root), and the family that named them ("gputopo", "kai", "kueue" or "")
    subgroup: str = ""
    groups: tuple[SubGroup, ...] = ()
    subgroup_source: str = ""


def level_wait(annotations: Mapping[str, str]) -> float | None:
    """The pod's LEVEL_WAIT_ANNOTATION in seconds, None when absent; SourceError when set to
    anything but a duration of at most MAX_LEVEL_WAIT_S (a typo must not mean "the default")."""
    raw = annotations.get(LEVEL_WAIT_ANNOTATION)
    if raw is None:
        return None
    value = duration_s(raw, max_s=MAX_LEVEL_WAIT_S) if isinstance(raw, str) else None
    if value is None:
        shown = raw[:40] if isinstance(raw, str) else raw
        raise SourceError(
            f"annotation {LEVEL_WAIT_ANNOTATION} must be a duration such as 300s, 30m or 1h30m "
            f"(at most {MAX_LEVEL_WAIT_S / 86_400:g} days), got {shown!r}"
        )
    return value


def pod_levels(annotations: Mapping[str, str]) -> tuple[str | None, str | None, str]:
    """(required, preferred, source) from the first annotation family that sets either."""
    for source, req_key, pref_key in LEVEL_ANNOTATIONS:
        required = annotations.get(req_key) or None
        preferred = annotations.get(pref_key) or None
        if required or preferred:
            return required, preferred, source
    return None, None, ""


def pod_gang(
    namespace: str, labels: Mapping[str, str], annotations: Mapping[str, str], spec: Mapping[str, Any]
) -> PodGang | None:
    """The pod's gang by the precedence of the core's table (`sources.SOURCES`) with the
    pod's levels, or None; SourceError when a source is named but malformed (a light label
    without a usable minimum, a Kueue group without count).

    Order: Kubernetes `spec.schedulingGroup` (1.36) > `spec.workloadRef` (1.35) >
    scheduler-plugins label > light labels > Volcano annotation > Kueue pod group > KAI
    Scheduler's `pod-group-name`."""
    required, preferred, level_source = pod_levels(annotations)
    found = gangsources.pod_gang(labels, annotations, spec)
    if found is None:
        return None
    key = f"{namespace}/{found.key}"
    return PodGang(
        key,
        found.source.label,
        found.min_member,
        required,
        preferred,
        level_source,
        found.subgroup,
        found.subgroups,
        found.subgroup_source,
    )


# --- topology objects (level lists) --------------------------------------------------------


def topology_levels(obj: Mapping[str, Any]) -> tuple[str, ...] | None:
    """A Kueue / KAI Topology's levels, smallest domain first (they list broadest first);
    None when the object is unusable (no levels, a bad label key, a duplicate)."""
    levels = dig(obj, "spec", "levels")
    if not isinstance(levels, list) or not 1 <= len(levels) <= 16:
        return None
    keys = [dig(lv, "nodeLabel") for lv in levels]
    if not all(is_label_key(k) for k in keys) or len(set(keys)) != len(keys):
        return None
    return tuple(reversed(keys))


def merge_levels(lists: Iterable[Sequence[str]], defaults: Sequence[str]) -> tuple[str, ...]:
    """Hostname first, then each Topology's levels (in object-name order), then the default
    levels none of them names. A level another list already holds keeps its first place:
    nodes one Topology does not describe lack its labels, so its levels are one-node domains
    to them and cannot change where their gangs go."""
    out: list[str] = [HOSTNAME]
    for levels in (*lists, defaults):
        out.extend(lv for lv in levels if lv not in out)
    return tuple(out)
