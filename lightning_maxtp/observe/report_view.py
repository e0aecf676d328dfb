"""What ``report.md`` and ``timeline.png`` say, derived from ``report.json``'s data alone.

Both files are drawn from the JSON (``ThroughputReport.to_dict()`` at the end of a fit, or the
file read back by ``maxtp report DIR``), never from live objects: re-rendering a folder gives
the files the fit wrote, and whatever they show is in the JSON. The view answers a reader's
first questions in their order: how much faster, with what settings, at what cost, how far from
the limit, what next; then one row per knob trial with its verdict, and each measured window's
role in the run (baseline, a trial's, a reference, the final settings).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from lightning_maxtp.observe.report_rows import (
    ChangeRow,
    TrialRow,
    WindowRow,
    change_row,
    trial_rows,
    window_rows,
)
from lightning_maxtp.observe.report_steps import StepTimes, step_times

__all__ = ["ReportView", "SettingChange", "Summary", "rate_words", "report_view"]

_NOT_ALLOWED = "not allowed: "
"""A tuning note naming the knobs the bottleneck points to that ``allow`` left out."""
_NEXT_SHOWN = 3
"""Recommendations of the top diagnosis in the summary's "next" (all are in its section)."""


@dataclass(frozen=True)
class SettingChange:
    """A setting in force that differs from the user's."""

    knob: str
    yours: Any
    now: Any

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return asdict(self)


@dataclass(frozen=True)
class Summary:
    """The first screen: before and after, the settings, the cost, the limit, what next."""

    rate_text: str
    """The headline rate under the final settings, in words (per rank and over ranks)."""
    bottleneck: str
    median_step_s: float
    data_wait_share: float
    steps_in_force: int
    """Steps measured under the final settings (what the headline rate is made of)."""
    tuned: bool = False
    """Whether a tuning loop ran (``False``: the report only watched; the settings are yours)."""
    before: float | None = None
    """The baseline window's samples/s (the user's settings), per rank."""
    after: float | None = None
    """Samples/s under the settings in force, per rank."""
    baseline_steps: tuple[int, int] | None = None
    """First and last step of the baseline window."""
    changed: tuple[SettingChange, ...] = ()
    unchanged: tuple[tuple[str, Any], ...] = ()
    """Settings the loop reports that are still the user's: ``(knob, value)``."""
    trials: int = 0
    kept: int = 0
    cost_s: float | None = None
    """What tuning cost: training blocked, slower windows, switching."""
    budget_s: float | None = None
    blocked_s: float = 0.0
    lost_s: float = 0.0
    switch_s: float = 0.0
    earned_s: float = 0.0
    """What the changes kept had saved by then: tuning may spend it beyond the budget."""
    over_s: float = 0.0
    """How far the cost went past the budget and the savings."""
    tuning_s: float | None = None
    tuning_steps: int | None = None
    stop_reason: str = ""
    finished: bool = False
    fit_s: float | None = None
    """The fit's measured steps' time from the baseline window on."""
    baseline_fit_s: float | None = None
    """The same steps at the baseline rate."""
    steps_run: int = 0
    limit: str | None = None
    """The distance to the limit, in words."""
    next: tuple[str, ...] = ()
    world_size: int = 1

    @property
    def speedup(self) -> float | None:
        """After over before (``None``: no baseline)."""
        if not self.before or self.after is None:
            return None
        return self.after / self.before

    @property
    def saved_s(self) -> float | None:
        """Seconds the fit's steps took less than at the baseline rate (negative: more)."""
        if self.fit_s is None or self.baseline_fit_s is None:
            return None
        return self.baseline_fit_s - self.fit_s

    @property
    def net(self) -> float | None:
        """The fit's time over the same steps at the baseline rate (< 1: faster)."""
        if self.fit_s is None or not self.baseline_fit_s:
            return None
        return self.fit_s / self.baseline_fit_s

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view, with the derived numbers."""
        data = asdict(self)
        data["changed"] = [c.to_dict() for c in self.changed]
        data["unchanged"] = [list(u) for u in self.unchanged]
        data["baseline_steps"] = None if self.baseline_steps is None else list(self.baseline_steps)
        data["next"] = list(self.next)
        return {**data, "speedup": self.speedup, "saved_s": self.saved_s, "net": self.net}


@dataclass(frozen=True)
class ReportView:
    """Everything ``report.md`` and ``timeline.png`` show beyond the raw series."""

    summary: Summary
    trials: tuple[TrialRow, ...]
    windows: tuple[WindowRow, ...]
    changes: tuple[ChangeRow, ...]
    """Knob changes no trial covers (empty when trials are shown)."""
    notes: tuple[str, ...]
    """The report's notes, less those the summary and the trial table already say."""
    tuning_spans: tuple[tuple[float, float], ...]
    """``(start_s, end_s)`` of each tuning period."""
    clock: StepTimes
    device: str
    """The device type the fit ran on (``"cpu"``, ``"cuda"``...; ``""``: unknown)."""
    host_cpus: int | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "summary": self.summary.to_dict(),
            "trials": [t.to_dict() for t in self.trials],
            "windows": [w.to_dict() for w in self.windows],
            "changes": [c.to_dict() for c in self.changes],
            "notes": list(self.notes),
            "tuning_spans": [list(s) for s in self.tuning_spans],
            "clock": self.clock.to_dict(),
            "device": self.device,
            "host_cpus": self.host_cpus,
        }


def rate_words(
    samples_per_s: float, world_size: int = 1, joules_per_sample: float | None = None
) -> str:
    """The headline rate in words: per rank and over all ranks under DDP; energy where measured."""
    joules = (
        "" if joules_per_sample is None else f" ({joules_per_sample:.3g} J/sample on the device)"
    )
    if world_size <= 1:
        return f"{samples_per_s:.1f} samples/s{joules}"
    return (
        f"{samples_per_s:.1f} samples/s per rank "
        f"({samples_per_s * world_size:.1f} over {world_size} ranks){joules}"
    )


def report_view(data: Mapping[str, Any]) -> ReportView:
    """What the report files show, from ``report.json``'s data.

    Args:
        data: ``ThroughputReport.to_dict()``, or ``report.json`` read back.

    Returns:
        The summary, the trial rows, the window rows with their roles, and the notes left.
    """
    windows = list(data.get("windows") or [])
    tuning = data.get("tuning")
    clock = step_times(data.get("step_log") or [], windows)
    changes = list(data.get("knob_changes") or [])
    trials = trial_rows(tuning, changes, clock)
    spans = tuple(
        (float(s[1]), float(s[2])) for s in data.get("spans") or [] if s and s[0] == "tuning"
    )
    rows = window_rows(data, windows, trials, changes=changes, clock=clock, spans=spans)
    summary = _summary(data, windows, rows, tuning)
    context = (windows[-1].get("context") or {}) if windows else {}
    loose = () if trials else tuple(change_row(c, clock) for c in changes)
    return ReportView(
        summary=summary,
        trials=trials,
        windows=rows,
        changes=loose,
        notes=_notes(data, trials, summary),
        tuning_spans=spans,
        clock=clock,
        device=str(context.get("device_type") or ""),
        host_cpus=context.get("host_cpus"),
    )


def _touched(trial: Mapping[str, Any]) -> dict[str, Any]:
    """The settings a trial changed, with the values before it (a plan changes several)."""
    old = trial.get("old")
    return dict(old) if isinstance(old, Mapping) else {str(trial.get("knob", "")): old}


def _settings(
    tuning: Mapping[str, Any], windows: Sequence[Mapping[str, Any]]
) -> tuple[tuple[SettingChange, ...], tuple[tuple[str, Any], ...]]:
    """The settings in force against the user's: a trial's "before", else the baseline's."""
    yours: dict[str, Any] = {}
    for trial in tuning.get("trials") or []:
        for knob, old in _touched(trial).items():
            yours.setdefault(knob, old)  # the first trial of a knob saw the user's value
    baseline = (windows[0].get("context") or {}) if windows else {}
    changed, same = [], []
    for knob, now in (tuning.get("settings") or {}).items():
        mine = yours[knob] if knob in yours else baseline.get(knob, now)
        if mine != now:
            changed.append(SettingChange(knob, mine, now))
        else:
            same.append((knob, now))
    return tuple(changed), tuple(same)


def _next(data: Mapping[str, Any], tuning: Mapping[str, Any] | None) -> tuple[str, ...]:
    """What to try next: the top diagnosis's first recommendations, and knobs left out.

    A recommended knob that ``allow`` left out is said once, by the note that names it (which
    also says how to allow it), not again as a recommendation above it.
    """
    notes = [str(n) for n in (tuning or {}).get("notes") or []]
    left_out = [n for n in notes if n.startswith(_NOT_ALLOWED)]
    named = {k for note in left_out for k in note[len(_NOT_ALLOWED) :].split(" (")[0].split(", ")}
    found = []
    diagnoses = data.get("diagnoses") or []
    if diagnoses:
        top = diagnoses[0]
        recs = [r for r in top.get("recommendations") or [] if r.get("knob") not in named]
        for rec in recs[:_NEXT_SHOWN]:
            mode = "automatic: the loop may apply it" if rec.get("auto_apply") else "opt-in"
            found.append(
                f"`{rec.get('knob')}`: {rec.get('current')} -> {rec.get('proposed')} ({mode}; "
                f"see `{top.get('kind')}` below)"
            )
    return (*found, *left_out)


def _summary(
    data: Mapping[str, Any],
    windows: Sequence[Mapping[str, Any]],
    rows: tuple[WindowRow, ...],
    tuning: Mapping[str, Any] | None,
) -> Summary:
    world = int(data.get("world_size") or 1)
    rate = float(data.get("samples_per_s") or 0.0)
    limit = data.get("limit")
    base = Summary(
        rate_text=rate_words(rate, world, data.get("joules_per_sample")),
        bottleneck=str(data.get("bottleneck", "unknown")),
        median_step_s=float(data.get("median_step_s") or 0.0),
        data_wait_share=float(data.get("data_wait_share") or 0.0),
        steps_in_force=int(data.get("steps_under_final_settings") or 0),
        limit=None if not limit else str(limit.get("text") or "") or None,
        next=_next(data, tuning),
        world_size=world,
    )
    if not tuning:
        return base
    trials = tuning.get("trials") or []
    cost = tuning.get("cost") or {}
    changed, same = _settings(tuning, windows)
    baseline = next((r for r in rows if r.role.startswith("baseline")), None)
    step_s, steps_run = cost.get("step_s"), int(cost.get("steps_run") or 0)
    return replace(
        base,
        tuned=True,
        before=tuning.get("baseline_samples_per_s"),
        after=tuning.get("tuned_samples_per_s"),
        baseline_steps=None if baseline is None else (baseline.first_step, baseline.last_step),
        changed=changed,
        unchanged=same,
        trials=len(trials),
        kept=sum(1 for t in trials if t.get("kept")),
        cost_s=cost.get("cost_s"),
        budget_s=cost.get("budget_s"),
        blocked_s=float(cost.get("blocked_s") or 0.0),
        lost_s=float(cost.get("lost_s") or 0.0),
        switch_s=float(cost.get("switch_s") or 0.0),
        earned_s=float(cost.get("earned_s") or 0.0),
        over_s=float(cost.get("over_s") or 0.0),
        tuning_s=tuning.get("tuning_s"),
        tuning_steps=tuning.get("tuning_steps"),
        stop_reason=str(tuning.get("stop_reason", "")),
        finished=bool(tuning.get("finished")),
        fit_s=cost.get("fit_s"),
        baseline_fit_s=None if step_s is None or not steps_run else float(step_s) * steps_run,
        steps_run=steps_run,
    )


def _notes(
    data: Mapping[str, Any], trials: tuple[TrialRow, ...], summary: Summary
) -> tuple[str, ...]:
    """The report's notes less what the summary and the trial table say already.

    The tuner puts its summary's first lines and each trial's line among the notes (the
    console shows them); here they are the summary block and the trial table.
    """
    said = {f"{t.knob}: {t.old} -> {t.new}: " for t in trials}
    kept = []
    for note in data.get("notes") or []:
        text = str(note)
        if text.startswith("maxtp: tuning: ") or (
            text.strip().startswith("throughput: ") and "(baseline window)" in text
        ):
            continue
        if any(text.startswith(prefix) for prefix in said) or text in summary.next:
            continue
        kept.append(text)
    return tuple(kept)
