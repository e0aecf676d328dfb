"""The tuner's math-knob steps: the next allowed knob, and the numerics guard around its trial.

``MathKnobs`` switches the knobs and ``NumericsGuard`` snapshots and checks; these functions
decide when, on the ``Tuner``'s state, the way ``loader_trial`` does for the loader plan. Under
DDP every rank runs the same steps at the same training step: rank zero picks the knob, and a
guard failure on any rank fails the trial on all of them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

from lightning_maxtp.callbacks.guard import GuardCheck, loss_band
from lightning_maxtp.knobs.base import NotOffered
from lightning_maxtp.knobs.registry import (
    DEVICE_LIMITED,
    GUARDED,
    MATH_KNOBS,
    MATH_ORDER,
    knob_class,
)
from lightning_maxtp.tuning.allow import math_knobs_for
from lightning_maxtp.tuning.tuning_loop import Try

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from lightning_maxtp.callbacks.tuner import Tuner
    from lightning_maxtp.tuning.trials import KnobTrial

__all__ = [
    "after_trial",
    "closing_check",
    "count_switch",
    "grow_batch",
    "guard_window",
    "math_change",
    "settle_steps",
    "start",
    "watch",
]


def math_change(tuner: Tuner, kind: str) -> Try | None:
    """Rank zero: the next allowed math knob the ``kind`` bottleneck points to, not yet tried."""
    allowed, device = tuner.math.allowed, tuner.monitor.context.device_type
    missing = [
        k
        for k in MATH_ORDER.get(kind, ())
        if k not in allowed and (k not in DEVICE_LIMITED or device in DEVICE_LIMITED[k])
    ]
    if missing and tuner.config.allow != "all":
        tuner.note(
            f"not allowed: {', '.join(missing)} (the {kind} bottleneck points to them; "
            "allow='all' tries each behind a numerics guard)"
        )
    cost = tuner.summary.cost
    left = cost.left_s if cost is not None else math.inf
    for knob in math_knobs_for(kind, allowed):
        spec = knob_class(knob)
        if spec.before_fit:  # chosen before the fit (``find_batch_size``)
            continue
        offer = tuner.math.offer(knob)
        if not isinstance(offer, NotOffered) and left < spec.min_budget_s:
            offer = NotOffered(f"less tuning budget left than it needs ({spec.min_budget_s:.0f} s)")
        if isinstance(offer, NotOffered):
            if not offer.quiet and tuner.config.allow != "safe":
                tuner.note(f"{knob} not tried: {offer}")
            continue
        if (knob, repr(offer.proposed)) in tuner.loop.tried:
            continue
        return Try(knob, {knob: offer.proposed}, f"{kind} bottleneck: {offer.why}")
    return None


def settle_steps(tuner: Tuner, knob: str) -> int:
    """Steps before each of the trial's windows."""
    least = knob_class(knob).settle_steps if knob in MATH_KNOBS else 0  # loader knobs: none
    return max(tuner.config.settle_steps, least)


def guard_window(tuner: Tuner, trainer: pl.Trainer, losses: list[float]) -> GuardCheck | None:
    """A window just closed: the guard's check when it ran a guarded trial's new settings.

    A window under the reference settings becomes the band's reference instead.
    """
    guard, loop = tuner.guard, tuner.loop
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


def closing_check(tuner: Tuner) -> GuardCheck | None:
    """The fit ends during a guarded trial's window: the guard's check of its last steps.

    Called on every rank (``on_train_end``), so the check's all-reduce stays in step.
    """
    loop, trainer = tuner.loop, tuner.math.trainer
    if trainer is None or not loop.measuring_new or loop.trial_knob not in GUARDED:
        return None
    return guard_window(tuner, trainer, tuner.guard.take())


def start(tuner: Tuner, trainer: pl.Trainer, knob: str) -> None:
    """Before a trial: snapshot the state for a guarded knob, and note where the switch began."""
    tuner.switch_from = len(tuner.monitor.clock.step_log)
    if knob in MATH_KNOBS and knob_class(knob).min_budget_s:  # the budget grew since
        stale = f"{knob} not tried: less tuning budget"
        tuner.notes[:] = [n for n in tuner.notes if not n.startswith(stale)]
    if knob in GUARDED and tuner.guard.enabled:
        tuner.guard.snapshot(trainer)


def after_trial(tuner: Tuner, trial: KnobTrial) -> None:
    """A trial was judged: restore the state before it if the guard failed it."""
    guard, trainer = tuner.guard, tuner.math.trainer
    assert trainer is not None
    if trial.kept:  # its last window is the reference now, for the next trial's band too
        guard.reference = guard.trial
    if trial.verdict == "guarded":
        restored = guard.restore(trainer)
        step = guard.snapshot_step
        tuner.note(
            f"numerics guard: {trial.knob} {trial.old} -> {trial.new} reverted at step "
            f"{trainer.global_step}; {trial.guard}; the state of step {step} restored "
            f"({'done' if restored else 'no snapshot'})"
        )
    if not _watched(tuner):  # a kept change of a watched knob (precision) stays watched
        guard.drop()


def count_switch(tuner: Tuner) -> None:
    """A trial's window starts: count the settle steps' excess over the reference's.

    Only for a knob whose first switch costs (compiling): that excess is a cost of tuning that
    no window measures.
    """
    loop, ref = tuner.loop, tuner.loop.ref
    knob = loop.trial_knob
    if knob not in MATH_KNOBS or loop.trial_windows != 1 or ref is None:
        return  # a loader trial, a later window, or no reference to compare with
    if not knob_class(knob).first_switch_costs:
        return  # only the first switch compiles; later ones reuse the compiled callables
    log = tuner.monitor.clock.step_log[tuner.switch_from :]
    step_s = ref.total_s / max(1, ref.steps)
    excess = max(0.0, sum(s for _, s, _ in log) - step_s * len(log))
    tuner.cost = dataclasses.replace(tuner.cost, switch_s=tuner.cost.switch_s + excess)


def watch(tuner: Tuner, losses: list[float]) -> None:
    """After tuning: a kept change of a watched knob (precision) must keep training finite.

    When a window goes non-finite the change is undone and the last state that passed restored.
    """
    guard, trainer = tuner.guard, tuner.math.trainer
    watched = _watched(tuner)
    if not watched or not guard.enabled or trainer is None:
        return
    check = loss_band([], losses, params_finite=guard.params_finite(trainer.lightning_module))
    failed = not check.passed
    if trainer.world_size > 1:
        failed = trainer.strategy.reduce_boolean_decision(failed, all=False)
    if not failed:
        guard.snapshot(trainer)  # the last state that passed
        return
    step = guard.snapshot_step
    changes = {k: (tuner.math.in_force[k], tuner.math.original(k)) for k in watched}
    tuner.knobs.request(**{k: original for k, (_, original) in changes.items()})
    restored = guard.restore(trainer)
    guard.drop()
    tuner.monitor.clock.update_context(**tuner.knobs.context())
    for knob, (old, original) in changes.items():
        tuner.record_change(knob, old, original, f"reverted by the numerics guard: {check}")
        tuner.note(
            f"numerics guard: {knob} {old} -> {original} at step {trainer.global_step} "
            f"({check.reason}); the state of step {step} restored "
            f"({'done' if restored else 'no snapshot'})"
        )


def grow_batch(tuner: Tuner, trainer: pl.Trainer) -> Any:
    """Before training: ``find_batch_size``'s fastest batch, applied, when ``allow`` has it.

    ``global_batch="grow"`` (the learning rate scaled and warmed up): a batch of 32 kept as
    the global batch could never get faster.

    Returns:
        The applied ``BatchSizePlan``, or ``None`` (not allowed, or noted as not possible).

    Raises:
        ValueError: The batch size was asked for by name and the loader cannot be resized.
    """
    if "batch_size" not in tuner.math.allowed:
        return None
    from lightning_maxtp.batch_size.find import find_batch_size
    from lightning_maxtp.batch_size.trainer_internals import resize_reason

    why = resize_reason(trainer, "batch_size")
    by_flag = tuner.config.allow_batch_size_change
    if why is not None and tuner.config.allow == "all" and not by_flag:
        tuner.note(f"batch_size not tried: {why}")
        return None
    if why is not None:
        asked = "`allow_batch_size_change=True`" if by_flag else "`allow` names 'batch_size'"
        raise ValueError(f"{asked}, but {why}")
    plan = find_batch_size(trainer.lightning_module, trainer=trainer, global_batch="grow")
    plan.apply(trainer)
    return plan


def _watched(tuner: Tuner) -> list[str]:
    """The knobs in force that stay watched by the guard once kept."""
    return [k for k in tuner.math.in_force if knob_class(k).watched]
