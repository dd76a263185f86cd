"""Rendering results: the aligned terminal table and the JSON document.

Rows are metrics and columns are policies, so seven policies fit a wide terminal and a reader
compares one figure across policies along a line.
"""

from __future__ import annotations

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


def _by_profile(s: Summary) -> str:
    """`cnn 1.001x / encoder 1.020x / ...`: the job-time ratio of each profile of the mix."""
    if not s.job_time_ratio_by_profile:
        return "n/a"
    return " / ".join(f"{p} {v:.3f}x" for p, v in s.job_time_ratio_by_profile.items())


#: Which way a figure is better: higher, lower, or neither (a count that describes the run).
HIGHER, LOWER, NEITHER = "↑", "↓", ""

ROWS: tuple[tuple[str, str, Callable[[Summary], str]], ...] = (
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
    ("job time / ideal per profile", LOWER, lambda s: _by_profile(s)),
    ("throughput vs kubelet-default (multi-GPU jobs)", HIGHER, lambda s: ratio(s.throughput_vs_baseline)),
    ("admission failures (plugin)", LOWER, lambda s: _int(s.admission_failures)),
    ("gangs that waited for quorum", NEITHER, lambda s: _extra(s, "gangs_waited_for_quorum")),
    ("reservations expired", LOWER, lambda s: _extra(s, "reservations_expired")),
    ("re-plans after bind failures", NEITHER, lambda s: _extra(s, "replans_after_bind_failure")),
    ("simulated pods/s", HIGHER, lambda s: f"{s.pods / s.seconds:,.0f}" if s.seconds > 0 else "n/a"),
)


def render_table(results: Sequence[Summary], header: Mapping[str, Any]) -> str:
    """Header lines (workload, cluster, mode) then the metric x policy table, with a column
    saying which way each figure is better (↑ higher, ↓ lower, blank: it only describes)."""
    lines = [f"{k}: {v}" for k, v in header.items()]
    lines.append("")
    width = max(len(label) for label, _, _ in ROWS) + 2
    cols = [max(len(r.policy), *(len(fmt(r)) for _, _, fmt in ROWS)) + 2 for r in results]
    lines.append(
        "metric".ljust(width)
        + "better"
        + "".join(r.policy.rjust(w) for r, w in zip(results, cols, strict=True))
    )
    lines.append("-" * (width + 6 + sum(cols)))
    for label, better, fmt in ROWS:
        lines.append(
            label.ljust(width)
            + better.center(6)
            + "".join(fmt(r).rjust(w) for r, w in zip(results, cols, strict=True))
        )
    lines.append("")
    lines.append(
        "queueing: the mean counts every placed job, so a few jobs that waited hours raise it while "
        "the p95 stays low; 'mean of those queued' is the wait of a job that had to wait. "
        "Throughput counts multi-GPU jobs (single-GPU jobs run alike under every policy)."
    )
    return "\n".join(lines)


def document(results: Sequence[Summary], header: Mapping[str, Any], comm: JobModel) -> dict[str, Any]:
    """The JSON form: the run's header, the job-time model's settings, one object per policy."""
    return {"run": dict(header), "job_time_model": comm.describe(), "results": [r.to_dict() for r in results]}
