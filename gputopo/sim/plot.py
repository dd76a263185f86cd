"""The --plot PNG: six panels in a 2x3 grid, one bar per policy. matplotlib is an optional extra."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gputopo.sim.metrics import Summary


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def check_available() -> None:
    """Fail before a long run rather than after it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib: pip install 'gputopo[plot]'") from None


#: (Summary field, title, unit label, scale, higher is better, why a panel may be empty)
PANELS: tuple[tuple[str, str, str, float, bool, str], ...] = (
    (
        "best_ring_share",
        "multi-GPU pods at their best ring",
        "% of multi-GPU pods",
        100.0,
        True,
        "no multi-GPU pod ran",
    ),
    (
        "gangs_one_leaf",
        "gangs inside one leaf",
        "% of gangs",
        100.0,
        True,
        "no multi-node job in this workload",
    ),
    (
        "free_at_first_failure",
        "free GPUs at the first failure (FGD)",
        "GPUs",
        1.0,
        False,
        "no job ever failed with enough GPUs free",
    ),
    ("fragmented_jobs", "jobs held up by fragmentation", "% of jobs", 100.0, False, "no job was held up"),
    ("queue_delay_mean", "queueing delay, mean", "hours", 1 / 3600, False, "fill mode has no queue"),
    (
        "throughput_vs_baseline",
        "throughput of multi-GPU jobs",
        "x kubelet-default",
        1.0,
        True,
        "no multi-GPU job ran",
    ),
)


#: What an undefined figure means for one policy when others have it.
NONE_TEXT = {"free_at_first_failure": "never\nfailed"}


def figure(result: Summary, attr: str) -> float | None:
    """One panel's value; free GPUs counted in milli-GPUs (--gpu-sharing) are drawn as GPUs."""
    v = getattr(result, attr)
    if v is not None and attr == "free_at_first_failure" and result.milli_gpus:
        return float(v) / 1000
    return None if v is None else float(v)


def write_plot(results: Sequence[Summary], path: str | Path, title: str) -> None:
    """Draw the panels into `path` (PNG, 16:9, a 2x3 grid for a slide); a panel whose figure
    is undefined for every policy says why instead of drawing empty axes."""
    check_available()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.policy for r in results]
    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    for ax, (attr, label, unit, scale, higher, empty) in zip(axes.flat, PANELS, strict=True):
        values = [figure(r, attr) for r in results]
        ax.set_title(f"{label}\n({'higher' if higher else 'lower'} is better)", fontsize=12)
        if all(v is None for v in values):
            ax.text(0.5, 0.5, f"no data: {empty}", ha="center", va="center", fontsize=11, wrap=True)
            ax.set_axis_off()
            continue
        heights = [0.0 if v is None else float(v) * scale for v in values]
        colors = ["tab:green" if n == "gputopo" else "tab:gray" for n in names]
        bars = ax.bar(range(len(names)), heights, color=colors)
        for bar, v in zip(bars, values, strict=True):
            text = NONE_TEXT.get(attr, "n/a") if v is None else f"{float(v) * scale:.3g}"
            ax.annotate(
                text,
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=10,
            )
        ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=10)
        ax.set_xlabel("policy", fontsize=10)
        ax.set_ylabel(unit, fontsize=10)
        ax.margins(y=0.15)
    fig.suptitle(title, fontsize=14)
    fig.tight_layout()
    fig.savefig(str(path), dpi=100)
    plt.close(fig)
