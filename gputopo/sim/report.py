"""Rendering results: the aligned terminal table and the JSON document.

Rows are metrics and columns are policies, so a reader compares one figure across policies
along a line. The default table fits 120 columns (or a narrower terminal): it shows gputopo,
the best of the other policies on the headline figure, and kubelet-default, the baseline every
throughput is measured against. `-o wide` shows every policy and the per-profile rows, split
into blocks of columns that fit the terminal instead of lines that wrap. A row no shown policy
has a figure for (fill-only rows in a replay, say) is left out and named under the table.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gputopo.sim.jobmodel import JobModel
from gputopo.sim.metrics import Summary


def pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f} %"


def _int(v: int | None) -> str:
    return "n/a" if v is None else f"{v:,}"


def _free(s: Summary) -> str:
    """Free GPUs at the first failure; under --gpu-sharing counted in milli-GPUs, shown in GPUs."""
    v = s.free_at_first_failure
    if v is None or not s.milli_gpus:
        return _int(v)
    return f"{v / 1000:,.3f}"


def secs(v: float | None) -> str:
    if v is None:
        return "n/a"
    if v >= 3600:
        return f"{v / 3600:.1f} h"
    if v >= 60:
        return f"{v / 60:.1f} min"
    return f"{v:.0f} s"


def ratio(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}x"


def _extra(s: Summary, key: str) -> str:
    """A lifecycle figure; n/a for policies that do not model the sidecar over time."""
    v = s.extra.get(key)
    return "n/a" if v is None else f"{v:,.0f}"


def _by_profile(profile: str) -> Callable[[Summary], str]:
    """The job-time ratio of one workload profile of the mix (n/a where it ran no multi-GPU job)."""
    return lambda s: ratio(s.job_time_ratio_by_profile.get(profile))


#: Which way a figure is better: higher, lower, or neither (a count that describes the run).
HIGHER, LOWER, NEITHER = "↑", "↓", ""

#: The widest line the default output prints, whatever the terminal: wider lines wrap in most
#: terminals and in every code review, and a wrapped table cannot be read along its rows.
MAX_WIDTH = 120

#: The policy the project is about, always a column when it ran.
OURS = "gputopo"

Row = tuple[str, str, Callable[[Summary], str]]

ROWS: tuple[Row, ...] = (
    ("jobs placed / arrived", NEITHER, lambda s: f"{s.placed:,}/{s.jobs:,}"),
    ("rejected (fill) / never started", LOWER, lambda s: f"{s.rejected:,}/{s.never_started:,}"),
    ("GPU demand placed", HIGHER, lambda s: pct(s.demand_placed)),
    ("GPUs allocated at first failure", HIGHER, lambda s: pct(s.allocated_at_first_failure)),
    ("GPUs allocated at end (fill)", HIGHER, lambda s: pct(s.allocated_at_end)),
    ("multi-GPU pods", NEITHER, lambda s: _int(s.multi_gpu_pods)),
    ("pods at best ring of empty node", HIGHER, lambda s: pct(s.best_ring_share)),
    ("mean ring bw / best ring bw", HIGHER, lambda s: pct(s.ring_over_best)),
    ("gangs (multi-node jobs)", NEITHER, lambda s: _int(s.gangs)),
    ("gangs inside one leaf", HIGHER, lambda s: pct(s.gangs_one_leaf)),
    ("gangs inside one spine", HIGHER, lambda s: pct(s.gangs_one_spine)),
    ("free GPUs at first failure (FGD)", LOWER, _free),
    ("jobs held up by fragmentation", LOWER, lambda s: pct(s.fragmented_jobs)),
    ("jobs that queued at all", LOWER, lambda s: pct(s.queued_share)),
    ("queueing delay, mean (all jobs)", LOWER, lambda s: secs(s.queue_delay_mean)),
    ("queueing delay, mean of those queued", LOWER, lambda s: secs(s.queue_delay_mean_queued)),
    (
        "queueing delay, mean: 1-GPU / multi-GPU jobs",
        LOWER,
        lambda s: f"{secs(s.queue_delay_mean_single)} / {secs(s.queue_delay_mean_multi)}",
    ),
    ("queueing delay, mean per GPU asked", LOWER, lambda s: secs(s.queue_delay_mean_per_gpu)),
    (
        "queueing delay, p95 / p99",
        LOWER,
        lambda s: f"{secs(s.queue_delay_p95)} / {secs(s.queue_delay_p99)}",
    ),
    ("job time / ideal (multi-GPU jobs)", LOWER, lambda s: ratio(s.job_time_ratio)),
    ("throughput vs kubelet-default (multi-GPU jobs)", HIGHER, lambda s: ratio(s.throughput_vs_baseline)),
    ("admission failures (plugin)", LOWER, lambda s: _int(s.admission_failures)),
    ("gangs that waited for quorum", NEITHER, lambda s: _extra(s, "gangs_waited_for_quorum")),
    ("reservations expired", LOWER, lambda s: _extra(s, "reservations_expired")),
    ("re-plans after bind failures", NEITHER, lambda s: _extra(s, "replans_after_bind_failure")),
)

#: The row after which `-o wide` puts one "job time / ideal: <profile>" row per profile.
_PROFILE_ROWS_AFTER = "job time / ideal (multi-GPU jobs)"

QUEUE_NOTE = (
    "queueing: the mean counts every placed job, so a few jobs that waited hours raise it while "
    "the p95 stays low; 'mean of those queued' is the wait of a job that had to wait. "
    "Throughput counts multi-GPU jobs (single-GPU jobs run alike under every policy)."
)


def wrap(text: str, width: int, indent: str = "  ") -> list[str]:
    """`text` in lines of at most `width` characters, the later ones indented: header and
    footer lines are prose, and a 250-character line wraps mid-word in a terminal."""
    return textwrap.wrap(text, width, subsequent_indent=indent, break_on_hyphens=False) or [""]


def _headline(s: Summary) -> tuple[float, float, float]:
    """The figures a reader looks for first, best first: throughput vs kubelet-default, then
    job time / ideal (lower is better), then GPU demand placed; a missing figure ranks last."""

    def value(v: float | None, sign: float) -> float:
        return -math.inf if v is None else sign * v

    return (value(s.throughput_vs_baseline, 1), value(s.job_time_ratio, -1), value(s.demand_placed, 1))


def best_peer(results: Sequence[Summary]) -> Summary | None:
    """The best of the policies other than gputopo and kubelet-default on the headline figures
    (the first listed on a tie), or None when the run has no such policy."""
    from gputopo.sim.policies.catalog import BASELINE

    peers = [r for r in results if r.policy not in (OURS, BASELINE)]
    return max(peers, key=_headline) if peers else None


def shown_policies(results: Sequence[Summary], *, wide: bool = False) -> list[Summary]:
    """The columns of the table: every policy under `-o wide` or when three or fewer ran;
    otherwise gputopo, the best peer and kubelet-default, in that order."""
    from gputopo.sim.policies.catalog import BASELINE

    if wide or len(results) <= 3:
        return list(results)
    peer = best_peer(results)
    by_name = {r.policy: r for r in results}
    names = [OURS, peer.policy if peer else None, BASELINE]
    return [by_name[n] for n in names if n is not None and n in by_name]


def table_rows(results: Sequence[Summary], *, wide: bool = False) -> list[Row]:
    """ROWS, with one job-time row per profile of the mix under `-o wide`."""
    if not wide:
        return list(ROWS)
    profiles = sorted({p for r in results for p in r.job_time_ratio_by_profile})
    out: list[Row] = []
    for row in ROWS:
        out.append(row)
        if row[0] == _PROFILE_ROWS_AFTER:
            out += [(f"job time / ideal: {p}", LOWER, _by_profile(p)) for p in profiles]
    return out


def _undefined(cell: str) -> bool:
    """True for "n/a" and for a pair of them ("n/a / n/a")."""
    return all(part.strip() == "n/a" for part in cell.split(" / "))


def render_table(
    results: Sequence[Summary], header: Mapping[str, Any], *, wide: bool = False, width: int = MAX_WIDTH
) -> str:
    """Header lines (workload, cluster, mode), the metric x policy table with a column saying
    which way each figure is better (↑ higher, ↓ lower, blank: it only describes), then the
    footer: rows left out for want of a figure, the simulator's own speed and how to read the
    queueing rows. Every line fits `width` unless one label and one column alone do not; the
    policies go into as many blocks of columns as that takes."""
    lines = [line for k, v in header.items() for line in wrap(f"{k}: {v}", width, "    ")]
    lines.append("")
    cols = shown_policies(results, wide=wide)
    if len(cols) < len(results):
        peer = best_peer(results)
        others = len(results) - 2 if any(r.policy == OURS for r in results) else len(results) - 1
        if peer is not None:
            lines += wrap(
                f"best peer: {peer.policy}, the best of the other {others} policies on throughput "
                f"vs kubelet-default (then job time / ideal); -o wide shows all {len(results)} "
                "policies and the per-profile rows",
                width,
            )
            lines.append("")
    rows: list[tuple[str, str, list[str]]] = []
    missing: list[str] = []
    for label, better, fmt in table_rows(results, wide=wide):
        cells = [fmt(r) for r in cols]
        if cells and all(_undefined(c) for c in cells):
            missing.append(label)
        else:
            rows.append((label, better, cells))
    label_w = max(len(label) for label, _, _ in rows) + 2 if rows else 8
    widths = [max([len(r.policy), *(len(cells[k]) for _, _, cells in rows)]) + 2 for k, r in enumerate(cols)]
    for n, block in enumerate(_blocks(widths, width - label_w - 6)):
        if n:
            lines.append("")  # a blank line between blocks of policies
        block_w = label_w + 6 + sum(widths[k] for k in block)
        lines.append(
            "metric".ljust(label_w) + "better" + "".join(cols[k].policy.rjust(widths[k]) for k in block)
        )
        lines.append("-" * block_w)
        for label, better, cells in rows:
            lines.append(
                label.ljust(label_w) + better.center(6) + "".join(cells[k].rjust(widths[k]) for k in block)
            )
    lines.append("")
    if missing:
        lines += wrap(
            f"no figure in this run (left out; -o json has them as null): {'; '.join(missing)}", width
        )
    speed = ", ".join(f"{r.policy} {r.pods / r.seconds:,.0f}" for r in cols if r.seconds > 0)
    if speed:
        lines += wrap(f"simulator speed, pods simulated per second: {speed}", width)
    lines += wrap(QUEUE_NOTE, width)
    return "\n".join(lines)


def _blocks(widths: Sequence[int], room: int) -> list[list[int]]:
    """Column indices in consecutive groups whose widths add up to at most `room` (at least
    one column per group, so a single column wider than the room still shows)."""
    blocks: list[list[int]] = []
    used = room + 1
    for k, w in enumerate(widths):
        if used + w > room:
            blocks.append([])
            used = 0
        blocks[-1].append(k)
        used += w
    return blocks


def document(results: Sequence[Summary], header: Mapping[str, Any], comm: JobModel) -> dict[str, Any]:
    """The JSON form: the run's header, the job-time model's settings, one object per policy."""
    return {"run": dict(header), "job_time_model": comm.describe(), "results": [r.to_dict() for r in results]}


def _tree(key: str, fmt: Callable[[float | None], str]) -> Callable[[Summary], str]:
    """A tree figure (Summary.extra, gputopo.sim.trees); n/a where the run has none."""
    return lambda s: fmt(s.extra.get(key))


def _racks(s: Summary) -> str:
    v, n = s.extra.get("racks_fragmented_mean"), s.extra.get("racks")
    return "n/a" if v is None else f"{v:.2f} of {n:.0f}"


#: The rows of `simulate --jobs tree` (docs/simulator.md "Jobs as trees on NVL72").
TREE_ROWS: tuple[Row, ...] = (
    ("jobs placed / arrived", NEITHER, lambda s: f"{s.placed:,}/{s.jobs:,}"),
    ("never started", LOWER, lambda s: f"{s.never_started:,}"),
    ("tree jobs placed", NEITHER, _tree("tree_jobs_placed", lambda v: "n/a" if v is None else f"{v:,.0f}")),
    ("TP groups inside one NVLink domain", HIGHER, _tree("tp_groups_inside_nvlink", pct)),
    ("tree jobs inside one leaf", HIGHER, _tree("tree_jobs_inside_leaf", pct)),
    ("throughput, tree jobs (ideal / actual time)", HIGHER, _tree("tree_efficiency", pct)),
    ("queueing delay, mean (all jobs)", LOWER, lambda s: secs(s.queue_delay_mean)),
    ("queueing delay, mean (tree jobs)", LOWER, _tree("tree_queue_delay_mean", secs)),
    ("queueing delay, mean per GPU asked", LOWER, lambda s: secs(s.queue_delay_mean_per_gpu)),
    ("racks left fragmented (time mean)", LOWER, _racks),
)

TREE_NOTE = (
    "tree jobs: TP groups of k 4-GPU pods (one GB200 tray each), DP replicas = the groups; "
    "throughput by gputopo.jobtime.parallel (a TP group split across NVLink domains pays the "
    "network), the ideal every group in one NVL72 rack; a rack is left fragmented while it is "
    "partly used and has at least one but fewer whole free trays than the typical TP group "
    "(typical: {typical} trays). Single pods (4 GPUs or fewer) are placed alike by every policy."
)


def render_tree_table(
    results: Sequence[Summary], header: Mapping[str, Any], *, width: int = MAX_WIDTH
) -> str:
    """The `--jobs tree` comparison: header lines, then TREE_ROWS x every policy that ran, in
    blocks of columns that fit `width`, then how to read it."""
    lines = [line for k, v in header.items() for line in wrap(f"{k}: {v}", width, "    ")]
    lines.append("")
    rows = [(label, better, [fmt(r) for r in results]) for label, better, fmt in TREE_ROWS]
    label_w = max(len(label) for label, _, _ in rows) + 2
    widths = [
        max([len(r.policy), *(len(cells[k]) for _, _, cells in rows)]) + 2 for k, r in enumerate(results)
    ]
    for n, block in enumerate(_blocks(widths, width - label_w - 6)):
        if n:
            lines.append("")
        lines.append(
            "metric".ljust(label_w) + "better" + "".join(results[k].policy.rjust(widths[k]) for k in block)
        )
        lines.append("-" * (label_w + 6 + sum(widths[k] for k in block)))
        for label, better, cells in rows:
            lines.append(
                label.ljust(label_w) + better.center(6) + "".join(cells[k].rjust(widths[k]) for k in block)
            )
    lines.append("")
    typical = next((r.extra["typical_tp_trays"] for r in results if "typical_tp_trays" in r.extra), 2.0)
    lines += wrap(TREE_NOTE.format(typical=f"{typical:.0f}"), width)
    return "\n".join(lines)
