"""What a caller asks the gang tracker (`gang.tracker.GangTracker`) and what it answers: plain
values, so the sidecar, the simulator and the tests build and read them without the tracker.

Pure: no I/O, no globals.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from gputopo.gang.spec import SubGroup
from gputopo.jobtime.profiles import Profile


@dataclass(frozen=True)
class GangMember:
    """One active member as the caller sees it: `node` is where it is bound ("" = pending)."""

    pod: str
    gpus: int
    node: str = ""
    group: str = ""  # the sub-group it belongs to (`planner.SubGroup.name`); "": the gang itself


@dataclass(frozen=True)
class GangAsk:
    """A member's question: who the gang is now, and what its PodGroup requires."""

    gang: str
    pod: str
    members: tuple[GangMember, ...]  # every active member known, any order
    min_member: int | None  # None: the PodGroup is not known (yet)
    required_level: str | None = None
    preferred_level: str | None = None
    #: how long this gang waits for its own level (gangwait), the pods' gputopo.io/topology-wait;
    #: None: the tracker's spill_after_s
    spill_after_s: float | None = None
    #: what the gang trains when its pods or group declare it (gputopo/jobtime/profiles.py);
    #: None: the planner weighs its levels by the objective's mix
    profile: Profile | None = None
    #: the gang's sub-groups when its API describes a tree (`planner.SubGroup`); () a flat gang
    groups: tuple[SubGroup, ...] = ()

    def __post_init__(self) -> None:
        if self.spill_after_s is not None and not 0 <= self.spill_after_s < math.inf:
            raise ValueError(f"a gang's spill_after_s must be >= 0 seconds, got {self.spill_after_s!r}")


@dataclass(frozen=True)
class Wait:
    """Not now: the member is refused in this cycle, with the reason kube-scheduler shows."""

    reason: str
    #: the Kubernetes Event reason a sidecar shows on the pod ("" = none): waiting for quorum,
    #: or unschedulable (fits nowhere now)
    event: str = "GangWaiting"


@dataclass(frozen=True)
class Planned:
    """The member's planned node (its only feasible node in this cycle)."""

    node: str
    reason: str


Decision = Wait | Planned


class Refused(Exception):
    """A bind the plan does not allow; the message is returned to kube-scheduler."""


@dataclass(frozen=True)
class Event:
    """Something that happened to a gang: `kind` is one of plan, plan_failed, quorum_wait,
    plan_dropped, replan, gang_bound, adopt; `cause` says why (expired, not_offered, gpus_taken,
    bind_failed, member_gone, node_gone, not_in_plan, bound_elsewhere, takeover)."""

    kind: str
    gang: str
    reason: str
    cause: str = ""
    fields: Mapping[str, object] = field(default_factory=dict)
