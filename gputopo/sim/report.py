"""Rendering results: the aligned terminal table and the JSON document.

Rows are metrics and columns are policies, so five policies fit a terminal and a reader
compares one figure across policies along a line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from gputopo.sim.comm import CommModel
from gputopo.sim.metrics import Summary


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f} %"


def _int(v: int | None) -> str:
    return "n/a" if v is None else f"{v:,}"


def _secs(v: float | None) -> str:
    if v is None:
        return "n/a"
    if v >= 3600:
        return f"{v / 3600:.1f} h"
    if v >= 60:
        return f"{v / 60:.1f} min"
    return f"{v:.0f} s"


def _ratio(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}x"


def _extra(s: Summary, key: str) -> str:
    """A lifecycle figure; n/a for policies that do not model the sidecar over time."""
    v = s.extra.get(key)
    return "n/a" if v is None else f"{v:,.0f}"


ROWS: tuple[tuple[str, Callable[[Summary], str]], ...] = (
    ("jobs placed / arrived", lambda s: f"{s.placed:,}/{s.jobs:,}"),
    ("rejected (fill) / never started", lambda s: f"{s.rejected:,}/{s.never_started:,}"),
    ("multi-GPU pods", lambda s: _int(s.multi_gpu_pods)),
    ("pods at best ring of empty node", lambda s: _pct(s.best_ring_share)),
    ("mean ring bw / best ring bw", lambda s: _pct(s.ring_over_best)),
    ("gangs (multi-node jobs)", lambda s: _int(s.gangs)),
    ("gangs inside one leaf", lambda s: _pct(s.gangs_one_leaf)),
    ("gangs inside one spine", lambda s: _pct(s.gangs_one_spine)),
    ("free GPUs at first failure (FGD)", lambda s: _int(s.free_at_first_failure)),
    ("jobs held up by fragmentation", lambda s: _pct(s.fragmented_jobs)),
    ("queueing delay, mean", lambda s: _secs(s.queue_delay_mean)),
    ("queueing delay, p95", lambda s: _secs(s.queue_delay_p95)),
    ("job time / ideal (multi-GPU)", lambda s: _ratio(s.job_time_ratio)),
    ("throughput vs kubelet-default", lambda s: _ratio(s.throughput_vs_baseline)),
    ("admission failures (plugin)", lambda s: _int(s.admission_failures)),
    ("gangs that waited for quorum", lambda s: _extra(s, "gangs_waited_for_quorum")),
    ("reservations expired", lambda s: _extra(s, "reservations_expired")),
    ("re-plans after bind failures", lambda s: _extra(s, "replans_after_bind_failure")),
    ("simulated pods/s", lambda s: f"{s.pods / s.seconds:,.0f}" if s.seconds > 0 else "n/a"),
)


def render_table(results: Sequence[Summary], header: Mapping[str, Any]) -> str:
    """Header lines (workload, cluster, mode) then the metric x policy table."""
    lines = [f"{k}: {v}" for k, v in header.items()]
    lines.append("")
    width = max(len(label) for label, _ in ROWS) + 2
    cols = [max(len(r.policy), *(len(fmt(r)) for _, fmt in ROWS)) + 2 for r in results]
    lines.append(
        "metric".ljust(width) + "".join(r.policy.rjust(w) for r, w in zip(results, cols, strict=True))
    )
    lines.append("-" * (width + sum(cols)))
    for label, fmt in ROWS:
        lines.append(
            label.ljust(width) + "".join(fmt(r).rjust(w) for r, w in zip(results, cols, strict=True))
        )
    return "\n".join(lines)


def document(results: Sequence[Summary], header: Mapping[str, Any], comm: CommModel) -> dict[str, Any]:
    """The --json document: inputs, the communication model's constants, one object per policy."""
    model = asdict(comm)
    model["level_gbps"] = dict(comm.level_gbps)
    return {"run": dict(header), "comm_model": model, "results": [r.to_dict() for r in results]}
