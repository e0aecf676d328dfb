"""``apply_loader_plan``: make a Trainer rebuild its DataLoaders with a ``LoaderPlan``.

The transform it installs runs for every DataLoader Lightning sets up (see
``lightning_hook``), after Lightning injected its distributed sampler and before workers
start, and only touches the stages it holds a plan for. The thread-limit ``worker_init_fn``
wraps the user's own, or Lightning's worker seeding when ``seed_everything(workers=True)`` would
have added it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from lightning_maxtp._log import rank_zero_info
from lightning_maxtp.loader.worker_limits import WorkerThreadLimit, start_method_of

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from lightning_maxtp.loader.plan import LoaderPlan

__all__ = ["STAGES", "PlanApplier", "apply_loader_plan"]

STAGES = ("train", "val", "test")


class PlanApplier:
    """``(dataloader, stage, trainer) -> dataloader`` for the stages in ``plans`` (picklable).

    Args:
        plans: ``{stage: plan}``, stage one of ``train``, ``val``, ``test``.
        verbose: Log each rebuild (rank zero).
    """

    def __init__(self, plans: dict[str, LoaderPlan], *, verbose: bool = True) -> None:
        self.plans = plans
        self.verbose = verbose

    def __call__(self, dataloader: object, stage: str | None, trainer: pl.Trainer) -> object:
        """The loader rebuilt with the stage's plan, or unchanged when there is none."""
        from torch.utils.data import DataLoader

        from lightning_maxtp.loader import lightning_hook as hook

        plan = self.plans.get(stage or "")
        if plan is None or not isinstance(dataloader, DataLoader):
            return dataloader
        overrides = plan.settings()
        if plan.num_workers:
            user_fn = dataloader.worker_init_fn or hook.lightning_worker_seeding(trainer)
            forked = start_method_of(dataloader.multiprocessing_context) == "fork"
            overrides["worker_init_fn"] = WorkerThreadLimit(
                plan.worker_threads, user_fn, forked=forked
            )
        rebuilt = hook.rebuild_dataloader(dataloader, **overrides)
        settings = ", ".join(f"{k}={v!r}" for k, v in plan.settings().items())
        if self.verbose:
            rank_zero_info(f"{stage} DataLoader rebuilt with {settings}")
        return rebuilt


def apply_loader_plan(
    trainer: pl.Trainer,
    plan: LoaderPlan,
    *,
    stages: Sequence[str] = ("train", "val"),
    verbose: bool = True,
) -> None:
    """Make ``trainer`` rebuild its DataLoaders of ``stages`` with ``plan``'s settings.

    Call it before ``fit``/``validate``/``test``. Each loader is rebuilt when Lightning sets it
    up, after it injected its distributed sampler (which is kept) and before workers start;
    everything else the user set (dataset, sampler, collate, batch size, ``worker_init_fn``,
    generator) stays. Calling again for other stages adds to the earlier call.

    Args:
        trainer: The Trainer whose loaders to rebuild.
        plan: Settings from ``tune_dataloader``.
        stages: Any of ``"train"``, ``"val"`` (sanity check included) and ``"test"``.
        verbose: Log each rebuilt loader's settings (rank zero); ``False`` logs nothing.

    Raises:
        ValueError: If a stage is not one of those.
    """
    from lightning_maxtp.loader import lightning_hook as hook

    unknown = [s for s in stages if s not in STAGES]
    if unknown or not stages or isinstance(stages, str):
        raise ValueError(
            f"`stages` must be a non-empty sequence of {STAGES}, got {stages!r}; e.g. ('train',)"
        )
    current = hook.dataloader_transform(trainer)
    plans = dict(current.plans) if isinstance(current, PlanApplier) else {}
    plans.update(dict.fromkeys(stages, plan))
    hook.install_dataloader_transform(trainer, PlanApplier(plans, verbose=verbose))
