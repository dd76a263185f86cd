"""The --plot PNG: five panels, one bar per policy. matplotlib is an optional extra."""

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


PANELS: tuple[tuple[str, str, float], ...] = (
    ("best_ring_share", "multi-GPU pods at the best ring (%)", 100.0),
    ("gangs_one_leaf", "gangs inside one leaf (%)", 100.0),
    ("free_at_first_failure", "free GPUs at first failure (lower is better)", 1.0),
    ("fragmented_jobs", "jobs held up by fragmentation (%, lower better)", 100.0),
    ("throughput_vs_baseline", "throughput vs kubelet-default (x)", 1.0),
)


def write_plot(results: Sequence[Summary], path: str | Path, title: str) -> None:
    """Draw the panels into `path` (PNG); undefined figures are drawn as empty bars."""
    check_available()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.policy for r in results]
    fig, axes = plt.subplots(1, len(PANELS), figsize=(3.8 * len(PANELS), 4.2))
    for ax, (attr, label, scale) in zip(axes, PANELS, strict=True):
        values = [getattr(r, attr) for r in results]
        heights = [0.0 if v is None else float(v) * scale for v in values]
        colors = ["tab:green" if n == "gputopo" else "tab:gray" for n in names]
        bars = ax.bar(range(len(names)), heights, color=colors)
        for bar, v in zip(bars, values, strict=True):
            text = "n/a" if v is None else (f"{v * scale:.1f}" if scale != 1.0 else f"{v:.3g}")
            ax.annotate(
                text,
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        ax.set_title(label, fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(str(path), dpi=110)
    plt.close(fig)
