"""``MaxThroughputCallback``'s plan line and its use of ``tune_dataloader`` (step 3 of the loop)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning_maxtp.window import Window

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from lightning_maxtp.callback import MaxThroughputCallback
    from lightning_maxtp.loader import LoaderPlan

__all__ = ["measure_loader", "plan_change", "plan_line"]


def plan_line(cb: MaxThroughputCallback, trainer: pl.Trainer) -> str:
    """The rank-zero summary printed before training: the machine and what the loop will do."""
    res = cb.resources
    gpus = ", ".join(g.name for g in res.gpus) or "none"
    from lightning_maxtp._thresholds import IO_WORKER_FACTOR

    budget = cb.max_workers if cb.max_workers is not None else res.advice.cpu_workers_per_process
    raised = f" (up to {IO_WORKER_FACTOR}x for loading that waits on reads)"
    return (
        f"maxtp plan: {res.cpu.effective} usable CPUs, worker budget {budget} per process"
        f"{'' if cb.max_workers is not None else raised}, "
        f"GPUs: {gpus}; world size {trainer.world_size}. Warm up {cb.warmup_steps} steps, "
        f"baseline {cb.window_steps} steps, then one loader knob at a time (kept if >= "
        f"{cb.min_gain:.0%} faster), at most {cb.max_trials} trials / {cb.time_budget_s:.0f} s; "
        f"batch size {'may change' if cb.allow_batch_size_change else 'unchanged'}."
    )


def measure_loader(cb: MaxThroughputCallback, window: Window) -> LoaderPlan:
    """``tune_dataloader`` on the user's loader against the window's consumption rate.

    The user's own loader object is measured (its pipeline re-run with preserved random state),
    never the running one, so the training's index stream is not touched.
    """
    from lightning_maxtp.loader import tune_dataloader

    rate = window.device_samples_per_s
    return tune_dataloader(
        cb.source_loader, consumption_rate=rate if rate > 0 else None,
        time_budget_s=cb.loader_time_budget_s, max_workers=cb.max_workers,
        pin_memory=window.context.device_type == "cuda", resources=cb.resources,
    )  # fmt: skip


def plan_change(
    plan: LoaderPlan, settings: dict[str, Any]
) -> tuple[str, dict[str, Any], str] | None:
    """The plan as one trial ``("loader plan", changed settings, reason)``, or ``None``."""
    new = {k: v for k, v in plan.dataloader_kwargs().items() if settings.get(k) != v}
    if not new or (not plan.num_workers and not settings["num_workers"]):
        return None
    return "loader plan", new, plan.reason.split(". ")[0].rstrip(".")
