"""``ThroughputReport``: what was measured, what limits the job, what changed, as JSON/markdown/PNG.

Plain data (no torch): built by the monitor at the end of a fit, or by hand from windows.
``write(folder)`` produces ``report.json``, ``report.md`` and ``timeline.png`` (the PNG needs the
``plot`` extra, matplotlib; without it the report says so and the other two files are written).
The markdown and the plot are drawn from ``to_dict()``'s data alone (``report_md``,
``timeline``), so ``maxtp report DIR`` re-renders them from ``report.json``.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_maxtp.observe.diagnosis import Diagnosis
from lightning_maxtp.observe.limit import Limit, distance
from lightning_maxtp.observe.report_view import rate_words
from lightning_maxtp.observe.window import CaptureSummary, SamplerSeries, Window, combined_rate

__all__ = ["KnobChange", "ThroughputReport", "strict_json"]


@dataclass(frozen=True)
class KnobChange:
    """A knob changed while the job ran (``MaxThroughputCallback``'s loop records these)."""

    t_s: float
    """Seconds since the monitor started."""
    knob: str
    old: Any
    new: Any
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "t_s": self.t_s,
            "knob": self.knob,
            "old": self.old,
            "new": self.new,
            "reason": self.reason,
        }

    def __str__(self) -> str:
        return f"t={self.t_s:.1f}s {self.knob}: {self.old} -> {self.new} {self.reason}".rstrip()


@dataclass(frozen=True)
class ThroughputReport:
    """The measured run: windows, the latest diagnosis, timelines, knob changes, captures."""

    windows: tuple[Window, ...]
    diagnoses: tuple[Diagnosis, ...]
    """Findings for the last window, most confident first."""
    step_log: tuple[tuple[float, float, float], ...] = ()
    """(t since start, step time, data wait) per measured step."""
    timeline: SamplerSeries = field(default_factory=SamplerSeries)
    knob_changes: tuple[KnobChange, ...] = ()
    captures: tuple[CaptureSummary, ...] = ()
    ranks: tuple[dict[str, Any], ...] = ()
    """Per-window DDP spreads (``RankSpread.to_dict()``), rank zero only."""
    notes: tuple[str, ...] = ()
    final_windows: tuple[Window, ...] | None = None
    """The windows measured under the settings the run ended with (``None``: all of them, as
    for a run nothing tuned). The headline numbers and the diagnoses describe these."""
    tuning: dict[str, Any] | None = None
    """What the closed loop did (``TuningSummary.to_dict()``), when it ran."""
    spans: tuple[tuple[str, float, float], ...] = ()
    """``(kind, start_s, end_s)`` on the timeline's clock: ``"tuning"`` (baseline to the end of
    tuning) and ``"blocked"`` (training waited, e.g. for the loader measured alone)."""

    @property
    def in_force(self) -> tuple[Window, ...]:
        """The windows the headline describes: those under the final settings."""
        return self.windows if self.final_windows is None else self.final_windows

    @property
    def steps(self) -> int:
        """Steps measured under the final settings."""
        return sum(w.steps for w in self.in_force)

    @property
    def samples_per_s(self) -> float:
        """Samples/s under the final settings, per rank (each window's stall-capped time)."""
        return combined_rate(self.in_force) or 0.0

    @property
    def global_samples_per_s(self) -> float:
        """Samples/s of the whole job: the per-rank rate times the ranks.

        DDP keeps the ranks in step, so each rank's rate is the job's over the world size.
        """
        world = self.in_force[-1].context.world_size if self.in_force else 1
        return self.samples_per_s * world

    @property
    def data_wait_share(self) -> float:
        """Data wait share under the final settings."""
        windows = self.in_force
        total = sum(w.total_s for w in windows)
        return sum(sum(w.data_wait_s) for w in windows) / total if total > 0 else 0.0

    @property
    def median_step_s(self) -> float:
        """Median step time under the final settings."""
        steps = [s for w in self.in_force for s in w.step_time_s]
        return statistics.median(steps) if steps else 0.0

    @property
    def bottleneck(self) -> str:
        """The most confident kind of the last window, or ``"unknown"``."""
        return self.diagnoses[0].kind.value if self.diagnoses else "unknown"

    @property
    def limit(self) -> Limit | None:
        """How far the final settings run from the machine's limit (``None``: no window)."""
        return distance(self.in_force, self.bottleneck)

    @property
    def joules_per_sample(self) -> float | None:
        """Device energy per sample under the final settings (NVML's counter; ``None``: none)."""
        measured = [w for w in self.in_force if w.joules_per_sample is not None]
        samples = sum(sum(w.samples) for w in measured)
        if not samples:
            return None
        return sum((w.joules_per_sample or 0.0) * sum(w.samples) for w in measured) / samples

    def rate_text(self) -> str:
        """The headline rate: per rank and over all ranks under DDP; energy where measured."""
        world = self.in_force[-1].context.world_size if self.in_force else 1
        return rate_words(self.samples_per_s, world, self.joules_per_sample)

    def summary(self) -> str:
        """A few lines for the end of a fit."""
        if not self.in_force:
            return (
                "maxtp: no window measured (each needs a few steps; the fit ran too few): "
                "nothing to report"
            )
        where = "" if self.final_windows is None else " under the final settings"
        lines = [
            f"maxtp: {self.steps} steps measured{where}, {self.rate_text()}, median step "
            f"{self.median_step_s * 1e3:.1f} ms, data wait {self.data_wait_share:.0%}; "
            f"bottleneck: {self.bottleneck}"
        ]
        limit = self.limit
        if limit is not None:
            lines.append(f"  limit: {limit}")
        if self.diagnoses:
            top = self.diagnoses[0]
            lines.append(f"  {top.summary}")
            lines += [f"  next: {r}" for r in top.recommendations[:2]]
        if self.ranks:
            last = self.ranks[-1]
            step, wait = last["stats"]["step_time_s"], last["stats"]["data_wait_share"]
            lines.append(
                f"  ranks: {len(last['per_rank']['step_time_s'])}, step {step['min'] * 1e3:.1f}/"
                f"{step['median'] * 1e3:.1f}/{step['max'] * 1e3:.1f} ms (min/median/max), data "
                f"wait {wait['min']:.0%}..{wait['max']:.0%}, straggler rank "
                f"{last['straggler_rank']}"
            )
        return "\n".join(lines)

    __str__ = summary

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view (every window included; NaN and infinities as ``None``)."""
        world = self.in_force[-1].context.world_size if self.in_force else 1
        final = self.in_force
        data = {
            "samples_per_s": self.samples_per_s,
            "samples_per_s_per_rank": self.samples_per_s,
            "global_samples_per_s": self.global_samples_per_s,
            "world_size": world,
            "steps_under_final_settings": self.steps,
            "final_window_first_steps": [w.first_step for w in final],
            "median_step_s": self.median_step_s,
            "joules_per_sample": self.joules_per_sample,
            "data_wait_share": self.data_wait_share,
            "bottleneck": self.bottleneck,
            "limit": None if self.limit is None else self.limit.to_dict(),
            "mfu": None
            if self.limit is None or self.limit.utilization is None
            else self.limit.utilization.mfu,
            "diagnoses": [d.to_dict() for d in self.diagnoses],
            "windows": [w.to_dict() for w in self.windows],
            "step_log": [list(s) for s in self.step_log],
            "timeline": self.timeline.to_dict(),
            "knob_changes": [k.to_dict() for k in self.knob_changes],
            "captures": [c.to_dict() for c in self.captures],
            "ranks": list(self.ranks),
            "tuning": self.tuning,
            "spans": [list(s) for s in self.spans],
            "notes": list(self.notes),
        }
        clean: dict[str, Any] = strict_json(data)
        return clean

    def to_markdown(self) -> str:
        """``report.md``'s text: the result first, then trials, diagnoses, windows, notes.

        Rendered from ``to_dict()`` as ``report.json`` reads back, the data ``maxtp report``
        renders from, so both give the same text.
        """
        from lightning_maxtp.observe.report_md import render_markdown

        return render_markdown(json.loads(json.dumps(self.to_dict(), default=str)))

    def write(self, folder: str | Path) -> dict[str, Path]:
        """Write ``report.json``, ``report.md`` and (with matplotlib) ``timeline.png``.

        Each file is written atomically (a temporary file moved into place). Without the plot,
        a note in the other two says why.

        Returns:
            The written files by name.
        """
        from lightning_maxtp.observe.report_write import write_report

        return write_report(self.to_dict(), folder).written


def strict_json(value: Any) -> Any:
    """``value`` with every NaN or infinity replaced by ``None`` (strict JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    return value
