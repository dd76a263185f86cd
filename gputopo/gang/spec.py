"""A gang as the planner is asked about it, and its answers: the data every gang module shares.

`GangSpec` (the members to place, the gang's levels, its sub-groups for a tree), `GangPlan` (where
every member goes, and why) and `NoPlan` (why nothing fits). Kept apart from the planners
(`gputopo.gang.planner` for flat gangs, `gputopo.gang.tree` for trees) so that either can use
them without importing the other. Pure data: no I/O, no globals.
"""

from __future__ import annotations

from dataclasses import dataclass

from gputopo.jobtime.profiles import Profile
from gputopo.network.nodeview import UNKNOWN_QUALITY, Placement, Quality


@dataclass(frozen=True)
class Member:
    pod: str  # "namespace/name"
    gpus: int  # GPUs the pod asks for (nvidia.com/gpu)
    group: str = ""  # the sub-group (`SubGroup.name`) the pod belongs to; "": the gang itself


@dataclass(frozen=True)
class SubGroup:
    """One non-root node of a hierarchical gang (docs/gang.md "Gangs as trees"): a named group
    of members and child sub-groups that must sit inside one domain of `required_level` (or is
    placed in the smallest domain from `preferred_level` up). The gang itself is the root; a
    sub-group's `parent` names another sub-group, "" the root. Kubernetes' PodGroups under a
    CompositePodGroup, KAI's `subGroups[]`, Kueue's slices and Volcano's partitions map to it
    (`gputopo.gang.sources`)."""

    name: str
    parent: str = ""
    required_level: str | None = None
    preferred_level: str | None = None
    #: the sub-group's own quorum where its API says one (KAI minMember, a PodGroup's minCount);
    #: informational: the gang's quorum decides when planning starts
    min_count: int | None = None


@dataclass(frozen=True)
class GangSpec:
    key: str  # "namespace/group-name"
    members: tuple[Member, ...]  # the members to place now (pending ones)
    required_level: str | None = None  # gputopo.io/required-topology (a level's label key)
    preferred_level: str | None = None  # gputopo.io/preferred-topology
    #: what the gang trains, when its pods or group declare it (gputopo.io/profile, or gradient
    #: bytes and compute seconds): the job-time prediction reads it instead of the mix
    profile: Profile | None = None
    #: the gang's sub-groups, any depth (empty: a flat gang, planned exactly as before)
    groups: tuple[SubGroup, ...] = ()
    #: (sub-group, node) of members already bound: a re-plan keeps each sub-group's required
    #: domain where its bound members are
    bound: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Placed:
    """Where one node of a tree gang went and why (`GangPlan.tree`): the plan's reason, the
    gang's Event and `kubectl gputopo why` all word it (`gputopo.gang.explain`), so an operator
    sees per sub-group the domain it got and whether its level was kept, without the logs."""

    name: str  # the sub-group's name; "" the root (the gang itself)
    parent: str  # its parent sub-group, "" the root (and for the root itself)
    level: str  # the label key of the level whose one domain holds it (CLUSTER: none smaller)
    domain: str  # that domain's label value ("cluster" at CLUSTER)
    nodes: tuple[str, ...]  # the nodes its pending members were planned on, sorted
    asked: str  # "required", "preferred" or "" (no level asked: the smallest that holds it)
    asked_level: str | None  # the level it asked for (None when `asked` is "")
    #: why it is not at its preferred level, or the flat planner's choice (predicted job time);
    #: "" when the level it asked for was kept or only the level rule decided
    why: str = ""
    pods: tuple[str, ...] = ()  # its own pending members placed ("namespace/name"), not its children's
    gpus: int = 0  # GPUs of every pending member of its subtree


@dataclass(frozen=True)
class GangPlan:
    gang: str
    level: str  # the label key of the level whose one domain holds every member
    domain: str  # that domain's label value
    placements: tuple[Placement, ...]
    nodes_used: int = 0  # objective (2)
    worst: Quality = UNKNOWN_QUALITY  # objective (3): the worst member's (ring, pair sum)
    domain_free: int = 0  # objective (4): free GPUs of the domain before the plan
    # tie-break (3b): domains touched at each grouping level inside `level`, largest level first
    # (e.g. (spines, leaves) for a plan at the cluster level); () at the smallest levels
    spans: tuple[int, ...] = ()
    #: why this level's plan was taken over the other levels' (`gang.predict.choose`), for the
    #: tracker's plan event; "" when only the level rule decided (no objective, or required)
    why: str = ""
    #: a tree gang's placement: the root first (name ""), then every sub-group with pending
    #: members, each after its parent; () for a flat gang
    tree: tuple[Placed, ...] = ()


@dataclass(frozen=True)
class NoPlan:
    gang: str
    reason: str  # readable: why nothing fits
    #: a tree that does not fit: the path ("parent/child") of the sub-group that could not be
    #: placed, "" when the root itself found no domain (or a flat gang)
    group: str = ""
