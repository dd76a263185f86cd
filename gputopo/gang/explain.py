"""A tree gang's placement in words: one grammar, written by the planner (the plan's reason),
the sidecar (the gang's Event) and read back by `kubectl gputopo why`.

Why one module: the Event note is the only record of the sidecar's decision that an operator
can read without its logs, and `kubectl gputopo why` turns it back into a tree. Written and
parsed here, side by side (and tested round trip), the two cannot drift apart.

The text of a placed tree, as a plan's reason and in the gang's `GangPlanned` Event::

    tree in cluster (cluster, no level asked) on 4 nodes, within the 6 nodes offered;
    sub-groups: podgroup:rank-0 → cl.0 (gpu.clique, required) on n1,n2 | podgroup:rank-1 → ...

(one line): the root, then each sub-group after its parent, nested ones by their path
("composite:half/podgroup:pg-b"), each with the domain it got, its level (short name), how that
level came about (`required`, `preferred` kept, `preferred LEVEL, fell back`, `no level asked`),
its nodes and, after a colon, why (a fall-back's cause, the planner's predicted job time).
Kubernetes refuses Event notes over 1 KiB: `plan_text(limit=...)` keeps whole sub-groups while
they fit and ends with `| and N more sub-groups on M nodes`.

A tree that does not fit names the sub-group that could not be placed (`stuck_text`)::

    sub-group podgroup:rank-1 (2 pods, 16 GPUs, required gpu.clique) cannot be placed in
    cluster: no gpu.clique domain can hold ...

Pure: no I/O, no clock, no globals.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from gputopo.gang.spec import Placed
from gputopo.network.levels import CLUSTER, short_name

ARROW = "→"
#: Between two sub-groups (a reason's own "|" is written "/", so the split is exact).
SEP = " | "
#: The API server refuses Event notes longer than this many bytes (events.k8s.io/v1 validation).
MAX_NOTE = 1024
#: Bytes kept free in a bounded note for what the sidecar's Event writer may append to it
#: (" (after the previous plan broke)" on a re-plan).
NOTE_SLACK = 40
#: Nodes listed per sub-group in a bounded note; more are counted (",+12").
NODES_SHOWN = 8
#: A sub-group's reason is cut to this many characters in a bounded note.
WHY_SHOWN = 200
#: Appended by the sidecar's Event writer to a plan that follows a broken one.
REPLANNED_SUFFIX = " (after the previous plan broke)"


def level_name(level: str) -> str:
    """A level as a reason shows it: its short name ("cluster" for the whole cluster)."""
    return "cluster" if level == CLUSTER else short_name(level)


def how(p: Placed) -> str:
    """How the sub-group's level came about, in the words the grammar allows (no parentheses)."""
    if p.asked == "required":
        return "required"
    if p.asked == "preferred" and p.asked_level is not None:
        if p.level == p.asked_level:
            return "preferred"
        return f"preferred {level_name(p.asked_level)}, fell back"
    return "no level asked"


def asks(pods: int, gpus: int, asked: str, level: str | None) -> str:
    """What a sub-group asks for, for the reason of a tree that does not fit."""
    want = f"{asked} {level_name(level)}" if asked and level is not None else "no level asked"
    return f"{pods} pod{'s' if pods != 1 else ''}, {gpus} GPUs, {want}"


def paths(tree: Sequence[Placed]) -> dict[str, str]:
    """Each sub-group's path from the root ("parent/child"); the root's is ""."""
    parent = {p.name: p.parent for p in tree if p.name}
    out: dict[str, str] = {}
    for name in parent:
        chain: list[str] = []
        at, seen = name, set()
        while at and at not in seen and len(chain) <= len(parent):
            seen.add(at)
            chain.append(at)
            at = parent.get(at, "")
        out[name] = "/".join(reversed(chain))
    return out


def _clean(text: str) -> str:
    """One line, no separator inside."""
    return " ".join(text.replace("|", "/").split())


def _nodes(nodes: Sequence[str], shown: int | None) -> str:
    if shown is None or len(nodes) <= shown:
        return ",".join(nodes) or "-"
    return ",".join(nodes[:shown]) + f",+{len(nodes) - shown}"


def entry(p: Placed, path: str, *, bounded: bool = False) -> str:
    """One sub-group: `PATH → DOMAIN (LEVEL, HOW) on NODES[: WHY]`."""
    text = (
        f"{path} {ARROW} {p.domain} ({level_name(p.level)}, {how(p)}) on "
        f"{_nodes(p.nodes, NODES_SHOWN if bounded else None)}"
    )
    why = _clean(p.why)
    if why:
        text += f": {why[:WHY_SHOWN] if bounded else why}"
    return text


def _root(p: Placed, offered: int | None) -> str:
    text = f"tree in {p.domain} ({level_name(p.level)}, {how(p)}) on {len(p.nodes)} nodes"
    if p.why:
        text += f": {_clean(p.why)}"
    if offered is not None:
        text += f", within the {offered} nodes offered"
    return text


def plan_text(tree: Sequence[Placed], *, offered: int | None = None, limit: int | None = None) -> str:
    """The placed tree in words (module docstring), root first. `offered`: the nodes the plan
    was made over, when known. `limit`: at most this many UTF-8 bytes, whole sub-groups kept
    while they fit, the rest counted (an Event note); None: every sub-group in full (logs)."""
    if not tree:
        return ""
    root, subs = tree[0], tree[1:]
    where = paths(tree)
    head = _root(root, offered)
    if not subs:
        return head
    head += "; sub-groups: "
    entries = [entry(p, where[p.name], bounded=limit is not None) for p in subs]
    if limit is None:
        return head + SEP.join(entries)
    kept: list[str] = []
    size = len(head.encode())
    for i, e in enumerate(entries):
        left = subs[i + 1 :]
        tail = _more(left) if left else ""
        grown = size + len(e.encode()) + (len(SEP) if kept else 0)
        if grown + len(tail.encode()) + (len(SEP) if tail else 0) > limit:
            return head + SEP.join([*kept, _more(subs[i:])])
        kept.append(e)
        size = grown
    return head + SEP.join(kept)


def _more(left: Sequence[Placed]) -> str:
    nodes = {n for p in left for n in p.nodes}
    return f"and {len(left)} more sub-groups on {len(nodes)} nodes"


def stuck_text(path: str, pods: int, gpus: int, asked: str, level: str | None, within: str, why: str) -> str:
    """The reason of a tree that does not fit, naming the sub-group that could not be placed."""
    return f"sub-group {path} ({asks(pods, gpus, asked, level)}) cannot be placed in {within}: {_clean(why)}"


# ------------------------------------------------------------------------ reading it back

_HEAD = re.compile(
    r"tree in (?P<domain>\S+) \((?P<level>[^,()]+), (?P<how>[^()]*)\) on (?P<count>\d+) nodes"
    r"(?:: (?P<why>.*?))?(?:, within the (?P<offered>\d+) nodes offered)?(?:; sub-groups: (?P<rest>.*))?$"
)
_ENTRY = re.compile(
    r"(?P<path>\S+) " + ARROW + r" (?P<domain>\S+) \((?P<level>[^,()]+), (?P<how>[^()]*)\) "
    r"on (?P<nodes>\S+)(?:: (?P<why>.*))?$"
)
_MORE = re.compile(r"and (?P<groups>\d+) more sub-groups on (?P<nodes>\d+) nodes$")
_STUCK = re.compile(
    r"sub-group (?P<path>\S+) \((?P<asks>[^()]*)\) cannot be placed in (?P<within>\S+): (?P<reason>.*?)"
    r"(?: \(retry in \d+s\))?$"
)


def _node_list(text: str) -> tuple[list[str], int]:
    nodes, more = [], 0
    for n in text.split(","):
        if n.startswith("+") and n[1:].isdigit():
            more += int(n[1:])
        elif n and n != "-":
            nodes.append(n)
    return nodes, more


def parse_plan(message: str) -> dict[str, Any] | None:
    """A placed tree read back from a message `plan_text` wrote (an Event's note, whatever
    precedes "tree in"), or None when the message holds none. Keys as documented for
    `kubectl gputopo why -o json`'s `gang.tree`: the root's level/domain/how/why, its node
    count, the nodes offered, and `subgroups` (each: name, path, parent, depth, domain, level,
    how, why, nodes, more_nodes) with `omitted`/`omitted_nodes` for those summarised away."""
    at = message.find("tree in ")
    if at < 0:
        return None
    text = message[at:].removesuffix(REPLANNED_SUFFIX)
    m = _HEAD.match(text)
    if m is None:
        return None
    doc: dict[str, Any] = {
        "domain": m["domain"],
        "level": m["level"],
        "how": m["how"],
        "why": m["why"] or "",
        "node_count": int(m["count"]),
        "offered": None if m["offered"] is None else int(m["offered"]),
        "subgroups": [],
        "omitted": 0,
        "omitted_nodes": 0,
    }
    for part in (m["rest"] or "").split(SEP) if m["rest"] else []:
        more = _MORE.match(part)
        if more is not None:
            doc["omitted"] += int(more["groups"])
            doc["omitted_nodes"] += int(more["nodes"])
            continue
        entry = parse_entry(part)
        if entry is None:
            return None
        doc["subgroups"].append(entry)
    return doc


def parse_entry(text: str) -> dict[str, Any] | None:
    """One sub-group as `entry` wrote it (name, path, parent, depth, domain, level, how, why,
    nodes, more_nodes), or None when `text` is not one."""
    e = _ENTRY.match(text.removesuffix(REPLANNED_SUFFIX))
    if e is None:
        return None
    path = e["path"]
    nodes, extra = _node_list(e["nodes"])
    parent, _, name = path.rpartition("/")
    return {
        "name": name,
        "path": path,
        "parent": parent.rpartition("/")[2],
        "depth": path.count("/") + 1,
        "domain": e["domain"],
        "level": e["level"],
        "how": e["how"],
        "why": e["why"] or "",
        "nodes": nodes,
        "more_nodes": extra,
    }


#: What the sidecar's GangPlanned Event on a tree member's pod appends (`scheduler/extender.py`).
OWN_SUBGROUP = "; its sub-group "


def parse_own(message: str) -> dict[str, Any] | None:
    """The pod's own sub-group from its GangPlanned Event ("...; its sub-group ENTRY"), or None."""
    at = message.find(OWN_SUBGROUP)
    return None if at < 0 else parse_entry(message[at + len(OWN_SUBGROUP) :])


def parse_stuck(message: str) -> dict[str, str] | None:
    """The sub-group a tree that does not fit could not place, read back from a message holding
    `stuck_text` (an Event's note): path, name, what it asks, where, why; None when none."""
    at = message.find("sub-group ")
    while at >= 0:
        m = _STUCK.match(message[at:])
        if m is not None:
            return {
                "path": m["path"],
                "name": m["path"].rpartition("/")[2],
                "asks": m["asks"],
                "within": m["within"],
                "reason": m["reason"],
            }
        at = message.find("sub-group ", at + 1)
    return None


def as_json(tree: Sequence[Placed]) -> list[Mapping[str, Any]]:
    """The tree as plain values, for a structured log line."""
    where = paths(tree)
    return [
        {
            "subgroup": where.get(p.name, ""),
            "level": p.level,
            "domain": p.domain,
            "how": how(p),
            "why": p.why,
            "nodes": list(p.nodes),
        }
        for p in tree
    ]
