"""``batch_size``: the fastest batch, chosen before training (``find_batch_size``), never mid-fit.

``allow`` names it like the other knobs (or ``allow_batch_size_change=True``). Before the first
step the callback asks its offer (a loader it can resize), then ``choose`` runs
``find_batch_size(global_batch="grow")`` (the learning rate scaled and warmed up) and ``apply``
applies the plan. It is not tried per bottleneck.
"""

from __future__ import annotations

from typing import Any, ClassVar

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
    context_field: ClassVar[str | None] = "batch_size"

    @override
    def current(self, fit: FitView) -> int | None:
        """The first train loader's batch size (``None``: behind a batch sampler, or none).

        The user's loader's, where the loop wrapped it in a switchable one (which batches
        through a batch sampler of its own).
        """
        from lightning_maxtp.loader.first import first_loader
        from lightning_maxtp.loader.switchable import SwitchableLoader

        loader = first_loader(fit.trainer.train_dataloader)
        if isinstance(loader, SwitchableLoader):
            loader = loader.source
        size = getattr(loader, "batch_size", None)
        return size if isinstance(size, int) else None

    @override
    def why_not(self, fit: FitView) -> str | None:
        from lightning_maxtp.batch_size.trainer_internals import resize_reason

        return resize_reason(fit.trainer, self.name)

    @override
    def offer(self, fit: FitView) -> Offer | NotOffered:
        """The search to run (``choose``), or why the loader cannot be resized."""
        why = self.why_not(fit)
        if why is not None:
            return NotOffered(why)
        return Offer(self.current(fit), "the fastest batch", self.reason)

    @override
    def choose(self, fit: FitView) -> Any:
        """``find_batch_size``'s plan for this fit.

        ``global_batch="grow"``: a batch of 32 kept as the global batch could never get faster.
        """
        from lightning_maxtp.batch_size.find import find_batch_size

        return find_batch_size(
            fit.module, trainer=fit.trainer, global_batch="grow", verbose=False
        )  # the callback prints the plan at its own verbosity

    @override
    def apply(self, fit: FitView, value: Any) -> None:
        """Apply a plan ``choose`` returned, before training.

        Raises:
            ValueError: For a bare size: the batch is not switched mid-fit.
        """
        if not hasattr(value, "apply"):
            raise ValueError(
                f"the batch size is chosen before training, not switched mid-fit (asked for "
                f"{value!r}); use find_batch_size(...).apply(trainer) before trainer.fit"
            )
        value.apply(fit.trainer)
