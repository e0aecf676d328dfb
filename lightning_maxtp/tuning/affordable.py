"""Whether this fit can pay for a trial: its worst case, the rule that admits it, its size.

``admission`` holds the two rules (within the budget, or past it on a strong prediction); this
module applies them to one fit. The Tuner reads its numbers into a ``Funds`` (the budget left,
the rest of the fit, the baseline's and the reference window's rates, the worker starts
measured so far) and asks, with plain data in and out:

* ``worst_case_s``: what a trial costs before a window can revert it;
* ``affordable`` (``admitted`` for a cost already known): the rule that lets it start, or
  ``None``; ``unpaid`` says why not, ``remeasure_refused`` why a re-measurement cannot start
  (the windows measured then decide);
* ``sized``: a modelled worker change sized to the rest of the fit (a start must pay for
  itself in the samples left);
* ``may_try_one_more``: whether a window monitored after tuning may start one more trial.

Pure: no clock, no Lightning; the Tuner carries out what comes back (a note, a trial, a stop).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from lightning_maxtp.knobs.registry import PERSISTENT, WORKERS
from lightning_maxtp.observe.job_model import JobModel
from lightning_maxtp.observe.thresholds import DATA_WAIT_SHARE_STRONG
from lightning_maxtp.tuning.admission import Admission, admit
from lightning_maxtp.tuning.decisions import Try
from lightning_maxtp.tuning.sequential import early_steps
from lightning_maxtp.tuning.switches import (
    Switches,
    only_persists,
    starts_workers,
    trial_risk_s,
    worker_starts,
    workers_after,
)
from lightning_maxtp.tuning.trials import fmt_settings

if TYPE_CHECKING:
    from lightning_maxtp.observe.window import Window

__all__ = [
    "Funds",
    "admitted",
    "affordable",
    "may_try_one_more",
    "remeasure_refused",
    "sized",
    "start_s",
    "switch_s",
    "unpaid",
    "worst_case_s",
]


@dataclass(frozen=True)
class Funds:
    """What the fit may still spend on tuning, and the windows a trial's cost is read from."""

    left_s: float = math.inf
    """The tuning budget left, seconds (``inf``: no budget; below 0 once overspent)."""
    rest_s: float | None = None
    """The rest of the fit at the baseline rate, seconds (``None``: its length is unknown)."""
    baseline_rate: float | None = None
    """The baseline window's samples/s (``None``: none measured)."""
    ref_rate: float | None = None
    """The reference window's samples/s (``None``: no reference yet)."""
    ref_step_s: float = 0.0
    """The reference window's mean step, seconds (0: no reference)."""
    ref_wait_share: float | None = None
    """Share of the reference window's time its steps waited for data (``None``: none)."""
    measured_starts: tuple[tuple[float, int], ...] = ()
    """``(excess seconds, workers started)`` of each worker start measured in this fit."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view (an unbounded budget as ``None``)."""
        data = asdict(self)
        data["left_s"] = None if math.isinf(self.left_s) else self.left_s
        data["measured_starts"] = [list(m) for m in self.measured_starts]
        return data

    @property
    def rest_now_s(self) -> float | None:
        """The rest of the fit at the rate in force, not the baseline's (``None``: unknown)."""
        rest, base, ref = self.rest_s, self.baseline_rate, self.ref_rate
        if rest is not None and ref is not None and base and ref > 0:
            rest *= base / ref
        return rest

    @property
    def strong(self) -> bool:
        """Whether the evidence for a prediction is strong.

        The reference window waits for data above ``DATA_WAIT_SHARE_STRONG``: the job model's
        prediction rests on the loading it measured there.
        """
        return self.ref_wait_share is not None and self.ref_wait_share >= DATA_WAIT_SHARE_STRONG


def start_s(workers: int, measured_starts: Sequence[tuple[float, int]]) -> float:
    """What starting ``workers`` workers is expected to cost, seconds (``Switches.start_s``).

    Args:
        workers: The workers the start starts.
        measured_starts: ``(excess seconds, workers started)`` of the starts measured so far:
            the dearest one's ratio to the prior scales it.
    """
    return Switches(measured=list(measured_starts)).start_s(workers)


def switch_s(
    target: Mapping[str, Any],
    settings: Mapping[str, Any],
    measured_starts: Sequence[tuple[float, int]],
) -> float:
    """What switching from ``settings`` to ``target`` costs beyond its steps: its worker starts.

    0 for a switch that starts no worker (``switches.starts_workers``).
    """
    if not starts_workers(target, settings):
        return 0.0
    return start_s(workers_after(target, settings), measured_starts)


def worst_case_s(
    change: Mapping[str, Any], settings: Mapping[str, Any], funds: Funds, *, window_steps: int
) -> float:
    """What a trial of ``change`` costs at worst before a window can revert it (predicted).

    Its worker starts, each at what the dearest start so far cost (``start_s``), and its first
    steps until a losing trial is cut short (``switches.trial_risk_s``), each at the reference
    window's step; none of those steps for a change that only makes the workers persistent
    (``only_persists``: the same workers load the same batches, no step runs slower).

    Args:
        change: The settings the trial switches to.
        settings: The settings in force (loader knobs and the others).
        funds: The fit's numbers: the reference's step and the starts measured so far.
        window_steps: The trial window's length under ``change``, in whole turns of its workers.
    """
    starts = [start_s(n, funds.measured_starts) for n in worker_starts(change, settings)]
    early = early_steps(window_steps, workers_after(change, settings))
    slower = 0 if only_persists(change, settings) else early
    return trial_risk_s(starts, slower, funds.ref_step_s)


def admitted(risk_s: float, funds: Funds, *, expected_gain: float | None) -> Admission | None:
    """``admission.admit`` with this fit's budget left, its rest and the evidence in force.

    The rest of the fit is counted at the rate in force (``Funds.rest_now_s``), and the
    evidence is strong when the reference window waits for data beyond doubt
    (``Funds.strong``).

    Args:
        risk_s: The worst case of what is to start, seconds.
        funds: The fit's numbers.
        expected_gain: The gain predicted for it (0.8: 1.8x), ``None`` without a prediction.
    """
    return admit(
        risk_s,
        funds.left_s,
        expected_gain=expected_gain,
        rest_s=funds.rest_now_s,
        strong=funds.strong,
    )


def affordable(
    change: Try, settings: Mapping[str, Any], funds: Funds, *, window_steps: int
) -> Admission | None:
    """The rule that lets a trial of ``change`` start at its worst (``worst_case_s``), or ``None``.

    Within the budget left, or past it on a strong prediction (``admission.admit``).

    Args:
        change: The trial proposed, with the gain predicted for it (if any).
        settings: The settings in force.
        funds: The fit's numbers.
        window_steps: The trial window's length under ``change``, in whole turns of its workers.
    """
    risk = worst_case_s(change.settings, settings, funds, window_steps=window_steps)
    return admitted(risk, funds, expected_gain=change.expected_gain)


def unpaid(change: Try, risk_s: float, left_s: float) -> str:
    """Why ``change`` was not tried for want of budget (a note, and the stop reason).

    Args:
        change: The trial turned down.
        risk_s: Its worst case (``worst_case_s``), seconds.
        left_s: The tuning budget left, seconds (shown as 0 once overspent).
    """
    return (
        f"{change.knob} {fmt_settings(change.settings)} may cost {risk_s:.2f} s before a window "
        f"can revert it (worker starts, its first steps), {max(0.0, left_s):.2f} s of the budget "
        "is left"
    )


def remeasure_refused(
    knob: str,
    target: Mapping[str, Any],
    settings: Mapping[str, Any],
    funds: Funds,
    *,
    expected_gain: float | None,
    loss_s: float = 0.0,
) -> str | None:
    """Why the budget left cannot pay for re-measuring ``target``, or ``None``.

    A trial that looked like a gain is measured again, the reference then the trial; a
    re-measure that starts workers is paid for before it is made, as a trial is (admitted on the
    trial's predicted gain): its workers' start, and what the window of the slower settings
    costs at the rates measured so far (``loss_s``: a reference of 4 workers restarted
    at every 12-step epoch, measured 17 % slower than none, cost its own start again and an
    epoch at that rate). Otherwise the windows measured decide (``TuningLoop.without_remeasure``:
    kept only on a confirmed prediction or two pairs beyond doubt), and the reason returned
    says why.

    Args:
        knob: The trial's knob.
        target: The settings to measure again (the reference's or the trial's).
        settings: The settings in force.
        funds: The fit's numbers.
        expected_gain: The gain predicted for the trial (``None``: none).
        loss_s: What the window re-measured costs beyond the other settings' measured rate.
    """
    if not starts_workers(target, settings):
        return None
    need = switch_s(target, settings, funds.measured_starts) + max(0.0, loss_s)
    if admitted(need, funds, expected_gain=expected_gain) is not None:
        return None
    window = f" and {loss_s:.2f} s of a slower window" if loss_s >= 0.005 else ""
    return (
        f"{knob}: re-measuring {fmt_settings(target)} would start workers{window} (about "
        f"{need:.2f} s) past the budget left ({max(0.0, funds.left_s):.2f} s): decided on the "
        "windows measured"
    )


def sized(
    change: Try,
    window: Window | None,
    *,
    batches: float | None,
    steps_done: int,
    per_start: tuple[float, float],
    most: int | None,
) -> Try | str:
    """A modelled worker change sized to the rest of this fit, or why none is tried.

    Persistent workers save the restarts at the epochs' starts: in a fit's last epoch there
    are none left, and they are not tried, alone or with a worker count (the model ranks them
    by the restarts an epoch costs, as though more epochs followed).

    The diagnosis ranks worker counts by their steady rate; here the job model weighs the
    start of more workers (as this fit's starts measured them) against the samples left
    (``JobModel.choose``): a short fit gets fewer, a long one as many as pay. Changes the job
    model did not predict, and fits of unknown length, are left as they are.

    Args:
        change: The change proposed.
        window: The window that named it (the reference, or one monitored after tuning).
        batches: Training batches the fit is expected to run (``None`` or ``inf``: unknown).
        steps_done: Steps run so far.
        per_start: What starting workers costs, ``(base, per worker)`` seconds
            (``Switches.per_start``).
        most: The user's cap on the workers (``max_workers``).

    Returns:
        The change, as proposed or with the worker count that finishes the fit soonest; or,
        when the count in force finishes soonest (no other count saves its start), the note
        that says why it is not tried.
    """
    if window is None:
        return change
    epoch = window.context.epoch_batches
    last_epoch = (
        epoch is not None
        and epoch > 0
        and batches is not None
        and math.isfinite(batches)
        and (math.ceil(batches) - 1) // epoch <= steps_done // epoch
    )
    if change.knob == PERSISTENT and change.settings.get(PERSISTENT):
        if last_epoch:
            assert batches is not None
            return (
                f"{fmt_settings(change.settings)} not tried: the fit ends within this epoch "
                f"({max(0.0, batches - steps_done):.0f} steps left), with no worker restart "
                "left to save"
            )
        return change
    if last_epoch and change.settings.get(PERSISTENT):
        rest = {k: v for k, v in change.settings.items() if k != PERSISTENT}
        change = replace(change, settings=rest)
    if change.knob != WORKERS or change.expected_gain is None:
        return change
    model = JobModel.from_window(window)
    if model is None or batches is None or not math.isfinite(batches) or not window.steps:
        return change
    samples_left = max(0.0, batches - steps_done) * sum(window.samples) / window.steps
    choice = model.choose(most=most, samples_left=samples_left, start_s=per_start)
    settings = {**change.settings, WORKERS: choice.workers}
    if not choice.workers or not choice.persistent:
        settings.pop(PERSISTENT, None)
    if choice.workers == model.workers:
        return (
            f"{fmt_settings(change.settings)} not tried: for the {samples_left:.0f} samples "
            f"left, starting them costs more than they would save ({choice.reason})"
        )
    if settings == change.settings:
        return change
    why = f"{change.why}; for the {samples_left:.0f} samples left, {choice.workers} workers"
    return Try(change.knob, settings, why, round(choice.gain, 4))


def may_try_one_more(
    *, converged: bool, switchable: bool, settling: bool, baseline_measured: bool
) -> bool:
    """Whether a window monitored after tuning may lead to one more trial.

    The end-of-fit report reads the same rules as the loop; a change it would name is either
    tried after tuning, when the budget left pays for it, or labelled with why it was not.
    Only after tuning converged (a loop stopped by its budget or its time limit stays
    stopped), with a train loader that can be switched, once the steps after an undo are past
    (the first monitoring window leaves them out), and on a baseline this fit measured
    (settings carried from an earlier fit were never budgeted).

    Args:
        converged: Whether tuning ended with nothing left to try.
        switchable: Whether the train loader can be switched.
        settling: Whether steps after an undo are still being left out.
        baseline_measured: Whether this fit measured a baseline (and so a budget).
    """
    return converged and switchable and not settling and baseline_measured
