"""The DataLoader profiled alone: ``tune_dataloader(loader) -> LoaderPlan``, applied to a Trainer.

The seeds' rule: iterate the data pipeline without training, compare with what the device
consumes, and raise workers/prefetch until the loader outruns it with margin. ``tune_dataloader``
measures the user's own loader configuration (dataset, sampler, collate, batch size) with
candidate settings (search rule in ``_loader_search``, measurement in ``_loader_measure``),
within a CPU budget from the probe, a RAM and ``/dev/shm`` budget from measured worker memory,
and a time budget. ``apply_loader_plan`` makes a Trainer rebuild its loaders with the plan.
Only "same math" knobs change: num_workers, prefetch_factor, pin_memory, persistent_workers and
thread limits inside workers.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from lightning_maxtp._loader_budget import LoaderBudget
from lightning_maxtp._loader_candidate import TARGET_MARGIN, LoaderCandidate

if TYPE_CHECKING:
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

    from lightning_maxtp.resources import Resources

__all__ = ["LoaderBudget", "LoaderCandidate", "LoaderPlan", "apply_loader_plan", "tune_dataloader"]

log = logging.getLogger(__name__)

STAGES = ("train", "val", "test")


@dataclass(frozen=True)
class LoaderPlan:
    """DataLoader settings chosen by measurement, with the evidence and the reason.

    Attributes:
        num_workers: Worker processes to use.
        prefetch_factor: Batches each worker loads ahead (``None`` without workers).
        pin_memory: Page-locked batches (only when training on a CUDA GPU).
        persistent_workers: Keep workers alive between epochs.
        worker_threads: Thread-pool limit inside each worker (0 without workers).
        samples_per_s: The chosen setting's measured rate, loader alone.
        startup_s: The chosen setting's start-up: workers plus the first batch.
        consumption_rate: Samples/s the device consumes, when it was given.
        target_met: Whether the loader reaches 1.25x the consumption rate (``None``: unknown).
        shortfall: When even the best setting is slower than the consumption rate, the share
            missing (0.3: the loader delivers 70 % of what the device could take).
        reason: Why these settings, in a sentence or two.
        diagnosis_kind: ``"data_pipeline"`` when the loader cannot keep up, else ``None``.
        recommendations: What to change next, most direct first.
        budget: The limits respected.
        candidates: Every setting measured, in the order measured.
        before: The loader's own settings.
        elapsed_s: Wall time of the tuning.
        notes: Caveats about this loader.
    """

    num_workers: int
    prefetch_factor: int | None
    pin_memory: bool
    persistent_workers: bool
    worker_threads: int
    samples_per_s: float
    startup_s: float
    consumption_rate: float | None
    target_met: bool | None
    shortfall: float | None
    reason: str
    diagnosis_kind: str | None
    recommendations: tuple[str, ...]
    budget: LoaderBudget
    candidates: tuple[LoaderCandidate, ...]
    before: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0
    notes: tuple[str, ...] = ()

    @property
    def target_rate(self) -> float | None:
        """1.25x the consumption rate, when known."""
        return None if self.consumption_rate is None else TARGET_MARGIN * self.consumption_rate

    def dataloader_kwargs(self) -> dict[str, Any]:
        """The settings as ``DataLoader`` keyword arguments (thread limits excluded)."""
        return {
            "num_workers": self.num_workers,
            "prefetch_factor": self.prefetch_factor,
            "pin_memory": self.pin_memory,
            "persistent_workers": self.persistent_workers,
        }

    def changes(self) -> list[str]:
        """``"num_workers: 0 -> 4"`` for each setting that differs from the loader's own."""
        return [
            f"{k}: {self.before.get(k)!r} -> {v!r}"
            for k, v in self.dataloader_kwargs().items()
            if k in self.before and self.before[k] != v
        ]

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        data = {k: v for k, v in asdict(self).items() if k not in ("budget", "candidates")}
        return {
            **data,
            "target_rate": self.target_rate,
            "changes": self.changes(),
            "recommendations": list(self.recommendations),
            "notes": list(self.notes),
            "budget": self.budget.to_dict(),
            "candidates": [c.to_dict() for c in self.candidates],
        }

    def __str__(self) -> str:
        from lightning_maxtp._loader_report import format_plan

        return format_plan(self)


def _validate(
    consumption_rate: float | None,
    time_budget_s: float,
    max_workers: int | None,
    local_world_size: int | None,
    memory_budget_bytes: int | None,
) -> None:
    if consumption_rate is not None and not consumption_rate > 0:
        raise ValueError(
            f"`consumption_rate` must be > 0 samples/s or None, got {consumption_rate!r}; pass "
            "the samples/s your training step takes with data already on the device"
        )
    if not (time_budget_s > 0 and math.isfinite(time_budget_s)):
        raise ValueError(f"`time_budget_s` must be > 0, got {time_budget_s!r}; e.g. pass 15")
    if max_workers is not None and max_workers < 0:
        raise ValueError(f"`max_workers` must be >= 0 or None (from the probe), got {max_workers}")
    if local_world_size is not None and local_world_size < 1:
        raise ValueError(
            f"`local_world_size` must be >= 1 or None, got {local_world_size}; pass the number "
            "of device processes on this node"
        )
    if memory_budget_bytes is not None and memory_budget_bytes < 0:
        raise ValueError(f"`memory_budget_bytes` must be >= 0 or None, got {memory_budget_bytes}")


def tune_dataloader(
    loader: DataLoader[Any],
    *,
    consumption_rate: float | None = None,
    time_budget_s: float = 15.0,
    max_workers: int | None = None,
    local_world_size: int | None = None,
    pin_memory: bool | None = None,
    memory_budget_bytes: int | None = None,
    resources: Resources | None = None,
) -> LoaderPlan:
    """Measure ``loader``'s pipeline alone with candidate settings and choose the cheapest good one.

    Workers grow 1, 2, 4, ... while each step gains >= 5 %, stop once the loader reaches 1.25x
    ``consumption_rate``, and never exceed the CPU, RAM or ``/dev/shm`` budget; the fewest
    workers within 5 % of the best (or reaching the target) win. When loading in the main
    process mostly waits (on reads), the CPU budget is raised up to 4x (``LoaderBudget.io_workers``)
    unless ``max_workers`` is given. Random states are restored
    afterwards and no worker process is left behind.

    Args:
        loader: The DataLoader to tune; it is not modified (its pipeline is re-run).
        consumption_rate: Samples/s the training step consumes with data ready, if known.
        time_budget_s: Wall-time budget for all measurements.
        max_workers: Worker cap, instead of the probe's CPU budget (never raised for I/O).
        local_world_size: Device processes on this node sharing the CPUs, RAM and
            ``/dev/shm`` (default: ``LOCAL_WORLD_SIZE`` or the probe's device processes).
        pin_memory: Pin batches (default: when CUDA is available).
        memory_budget_bytes: RAM the workers may use together, instead of half of what the
            probe finds available (divided among the device processes).
        resources: A probe result to use instead of probing again.

    Returns:
        The plan: settings, every candidate measured, the budget and the reason.

    Raises:
        ValueError: For invalid arguments, an empty loader, or a dataset that cannot be sent
            to workers started with ``spawn``/``forkserver`` (the message names the attribute).
    """
    from torch.utils.data import DataLoader, IterableDataset

    from lightning_maxtp import _loader_measure as lm
    from lightning_maxtp._loader_budget import budget_from, limits_from
    from lightning_maxtp._loader_order import (
        keeps_order_when_persistent,
        persistence,
        preserved_rng,
    )
    from lightning_maxtp._loader_pickle import check_picklable
    from lightning_maxtp._loader_report import explain
    from lightning_maxtp._loader_search import search
    from lightning_maxtp.resources import inspect_resources

    if not isinstance(loader, DataLoader):
        raise ValueError(f"`loader` must be a torch DataLoader, got {type(loader).__name__}")
    _validate(consumption_rate, time_budget_s, max_workers, local_world_size, memory_budget_bytes)
    started = time.perf_counter()
    deadline = started + time_budget_s
    limits = limits_from(
        resources if resources is not None else inspect_resources(),
        max_workers=max_workers,
        local_world_size=local_world_size,
        memory_budget_bytes=memory_budget_bytes,
    )
    if pin_memory is None:
        import torch

        pin_memory = torch.cuda.is_available()
    method = lm.start_method(loader)
    if method != "fork" and limits.cpu_workers > 0:
        check_picklable(loader, method)
    steps = 4 + math.ceil(math.log2(max(limits.cpu_workers, 1)))
    slice_s = min(3.0, max(0.1, 0.7 * time_budget_s / steps))
    measured: list[LoaderCandidate] = []

    def measure(workers: int, prefetch: int | None) -> LoaderCandidate | None:
        startup = max((c.startup_s for c in measured if c.num_workers), default=0.0)
        if deadline - time.perf_counter() < 0.3 * slice_s + startup:
            return None
        candidate = lm.measure_candidate(
            loader,
            num_workers=workers,
            prefetch_factor=prefetch,
            pin_memory=bool(pin_memory),
            threads=max(1, limits.probe_workers // max(workers, 1)),
            slice_s=slice_s,
            deadline=deadline,
        )
        measured.append(candidate)
        return candidate

    with preserved_rng(loader):
        result = search(
            measure,
            cpu_workers=limits.cpu_workers,
            consumption_rate=consumption_rate,
            memory_bytes=limits.memory_bytes,
            shm_bytes=limits.shm_bytes,
            raise_for_io=max_workers is None,
        )
    budget = budget_from(result, limits, time_budget_s)
    chosen = result.chosen
    try:
        batches: int | None = len(loader)
    except TypeError:
        batches = None
    persistent, persistent_why = persistence(
        chosen, batches, method, keeps_order=keeps_order_when_persistent(loader)
    )
    text = explain(result, budget, consumption_rate, persistent_why)
    workers = chosen.num_workers if chosen is not None else loader.num_workers
    notes = []
    if isinstance(loader.dataset, IterableDataset) and workers != loader.num_workers:
        notes.append(
            "IterableDataset: a different num_workers keeps the same samples only if the dataset "
            "splits its stream by `torch.utils.data.get_worker_info()`"
        )
    if chosen is None:
        prefetch, persistent = loader.prefetch_factor, loader.persistent_workers
    else:
        prefetch = chosen.prefetch_factor
    return LoaderPlan(
        num_workers=workers,
        prefetch_factor=prefetch if workers else None,
        pin_memory=bool(pin_memory),
        persistent_workers=persistent and workers > 0,
        worker_threads=max(1, limits.probe_workers // workers) if workers else 0,
        samples_per_s=chosen.samples_per_s if chosen else 0.0,
        startup_s=chosen.startup_s if chosen else 0.0,
        consumption_rate=consumption_rate,
        target_met=None if consumption_rate is None else result.target_met,
        shortfall=text.shortfall,
        reason=text.reason,
        diagnosis_kind="data_pipeline" if text.shortfall is not None else None,
        recommendations=text.recommendations,
        budget=budget,
        candidates=result.candidates,
        before={
            "num_workers": loader.num_workers,
            "prefetch_factor": loader.prefetch_factor,
            "pin_memory": loader.pin_memory,
            "persistent_workers": loader.persistent_workers,
        },
        elapsed_s=time.perf_counter() - started,
        notes=tuple(notes),
    )


def apply_loader_plan(
    trainer: pl.Trainer, plan: LoaderPlan, *, stages: Sequence[str] = ("train", "val")
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

    Raises:
        ValueError: If a stage is not one of those.
    """
    from lightning_maxtp import _lightning_private as private
    from lightning_maxtp._loader_apply import PlanApplier

    unknown = [s for s in stages if s not in STAGES]
    if unknown or not stages or isinstance(stages, str):
        raise ValueError(
            f"`stages` must be a non-empty sequence of {STAGES}, got {stages!r}; e.g. ('train',)"
        )
    current = private.dataloader_transform(trainer)
    plans = dict(current.plans) if isinstance(current, PlanApplier) else {}
    plans.update(dict.fromkeys(stages, plan))
    private.install_dataloader_transform(trainer, PlanApplier(plans))
