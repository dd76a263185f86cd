"""The --plot PNG: the run's headline figures, one panel each, one bar per policy.

The four headline panels are throughput vs kubelet-default, job time / ideal by workload
profile, gangs inside one leaf and queueing delay per GPU asked: what the table's reader looks
for first. A panel is drawn only when it has something to show: a figure no policy has (no
gangs in the workload, no queue in a fill) or one that is 0 under every policy (nobody
waited) would be an empty or flat panel, so the next figure of FALLBACKS takes its place and a
line under the panels names what was left out and why. Bars are horizontal, so nine policy
names read without rotation; gputopo is green, kubelet-default (the baseline) dark grey.
matplotlib is an optional extra, imported only here.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gputopo.sim.metrics import Summary


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def check_available() -> None:
    """Fail before a long run rather than after it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib: pip install 'gputopo[plot]'") from None


def _milli(s: Summary) -> float | None:
    """Free GPUs at the first failure, in GPUs also when --gpu-sharing counts milli-GPUs."""
    v = s.free_at_first_failure
    return None if v is None else float(v) / (1000 if s.milli_gpus else 1)


def _share(get: Callable[[Summary], float | None]) -> Callable[[Summary], float | None]:
    """A 0..1 share as a percentage."""

    def percent(s: Summary) -> float | None:
        v = get(s)
        return None if v is None else 100 * v

    return percent


@dataclass(frozen=True)
class Panel:
    """One bar chart: a figure per policy (or per policy and profile when `profiles`)."""

    title: str
    unit: str
    higher: bool
    value: Callable[[Summary], float | None]
    #: a dashed line drawn at this value (1 = kubelet-default, or a job at its ideal time)
    reference: float | None = None
    #: bars per workload profile of the mix (job time / ideal) instead of one per policy
    profiles: bool = False
    #: seconds, drawn in s, min or h whichever reads best
    seconds: bool = False
    #: why no policy has the figure, for the note under the panels
    empty: str = "no policy has this figure in this run"
    #: how a bar's value is written at its end
    text: Callable[[float], str] = lambda v: f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def _times(v: float) -> str:
    return f"{v:.2f}x"


def _percent(v: float) -> str:
    return f"{v:.1f} %"


HEADLINE: tuple[Panel, ...] = (
    Panel(
        "throughput of multi-GPU jobs vs kubelet-default",
        "x kubelet-default",
        True,
        lambda s: s.throughput_vs_baseline,
        reference=1.0,
        text=_times,
    ),
    Panel(
        "job time / ideal, multi-GPU jobs, by workload profile",
        "x the job's time at its ideal placement",
        False,
        lambda s: s.job_time_ratio,
        reference=1.0,
        profiles=True,
        text=_times,
    ),
    Panel(
        "gangs inside one leaf",
        "% of gangs",
        True,
        _share(lambda s: s.gangs_one_leaf),
        text=_percent,
        empty="no multi-node job in this workload",
    ),
    Panel(
        "queueing delay, mean per GPU asked",
        "",
        False,
        lambda s: s.queue_delay_mean_per_gpu,
        seconds=True,
        empty="a fill has no queue",
    ),
)

#: What takes the place of a headline panel with nothing to show, in this order.
FALLBACKS: tuple[Panel, ...] = (
    Panel(
        "multi-GPU pods at their best ring",
        "% of multi-GPU pods",
        True,
        _share(lambda s: s.best_ring_share),
        text=_percent,
    ),
    Panel(
        "GPU demand placed", "% of the GPUs asked for", True, _share(lambda s: s.demand_placed), text=_percent
    ),
    Panel(
        "jobs held up by fragmentation",
        "% of jobs",
        False,
        _share(lambda s: s.fragmented_jobs),
        text=_percent,
    ),
    Panel(
        "GPUs allocated at the end of the fill",
        "% of GPUs",
        True,
        _share(lambda s: s.allocated_at_end),
        text=_percent,
    ),
    Panel("free GPUs at the first failure (FGD)", "GPUs", False, _milli),
    Panel("gangs inside one spine", "% of gangs", True, _share(lambda s: s.gangs_one_spine), text=_percent),
)

#: Colours: gputopo, the baseline, every other policy; and one per workload profile.
OURS, BASELINE_COLOUR, OTHER = "tab:green", "dimgray", "silver"
PROFILE_COLOURS = ("tab:blue", "tab:orange", "tab:red", "tab:purple", "tab:brown")


def _values(panel: Panel, results: Sequence[Summary]) -> list[float | None]:
    return [panel.value(r) for r in results]


def _profiles(results: Sequence[Summary]) -> list[str]:
    return sorted({p for r in results for p in r.job_time_ratio_by_profile})


def why_empty(panel: Panel, results: Sequence[Summary]) -> str | None:
    """None when the panel has something to show, else the reason it is left out."""
    if panel.profiles and _profiles(results):
        return None
    values = [v for v in _values(panel, results) if v is not None and math.isfinite(v)]
    if not values:
        return panel.empty
    if all(v == 0 for v in values):
        return "0 under every policy (no job waited)" if panel.seconds else "0 under every policy"
    return None


def choose(results: Sequence[Summary], count: int = 4) -> tuple[list[Panel], list[str]]:
    """The panels to draw (the headline ones with something to show, then fallbacks, at most
    `count`) and a note per headline panel left out."""
    chosen: list[Panel] = []
    notes: list[str] = []
    for panel in HEADLINE:
        why = why_empty(panel, results)
        if why is None:
            chosen.append(panel)
        else:
            notes.append(f"{panel.title}: {why}")
    # A fallback that differs between policies first: "100 % under every policy" is data, but
    # says less than a figure that tells the policies apart.
    spare = [p for p in FALLBACKS if why_empty(p, results) is None]
    spare.sort(key=lambda p: len({v for v in _values(p, results) if v is not None}) < 2)  # stable
    room = min(count, len(HEADLINE)) - len(chosen)
    return chosen + spare[: max(0, room)], notes


def _time_unit(values: Sequence[float | None]) -> tuple[str, float]:
    """The unit that shows these seconds as figures a person reads, and its scale."""
    top = max((v for v in values if v is not None), default=0.0)
    if top >= 3 * 3600:
        return "hours", 1 / 3600
    if top >= 3 * 60:
        return "minutes", 1 / 60
    return "seconds", 1.0


def _colour(name: str) -> str:
    from gputopo.sim.policies.catalog import BASELINE

    return OURS if name == "gputopo" else BASELINE_COLOUR if name == BASELINE else OTHER


def _draw(ax: Any, panel: Panel, results: Sequence[Summary]) -> None:
    names = [r.policy for r in results]
    rows = list(range(len(names)))
    unit = panel.unit
    top = 0.0
    if panel.profiles:
        profiles = _profiles(results)
        height = 0.8 / len(profiles)
        for k, profile in enumerate(profiles):
            values = [r.job_time_ratio_by_profile.get(profile) for r in results]
            ys = [y - 0.4 + height * (k + 0.5) for y in rows]
            widths = [0.0 if v is None else v for v in values]
            colour = PROFILE_COLOURS[k % len(PROFILE_COLOURS)]
            ax.barh(ys, widths, height=height * 0.9, color=colour, label=profile)
            for y, v in zip(ys, values, strict=True):
                ax.text(v or 0, y, f" {panel.text(v)}" if v is not None else " n/a", va="center", fontsize=7)
            top = max([top, *(w for w in widths)])
        # beside the panel, not over it: the longest bars reach the right edge
        ax.legend(title="profile", fontsize=9, title_fontsize=9, loc="center left", bbox_to_anchor=(1.0, 0.5))
    else:
        values = _values(panel, results)
        scale = 1.0
        if panel.seconds:
            unit, scale = _time_unit(values)
        shown = [None if v is None else v * scale for v in values]
        widths = [0.0 if v is None else v for v in shown]
        ax.barh(rows, widths, height=0.7, color=[_colour(n) for n in names])
        for y, v in zip(rows, shown, strict=True):
            ax.text(v or 0, y, f" {panel.text(v)}" if v is not None else " n/a", va="center", fontsize=9)
        top = max(widths)
    if panel.reference is not None:
        ax.axvline(panel.reference, color="black", linestyle="--", linewidth=1)
    ax.set_xlim(0, (top or 1) * 1.18)
    ax.set_yticks(rows, names, fontsize=9)
    for tick, name in zip(ax.get_yticklabels(), names, strict=True):
        if name == "gputopo":
            tick.set_fontweight("bold")
    ax.invert_yaxis()  # the first policy of --policies on top
    ax.set_xlabel(unit, fontsize=9)
    ax.set_title(f"{panel.title}\n({'higher' if panel.higher else 'lower'} is better)", fontsize=11)


def write_plot(results: Sequence[Summary], path: str | Path, title: str) -> None:
    """Draw the chosen panels into `path` (PNG, 1600 x 900 for a slide), the run's description
    wrapped over the top and a note of any panel left out at the bottom."""
    check_available()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels, notes = choose(results)
    grid = {1: (1, 1), 2: (1, 2), 3: (1, 3)}.get(len(panels), (2, 2))
    fig, axes = plt.subplots(*grid, figsize=(16, 9), squeeze=False, layout="constrained")
    for ax, panel in zip(axes.flat, panels, strict=False):
        _draw(ax, panel, results)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_axis_off()
    fig.suptitle("\n".join(textwrap.wrap(title, 150)), fontsize=12)
    if notes:
        note = "not drawn: " + "; ".join(notes)
        fig.supxlabel("\n".join(textwrap.wrap(note, 180)), fontsize=9, color="dimgray")
    fig.savefig(str(path), dpi=100)
    plt.close(fig)
