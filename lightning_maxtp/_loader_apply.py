"""The transform ``apply_loader_plan`` installs on a Trainer: rebuild planned loaders.

It runs for every DataLoader Lightning sets up (see ``_lightning_private``), after Lightning
injected its distributed sampler and before workers start, and only touches the stages it holds
a plan for. The thread-limit ``worker_init_fn`` wraps the user's own, or Lightning's worker
seeding when ``seed_everything(workers=True)`` would have added it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_maxtp._worker_limits import WorkerThreadLimit

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from lightning_maxtp.loader import LoaderPlan

__all__ = ["PlanApplier"]


class PlanApplier:
    """``(dataloader, stage, trainer) -> dataloader`` for the stages in ``plans`` (picklable).

    Args:
        plans: ``{stage: plan}``, stage one of ``train``, ``val``, ``test``.
    """

    def __init__(self, plans: dict[str, LoaderPlan]) -> None:
        self.plans = plans

    def __call__(self, dataloader: object, stage: str | None, trainer: pl.Trainer) -> object:
        from lightning.pytorch.utilities import rank_zero_info
        from torch.utils.data import DataLoader

        from lightning_maxtp import _lightning_private as private

        plan = self.plans.get(stage or "")
        if plan is None or not isinstance(dataloader, DataLoader):
            return dataloader
        overrides = plan.dataloader_kwargs()
        if plan.num_workers:
            user_fn = dataloader.worker_init_fn or private.lightning_worker_seeding(trainer)
            overrides["worker_init_fn"] = WorkerThreadLimit(plan.worker_threads, user_fn)
        rebuilt = private.rebuild_dataloader(dataloader, **overrides)
        settings = ", ".join(f"{k}={v!r}" for k, v in plan.dataloader_kwargs().items())
        rank_zero_info(f"lightning_maxtp: {stage} DataLoader rebuilt with {settings}")
        return rebuilt
