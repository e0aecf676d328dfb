"""``timeline.png``: what each step took, what the machine did, and what each knob trial decided.

Made to be looked at: the title is the result (before -> after samples/s and the speed-up),
steps are points (a measurement that blocked training is a shaded span, not a ramp), the
step-time axis ends a little above the 95th percentile so one stall cannot flatten the rest
(steps above it are marked on the upper edge and counted), only the tuning period is shaded,
apart from the monitoring after it, and each knob trial is one marker labelled with its knob and
verdict (its switches to re-measure are not markers of their own), described under the plots
(wrapped, never cut) where the descriptions cannot run over each other or the title. The
machine plot's axis says what 100 % means on the device in use. Legends sit beside the plots,
not over their last seconds. Drawn from ``report.json``'s data alone (``report_view``).
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from lightning_maxtp.observe.report_view import ReportView, report_view

__all__ = ["Marker", "Place", "machine_label", "markers", "plot_timeline", "title"]

_MAX_LISTED = 14
"""Trials (or changes) listed under the plots; the rest are in ``report.md``."""
_LISTING_WIDTH = 150
"""Characters per listed line: about the plots' width in 7-point monospace."""
_CHAR_SHARE = 0.0068
"""Share of the time axis one character of a marker's label takes (7-point, 11-inch figure)."""
_MARGIN = 0.05
"""matplotlib's default margin on each side of the data, as a share of its range."""
_SPAN_STYLE = {
    "tuning": {"color": "#f2c14e", "alpha": 0.18},
    "blocked": {"color": "#888888", "alpha": 0.35, "hatch": "//"},
}
_VERDICT_COLOR = {
    "kept": "#2b8a3e",
    "reverted": "#c92a2a",
    "guarded": "#862e9c",
    "undecided": "#666666",
    "unfinished": "#666666",
}


@dataclass(frozen=True)
class Marker:
    """One knob trial on the time axis (or one change, when no trial covers it)."""

    t_s: float
    label: str
    """What the plot writes at the marker: its number, knob and verdict."""
    verdict: str
    """The trial's verdict (``""`` for a change without a trial)."""
    text: str
    """Its line under the plots."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {"t_s": self.t_s, "label": self.label, "verdict": self.verdict, "text": self.text}


@dataclass(frozen=True)
class Place:
    """Where a marker's label goes: its row above the plot, and its side of the line."""

    row: int
    side: str
    """``"left"``: the label runs right of the line (its left end at it); ``"right"``: left."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {"row": self.row, "side": self.side}


def markers(view: ReportView) -> tuple[Marker, ...]:
    """One marker per trial, at the switch that started it; per change when no trial was run."""
    found = []
    for t in view.trials:
        at = t.t_s if t.t_s is not None else view.clock.end_of(t.step - 1)
        if at is None:  # neither the switch nor the step before it was recorded
            continue
        after = "not measured" if t.after is None else f"{t.after:.1f} samples/s ({t.gain:+.1%})"
        detail = t.outcome or f"tried because {t.reason}"
        found.append(
            Marker(
                at,
                f"{t.number} {t.knob}: {t.verdict}",
                t.verdict,
                f"{t.number:>2}  step {t.step} (t={at:.1f} s)  {t.knob}: {t.old} -> {t.new}  "
                f"{t.before:.1f} -> {after}  {t.verdict.upper()}  ({detail})",
            )
        )
    for i, c in enumerate(view.changes, len(found) + 1):
        step = "" if c.step is None else f"step {c.step} "
        found.append(
            Marker(
                c.t_s,
                f"{i} {c.knob}",
                "",
                f"{i:>2}  {step}(t={c.t_s:.1f} s)  {c.knob}: {c.old} -> {c.new}  ({c.reason})",
            )
        )
    return tuple(found)


def title(view: ReportView) -> str:
    """The figure's title: the result first, then what limits the run now."""
    s = view.summary
    speedup = s.speedup
    if s.tuned and s.before is not None and s.after is not None and speedup is not None:
        unit = "samples/s per rank" if s.world_size > 1 else "samples/s"
        same = "" if s.changed else ", no setting changed"
        return (
            f"{s.before:.1f} -> {s.after:.1f} {unit} ({speedup:.2f}x{same}); "
            f"bottleneck now: {s.bottleneck}"
        )
    return f"{s.rate_text}; bottleneck: {s.bottleneck}"


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def _steps(ax: Any, step_log: Sequence[Sequence[float]]) -> None:
    """Step time and data wait as points, with a robust y-limit and the outliers marked."""
    if not step_log:
        ax.text(0.5, 0.5, "no step measured", transform=ax.transAxes, ha="center")
        return
    t = [s[0] for s in step_log]
    step = [s[1] * 1e3 for s in step_log]
    wait = [s[2] * 1e3 for s in step_log]
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


def machine_label(device: str, host_cpus: int | None) -> str:
    """What the machine plot's percentages mean on ``device`` (a CPU-only fit has no GPU %)."""
    cores = "one core" if not host_cpus else f"one of {host_cpus} cores"
    if device == "cuda":
        return f"GPU busy %, CPU %\n(CPU: 100 = {cores})"
    return f"CPU %\n(100 = {cores})"


def _machine(ax: Any, timeline: Mapping[str, Any], view: ReportView) -> None:
    t_s = list(timeline.get("t_s") or [])
    series = (
        ("GPU util %", timeline.get("gpu_util_percent") or []),
        ("main CPU %", timeline.get("main_cpu_percent") or []),
        ("workers CPU %", timeline.get("worker_cpu_percent") or []),
    )
    peak = 100.0
    for label, values in series:
        if values:
            ax.plot(t_s[-len(values) :], values, lw=1, label=label)
            peak = max(peak, _percentile(list(values), 0.99) * 1.1)
    ax.set_ylim(0, peak)
    ax.set_ylabel(machine_label(view.device, view.host_cpus), fontsize=8)
    ax.set_xlabel("seconds since the fit started")


def _spans(axes: list[Any], data: Mapping[str, Any], view: ReportView, end: float) -> None:
    """Shade the tuning periods and blocked time; label the phases inside the top plot."""
    top = axes[0]
    for kind, start, stop in data.get("spans") or []:
        for ax in axes:
            ax.axvspan(start, stop, lw=0, zorder=1, gid=kind, **_SPAN_STYLE.get(kind, {}))
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
    label = {
        "fontsize": 8,
        "va": "bottom",
        "transform": top.get_xaxis_transform(),
        "bbox": {"fc": "white", "ec": "none", "alpha": 0.8, "pad": 1},
    }
    for start, stop in view.tuning_spans:
        top.text(start, 0.02, "tuning", color="#8a6d00", **label)
        if stop < end:
            top.text(stop, 0.02, "monitoring", color="#2b6b2b", **label)
        elif not view.summary.finished:
            top.text(stop, 0.02, "(the fit ended first)", color="#8a6d00", ha="right", **label)


def _label_rows(xs: list[float], labels: list[str], low: float, high: float) -> list[Place]:
    """A row and a side for each marker's label, so that labels in one row never overlap.

    A label runs right of its line, or left of it in the last quarter of the axis (it would
    leave the plot); its width is estimated from its length (7-point text on an 11-inch
    figure). Labels go to the first row where they clear the previous one.
    """
    span = max(high - low, 1e-9)
    spans = []
    for x, label in zip(xs, labels, strict=True):
        at, width = (x - low) / span, _CHAR_SHARE * (len(label) + 2)
        side = "right" if at > 0.75 else "left"
        spans.append((at - width, at, side) if side == "right" else (at, at + width, side))
    ends: list[float] = []  # where the last label of each row ends
    places = [Place(0, "left")] * len(xs)
    for i in sorted(range(len(xs)), key=lambda k: spans[k][0]):
        start, end, side = spans[i]
        row = next((r for r, e in enumerate(ends) if e <= start), len(ends))
        if row == len(ends):
            ends.append(end)
        ends[row] = end
        places[i] = Place(row, side)
    return places


def _listing(texts: Sequence[str], width: int = _LISTING_WIDTH) -> list[str]:
    """The numbered descriptions under the plots, each wrapped (never cut) to ``width``."""
    lines = []
    for text in texts[:_MAX_LISTED]:
        lines += textwrap.wrap(text, width, subsequent_indent=" " * 16, break_on_hyphens=False)
    if len(texts) > _MAX_LISTED:
        lines.append(f"    ... {len(texts) - _MAX_LISTED} more in report.md")
    return lines


def _markers(axes: list[Any], found: tuple[Marker, ...], places: list[Place]) -> None:
    """A line per trial across the plots, its label above (placed by ``_label_rows``)."""
    top = axes[0]
    for marker, place in zip(found, places, strict=True):
        color = _VERDICT_COLOR.get(marker.verdict, "#555555")
        for ax in axes:
            ax.axvline(marker.t_s, color=color, ls="--", lw=1.0, zorder=2, gid="trial")
        top.text(
            marker.t_s,
            1.03 + 0.1 * place.row,
            marker.label,
            transform=top.get_xaxis_transform(),
            ha=place.side,
            va="bottom",
            fontsize=7,
            color=color,
            gid="trial",
            bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": color},
        )


def _describe(listing: Any, lines: list[str], view: ReportView) -> None:
    """The markers' descriptions under the plots (or why there is none)."""
    listing.axis("off")
    text = "\n".join(lines) or "no knob changed"
    if not lines and view.summary.tuned:
        text = f"no knob tried: {view.summary.stop_reason}"
    listing.text(0.0, 1.0, text, va="top", ha="left", family="monospace", fontsize=7)


class _Report(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


def plot_timeline(data: Mapping[str, Any] | _Report, path: Path) -> None:
    """Draw the timelines of ``report.json``'s data into ``path`` (PNG, whatever its suffix).

    Args:
        data: ``report.json``'s data (a ``ThroughputReport`` is read through its ``to_dict()``).
        path: Where the PNG goes.

    Raises:
        ImportError: Without matplotlib (the ``plot`` extra).
    """
    if not isinstance(data, Mapping):
        data = data.to_dict()
    import matplotlib

    matplotlib.use("Agg", force=False)  # no display needed; never opens a window
    import matplotlib.pyplot as plt

    view = report_view(data)
    found = markers(view)
    lines = _listing([m.text for m in found])
    listed = max(1, len(lines))
    step_log = data.get("step_log") or []
    timeline = data.get("timeline") or {}
    ends = [s[0] for s in step_log] + list(timeline.get("t_s") or [])
    start, end = (min(ends), max(ends)) if ends else (0.0, 0.0)
    pad = _MARGIN * max(end - start, 1e-6)  # where matplotlib will put the axis's ends
    places = _label_rows([m.t_s for m in found], [m.label for m in found], start - pad, end + pad)
    rows = [p.row for p in places]
    fig = plt.figure(figsize=(11, 6.2 + 0.14 * listed + 0.2 * max(rows, default=0)))
    # Room above the step plot for the rows of trial labels, under the title.
    grid = fig.add_gridspec(
        3,
        1,
        height_ratios=[3, 1.8, 0.35 + 0.22 * listed],
        hspace=0.35,
        top=0.88 - 0.025 * max(rows, default=0),
    )
    top = fig.add_subplot(grid[0])
    bottom = fig.add_subplot(grid[1], sharex=top)
    listing = fig.add_subplot(grid[2])
    _steps(top, step_log)
    _machine(bottom, timeline, view)
    _spans([top, bottom], data, view, end)
    _markers([top, bottom], found, places)
    _describe(listing, lines, view)
    fig.suptitle(title(view), fontsize=11)
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
    fig.savefig(path, dpi=100, bbox_inches="tight", format="png")
    plt.close(fig)
