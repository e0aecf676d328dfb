"""Readable text for ``BatchSizePlan`` and the list of settings a plan changes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning_maxtp.batch_size import BatchSizePlan

__all__ = ["format_plan", "plan_changes"]


def plan_changes(fields: Mapping[str, Any]) -> tuple[str, ...]:
    """Every setting that differs from before the search, as ``name: old -> new``."""
    changes = []
    for name, old_key in (
        ("batch_size", "previous_batch_size"),
        ("accumulate_grad_batches", "previous_accumulate_grad_batches"),
        ("global_batch_size", "previous_global_batch_size"),
    ):
        if fields[name] != fields[old_key]:
            changes.append(f"{name}: {fields[old_key]} -> {fields[name]}")
    for index, (scale, rule) in enumerate(
        zip(fields["lr_scales"], fields["lr_rules"], strict=True)
    ):
        if scale != 1.0:
            warmup = fields["lr_warmup_steps"] if scale > 1.0 else 0
            ramp = f", linear warm-up over {warmup} steps" if warmup else ""
            changes.append(f"learning rate (optimizer {index}): x{scale:.4g} ({rule} rule{ramp})")
    return tuple(changes)


def _gib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**30:.2f} GiB"


def format_plan(plan: BatchSizePlan) -> str:
    """Summary line, the decision, the trial table, the changes and the notes."""
    lines = [
        f"batch size plan: micro-batch {plan.batch_size} x {plan.world_size} device(s) x "
        f"accumulate {plan.accumulate_grad_batches} = global {plan.global_batch_size} (was "
        f"{plan.previous_batch_size} x {plan.previous_accumulate_grad_batches} = "
        f"{plan.previous_global_batch_size}); {plan.device}, {plan.precision}; "
        f"{len(plan.trials)} trials in {plan.seconds:.1f} s"
    ]
    fastest, best = plan.samples_per_s(plan.fastest_batch_size), None
    if plan.best_batch_size is not None:
        best = plan.samples_per_s(plan.best_batch_size)
    if fastest is not None and best:
        lines.append(
            f"  fastest {plan.fastest_batch_size} ({fastest:,.1f} samples/s, "
            f"{fastest / best:.1%} of the best: {best:,.1f} at {plan.best_batch_size}; "
            f"tolerance {plan.tolerance:.0%})"
        )
    if plan.ceiling is not None:
        oom = f" (first out of memory: {plan.first_oom})" if plan.first_oom else ""
        limit = f"ceiling {plan.ceiling}{oom}, margin {plan.margin:.0%}"
    else:
        limit = f"no ceiling reached (ended by the {plan.bound.replace('_', ' ')})"
    lines.append(f"  {limit} -> at most {plan.safe_max_batch_size}; cap {plan.max_batch_size}")
    lines.append(f"  {'batch':>7}  {'phase':<7} {'samples/s':>11}  {'peak memory':>11}  result")
    for t in plan.trials:
        rate = "-" if t.samples_per_s is None else f"{t.samples_per_s:,.1f}"
        if t.fits:
            result = "fit" if t.samples_per_s is not None else "fit (not timed)"
        else:
            result = f"does not fit: {t.error}"
        mark = ""
        if t.samples_per_s is not None and t.batch_size == plan.fastest_batch_size:
            mark = "  <- fastest"
        elif t.samples_per_s is not None and t.batch_size == plan.best_batch_size:
            mark = "  <- best"
        lines.append(
            f"  {t.batch_size:>7}  {t.phase:<7} {rate:>11}  {_gib(t.peak_memory_bytes):>11}  "
            f"{result}{mark}"
        )
    lines.append("  changes: " + ("; ".join(plan.changes) or "none"))
    lines += [f"  note: {n}" for n in plan.notes]
    return "\n".join(lines)
