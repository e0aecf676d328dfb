"""``batch_size``: the fastest batch, chosen before training (``find_batch_size``), never mid-fit.

``allow`` names it like the other knobs (or ``allow_batch_size_change=True``); the callback
runs ``find_batch_size(global_batch="grow")`` before the first step, the learning rate scaled
and warmed up, and applies the plan. It is not tried per bottleneck, so it has no offer.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_maxtp.knobs.base import BaseKnob, FitView, NotOffered, Offer

__all__ = ["BatchSize"]


class BatchSize(BaseKnob):
    """The train loader's batch size, chosen before training."""

    name = "batch_size"
    reason = "the fastest batch the device fits"
    changes = (
        '``find_batch_size(global_batch="grow")`` before training: the fastest batch, the '
        "learning rate scaled and warmed up (reported); needs a loader built from ``batch_size`` "
        "in ``train_dataloader()``"
    )
    before_fit = True

    @override
    def current(self, fit: FitView) -> int | None:
        loader = fit.trainer.train_dataloader
        size = getattr(loader, "batch_size", None)
        return size if isinstance(size, int) else None

    @override
    def offer(self, fit: FitView) -> Offer | NotOffered:
        return NotOffered("chosen before training (find_batch_size)", quiet=True)

    @override
    def apply(self, fit: FitView, value: Any) -> None:
        raise ValueError(
            f"the batch size is chosen before training, not switched mid-fit (asked for "
            f"{value!r}); use find_batch_size(...).apply(trainer) before trainer.fit"
        )
