"""The rows of ``report.md``'s tables, from ``report.json``'s data: trials and windows.

One row per knob trial, not per switch: a trial starts with a "trying" switch, may switch back
and forth to measure the settings before it again, and ends with its verdict; each row carries
the verdict and what it rests on. One row per window, keyed by steps with its time beside it
(``report_steps``), with its role in the run: the baseline under the user's settings, a trial's
or its reference's, or the final settings monitored once tuning ended.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from lightning_maxtp.observe.report_steps import StepTimes

__all__ = [
    "ChangeRow",
    "TrialRow",
    "WindowRow",
    "change_row",
    "trial_rows",
    "value_text",
    "window_rows",
]

# The tuner's words for a trial's switches (``KnobChange.reason``): a trial starts with
# "trying: ...", may switch back and forth to re-measure, and ends with its verdict's words.
_TRYING = "trying: "
_REFERENCE_AGAIN = "re-measuring the reference"
_TRIAL_AGAIN = "re-measuring the trial"
_VERDICT_WORDS = {
    "undecided": "undecided: not beyond the noise, the original kept",
    "unfinished": "unfinished: the fit ended before the trial was judged",
    "guarded": "reverted by the numerics guard, state restored",
    "reverted": "reverted",
}
"""A verdict in words when no switch recorded the loop's own (the fit ended first)."""
_MONITORING = "final settings (monitoring)"


@dataclass(frozen=True)
class TrialRow:
    """One knob trial: what changed, what it measured, the verdict and why."""

    number: int
    knob: str
    old: Any
    new: Any
    step: int
    """The step the change applied from."""
    t_s: float | None
    """When the change was made, seconds since the monitor started (``None``: not recorded)."""
    before: float
    after: float | None
    gain: float
    predicted: float | None
    verdict: str
    outcome: str
    """The loop's words for its verdict ("reverted: -8.0% < 5%"; ``""`` when kept)."""
    reason: str
    """Why it was tried."""
    windows: int
    noise: float | None = None
    lost_s: float = 0.0
    guard: str | None = None

    @property
    def evidence(self) -> str:
        """What the verdict rests on, in words."""
        parts = [
            f"{self.windows} windows" + ("" if self.noise is None else f", noise {self.noise:.0%}")
        ]
        if self.outcome:
            parts.append(self.outcome)
        if self.guard:
            parts.append(self.guard)
        if self.lost_s > 0:
            parts.append(f"{self.lost_s:.1f} s lost in slower windows")
        if self.reason:
            parts.append(f"tried because {self.reason}")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {**asdict(self), "evidence": self.evidence}


@dataclass(frozen=True)
class WindowRow:
    """A measured window, keyed by steps, with its time and its role in the run."""

    first_step: int
    last_step: int
    start_s: float | None
    end_s: float | None
    role: str
    samples_per_s: float
    median_step_s: float
    data_wait_share: float
    gpu_util_percent: float | None = None
    counted: bool = False
    """Whether its FLOPs were counted (then ``mfu`` ``None`` means above the peak: an error)."""
    mfu: float | None = None
    gc_share: float | None = None
    final: bool = False
    """Under the final settings: part of the headline."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return asdict(self)


@dataclass(frozen=True)
class ChangeRow:
    """A knob change with no trial to show it (a report built by hand, or by another loop)."""

    step: int | None
    t_s: float
    knob: str
    old: Any
    new: Any
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return asdict(self)


def change_row(change: Mapping[str, Any], clock: StepTimes) -> ChangeRow:
    """A ``report.json`` knob change as a row, keyed by the step it applied from."""
    t = float(change.get("t_s", 0.0))
    return ChangeRow(
        clock.step_at(t), t, str(change.get("knob", "")), change.get("old"), change.get("new"),
        str(change.get("reason", "")),
    )  # fmt: skip


def _groups(changes: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """The knob changes by trial: each "trying" change with the switches after it."""
    groups: list[list[Mapping[str, Any]]] = []
    for change in changes:
        if str(change.get("reason", "")).startswith(_TRYING) or not groups:
            groups.append([])
        groups[-1].append(change)
    return groups


def trial_rows(
    tuning: Mapping[str, Any] | None, changes: Sequence[Mapping[str, Any]], clock: StepTimes
) -> tuple[TrialRow, ...]:
    """One row per trial of ``tuning`` (``report.json``'s), with the switches it made.

    Args:
        tuning: The tuning summary's data (``None``: nothing was tuned, no row).
        changes: Every knob change: the i-th "trying" one started the i-th trial.
        clock: The step log on the step axis.
    """
    if not tuning:
        return ()
    groups = [g for g in _groups(changes) if str(g[0].get("reason", "")).startswith(_TRYING)]
    rows = []
    for i, trial in enumerate(tuning.get("trials") or []):
        group = groups[i] if i < len(groups) else []
        t_s = float(group[0]["t_s"]) if group else None
        ends = [
            str(c.get("reason", ""))
            for c in group[1:]
            if not str(c.get("reason", "")).startswith((_REFERENCE_AGAIN, _TRIAL_AGAIN))
        ]
        guard = trial.get("guard")
        guard_text = None
        if guard:
            passed = "passed" if guard.get("passed") else "FAILED"
            guard_text = f"numerics guard {passed}: {guard.get('reason', '')}".rstrip(": ")
        rows.append(
            TrialRow(
                number=i + 1,
                knob=str(trial.get("knob", "")),
                old=trial.get("old"),
                new=trial.get("new"),
                step=int(trial.get("first_step", 0)),
                t_s=t_s,
                before=float(trial.get("before_samples_per_s") or 0.0),
                after=trial.get("after_samples_per_s"),
                gain=float(trial.get("gain") or 0.0),
                predicted=trial.get("expected_gain"),
                verdict=str(trial.get("verdict", "kept" if trial.get("kept") else "reverted")),
                outcome=ends[-1] if ends else _VERDICT_WORDS.get(str(trial.get("verdict")), ""),
                reason=str(trial.get("reason", "")),
                windows=int(trial.get("windows") or 0),
                noise=trial.get("noise"),
                lost_s=float(trial.get("lost_s") or 0.0),
                guard=guard_text,
            )
        )
    return tuple(rows)


def _events(
    trials: tuple[TrialRow, ...], changes: Sequence[Mapping[str, Any]], clock: StepTimes
) -> list[tuple[int, str, int]]:
    """``(step, state, trial index)`` from each switch on: the settings a window ran with.

    States: ``trial`` (the trial's settings), ``reference`` (the settings before it, measured
    again), ``undone`` (its settings undone by the verdict). Without a step log only the trials'
    starts are known.
    """
    groups = [g for g in _groups(changes) if str(g[0].get("reason", "")).startswith(_TRYING)]
    events = []
    for i, trial in enumerate(trials):
        group = groups[i] if i < len(groups) and clock.first_step is not None else []
        if not group:
            events.append((trial.step, "trial", i))
            continue
        for change in group:
            reason = str(change.get("reason", ""))
            step = clock.step_at(float(change.get("t_s", 0.0)))
            if step is None:  # not reached: the clock has a first step here
                continue
            if reason.startswith((_TRYING, _TRIAL_AGAIN)):
                events.append((step, "trial", i))
            elif reason.startswith(_REFERENCE_AGAIN):
                events.append((step, "reference", i))
            else:
                events.append((step, "undone", i))
    return sorted(events, key=lambda e: e[0])


def window_rows(
    data: Mapping[str, Any],
    windows: Sequence[Mapping[str, Any]],
    trials: tuple[TrialRow, ...],
    *,
    changes: Sequence[Mapping[str, Any]],
    clock: StepTimes,
    spans: tuple[tuple[float, float], ...],
) -> tuple[WindowRow, ...]:
    """One row per window of ``report.json``'s data, with its time and its role.

    Args:
        data: ``report.json``'s data (whether it tuned, which windows are the final ones).
        windows: Its windows.
        trials: Its trial rows (``trial_rows``).
        changes: Its knob changes (each trial's switches).
        clock: The step log on the step axis.
        spans: The tuning periods, ``(start_s, end_s)``.
    """
    tuned = bool(data.get("tuning"))
    final = set(data.get("final_window_first_steps") or [])
    events = _events(trials, changes, clock)
    tuning_steps = [
        (clock.step_at(a), clock.step_at(b)) for a, b in spans if clock.first_step is not None
    ]
    rows = []
    for index, window in enumerate(windows):
        first = int(window.get("first_step", 0))
        steps = int(window.get("steps") or len(window.get("step_time_s") or ()))
        last = first + steps - 1
        role = _role(first, index == 0, events, trials, tuning_steps) if tuned else "monitoring"
        in_final = tuned and first in final
        if in_final and role != _MONITORING:
            role += " - final settings"
        step_s = [float(s) for s in window.get("step_time_s") or ()]
        gpu = [float(u) for u in (window.get("sampler") or {}).get("gpu_util_percent") or ()]
        util = window.get("utilization")
        gc = window.get("gc")
        rows.append(
            WindowRow(
                first_step=first,
                last_step=last,
                start_s=clock.start_of(first),
                end_s=clock.end_of(last),
                role=role,
                samples_per_s=float(window.get("samples_per_s") or 0.0),
                median_step_s=statistics.median(step_s) if step_s else 0.0,
                data_wait_share=float(window.get("data_wait_share") or 0.0),
                gpu_util_percent=statistics.fmean(gpu) if gpu else None,
                counted=util is not None,
                mfu=None if util is None else util.get("mfu"),
                gc_share=None if gc is None else gc.get("share"),
                final=in_final or not tuned,
            )
        )
    return tuple(rows)


def _role(
    first: int,
    earliest: bool,
    events: list[tuple[int, str, int]],
    trials: tuple[TrialRow, ...],
    tuning_steps: list[tuple[int | None, int | None]],
) -> str:
    """A tuned run's window's role, from the last switch before its first step.

    ``earliest``: the run's first window (the baseline, unless it ran before tuning began).
    """
    if tuning_steps:
        starts = [a for a, _ in tuning_steps if a is not None]
        if starts and first < min(starts):
            return "warm-up"
        if not any(a is not None and b is not None and a <= first < b for a, b in tuning_steps):
            return _MONITORING
    before = [e for e in events if e[0] <= first]
    if not before:
        # Before the first trial: the user's settings (a plan may take several windows).
        return "baseline (your settings)" if earliest or trials else _MONITORING
    _, state, i = before[-1]
    trial = trials[i]
    if state == "trial":
        change = f"{value_text(trial.old)} -> {value_text(trial.new)}"
        return f"trial {trial.number} of {trial.knob}: {change}"
    if state == "reference":
        return f"reference for trial {trial.number}: {trial.knob} {value_text(trial.old)}"
    return f"after trial {trial.number} ({trial.verdict}): {trial.knob} {value_text(trial.old)}"


def value_text(value: Any) -> str:
    """A setting's value as the report writes it (a settings dict as ``k=v, ...``)."""
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return str(value)
