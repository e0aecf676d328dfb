"""What the callback prints by default: a few short lines, each answering one question.

``verbose=True`` (the default) prints, on global rank zero, at most these lines of at most
``WIDTH`` characters (the report's path is never cut): the plan and what binds its budget; the
baseline and its bottleneck; one line per trial with its verdict; the result with the tuning
cost; the distance to the limit and the next opt-in; where the report is. ``verbose="steps"``
prints every step of the loop as well (re-measures, notes, the full summaries);
``verbose=False`` prints nothing. The lines are pure functions of what the loop measured, so
that a test can read them without a fit.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from lightning_maxtp.knobs.registry import MATH_KNOBS

if TYPE_CHECKING:
    from lightning_maxtp.observe.diagnosis import Diagnosis
    from lightning_maxtp.observe.report import ThroughputReport
    from lightning_maxtp.tuning.config import TuningConfig
    from lightning_maxtp.tuning.cost import TuningCost
    from lightning_maxtp.tuning.trials import KnobTrial, TuningSummary

__all__ = [
    "WIDTH",
    "Verbosity",
    "baseline_line",
    "plan_brief",
    "result_lines",
    "trial_line",
    "verbosity",
]

WIDTH = 100
"""The longest console line, ``maxtp:`` prefix included (a terminal's width, with margin)."""

Verbosity = Literal["quiet", "brief", "steps"]

_VERDICT = {
    "kept": "kept",
    "reverted": "reverted",
    "undecided": "not beyond the noise, reverted",
    "unfinished": "unfinished at the fit's end, reverted",
    "guarded": "reverted by the numerics guard",
}


def verbosity(verbose: object) -> Verbosity:
    """The console level of the callback's ``verbose`` argument.

    Raises:
        ValueError: For anything but ``True``, ``False`` or ``"steps"``.
    """
    if verbose is True:
        return "brief"
    if verbose is False:
        return "quiet"
    if verbose == "steps":
        return "steps"
    raise ValueError(
        f"verbose={verbose!r}: expected True (a few lines), 'steps' (every step of the loop) or "
        "False (nothing), e.g. verbose='steps'"
    )


def fit(text: str) -> str:
    """``text`` cut to ``WIDTH`` characters with the ``maxtp:`` prefix (an ellipsis marks a cut)."""
    room = WIDTH - len("maxtp: ")
    return text if len(text) <= room else text[: room - 3].rstrip() + "..."


def plan_brief(
    config: TuningConfig, knobs: list[str], cpus: int, gpus: int, world_size: int
) -> str:
    """The plan: what the loop may change (``knobs`` beyond the loader's), and its limits."""
    tuned = ["loader" if config.tune_loader else "", "threads", *knobs]
    device = f"{gpus} GPU(s)" if gpus else "no GPU"
    ranks = f", {world_size} ranks" if world_size > 1 else ""
    share = "" if config.cost_share is None else f"{config.cost_share:.0%} of the fit, "
    return fit(
        f"plan: tune {', '.join(k for k in tuned if k)} ({cpus} CPUs, {device}{ranks}); "
        f"cost at most {share}{config.time_budget_s:.0f} s, {config.max_trials} trials"
    )


def baseline_line(rate: float, found: tuple[Diagnosis, ...], cost: TuningCost) -> str:
    """The baseline: its rate, its bottleneck, and the budget the fit's length gives tuning."""
    kind = found[0].kind.value if found else "unknown"
    budget = "no budget from the fit's length (unknown)"
    if cost.budget_s is not None and cost.expected_fit_s is not None:
        budget = f"budget {cost.budget_s:.1f} s of a ~{cost.expected_fit_s:.0f} s fit"
    return fit(f"baseline {rate:.1f} samples/s, bottleneck {kind}; {budget}")


def trial_line(trial: KnobTrial) -> str:
    """One trial: the change, the measured rate and gain (and the prediction), the verdict."""
    verdict = _VERDICT.get(trial.verdict, trial.verdict)
    change = trial.change
    if trial.after_samples_per_s is None:
        return fit(f"{change}: not measured, {verdict}")
    predicted = "" if trial.expected_gain is None else f", predicted {trial.expected_gain:+.0%}"
    return fit(
        f"{change}: {trial.after_samples_per_s:.1f} samples/s "
        f"({trial.gain:+.0%}{predicted}), {verdict}"
    )


def _where(path: Path) -> str:
    """``path`` relative to the working directory when it lies under it (shorter), else as is."""
    try:
        return os.path.relpath(path) if path.resolve().is_relative_to(Path.cwd()) else str(path)
    except (OSError, ValueError):
        return str(path)


def _next(report: ThroughputReport) -> str:
    """What the user could try next: the top diagnosis's first opt-in, else nothing."""
    for diagnosis in report.diagnoses[:1]:
        for rec in diagnosis.recommendations:
            if rec.auto_apply:
                continue
            if rec.knob in MATH_KNOBS:  # the loop tries it when allowed
                return f"; next: allow=[{rec.knob!r}]"
            return f"; next (yours): {rec.knob} -> {rec.proposed}"
    return ""


def _held(report: ThroughputReport) -> str:
    """What holds the run now, and how close to that limit it runs."""
    kind = report.bottleneck
    held = "now no bottleneck above threshold" if kind == "healthy" else f"now {kind}-bound"
    limit = report.limit
    if limit is None or limit.share is None:
        return held
    if limit.limit == "device":
        return f"{held}, MFU {limit.share:.1%} of the measured peak"
    return f"{held}, the loader at {limit.share:.0%} of the device's rate"


def result_lines(
    summary: TuningSummary, report: ThroughputReport, report_dir: Path | None
) -> list[str]:
    """The end of the fit: before -> after and the cost; the limit and next step; the report."""
    lines = []
    before, after, cost = summary.baseline_samples_per_s, summary.tuned_samples_per_s, summary.cost
    if before and after:
        spent = ""
        if cost is not None:
            budget = "" if cost.budget_s is None else f" (budget {cost.budget_s:.1f} s)"
            spent = f"; tuning cost {cost.cost_s:.1f} s{budget}"
        speedup = f"({after / before:.2f}x)"
        lines.append(fit(f"result: {before:.1f} -> {after:.1f} samples/s {speedup}{spent}"))
    else:  # no baseline, or no window under the settings in force: say why
        state = "tuning stopped" if summary.finished else "the fit ended while tuning"
        lines.append(fit(f"result: not measured ({state}: {summary.stop_reason or 'no window'})"))
    lines.append(fit(_held(report) + _next(report)))
    if report_dir is not None:  # a path cut short is no path: this line may be longer
        lines.append(f"report: {_where(report_dir / 'report.md')}")
    return lines
