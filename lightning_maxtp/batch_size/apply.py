"""Applying a ``BatchSizePlan`` to a Trainer: batch size, accumulation, learning rate, warm-up."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from lightning.pytorch.callbacks import Callback

from lightning_maxtp.batch_size.lr import scale_param_groups
from lightning_maxtp.batch_size.trainer_internals import set_batch_size

if TYPE_CHECKING:
    import lightning.pytorch as pl
    import torch

__all__ = ["LrWarmup", "PlanToApply", "apply_plan"]


class PlanToApply(Protocol):
    """What applying a plan reads (a ``BatchSizePlan``; ``BatchSizePlan.apply`` calls it)."""

    @property
    def batch_size(self) -> int:
        """The batch to train with."""

    @property
    def previous_batch_size(self) -> int:
        """The batch the loader had."""

    @property
    def accumulate_grad_batches(self) -> int:
        """Batches per optimizer step."""

    @property
    def lr_scales(self) -> tuple[float, ...]:
        """Per optimizer, the learning-rate factor."""

    @property
    def lr_warmup_steps(self) -> int:
        """Optimizer steps of the warm-up to the scaled rate (0: none)."""


class LrWarmup(Callback):
    """Ramp the learning rate linearly from the old value to the scaled one over ``steps``.

    The factor is applied just before each optimizer update and undone right after, so any LR
    scheduler keeps computing from the scaled rate and never sees the ramp.

    Args:
        steps: Optimizer steps of the ramp.
        scales: The factor each optimizer's rate was scaled by (the ramp starts at ``1/scale``).
    """

    def __init__(self, steps: int, scales: tuple[float, ...]) -> None:
        self.steps, self.scales = steps, scales
        self._undo: list[tuple[dict[str, Any], float]] = []

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        """Scale the rate down for this step while the ramp lasts."""
        step = trainer.global_step
        if step >= self.steps or optimizer not in trainer.optimizers:
            return
        scale = self.scales[trainer.optimizers.index(optimizer)]
        if scale <= 1.0:
            return
        start = 1.0 / scale
        factor = start + (1.0 - start) * step / self.steps
        for group in optimizer.param_groups:
            self._undo.append((group, group["lr"]))
            group["lr"] = group["lr"] * factor

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any, **kwargs: Any
    ) -> None:
        """Put the scheduled rate back after the update."""
        for group, lr in reversed(self._undo):
            group["lr"] = lr
        self._undo.clear()


def apply_plan(plan: PlanToApply, trainer: pl.Trainer, batch_arg_name: str) -> None:
    """Make the Trainer train as the plan says; see ``BatchSizePlan.apply``."""
    if plan.batch_size != plan.previous_batch_size:
        set_batch_size(trainer, batch_arg_name, plan.batch_size)
    trainer.accumulate_grad_batches = plan.accumulate_grad_batches
    if any(s != 1.0 for s in plan.lr_scales):
        if len(plan.lr_scales) != len(trainer.optimizers):
            raise ValueError(
                f"the plan scales {len(plan.lr_scales)} optimizer(s) but the Trainer has "
                f"{len(trainer.optimizers)}; apply a plan to the Trainer it was made for"
            )
        for optimizer, scale in zip(trainer.optimizers, plan.lr_scales, strict=True):
            scale_param_groups(optimizer, scale)
        for config in trainer.lr_scheduler_configs:
            scheduler = config.scheduler
            index = trainer.optimizers.index(scheduler.optimizer)
            if hasattr(scheduler, "base_lrs"):
                scheduler.base_lrs = [lr * plan.lr_scales[index] for lr in scheduler.base_lrs]
    if plan.lr_warmup_steps > 0:
        trainer.callbacks.append(  # type: ignore[attr-defined]
            LrWarmup(plan.lr_warmup_steps, plan.lr_scales)
        )
