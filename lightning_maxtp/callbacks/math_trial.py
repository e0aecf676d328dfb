"""The math knobs' side of the loop for one fit, ``MathTrials``.

The next allowed knob, the numerics guard around its trial, and the watch on a kept precision
change after tuning. ``MathKnobs`` switches the knobs and ``NumericsGuard`` snapshots and
checks; ``MathTrials`` decides when, from what it is given: the config, the loop's state, the
monitor's clock, the knobs and the guard. It reports to the ``Journal`` it shares with the
Tuner (notes, knob changes) and returns what it costs instead of writing it anywhere. Under
DDP every rank runs the same steps at the same training step: rank zero picks the knob, and a
guard failure on any rank fails the trial on all of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning_maxtp.callbacks.guard import GuardCheck, NumericsGuard, loss_band
from lightning_maxtp.knobs.base import FitView, NotOffered
from lightning_maxtp.knobs.registry import (
    DEVICE_LIMITED,
    GUARDED,
    MATH_KNOBS,
    MATH_ORDER,
    knob_class,
)
from lightning_maxtp.tuning.allow import math_knobs_for, resolve_allow
from lightning_maxtp.tuning.decisions import Try

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from lightning_maxtp.callbacks.bottleneck_monitor import BottleneckMonitor
    from lightning_maxtp.callbacks.journal import Journal
    from lightning_maxtp.callbacks.knobs import Knobs
    from lightning_maxtp.callbacks.math_knobs import MathKnobs
    from lightning_maxtp.tuning.config import TuningConfig
    from lightning_maxtp.tuning.trials import KnobTrial
    from lightning_maxtp.tuning.tuning_loop import TuningLoop

__all__ = ["MathTrials"]


class MathTrials:
    """The math knobs' trial steps for one fit (see the module docstring).

    Args:
        config: The loop's settings (``allow``, ``settle_steps``).
        loop: The fit's loop: its phase, the trial under way, the knobs already tried.
        monitor: Its clock's step log (the switch cost) and its job context.
        knobs: The fit's settings, with its math knobs (``knobs.math``).
        guard: The numerics guard (``enabled`` when a guarded knob is allowed).
        journal: Where notes and knob changes go (shared with the Tuner).
    """

    def __init__(  # noqa: PLR0917 (the five parts it works on, and where it reports)
        self,
        config: TuningConfig,
        loop: TuningLoop,
        monitor: BottleneckMonitor,
        knobs: Knobs,
        guard: NumericsGuard,
        journal: Journal,
    ) -> None:
        self.config, self.loop, self.monitor = config, loop, monitor
        self.knobs, self.guard, self.journal = knobs, guard, journal

    @property
    def math(self) -> MathKnobs:
        """The fit's math knobs."""
        assert self.knobs.math is not None
        return self.knobs.math

    def change(self, kind: str, left_s: float, named: tuple[str, ...] = ()) -> Try | None:
        """Rank zero: the next allowed math knob the ``kind`` bottleneck points to, not tried.

        Args:
            kind: The top diagnosis's kind.
            left_s: The tuning budget left (a knob needing more is not tried).
            named: The knobs the top diagnosis recommends by name (``named_only`` knobs are
                tried only then).
        """
        allowed, device = self.math.allowed, self.monitor.context.device_type
        missing = [
            k
            for k in (() if self.config.allow == "all" else MATH_ORDER.get(kind, ()))
            if k not in allowed
            and (k not in DEVICE_LIMITED or device in DEVICE_LIMITED[k])
            and (not knob_class(k).named_only or k in named)
            # What this fit could not try even if allowed (bf16 on a CPU without its kernels)
            # is not worth allowing.
            and not isinstance(self.math.offer(k), NotOffered)
        ]
        if missing:
            self.journal.note(
                f"not allowed: {', '.join(missing)} (the {kind} bottleneck seen while tuning "
                "points to them; allow='all' tries each behind a numerics guard)"
            )
        for knob in math_knobs_for(kind, allowed):
            spec = knob_class(knob)
            if spec.before_fit:  # chosen before the fit (``find_batch_size``)
                continue
            if spec.named_only and knob not in named:  # the finding is not its cause
                continue
            offer = self.math.offer(knob)
            short = spec.min_budget_s and left_s < spec.min_budget_s  # an overrun budget too
            if not isinstance(offer, NotOffered) and short:
                needs = f"{spec.min_budget_s:.0f} s"
                offer = NotOffered(f"less tuning budget left than it needs ({needs})")
            if isinstance(offer, NotOffered):
                if not offer.quiet and self.config.allow != "safe":
                    self.journal.note(f"{knob} not tried: {offer}")
                continue
            if (knob, repr(offer.proposed)) in self.loop.tried:
                continue
            return Try(knob, {knob: offer.proposed}, f"{kind} bottleneck: {offer.why}")
        return None

    def settle_steps(self, knob: str) -> int:
        """Steps before each of the trial's windows."""
        least = knob_class(knob).settle_steps if knob in MATH_KNOBS else 0  # loader knobs: none
        return max(self.config.settle_steps, least)

    def guard_window(self, trainer: pl.Trainer, losses: list[float]) -> GuardCheck | None:
        """A window just closed: the guard's check when it ran a guarded trial's new settings.

        A window under the reference settings becomes the band's reference instead.
        """
        guard, loop = self.guard, self.loop
        if not guard.enabled:
            return None
        if loop.phase == "baseline" or not loop.measuring_new:
            guard.reference = losses
            return None
        guard.trial = losses  # the reference's losses if the trial is kept
        if loop.trial_knob not in GUARDED:
            return None
        finite = guard.params_finite(trainer.lightning_module)
        check = loss_band(guard.reference, losses, params_finite=finite)
        failed = not check.passed
        if trainer.world_size > 1:  # one rank's NaN is every rank's after the gradient all-reduce
            failed = trainer.strategy.reduce_boolean_decision(failed, all=False)
            if failed and check.passed:
                check = GuardCheck(False, "failed on another rank", check.steps)
        return check

    def closing_check(self) -> GuardCheck | None:
        """The fit ends during a guarded trial's window: the guard's check of its last steps.

        Called on every rank (``on_train_end``), so the check's all-reduce stays in step.
        """
        loop, trainer = self.loop, self.math.trainer
        if trainer is None or not loop.measuring_new or loop.trial_knob not in GUARDED:
            return None
        return self.guard_window(trainer, self.guard.take())

    def start(self, trainer: pl.Trainer, knob: str) -> None:
        """Before a trial: snapshot the state for a guarded knob."""
        if knob in MATH_KNOBS and knob_class(knob).min_budget_s:  # the budget grew since
            self.journal.drop_notes(f"{knob} not tried: less tuning budget")
        if knob in GUARDED and self.guard.enabled:
            self.guard.snapshot(trainer)

    def after_trial(self, trial: KnobTrial) -> None:
        """A trial was judged: restore the state before it if the guard failed it."""
        guard, trainer = self.guard, self.math.trainer
        assert trainer is not None
        if trial.kept:  # its last window is the reference now, for the next trial's band too
            guard.reference = guard.trial
        if trial.verdict == "guarded":
            restored = guard.restore(trainer)
            step = guard.snapshot_step
            self.journal.note(
                f"numerics guard: {trial.knob} {trial.old} -> {trial.new} reverted at step "
                f"{trainer.global_step}; {trial.guard}; the state of step {step} restored "
                f"({'done' if restored else 'no snapshot'})"
            )
        if not self._watched():  # a kept change of a watched knob (precision) stays watched
            guard.drop()

    def watch(self, losses: list[float]) -> None:
        """After tuning: a kept change of a watched knob (precision) must keep training finite.

        When a window goes non-finite the change is undone and the last state that passed
        restored.
        """
        guard, trainer = self.guard, self.math.trainer
        watched = self._watched()
        if not watched or not guard.enabled or trainer is None:
            return
        finite = guard.params_finite(trainer.lightning_module)
        check = loss_band([], losses, params_finite=finite)
        failed = not check.passed
        if trainer.world_size > 1:
            failed = trainer.strategy.reduce_boolean_decision(failed, all=False)
        if not failed:
            guard.snapshot(trainer)  # the last state that passed
            return
        step = guard.snapshot_step
        changes = {k: (self.math.in_force[k], self.math.original(k)) for k in watched}
        self.knobs.request(**{k: original for k, (_, original) in changes.items()})
        restored = guard.restore(trainer)
        guard.drop()
        self.monitor.update_context(**self.knobs.context())
        for knob, (old, original) in changes.items():
            self.journal.record_change(
                knob, old, original, f"reverted by the numerics guard: {check}"
            )
            self.journal.note(
                f"numerics guard: {knob} {old} -> {original} at step {trainer.global_step} "
                f"({check.reason}); the state of step {step} restored "
                f"({'done' if restored else 'no snapshot'})"
            )

    def choose_before_fit(self, trainer: pl.Trainer) -> Any:
        """Before training: each allowed knob chosen before the fit, measured and applied.

        A knob ``allow`` names (or its flag, ``allow_batch_size_change``) that this fit cannot
        take is an error; one that ``allow="all"`` brought in is noted and left.

        Returns:
            What the last knob chose (the applied ``BatchSizePlan``), or ``None``.

        Raises:
            ValueError: A knob asked for by name cannot be chosen on this fit.
        """
        chosen = None
        fit = FitView(trainer)
        flagged = resolve_allow((), batch_size=self.config.allow_batch_size_change)
        for name in self.math.allowed:
            if not knob_class(name).before_fit:
                continue
            knob = self.math.knob(name)
            offer = knob.offer(fit)  # the math knobs are bound to the Trainer at its start
            by_flag = name in flagged
            if isinstance(offer, NotOffered) and self.config.allow == "all" and not by_flag:
                self.journal.note(f"{name} not tried: {offer}")
                continue
            if isinstance(offer, NotOffered):
                asked = "`allow_batch_size_change=True`" if by_flag else f"`allow` names {name!r}"
                raise ValueError(f"{asked}, but {offer}")
            chosen = knob.choose(fit)
            knob.apply(fit, chosen)
        return chosen

    def _watched(self) -> list[str]:
        """The knobs in force that stay watched by the guard once kept."""
        return [k for k in self.math.in_force if knob_class(k).watched]
