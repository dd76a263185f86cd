"""Single-pod placement: which node (and GPU set) is best for one pod that is not in a gang.

The sidecar's prioritize verb scores nodes with `node_scores` (the simulator's deployed path
too, through its model of kube-scheduler); with an `objective` the order is the cluster-level
one of `gputopo.pod.objective`, else the first cut's: the best GPU set the node's allocator
would give (design.md §2), then best fit, so the emptier nodes stay whole for the gangs.
`place_pod` is the first cut's order without the rounding to 0..10, one best node.
Pure: no I/O, no clock, no globals.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from gputopo.network.nodeview import ChoiceMemo, NodeView, Placement
from gputopo.node.policy import GpuPolicy
from gputopo.pod.objective import ClusterObjective, SingleKey, single_key

#: Score of a node of unknown topology in `node_scores`: the middle of 0..10.
NEUTRAL_SCORE = 5
MAX_SCORE = 10


#: A node's key in `rank_scores`: any comparable tuple (larger is better).
K = TypeVar("K", bound=tuple[Any, ...])


def node_scores(
    gpus: int,
    nodes: Sequence[NodeView],
    *,
    memo: ChoiceMemo | None = None,
    objective: ClusterObjective | None = None,
) -> dict[str, int]:
    """Prioritize for a single pod: each node scored 0..10 by the best GPU set it can give
    (node objective), then by least disruption of what stays free. Nodes that cannot fit get 0.
    With an `objective`, the order is the cluster-level one (`gputopo.pod.objective`).

    Scores are ranks, scaled over the nodes given: the best distinct key gets 10, the worst
    fitting one 1, the rest evenly between; unknown-topology nodes that fit get 5 (neutral)."""
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
        raise ValueError(f"a pod must ask for at least 1 GPU to be scored, got {gpus!r}")
    memo = memo if memo is not None else ChoiceMemo()
    scores: dict[str, int] = {}
    # Nodes of one server type with the same free GPUs share a key: work per kind, not per node.
    kinds: dict[tuple[GpuPolicy, frozenset[int]], list[str]] = {}
    for v in nodes:
        if len(v.free) < gpus:
            scores[v.name] = 0
        elif v.allocator is None:
            scores[v.name] = NEUTRAL_SCORE
        else:
            kinds.setdefault((v.allocator, v.free), []).append(v.name)
    keyed: dict[tuple[GpuPolicy, frozenset[int]], tuple[object, ...]]
    if objective is not None:
        keyed = objective.keys(gpus, {(a, free): memo.choose(a, free, gpus) for a, free in kinds})
    else:
        keyed = {(a, free): single_key(free, memo.choose(a, free, gpus), gpus) for a, free in kinds}
    score_of = rank_scores(keyed.values())
    for kind, names in kinds.items():
        score = score_of[keyed[kind]]
        for name in names:
            scores[name] = score
    return scores


def rank_scores(keys: Iterable[K]) -> dict[K, int]:
    """`node_scores`' 0..10 per distinct key (larger keys are better): the best gets 10, the
    worst 1, the rest evenly between by rank; a single distinct key gets 10. Only the set of
    keys matters (not their order or repeats)."""
    distinct = sorted(set(keys), reverse=True)
    return dict(zip(distinct, _scaled(len(distinct)), strict=True))


def scores_in_order(keys: Sequence[K]) -> list[int]:
    """`rank_scores`' score of each of `keys`, in their order: the simulated sidecar asks it of
    one node per class of identical nodes. Ranked by sorting positions (keys compare, never
    hash: they are nested tuples, and a few of them are asked for at a time)."""
    order = sorted(range(len(keys)), key=keys.__getitem__, reverse=True)
    rank = [0] * len(keys)
    r = 0
    for i in range(1, len(order)):
        if keys[order[i]] != keys[order[i - 1]]:
            r += 1
        rank[order[i]] = r
    if not keys:
        return []
    scaled = _SCALED[r] if r < len(_SCALED) else _scaled(r + 1)
    return [scaled[x] for x in rank]


def _scaled(distinct: int) -> tuple[int, ...]:
    """The score of each rank 0..distinct-1: 10 for the best, 1 for the worst, evenly between."""
    span = distinct - 1
    if span == 0:
        return (MAX_SCORE,)
    return tuple(1 + round((MAX_SCORE - 1) * (span - r) / span) for r in range(distinct))


#: `_scaled(r + 1)` for r distinct keys past the first, up to a few dozen (a constant table).
_SCALED = tuple(_scaled(d) for d in range(1, 65))


def place_pod(
    pod: str, gpus: int, nodes: Iterable[NodeView], *, memo: ChoiceMemo | None = None
) -> Placement | None:
    """The single best node and GPU set for one pod, or None when no node has room.

    Nodes of known topology come first, ordered as in `node_scores` but without its rounding;
    then unknown-topology nodes by best fit. Ties: name order."""
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
        raise ValueError(f"a pod must ask for at least 1 GPU to be placed, got {gpus!r}")
    memo = memo if memo is not None else ChoiceMemo()
    best: tuple[int, int | SingleKey] | None = None
    best_place: Placement | None = None
    for v in nodes:
        if len(v.free) < gpus:
            continue
        if v.allocator is None:
            key: tuple[int, int | SingleKey] = (0, -len(v.free))
            place = Placement(pod, v.name, ())
        else:
            choice = memo.choose(v.allocator, v.free, gpus)
            key = (1, single_key(v.free, choice, gpus))
            place = Placement(pod, v.name, choice.indices, choice)
        if best is None or best_place is None or key > best or (key == best and v.name < best_place.node):
            best, best_place = key, place
    return best_place
