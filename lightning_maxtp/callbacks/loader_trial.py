"""The loader plan as the loop's first trial: the plan line, ``tune_dataloader``, the change.

When the baseline window is data-bound, the loop measures the user's own loader alone against
the window's consumption rate and tries the settings ``tune_dataloader`` chose before any
single knob. Plain functions over plain data; the callback supplies the loader and the window.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning_maxtp.knobs.registry import BEFORE_FIT, DEVICE_LIMITED, GUARDED, WORKERS, knob_class
from lightning_maxtp.observe.thresholds import IO_WORKER_FACTOR
from lightning_maxtp.resources.probe import worker_ceiling, workers_per_process
from lightning_maxtp.tuning.decisions import Try
from lightning_maxtp.tuning.judge import TWO_PAIR_GAIN
from lightning_maxtp.tuning.switches import PER_WORKER_S, WORKER_START_S

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

    from lightning_maxtp.loader.plan import LoaderPlan
    from lightning_maxtp.observe.window import Window
    from lightning_maxtp.resources.probe import Resources
    from lightning_maxtp.tuning.config import TuningConfig

__all__ = [
    "MIN_LOADER_MEASURE_S",
    "SEARCH_FLOOR_BATCHES",
    "measure_loader",
    "most_workers",
    "plan_change",
    "plan_line",
    "search_floor_s",
    "tried_knobs",
]

MIN_LOADER_MEASURE_S = 1.0
"""Below this, measuring the loader alone cannot tell its settings apart (each candidate needs a
slice of a fraction of a second plus worker start-up): skipped."""
SEARCH_FLOOR_BATCHES = 10
"""Batches the search loads before it can compare no worker with one: 1 warm-up and 3 timed
without workers, 2 warm-up and 4 timed with one (``loader.measure``)."""


def search_floor_s(window: Window) -> float:
    """The least time measuring the loader alone needs to compare no worker with one.

    From the window: a batch takes the loader ``samples / loader rate`` (with no workers, the
    main process's loading measured while the step waited). A budget below this would end the
    search before a worker setting is measured in full, and training would wait for nothing.
    """
    from lightning_maxtp.observe.shares import loader_rates

    rate = loader_rates(window)[1]
    if rate <= 0 or not window.samples:
        return MIN_LOADER_MEASURE_S
    batch_s = sum(window.samples) / len(window.samples) / rate
    start = WORKER_START_S + PER_WORKER_S  # one worker's start, as a trial's is predicted
    return max(MIN_LOADER_MEASURE_S, SEARCH_FLOOR_BATCHES * batch_s + start)


def plan_line(
    config: TuningConfig, resources: Resources, world_size: int, local_ranks: int = 1
) -> str:
    """The rank-zero summary printed before training: the machine and what the loop will do."""
    gpus = ", ".join(g.name or f"GPU {g.index}" for g in resources.gpus) or "none"
    own = config.max_workers
    budget = own if own is not None else workers_per_process(resources.cpu, local_ranks)
    ceiling = worker_ceiling(resources.cpu, local_ranks, has_gpus=bool(resources.gpus))
    past = f"past it while each worker pays, up to {ceiling}; " if ceiling > budget else ""
    raised = (
        ""
        if own is not None
        else f" ({past}up to {IO_WORKER_FACTOR}x for loading that waits on reads)"
    )
    return (
        f"plan: {resources.cpu.effective} usable CPUs shared by {local_ranks} rank(s) on this "
        f"node, worker budget {budget} per rank{raised}, GPUs: {gpus}; world size "
        f"{world_size}. Warm up {config.warmup_steps} steps, "
        f"baseline {config.window_steps} steps, then one knob at a time (kept if faster "
        f"beyond the noise, by >= {TWO_PAIR_GAIN * config.min_gain:.0%} on two pairs of "
        f"windows), at most {config.max_trials} trials / "
        f"{config.time_budget_s:.0f} s; {_allowed_words(config, resources)}."
    )


def tried_knobs(config: TuningConfig, resources: Resources) -> list[str]:
    """The knobs beyond the loader's that ``allow`` lets the loop try on this machine's device.

    The batch size is grown before the fit, never tried on the running one.
    """
    allowed = [k for k in config.allowed() if not knob_class(k).before_fit]
    if not resources.gpus:  # TF32 and cuDNN flags do nothing on a CPU
        allowed = [k for k in allowed if "cpu" in DEVICE_LIMITED.get(k, {"cpu"})]
    return allowed


def _allowed_words(config: TuningConfig, resources: Resources) -> str:
    """What ``allow`` lets the loop try beyond the loader's knobs, in words."""
    allowed = tried_knobs(config, resources)
    guard = ", behind a numerics guard" if GUARDED & set(allowed) else ""
    math = f"also {', '.join(allowed)}{guard}" if allowed else "loader knobs only"
    batch = "batch size may grow" if BEFORE_FIT in config.allowed() else "batch size unchanged"
    return f"{math}; {batch}"


def most_workers(config: TuningConfig, resources: Resources | None, local_ranks: int) -> int | None:
    """The most workers ``tune_dataloader`` may try for this job (``None``: unknown).

    The user's ``max_workers``, else ``loader.budget.most_workers`` of this machine's limits.
    """
    from lightning_maxtp.loader import budget

    if config.max_workers is not None:
        return config.max_workers
    if resources is None:
        return None
    limits = budget.limits_from(
        resources, max_workers=None, local_world_size=local_ranks, memory_budget_bytes=None
    )
    return budget.most_workers(limits)


def measure_loader(
    loader: DataLoader[Any],
    window: Window,
    config: TuningConfig,
    resources: Resources | None,
    *,
    time_budget_s: float | None = None,
    local_ranks: int | None = None,
) -> LoaderPlan:
    """``tune_dataloader`` on the user's loader against the window's consumption rate.

    The user's own loader object is measured (its pipeline re-run with preserved random state),
    never the running one, so the training's index stream is not touched. ``time_budget_s``
    (default: the config's) bounds how long training waits for it.
    """
    from lightning_maxtp.loader.tune import tune_dataloader

    rate = window.device_samples_per_s
    return tune_dataloader(
        loader,
        consumption_rate=rate if rate > 0 else None,
        time_budget_s=config.loader_time_budget_s if time_budget_s is None else time_budget_s,
        max_workers=config.max_workers,
        local_world_size=local_ranks,
        pin_memory=window.context.device_type == "cuda",
        resources=resources,
    )


def plan_change(plan: LoaderPlan, settings: dict[str, Any], rate: float) -> Try | None:
    """The plan as one trial of ``"loader plan"`` (the settings it changes), or ``None``.

    Its expected gain is what the measurement predicts for the job now at ``rate`` samples/s:
    the slower of the loader's measured rate and the device's consumption.
    """
    new = {k: v for k, v in plan.settings().items() if settings.get(k) != v}
    if not new or (not plan.num_workers and not settings[WORKERS]):
        return None
    expected = None
    if plan.consumption_rate is not None and rate > 0 and plan.samples_per_s > 0:
        expected = min(plan.samples_per_s, plan.consumption_rate) / rate - 1
    return Try("loader plan", new, plan.reason.split(". ")[0].rstrip("."), expected)
