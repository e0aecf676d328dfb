"""``BatchSizePlan``: the batch-size search's table and its decision, as plain data.

``find_batch_size`` (in ``find``) returns one; ``BatchSizePlan.apply`` hands it to ``apply``,
which makes a Trainer train as planned. Importing this imports neither torch nor lightning.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from lightning_maxtp.batch_size.lr import scale_param_groups
from lightning_maxtp.batch_size.search import TrialResult, gib

if TYPE_CHECKING:
    import lightning.pytorch as pl

__all__ = ["BatchSizePlan", "plan_changes"]


@dataclass(frozen=True)
class BatchSizePlan:
    """The search's table and its decision: micro-batch, accumulation, learning-rate factors."""

    batch_size: int
    """Per-device micro-batch to train with."""
    accumulate_grad_batches: int
    global_batch_size: int
    """``batch_size x world_size x accumulate_grad_batches``."""
    previous_batch_size: int
    previous_accumulate_grad_batches: int
    previous_global_batch_size: int
    fastest_batch_size: int
    """The knee: smallest measured batch within ``tolerance`` of the best throughput."""
    best_batch_size: int | None
    """The measured batch with the highest throughput (under the safe maximum)."""
    ceiling: int | None
    """Largest batch that fit when memory bounded the search; ``None`` if it was not reached."""
    first_oom: int | None
    """Smallest batch that did not fit (``ceiling + 1`` when the bisection finished)."""
    safe_max_batch_size: int
    bound: Literal["memory", "cap", "time_budget"]
    """What ended the doubling."""
    trials: tuple[TrialResult, ...]
    global_batch: Literal["keep", "grow"]
    lr_scales: tuple[float, ...]
    """Learning-rate factor per optimizer (1.0: unchanged)."""
    lr_rules: tuple[str, ...]
    lr_warmup_steps: int
    world_size: int
    device: str
    precision: str
    margin: float
    tolerance: float
    max_batch_size: int
    """The cap the search used (the argument, or less when the data set is smaller)."""
    memory_limit_bytes: int | None
    """The RAM limit on a CPU (no device allocator raises there); ``None`` on an accelerator."""
    seconds: float
    """Wall time of the whole search."""
    changes: tuple[str, ...]
    """Every setting the plan changes, as ``name: old -> new``."""
    notes: tuple[str, ...]

    @property
    def tried(self) -> tuple[int, ...]:
        """The batch sizes tried, in order."""
        return tuple(t.batch_size for t in self.trials)

    def samples_per_s(self, batch_size: int) -> float | None:
        """The fastest timed throughput measured at ``batch_size``, if it was timed."""
        rates = [
            t.samples_per_s
            for t in self.trials
            if t.batch_size == batch_size and t.samples_per_s is not None
        ]
        return max(rates) if rates else None

    def scale_learning_rates(self, optimizers: Sequence[Any]) -> None:
        """Plain PyTorch: scale each optimizer's learning rates as the plan says.

        Outside Lightning the plan is applied by hand: build the loader with
        ``batch_size=plan.batch_size``, step the optimizer every
        ``plan.accumulate_grad_batches`` batches, and call this once before training and
        before creating any learning-rate scheduler (a scheduler made earlier keeps the old
        rates in its ``base_lrs`` and puts them back at its next step). With
        ``plan.lr_warmup_steps``, ramp up to the scaled rates as ``apply`` does, e.g.
        ``LinearLR(optimizer, start_factor=1 / plan.lr_scales[0],
        total_iters=plan.lr_warmup_steps)``.

        Args:
            optimizers: The optimizers the search was given, in the same order.

        Raises:
            ValueError: If their number is not the plan's.
        """
        if len(optimizers) != len(self.lr_scales):
            raise ValueError(
                f"`optimizers` has {len(optimizers)} optimizer(s) but the plan scales "
                f"{len(self.lr_scales)}; pass the optimizers the search was given, in order"
            )
        for optimizer, scale in zip(optimizers, self.lr_scales, strict=True):
            scale_param_groups(optimizer, scale)

    def apply(self, trainer: pl.Trainer, *, batch_arg_name: str = "batch_size") -> None:
        """Make the Trainer train as planned (call once, from ``on_fit_start`` or later).

        Sets ``batch_arg_name`` where the user's ``train_dataloader()`` reads it (model,
        hparams or datamodule; a loader already built is rebuilt), the Trainer's
        ``accumulate_grad_batches``, scales learning rates (param groups and schedulers'
        ``base_lrs``) and adds a warm-up callback when the plan has one.

        Raises:
            ValueError: If the batch size changes and nothing holds ``batch_arg_name``.
        """
        from lightning_maxtp.batch_size.apply import apply_plan

        apply_plan(self, trainer, batch_arg_name)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view, every trial included."""
        out = {k: v for k, v in vars(self).items() if k != "trials"}
        out.update(
            trials=[t.to_dict() for t in self.trials],
            tried=list(self.tried),
            lr_scales=list(self.lr_scales),
            lr_rules=list(self.lr_rules),
            changes=list(self.changes),
            notes=list(self.notes),
        )
        return out

    def __str__(self) -> str:
        """Summary line, the decision, the trial table, the changes and the notes."""
        lines = [
            f"batch size plan: micro-batch {self.batch_size} x {self.world_size} device(s) x "
            f"accumulate {self.accumulate_grad_batches} = global {self.global_batch_size} (was "
            f"{self.previous_batch_size} x {self.previous_accumulate_grad_batches} = "
            f"{self.previous_global_batch_size}); {self.device}, {self.precision}; "
            f"{len(self.trials)} trials in {self.seconds:.1f} s"
        ]
        fastest, best = self.samples_per_s(self.fastest_batch_size), None
        if self.best_batch_size is not None:
            best = self.samples_per_s(self.best_batch_size)
        if fastest is not None and best:
            lines.append(
                f"  fastest {self.fastest_batch_size} ({fastest:,.1f} samples/s, "
                f"{fastest / best:.1%} of the best: {best:,.1f} at {self.best_batch_size}; "
                f"tolerance {self.tolerance:.0%})"
            )
        if self.ceiling is not None:
            oom = f" (first out of memory: {self.first_oom})" if self.first_oom else ""
            limit = f"ceiling {self.ceiling}{oom}, margin {self.margin:.0%}"
        else:
            limit = f"no ceiling reached (ended by the {self.bound.replace('_', ' ')})"
        lines.append(f"  {limit} -> at most {self.safe_max_batch_size}; cap {self.max_batch_size}")
        lines.append(f"  {'batch':>7}  {'phase':<7} {'samples/s':>11}  {'peak memory':>11}  result")
        for t in self.trials:
            rate = "-" if t.samples_per_s is None else f"{t.samples_per_s:,.1f}"
            if t.fits:
                result = "fit" if t.samples_per_s is not None else "fit (not timed)"
            else:
                result = f"does not fit: {t.error}"
            mark = ""
            if t.samples_per_s is not None and t.batch_size == self.fastest_batch_size:
                mark = "  <- fastest"
            elif t.samples_per_s is not None and t.batch_size == self.best_batch_size:
                mark = "  <- best"
            lines.append(
                f"  {t.batch_size:>7}  {t.phase:<7} {rate:>11}  {gib(t.peak_memory_bytes):>11}  "
                f"{result}{mark}"
            )
        lines.append("  changes: " + ("; ".join(self.changes) or "none"))
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


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
