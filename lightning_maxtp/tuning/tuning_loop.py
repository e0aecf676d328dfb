"""The closed loop's state machine, without Lightning: when to measure, what to try, what to keep.

``MaxThroughputCallback``'s ``Tuner`` feeds it step counts and measured windows and carries out
what it decides (switching the loader, broadcasting under DDP, logging). Phases::

    warmup -> baseline -> (settle -> trial [-> settle -> trial (reference again)
                                             -> settle -> trial (trial again)
                                            [-> the third pair, the same way]])* -> monitor

A trial is judged against the reference window (the baseline, or the last kept trial) by
``judge.judge``: one that looks like a gain is re-measured, reference and trial in turn,
before it is kept; ``sequential`` ends a trial sooner when its first steps already lose, or
when its first window confirms a predicted gain. After a revert the next decision reads a
reference window's diagnoses, not the reverted trial's, so the stop reason and the knobs
offered next describe the settings actually in force.

Long because it is one state machine: the phases, the trial under way, the reference and the
settings tried are one state that every step, window and decision reads and changes together
(the rules it applies live beside it: ``judge``, ``sequential``, ``trials``, ``cost``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from lightning_maxtp.knobs.registry import WORKERS
from lightning_maxtp.observe.diagnosis import Diagnosis
from lightning_maxtp.observe.window import Window, aligned_epochs
from lightning_maxtp.tuning.admission import Admission
from lightning_maxtp.tuning.config import TuningConfig
from lightning_maxtp.tuning.cost import TuningCost
from lightning_maxtp.tuning.decisions import (
    ASK,
    Ask,
    AskMath,
    Decision,
    MeasureLoader,
    Remeasure,
    Step,
    Stop,
    Try,
)
from lightning_maxtp.tuning.judge import THIRD_PAIR_GAIN, TWO_PAIR_GAIN, judge, judged
from lightning_maxtp.tuning.sequential import (
    CONFIRM_GAIN,
    confirmed_at_once,
    decided_at_the_end,
    early_steps,
    losing_early,
    wait_per_sample,
    winning_early,
)
from lightning_maxtp.tuning.trials import (
    KnobTrial,
    TuningSummary,
    Verdict,
    fmt_settings,
    next_change,
)

__all__ = ["DATA_KINDS", "NOTHING_LEFT", "TuningLoop", "window_rate"]

DATA_KINDS = ("data_pipeline", "storage")
"""Bottleneck kinds for which ``tune_dataloader`` is run before single knobs are tried."""

WARMUP_WITHOUT_WORKERS = 2
"""Warm-up steps when the loader starts with no workers (``TuningLoop.nothing_to_warm``): the
first step's lazy set-up, and one step after it."""

NOTHING_LEFT = "no auto-applicable knob left"
"""How the stop reason begins when the diagnosis names nothing the loop may try by itself."""
CONVERGED = ("no bottleneck above threshold", NOTHING_LEFT, "max_trials=")
"""Stop reasons that mean nothing was left to try (the settings are worth carrying)."""


def _wants_workers(found: tuple[Diagnosis, ...]) -> bool:
    """Whether the loader is worth measuring alone before the workers change.

    Only when the top diagnosis may change the workers by itself and the job model could not
    predict the change (its ``expected_gain`` is ``None``: the loader's cost was not measured):
    a prediction is confirmed on real steps instead, without stopping training.
    """
    return any(
        r.knob == WORKERS and r.auto_apply and r.expected_gain is None
        for r in found[0].recommendations
    )


def _direction(old: Any, new: Any) -> int:
    """+1 when a numeric knob grows, -1 when it shrinks, 0 otherwise."""
    if isinstance(old, int | float) and isinstance(new, int | float) and old != new:
        return 1 if new > old else -1
    return 0


def step_per_sample(window: Window) -> float:
    """A window's step time less its data wait, per sample, seconds."""
    return (window.total_s - sum(window.data_wait_s)) / max(sum(window.samples), 1)


def window_rate(window: Window) -> float:
    """Samples/s of the fit over a window (``Window.fit_samples_per_s``).

    Stalls capped, each epoch's cost between steps counted: the one rate every trial is judged
    by.
    """
    return window.fit_samples_per_s


STILL_SETTLING = 3.0
"""A step this many times the reference's median step is still compiling (a compile of a small
conv net took 25 s here against a 50 ms step; noise stays well under 3x)."""
MAX_EXTRA_SETTLE = 20
"""Most settle steps added to one window's settle: a model that recompiles every step is
measured as it is (and reverted) rather than settled forever."""


@dataclass
class _Trial:
    """The trial under way: the change, and its windows so far (the reference first)."""

    knob: str
    old: dict[str, Any]
    new: dict[str, Any]
    why: str
    step: int
    windows: list[tuple[Window, tuple[Diagnosis, ...]]] = field(default_factory=list)
    measuring: Literal["old", "new"] = "new"
    """Which settings the window being measured runs with: ``"new"`` or ``"old"``."""
    settle_steps: int = 0
    guard: Any = None  # the numerics guard's last check of a window under the new settings
    expected_gain: float | None = None
    cut_short: bool = False
    """Its first window was closed early, already losing (``sequential.losing_early``)."""
    loop_step: int = 0
    """The loop's step count when it began (``step`` is the trainer's, which may differ)."""
    admitted: Admission | None = None
    """Which rule let it start."""


class TuningLoop:
    """Phase, reference window, trials and knobs already tried, for one ``fit``.

    Args:
        config: The settings it reads: ``warmup_steps``, ``settle_steps``, ``min_gain``,
            ``max_trials``, ``time_budget_s``, ``max_workers`` and ``window_steps`` (only for
            saying how long a fit must be).
    """

    def __init__(self, config: TuningConfig) -> None:
        self.config = config
        self.warmup_steps = config.warmup_steps
        """Steps before the baseline window (``nothing_to_warm`` may shorten them)."""
        self.phase = "warmup"
        self.steps = 0
        self.trials: list[KnobTrial] = []
        self.tried: set[tuple[str, str]] = set()
        self.skipped: set[tuple[str, str]] = set()
        """``(knob, repr(value))`` changes the budget left could not pay for, in the decision
        under way (cleared before each: the budget may have grown since)."""
        self.ref: Window | None = None
        self.ref_found: tuple[Diagnosis, ...] = ()
        self.baseline: float | None = None
        self.stop_reason = "the fit ended before tuning finished"
        self.converged = False
        self._settle_left = 0
        self._extended = 0  # steps ``extend_settle`` added to the settle under way
        self._trial: _Trial | None = None
        self._t_start: float | None = None
        self._tuning_s: float | None = None
        self._tuning_steps: int | None = None
        self.kept_at: int | None = None
        """The step at which the last kept trial ended (its settings run since)."""
        self.banked_steps = 0.0
        """Baseline steps the kept changes saved before the last one was kept."""
        self._resumed: tuple[float, int] | None = None
        """When (clock, step count) tuning resumed after it had stopped (``resume``)."""
        self._misses: list[tuple[str, int, float]] = []
        """``(knob, direction, measured / predicted)`` of trials that fell short of a prediction."""
        self._lost: set[tuple[str, str]] = set()
        """Changes measured slower by trials that were not kept, since the last kept one."""
        self._retried: set[tuple[str, str]] = set()
        """Changes already given their one more try after a kept change."""

    def nothing_to_warm(self) -> None:
        """The loader starts with no workers: the warm-up ends after ``WARMUP_WITHOUT_WORKERS``.

        It is there for workers starting, caches filling and a compile; a loader in the main
        process has no workers to start, and on a data-bound job every warm-up step at its
        settings is a step at the slowest rate.
        """
        self.warmup_steps = min(self.warmup_steps, WARMUP_WITHOUT_WORKERS)

    def drain_first(self, queued: int) -> None:
        """The loader starts with workers: the warm-up lasts until their first queue is used.

        Workers have up to ``queued`` batches ready soon after the fit starts
        (``switches.queued_batches``), as after a switch; a baseline begun before they are used
        times the queue, not the workers, and reads the loader as keeping up. Measured on
        2 CPUs, 4 workers that wait 3 ms a sample (12 batches queued), a baseline from step 5:
        1,400-2,180 samples/s, the fit then 1,225; the model read their waits as unseen and
        tried no workers at all (-79 %). Not for epoch-long windows: each holds its epoch's own
        restart and drain, so they compare alike.
        """
        self.warmup_steps = max(self.warmup_steps, queued)

    @property
    def measuring(self) -> bool:
        """Whether the current window is a baseline or trial measurement."""
        return self.phase in ("baseline", "trial")

    @property
    def finished(self) -> bool:
        """Whether tuning ended (the loop only monitors now)."""
        return self.phase == "monitor"

    def on_step(self, *, switched: bool, now: float) -> bool:
        """Count a finished training step; ``True`` when a measured window starts here.

        Args:
            switched: Whether the loader already serves batches with the requested settings
                (the settle steps count only from then on).
            now: The caller's clock (``time.perf_counter()``): tuning's time starts here when
                the warm-up ends. The loop reads no clock, so the same inputs decide the same.
        """
        self.steps += 1
        if self.phase == "warmup" and self.steps >= self.warmup_steps:
            self._t_start = now
            self.phase = "baseline"
            return True
        if self.phase == "settle" and switched:
            self._settle_left -= 1
            if self._settle_left <= 0:
                self.phase = "trial"
                return True
        return False

    def record_baseline(self, window: Window, found: tuple[Diagnosis, ...]) -> None:
        """The baseline window becomes the reference."""
        self.ref, self.ref_found, self.baseline = window, found, window_rate(window)

    def start(
        self,
        knob: str,
        old: dict[str, Any],
        new: dict[str, Any],
        why: str,
        step: int,
        *,
        settle_steps: int | None = None,
        expected_gain: float | None = None,
        admitted: Admission | None = None,
    ) -> None:
        """A trial of ``new`` (replacing ``old``) begins at training step ``step``.

        ``settle_steps`` before each of its windows default to the loop's; a compile needs more
        (its first steps compile). ``expected_gain``: what a measurement of its own predicts
        (``Try.expected_gain``), which lets a first window that confirms it decide alone;
        ``admitted``: the rule that let it start (``admission.admit``), for the report.
        """
        assert self.ref is not None
        settle = self.config.settle_steps if settle_steps is None else settle_steps
        self._trial = _Trial(
            knob,
            old,
            new,
            why,
            step,
            [(self.ref, self.ref_found)],
            settle_steps=settle,
            expected_gain=expected_gain,
            loop_step=self.steps,
            admitted=admitted,
        )
        self._settle()

    @property
    def settle_left(self) -> int:
        """Settle steps left before the trial's next window (0 outside a settle)."""
        return self._settle_left if self.phase == "settle" else 0

    def settle_longer(self, step_s: float) -> bool:
        """Whether the settle about to end runs one more step: its last step still compiled.

        For a knob whose switch keeps working past its settle steps (``settles_until_steady``:
        a compile, then the recompiles of a guard or a shape): the step just done took more
        than ``STILL_SETTLING`` times the reference's median step, and this settle was
        extended fewer than ``MAX_EXTRA_SETTLE`` times. Rank zero's reading decides under DDP.
        """
        ref = self.ref
        if self.settle_left != 1 or self._trial is None or ref is None:
            return False
        if not self.measuring_new or self._extended >= MAX_EXTRA_SETTLE:
            return False
        return step_s > STILL_SETTLING * ref.median_step_s > 0

    def draining(self, queued: int) -> bool:
        """Whether the settle about to end runs one more step: the workers' queue still drains.

        Workers the switch started have up to ``queued`` batches ready at once
        (``switches.queued_batches``): the settle lasts that many steps in all, and the window
        then times the workers. Whether a step waited cannot tell when the queue is empty (one
        that waits on a batch still in transfer looks the same), so the count decides.
        """
        if self.settle_left != 1 or self._trial is None:
            return False
        return self._trial.settle_steps + self._extended < queued

    def extend_settle(self) -> None:
        """One more settle step before the window (``settle_longer`` said so)."""
        assert self.phase == "settle"
        self._settle_left += 1
        self._extended += 1

    def _settle(self) -> None:
        # Even with settle_steps=0 the window waits for the switch: until then the old workers
        # still deliver batches they started under the previous settings.
        assert self._trial is not None
        self._settle_left, self.phase = self._trial.settle_steps, "settle"
        self._extended = 0

    @property
    def measuring_new(self) -> bool:
        """Whether the window under way runs a trial's new settings."""
        return self._trial is not None and self._trial.measuring == "new"

    @property
    def trial_windows(self) -> int:
        """Windows the trial under way has measured so far, its first reference included."""
        return 0 if self._trial is None else len(self._trial.windows)

    @property
    def trial_knob(self) -> str | None:
        """The knob of the trial under way."""
        return None if self._trial is None else self._trial.knob

    @property
    def trial_expected_gain(self) -> float | None:
        """The gain predicted for the trial under way (``None``: none, or no trial)."""
        return None if self._trial is None else self._trial.expected_gain

    @property
    def pending(self) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """``(old, new)`` settings of the trial under way."""
        return None if self._trial is None else (self._trial.old, self._trial.new)

    @property
    def in_first_trial_window(self) -> bool:
        """Whether the window under way is a trial's first one with its new settings."""
        t = self._trial
        return (
            t is not None and self.phase == "trial" and t.measuring == "new" and len(t.windows) == 1
        )

    def losing(self, step_s: Sequence[float], samples: Sequence[int]) -> bool:
        """Rank zero: whether the first trial window's steps so far already lose.

        Only the first window of a trial is read this way (``sequential.losing_early``); when
        it loses, call ``cut_short`` and close the window: ``judge`` then reverts the trial.
        """
        if not self.in_first_trial_window:
            return False
        assert self._trial is not None
        ref = self._trial.windows[0][0]
        min_gain, workers = self.config.min_gain, self._workers()
        return losing_early(
            ref.step_time_s, ref.samples, step_s, samples, min_gain, workers=workers
        )

    def winning(self, step_s: Sequence[float], samples: Sequence[int]) -> bool:
        """Rank zero: whether the first trial window's steps so far confirm its prediction.

        Only the first window of a trial with a predicted gain (``sequential.winning_early``);
        when it wins, close the window: ``judge`` then keeps the trial if its mechanism shows.
        """
        if not self.in_first_trial_window:
            return False
        assert self._trial is not None
        ref = self._trial.windows[0][0]
        expected = self._trial.expected_gain
        return winning_early(
            ref.step_time_s, ref.samples, step_s, samples, expected, workers=self._workers()
        )

    def _workers(self) -> tuple[int, int]:
        """The loader workers of the trial's reference and of its new settings."""
        assert self._trial is not None
        old = self._trial.windows[0][0].context.num_workers or 0
        return old, int(self._trial.new.get(WORKERS, old) or 0)

    def cut_short(self) -> None:
        """The first trial window closes now, already losing: the trial is reverted."""
        assert self._trial is not None
        self._trial.cut_short = True

    def outlasts(self, window: Window, steps_left: float) -> bool:
        """Whether re-measuring the trial (reference, then trial) needs more steps than are left.

        A reference window as long as the first, then a trial window as long as the longer of
        ``window`` and the reference (``window`` may have been read early), each after the
        trial's settle steps.
        """
        assert self._trial is not None
        ref = self._trial.windows[0][0].steps
        return steps_left < 2 * self._trial.settle_steps + ref + max(window.steps, ref)

    def judge(self, window: Window, *, steps_left: float = math.inf, undo_s: float = 0.0) -> Step:
        """Rank zero: what this trial window decides (see ``judge.judge``).

        A first window cut short as losing reverts the trial; one that confirms a predicted
        gain beyond doubt keeps it (``sequential.confirmed_at_once``); one that misses a
        predicted gain of ``CONFIRM_GAIN`` or more is measured again, reference then trial,
        before the trial is reverted. A first pair not kept, with fewer steps left in the fit
        than measuring it again needs, is decided there: which settings finish the fit sooner
        (``sequential.decided_at_the_end``).

        Args:
            window: The trial's window that closed.
            steps_left: Training steps left in the fit (``inf``: unknown).
            undo_s: What undoing the trial would cost beyond its steps (worker starts).

        Returns:
            ``Remeasure("old")``/``Remeasure("new")`` (measure again with those settings) or the
            verdict ``"kept"``, ``"reverted"`` or ``"undecided"``.
        """
        assert self._trial is not None
        t = self._trial
        # A reference's predicted epoch start, completed by the boundary the trial's first
        # window measured (``advance`` keeps it so for the windows after).
        first = aligned_epochs(t.windows[0][0], window) if len(t.windows) == 1 else t.windows[0][0]
        if len(t.windows) == 1:
            ref = first
            if t.cut_short:
                return "reverted"
            if confirmed_at_once(
                window_rate(ref),
                window_rate(window),
                wait_per_sample(ref.data_wait_s, ref.samples),
                wait_per_sample(window.data_wait_s, window.samples),
                t.expected_gain,
                ref_step_per_sample=step_per_sample(ref),
                trial_step_per_sample=step_per_sample(window),
                ref_epoch_s=ref.epoch_cost_s,
                trial_epoch_s=window.epoch_cost_s,
            ):
                return "kept"
        rates = [window_rate(first)]
        rates += [window_rate(w) for w, _ in self._trial.windows[1:]] + [window_rate(window)]
        outcome = judge(rates, self.config.min_gain)[0]
        if outcome == "reverted" and len(rates) == 2 and (t.expected_gain or 0) >= CONFIRM_GAIN:
            # One window against a measured prediction of a large gain: the pair is measured
            # again before the prediction loses (an epoch's start or another job's burst in
            # that window), as a window that looked like a gain would be.
            step: Step = Remeasure("old")
        elif outcome == "old" or outcome == "new":  # noqa: PLR1714 (mypy narrows == only)
            step = Remeasure(outcome)
        else:
            step = outcome
        if step != "kept" and len(rates) == 2 and self.outlasts(window, steps_left):
            gain = rates[1] / rates[0] - 1 if rates[0] > 0 else 0.0
            ref = t.windows[0][0]
            rest_s = steps_left * ref.total_s / max(ref.steps, 1)
            return decided_at_the_end(
                gain, t.expected_gain, self.config.min_gain, rest_s=rest_s, undo_s=undo_s
            )
        return step

    def without_remeasure(self, window: Window) -> Literal["kept", "reverted", "undecided"]:
        """Rank zero: the verdict when the budget cannot pay for the re-measure ``judge`` asked.

        Kept only on evidence that needs no further window: a first pair that reaches
        ``min_gain`` and half the gain predicted for the trial (the prediction confirmed, as
        ``sequential.decided_at_the_end``'s first rule; not its rest-of-fit rule, as one pair
        against a long rest is not evidence on a shared machine); or two pairs that gained
        ``THIRD_PAIR_GAIN`` times ``min_gain``, every trial window above every reference window
        (what earns a third pair). Otherwise ``"undecided"`` (``"reverted"`` under
        ``min_gain``): the original settings come back. When the window that closed is a
        reference window, those are in force and stay: ``"undecided"``, nothing switches.

        Args:
            window: The window that just closed (not yet recorded): the trial's, or a
                reference window measured again.
        """
        assert self._trial is not None
        t, min_gain = self._trial, self.config.min_gain
        windows = self._measured(window)
        if len(windows) % 2:  # a reference window closed: its settings are in force
            return "undecided"
        rates = [window_rate(w) for w in windows]
        refs, trials = rates[0::2], rates[1::2]
        before, after = statistics.mean(refs), statistics.mean(trials)
        gain = after / before - 1 if before > 0 else 0.0
        if len(windows) == 2:
            return decided_at_the_end(gain, t.expected_gain, min_gain, rest_s=math.inf)
        if gain >= THIRD_PAIR_GAIN * min_gain and min(trials) > max(refs):
            return "kept"
        return "reverted" if gain < min_gain else "undecided"

    def remeasure_loss_s(self, window: Window, settings: Literal["old", "new"]) -> float:
        """Rank zero: what re-measuring ``settings`` costs at the rates measured so far.

        A window as long as that side's last one, at that side's mean rate (its epochs' costs
        included, as ``window_rate`` reads them), against the same samples at the other side's
        mean rate: the slower side's window is time lost (0 for the faster side). ``window``
        is the window that just closed (not yet recorded), the trial's or a reference's.
        """
        windows = self._measured(window)
        sides = {"old": windows[0::2], "new": windows[1::2]}
        other = "new" if settings == "old" else "old"
        rate = statistics.mean(window_rate(w) for w in sides[settings])
        faster = statistics.mean(window_rate(w) for w in sides[other])
        if rate <= 0 or faster <= rate:
            return 0.0
        return sum(sides[settings][-1].samples) * (1 / rate - 1 / faster)

    def _measured(self, window: Window) -> list[Window]:
        """The trial's windows so far and ``window``, which just closed, in turn from the reference.

        The first reference's predicted epoch start is completed as ``judge`` reads it.
        """
        assert self._trial is not None
        windows = [w for w, _ in self._trial.windows] + [window]
        windows[0] = aligned_epochs(windows[0], windows[1])
        return windows

    def advance(
        self, decision: Step, window: Window, found: tuple[Diagnosis, ...], guard: Any = None
    ) -> KnobTrial | None:
        """Record a trial window and act on ``decision`` (rank zero's, broadcast under DDP).

        ``decision`` is ``judge``'s answer, or ``"guarded"`` when the numerics guard failed
        ``guard``, its check of this window (for knobs that round differently).

        Returns:
            The judged trial, or ``None`` when another window is to be measured: then the
            loader must switch to ``pending``'s ``decision`` settings (``"old"`` or ``"new"``).
        """
        assert self._trial is not None
        windows = self._trial.windows
        if len(windows) == 1:  # as ``judge`` read it
            windows[0] = (aligned_epochs(windows[0][0], window), windows[0][1])
        windows.append((window, found))
        if guard is not None:
            self._trial.guard = guard
        if isinstance(decision, Remeasure):
            self._trial.measuring = decision.settings
            self._settle()
            return None
        assert decision in ("kept", "reverted", "undecided", "guarded"), decision
        return self._finish(decision)

    def _finish(self, verdict: Verdict) -> KnobTrial:
        """Judge the trial: a kept one becomes the reference, a reverted one is never retried."""
        assert self._trial is not None
        t = self._trial
        alone = len(t.new) == 1 and t.knob in t.new  # else several settings, all shown
        shown_old = t.old[t.knob] if alone else fmt_settings(t.old)
        shown_new = t.new[t.knob] if alone else fmt_settings(t.new)
        kept = verdict == "kept"
        olds, news = t.windows[0::2], t.windows[1::2]
        before, after, noise, lost = judged(t.windows, kept, self.config.min_gain)
        steps = sum(w.steps for w, _ in news)
        trial = KnobTrial(
            t.knob,
            shown_old,
            shown_new,
            t.why,
            before_samples_per_s=before,
            after_samples_per_s=after,
            kept=kept,
            first_step=t.step,
            steps=steps,
            verdict=verdict,
            noise=noise,
            windows=len(t.windows),
            lost_s=lost,
            guard=t.guard,
            expected_gain=t.expected_gain,
            admitted=t.admitted,
        )
        self.trials.append(trial)
        if kept:
            # Going back to settings measured slower is no trial either: no ping-pong between
            # a diagnosis that wants more workers and one that wants fewer.
            self.ref, self.ref_found = news[-1]
            self.tried |= {(k, repr(v)) for k, v in t.old.items()}
            if self.kept_at is not None and self.baseline and window_rate(olds[0][0]) > 0:
                # The stretch at the settings this trial replaced saved its share too.
                share = 1 - self.baseline / window_rate(olds[0][0])
                self.banked_steps += max(0.0, share) * (t.loop_step - self.kept_at)
            baseline = self.baseline or 0.0
            for w, _ in t.windows[1:]:  # and so did the trial's windows, at the rate each ran
                if baseline > 0 and window_rate(w) > 0:
                    share = 1 - baseline / window_rate(w)
                    self.banked_steps += max(0.0, share) * w.steps
            self.kept_at = self.steps
            # Knobs interact (channels_last after bf16, threads after workers): what lost
            # before this change may be tried once more, when a diagnosis names it again.
            again = self._lost - self._retried
            self.tried -= again
            self._retried |= again
            self._lost.clear()
        else:
            self.ref, self.ref_found = olds[-1]
            slower = {(k, repr(v)) for k, v in t.new.items()}
            self.tried |= slower
            self._lost |= slower
            if t.expected_gain is not None and trial.after_samples_per_s is not None:
                ratio = (1 + trial.gain) / (1 + t.expected_gain)
                for k in t.new:
                    self._misses.append((k, _direction(t.old.get(k), t.new[k]), ratio))
        self._trial = None
        return trial

    def room(self, steps_left: float) -> bool:
        """Whether a trial started now could be read before the fit ends.

        Its settle steps and the first steps a window is read at (``sequential.early_steps``).
        """
        early = early_steps(self.config.window_steps)
        return steps_left >= self.config.settle_steps + early

    def decide(
        self,
        settings: dict[str, Any],
        *,
        device_type: str,
        now: float,
        steps_left: float = math.inf,
        plan: Try | Ask | None = None,
        math: Try | Ask | None = None,
    ) -> Decision:
        """The next trial, why the loop stops, or what it needs to know first (pure).

        Rank zero decides under DDP. It never blocks: measuring the loader alone and finding a
        math knob are the caller's, asked for as ``MeasureLoader`` and ``AskMath`` and answered
        by calling again with ``plan=`` or ``math=``.

        Args:
            settings: The loader's settings now in force (none for a loader the loop does not
                switch) and the main threads'.
            device_type: ``"cuda"``, ``"cpu"``, ... (``pin_memory`` only pays for CUDA).
            now: The caller's clock, for ``time_budget_s``.
            steps_left: Training steps left in the fit (``inf``: unknown); a trial that could
                not be read before the fit ends is not started (``room``).
            plan: ``ASK`` to have the loader measured alone when the reference is data-bound
                and its diagnosis may change the workers by itself; then the trial that
                measurement proposes, or ``None`` (none, or not wanted).
            math: ``ASK`` to be asked for a math knob when no loader or thread knob is left;
                then its trial, or ``None`` (none, or not wanted).
        """
        # Settings measured slower before (a reverted trial's, or those a kept one replaced)
        # are not tried again, whoever proposes them; the plan's settings were measured
        # together, so one of them measured slower drops the plan.
        slower = isinstance(plan, Try) and any(
            (k, repr(v)) in self.tried for k, v in plan.settings.items()
        )
        if isinstance(plan, Try) and not slower:
            return plan
        if len(self.trials) >= self.config.max_trials:
            return Stop(f"max_trials={self.config.max_trials} reached")
        if not self.time_left(now):
            return Stop(f"time_budget_s={self.config.time_budget_s:g} spent")
        if not self.room(steps_left):
            return Stop(f"the fit ends in {steps_left:.0f} steps, too few to read a trial")
        found = self.ref_found
        if plan is ASK and found and found[0].kind.value in DATA_KINDS and _wants_workers(found):
            return MeasureLoader()
        change = self.next_try(found, settings, device_type=device_type)
        kind = found[0].kind.value if found else "unknown"
        if change is None and math is ASK:
            named = tuple(r.knob for r in found[0].recommendations) if found else ()
            return AskMath(kind, named)
        if change is None and isinstance(math, Try):
            return math
        if change is None:
            if kind == "healthy":
                return Stop("no bottleneck above threshold: nothing to tune")
            return Stop(f"{NOTHING_LEFT} for the {kind} bottleneck")
        return change

    def next_try(
        self, found: tuple[Diagnosis, ...], settings: dict[str, Any], *, device_type: str
    ) -> Try | None:
        """The loader or thread change ``found`` names first that was neither tried nor skipped.

        With the gain the job model (or a measurement of its own) predicts for it, if any,
        corrected by the trials that missed their prediction in the same direction
        (``_corrected``); a change whose corrected gain two pairs of windows could not keep
        (under ``TWO_PAIR_GAIN * min_gain``) is passed over (pure).
        """
        passed: set[tuple[str, str]] = set()
        while True:
            change = next_change(
                found,
                settings,
                self.tried | self.skipped | passed,
                device_type=device_type,
                max_workers=self.config.max_workers,
            )
            if change is None:
                return None
            knob, value, reason = change
            rec = next(
                (r for r in found[0].recommendations if r.knob == knob and r.proposed == value),
                None,
            )
            expected = None if rec is None else rec.expected_gain
            corrected = self._corrected(knob, settings.get(knob), value, expected)
            # A predicted gain two pairs could not keep (under 3x min_gain: only a third pair
            # might, at three windows' cost) is not worth a trial.
            if corrected is None or corrected >= TWO_PAIR_GAIN * self.config.min_gain:
                if corrected is not None and corrected != expected:
                    reason += f" (predicted {expected:+.0%}, {corrected:+.0%} after a miss)"
                also = {} if rec is None else dict(rec.also)
                return Try(knob, {knob: value, **also}, reason, corrected)
            passed.add((knob, repr(value)))

    def _corrected(self, knob: str, old: Any, new: Any, expected: float | None) -> float | None:
        """``expected`` scaled by how far the last trial moving ``knob`` the same way missed.

        A trial that measured less than the model predicted tells it by how much (the
        measured rate replaces the predicted one): the next change in that direction is
        re-ranked by the same ratio.
        """
        if expected is None or not self._misses:
            return expected
        direction = _direction(old, new)
        for missed_knob, missed_direction, ratio in reversed(self._misses):
            if missed_knob == knob and missed_direction == direction:
                return (1 + expected) * ratio - 1
        return expected

    def time_left(self, now: float) -> bool:
        """Whether ``time_budget_s`` still lets a trial start at ``now`` (the caller's clock)."""
        elapsed = now - (now if self._t_start is None else self._t_start)
        return elapsed < self.config.time_budget_s

    def resume(self, window: Window, found: tuple[Diagnosis, ...], *, now: float) -> None:
        """Tuning resumes after it stopped: ``window``, measured since, names a change not tried.

        The window becomes the reference; start the trial next (``start``). Its time and steps
        are added to tuning's when it stops again.
        """
        assert self.finished and self._trial is None
        self.ref, self.ref_found = window, found
        self._resumed = (now, self.steps)

    def stop(self, reason: str, *, now: float, converged: bool | None = None) -> None:
        """Tuning is over: from now on the loop only monitors.

        Args:
            reason: Why, for the report.
            now: The caller's clock: tuning's time ends here.
            converged: Whether nothing was left to try (default: read from ``reason``); only
                converged settings are carried into a checkpoint or the next fit, not those of
                tuning cut short by a budget.
        """
        resumed_converged = self._resumed is not None and self.converged
        self.stop_reason, self.phase = reason, "monitor"
        self.converged = reason.startswith(CONVERGED) if converged is None else converged
        # Tuning had converged before one more trial; a budget that stops it after that trial
        # leaves settings as worth carrying as they were.
        self.converged = self.converged or resumed_converged
        self._close(now)

    def _close(self, now: float) -> None:
        if self._resumed is not None and self._tuning_s is not None:
            resumed_at, steps = self._resumed
            self._tuning_s += now - resumed_at
            self._tuning_steps = (self._tuning_steps or 0) + self.steps - steps
            self._resumed = None
        if self._tuning_s is None:
            started = self._t_start
            self._tuning_s = 0.0 if started is None else now - started
            self._tuning_steps = max(0, self.steps - self.warmup_steps)

    def end(self, *, now: float, guard: Any = None) -> KnobTrial | None:
        """The fit ended at ``now`` (the caller's clock): tuning's time and steps are fixed.

        Even when tuning did not finish.

        Returns:
            A trial the fit ended in the middle of, recorded as ``unfinished`` (``guarded``
            when ``guard``, the check of its last steps, failed; not kept: the caller puts its
            old settings back), or ``None``.
        """
        unfinished = None
        if self._trial is not None:
            self._trial.guard = guard or self._trial.guard
            failed = guard is not None and not guard.passed
            unfinished = self._finish("guarded" if failed else "unfinished")
            self.stop_reason = "the fit ended during a trial"
        elif self.phase in ("warmup", "baseline"):
            need = self.warmup_steps + self.config.window_steps
            self.stop_reason = (
                f"the fit ended before the baseline was measured: it ran {self.steps} steps, "
                f"tuning needs at least {need} ({self.warmup_steps} warm-up + "
                f"{self.config.window_steps} baseline)"
            )
        self._close(now)
        return unfinished

    def summary(
        self,
        settings: dict[str, Any],
        notes: tuple[str, ...],
        tuned_samples_per_s: float | None = None,
        cost: TuningCost | None = None,
        *,
        now: float,
    ) -> TuningSummary:
        """What the loop did so far.

        Args:
            settings: The loader settings in force.
            notes: Caveats for the report.
            tuned_samples_per_s: The rate under the settings in force (default: the reference
                window's).
            cost: What tuning cost, for the summary.
            now: The caller's clock, for the time of tuning still under way.
        """
        tuning_s, steps = self._tuning_s, self._tuning_steps
        if tuning_s is None:
            tuning_s = now - self._t_start if self._t_start is not None else 0.0
            steps = max(0, self.steps - self.warmup_steps)
        return TuningSummary(
            trials=tuple(self.trials),
            baseline_samples_per_s=self.baseline,
            tuned_samples_per_s=tuned_samples_per_s
            if tuned_samples_per_s is not None or self.ref is None
            else window_rate(self.ref),
            tuning_s=tuning_s,
            tuning_steps=steps or 0,
            stop_reason=self.stop_reason,
            settings=settings,
            notes=notes,
            finished=self.finished,
            cost=cost,
        )
