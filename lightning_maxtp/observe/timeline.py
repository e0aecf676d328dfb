"""``timeline.png``: what each step took, what the machine did, and when knobs changed.

Made to be looked at: steps are points (a measurement that blocked training is a shaded span,
not a ramp), the step-time axis ends a little above the 95th percentile so one stall cannot
flatten the rest (steps above it are marked on the upper edge and counted), the tuning phase is
shaded apart from the monitoring after it, and knob changes are numbered markers whose
descriptions are listed under the plots (wrapped, never cut), where they cannot run over each
other or the title. Legends sit beside the plots, not over their last seconds.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from lightning_maxtp.observe.window import SamplerSeries, Window

__all__ = ["TimelineSource", "plot_timeline"]


class TimelineSource(Protocol):
    """What the plot reads (a ``ThroughputReport``; ``ThroughputReport.write`` calls it)."""

    @property
    def step_log(self) -> tuple[tuple[float, float, float], ...]:
        """``(t_s, step_s, data_wait_s)`` per training step."""

    @property
    def timeline(self) -> SamplerSeries:
        """The machine's samples over the fit."""

    @property
    def spans(self) -> tuple[tuple[str, float, float], ...]:
        """``(kind, start_s, end_s)``: tuning, and the time training was blocked."""

    @property
    def knob_changes(self) -> tuple[Any, ...]:
        """Every knob change, with its time ``t_s``."""

    @property
    def final_windows(self) -> tuple[Window, ...] | None:
        """The windows under the settings the fit ended with."""

    @property
    def bottleneck(self) -> str:
        """The top diagnosis's kind."""

    def rate_text(self) -> str:
        """The headline rate, in words."""


_MAX_LISTED = 14
"""Knob changes listed under the plots; the rest are in ``report.md``."""
_LISTING_WIDTH = 150
"""Characters per listed line: about the plots' width in 7-point monospace."""
_SPAN_STYLE = {
    "tuning": {"color": "#f2c14e", "alpha": 0.18},
    "blocked": {"color": "#888888", "alpha": 0.35, "hatch": "//"},
}


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def _steps(ax: Any, report: TimelineSource) -> None:
    """Step time and data wait as points, with a robust y-limit and the outliers marked."""
    if not report.step_log:
        ax.text(0.5, 0.5, "no step measured", transform=ax.transAxes, ha="center")
        return
    t = [s[0] for s in report.step_log]
    step = [s[1] * 1e3 for s in report.step_log]
    wait = [s[2] * 1e3 for s in report.step_log]
    top = max(1.0, 1.5 * _percentile(step, 0.95))
    ax.scatter(t, step, s=6, color="#1f77b4", label="step time", zorder=3)
    ax.scatter(t, wait, s=6, color="#ff7f0e", label="data wait", zorder=3)
    high = [(x, y) for x, y in zip(t, step, strict=True) if y > top]
    if high:
        ax.scatter(
            [x for x, _ in high],
            [top * 0.985] * len(high),
            marker="^",
            s=28,
            color="#d62728",
            zorder=4,
            label="step above the axis",
        )
        ax.text(
            0.01,
            0.96,
            f"{len(high)} step(s) above {top:.0f} ms (longest "
            f"{max(y for _, y in high) / 1e3:.1f} s)",
            transform=ax.transAxes,
            va="top",
            fontsize=8,
            color="#d62728",
        )
    ax.set_ylim(0, top)
    ax.set_ylabel("ms per step")


def _machine(ax: Any, report: TimelineSource) -> None:
    tl = report.timeline
    series = (
        ("GPU util %", tl.gpu_util_percent),
        ("main CPU %", tl.main_cpu_percent),
        ("workers CPU %", tl.worker_cpu_percent),
    )
    peak = 100.0
    for label, values in series:
        if values:
            ax.plot(tl.t_s[-len(values) :], values, lw=1, label=label)
            peak = max(peak, _percentile(list(values), 0.99) * 1.1)
    ax.set_ylim(0, peak)
    ax.set_ylabel("% (100 = one core, full GPU)", fontsize=8)
    ax.set_xlabel("seconds since the fit started")


def _spans(axes: list[Any], report: TimelineSource, end: float) -> None:
    """Shade tuning and blocked time; label the phases inside the top plot."""
    top = axes[0]
    tuning = [s for s in report.spans if s[0] == "tuning"]
    for kind, start, stop in report.spans:
        for ax in axes:
            ax.axvspan(start, stop, lw=0, zorder=1, **_SPAN_STYLE.get(kind, {}))
        if kind == "blocked":
            top.text(
                (start + stop) / 2,
                0.5,
                f"loader measured alone\n{stop - start:.1f} s",
                transform=top.get_xaxis_transform(),
                ha="center",
                va="center",
                fontsize=7,
                color="#444444",
                zorder=5,
            )
    for _, start, stop in tuning:
        label = {
            "fontsize": 8,
            "va": "bottom",
            "transform": top.get_xaxis_transform(),
            "bbox": {"fc": "white", "ec": "none", "alpha": 0.8, "pad": 1},
        }
        top.text(start, 0.02, "tuning", color="#8a6d00", **label)
        if stop < end:
            top.text(stop, 0.02, "monitoring", color="#2b6b2b", **label)


def _levels(xs: list[float], span: float, gap: float = 0.022) -> list[int]:
    """A row for each marker so that markers closer than ``gap`` of the axis never overlap."""
    last: list[float] = []  # the x of the last marker in each row
    rows = []
    for x in xs:
        row = next((r for r, at in enumerate(last) if (x - at) / span >= gap), len(last))
        if row == len(last):
            last.append(x)
        last[row] = x
        rows.append(row)
    return rows


def _listing(changes: tuple[Any, ...], width: int = _LISTING_WIDTH) -> list[str]:
    """The numbered descriptions under the plots, each wrapped (never cut) to ``width``."""
    lines = []
    for i, change in enumerate(changes[:_MAX_LISTED], 1):
        text = (
            f"{i:>2}  t={change.t_s:6.1f} s  {change.knob}: {change.old} -> {change.new}  "
            f"({change.reason})"
        )
        lines += textwrap.wrap(text, width, subsequent_indent=" " * 16, break_on_hyphens=False)
    if len(changes) > _MAX_LISTED:
        lines.append(f"    ... {len(changes) - _MAX_LISTED} more in report.md")
    return lines


def _changes(
    axes: list[Any], listing: Any, lines: list[str], report: TimelineSource, span: float
) -> None:
    """Numbered markers on the plots; their descriptions (``lines``) in the listing under them."""
    top = axes[0]
    times = [c.t_s for c in report.knob_changes]
    for i, (change, row) in enumerate(
        zip(report.knob_changes, _levels(times, span), strict=True), 1
    ):
        for ax in axes:
            ax.axvline(change.t_s, color="#555555", ls="--", lw=0.8, zorder=2)
        top.text(
            change.t_s,
            1.03 + 0.09 * row,
            str(i),
            transform=top.get_xaxis_transform(),
            ha="center",
            va="bottom",
            fontsize=7,
            bbox={"boxstyle": "circle,pad=0.15", "fc": "white", "ec": "#555555"},
        )
    listing.axis("off")
    text = "\n".join(lines) or "no knob changed"
    listing.text(0.0, 1.0, text, va="top", ha="left", family="monospace", fontsize=7)


def plot_timeline(report: TimelineSource, path: Path) -> None:
    """Draw the report's timelines into ``path``.

    Raises:
        ImportError: Without matplotlib (the ``plot`` extra).
    """
    import matplotlib

    matplotlib.use("Agg", force=False)  # no display needed; never opens a window
    import matplotlib.pyplot as plt

    lines = _listing(report.knob_changes)
    listed = max(1, len(lines))
    fig = plt.figure(figsize=(11, 6.2 + 0.14 * listed))
    grid = fig.add_gridspec(3, 1, height_ratios=[3, 1.8, 0.35 + 0.22 * listed], hspace=0.35)
    top = fig.add_subplot(grid[0])
    bottom = fig.add_subplot(grid[1], sharex=top)
    listing = fig.add_subplot(grid[2])
    _steps(top, report)
    _machine(bottom, report)
    ends = [s[0] for s in report.step_log] + list(report.timeline.t_s)
    end = max(ends) if ends else 0.0
    _spans([top, bottom], report, end)
    start = min(ends) if ends else 0.0
    _changes([top, bottom], listing, lines, report, max(end - start, 1e-6))
    where = "" if report.final_windows is None else " under the final settings"
    fig.suptitle(f"bottleneck: {report.bottleneck} - {report.rate_text()}{where}", fontsize=11)
    for ax in (top, bottom):
        if ax.get_legend_handles_labels()[0]:
            # Beside the plot, not over it: the last seconds are the settings the fit kept.
            ax.legend(
                loc="upper left",
                bbox_to_anchor=(1.005, 1.0),
                fontsize=7,
                markerscale=1.5,
                frameon=False,
            )
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
