"""``tune_dataloader(loader) -> LoaderPlan``: the DataLoader's pipeline measured alone.

The seeds' rule: iterate the data pipeline without training, compare with what the device
consumes, and raise workers/prefetch until the loader outruns it with margin. The user's own
loader configuration (dataset, sampler, collate, batch size) is measured with candidate
settings (the rule in ``search``, the measurement in ``measure``) within a CPU budget from the
probe, a RAM and ``/dev/shm`` budget from measured worker memory, and a time budget. Only "same
math" knobs change: num_workers, prefetch_factor, pin_memory, persistent_workers and thread
limits inside workers.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, Any

from lightning_maxtp._checks import COUNT, SECONDS, refuse_bool
from lightning_maxtp._log import prefixed
from lightning_maxtp._units import GIB
from lightning_maxtp.loader.candidate import LOADER_KNOBS, LoaderCandidate
from lightning_maxtp.loader.plan import LoaderPlan
from lightning_maxtp.loader.worker_limits import unwrap_worker_init_fn

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

    from lightning_maxtp.loader.budget import Limits
    from lightning_maxtp.loader.candidate import SearchResult
    from lightning_maxtp.observe.data_path import DataPathAdvice
    from lightning_maxtp.resources.probe import Resources

__all__ = ["tune_dataloader"]


def _validate(
    consumption_rate: float | None,
    time_budget_s: float,
    max_workers: int | None,
    local_world_size: int | None,
    memory_budget_bytes: int | None,
) -> None:
    for name, value, expected, example in (
        ("consumption_rate", consumption_rate, "samples/s (a number > 0) or None", 500),
        ("time_budget_s", time_budget_s, SECONDS, 15),
        ("max_workers", max_workers, f"{COUNT} >= 0 or None", 4),
        ("local_world_size", local_world_size, f"{COUNT} >= 1 or None", 1),
        ("memory_budget_bytes", memory_budget_bytes, f"{COUNT} of bytes >= 0 or None", 8 * GIB),
    ):
        refuse_bool(name, value, expected, example)
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


def _batches(loader: DataLoader[Any]) -> int | None:
    """Batches per epoch (``None`` for a loader without a length)."""
    try:
        return len(loader)
    except TypeError:
        return None


def _data_path(
    loader: DataLoader[Any], result: SearchResult, consumption_rate: float | None, cuda: bool
) -> DataPathAdvice | None:
    """The data path that fits when even the fastest setting is short of ``consumption_rate``."""
    from lightning_maxtp.loader.sample_cost import SampleError, measure_sample_costs
    from lightning_maxtp.observe.data_path import DataFacts, advise_data_path

    eligible = [c for c in result.candidates if c.complete and not c.note]
    if consumption_rate is None or result.target_met or not eligible:
        return None
    fastest = max(eligible, key=lambda c: c.samples_per_s)
    if fastest.samples_per_s >= consumption_rate:
        return None
    try:
        costs = measure_sample_costs(loader.dataset)
    except SampleError as err:  # the advice goes on without a sample's cost, and says so
        log.warning(prefixed("a sample's cost was not measured (%s): advised without it"), err)
        costs = None
    facts = DataFacts(
        sample_bytes=fastest.sample_bytes,
        pixel_dtype=fastest.pixel_dtype,
        per_sample_s=costs.per_sample_s if costs else None,
        decode_s=costs.decode_s if costs else None,
        files=costs.files if costs else None,
    )
    return advise_data_path(
        facts,
        device_rate=consumption_rate,
        loader_rate=fastest.samples_per_s,
        device_type="cuda" if cuda else "cpu",
    )


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

    Workers grow 1, 2, 4, ... up to the CPU budget while each step gains >= 5 %, then past it by
    smaller steps that must each still gain >= 5 % (measured again when close), up to the
    probe's ceiling (``LoaderBudget.ceiling_workers``: every core on a GPU host, twice the cores
    on a CPU-only host, per rank), within the RAM and ``/dev/shm`` budgets; growth stops once
    the loader reaches 1.25x ``consumption_rate``. The fewest workers within 5 % of the best (or
    reaching the target) win, and the plan is never slower than the loader's own setting,
    measured beside it. When loading in the main process mostly waits (on reads), the CPU
    budget is raised up to 4x (``LoaderBudget.io_workers``). ``max_workers`` is a hard cap.
    Random states are restored afterwards and no worker process is left behind.

    Args:
        loader: The DataLoader to tune; it is not modified (its pipeline is re-run).
        consumption_rate: Samples/s the training step consumes with data ready, if known.
        time_budget_s: Wall-time budget for all measurements.
        max_workers: Hard worker cap, instead of the probe's budget and ceiling (never raised).
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
    from torch.utils.data import DataLoader

    from lightning_maxtp.loader import measure as lm
    from lightning_maxtp.loader.budget import limits_from
    from lightning_maxtp.loader.pickling import check_picklable
    from lightning_maxtp.resources.probe import inspect_resources

    if not isinstance(loader, DataLoader):
        raise ValueError(f"`loader` must be a torch DataLoader, got {type(loader).__name__}")
    _validate(consumption_rate, time_budget_s, max_workers, local_world_size, memory_budget_bytes)
    started = time.perf_counter()
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
    result, data_path = _search(
        loader,
        limits,
        consumption_rate=consumption_rate,
        time_budget_s=time_budget_s,
        deadline=started + time_budget_s,
        pin_memory=bool(pin_memory),
        hard_cap=max_workers,
    )
    return _plan(
        loader,
        result,
        limits,
        method,
        consumption_rate=consumption_rate,
        time_budget_s=time_budget_s,
        pin_memory=bool(pin_memory),
        data_path=data_path,
        started=started,
    )


def _search(
    loader: DataLoader[Any],
    limits: Limits,
    *,
    consumption_rate: float | None,
    time_budget_s: float,
    deadline: float,
    pin_memory: bool,
    hard_cap: int | None,
) -> tuple[SearchResult, DataPathAdvice | None]:
    """Measure candidates within ``limits`` until ``deadline``.

    Returns the search's result and the data path that fits when even the fastest setting is
    short (both measured inside the loader's preserved random state).
    """
    from lightning_maxtp.loader import measure as lm
    from lightning_maxtp.loader.order import preserved_rng
    from lightning_maxtp.loader.search import search

    top = max(limits.cpu_workers, limits.ceiling_workers or 0, 1)
    # Doubling up to the budget, a step or two past it, the own setting: one slice each.
    steps = 6 + math.ceil(math.log2(top))
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
            pin_memory=pin_memory,
            threads=max(1, limits.probe_workers // max(workers, 1)),
            slice_s=slice_s,
            deadline=deadline,
        )
        measured.append(candidate)
        return candidate

    capped = hard_cap is not None and loader.num_workers > hard_cap
    with preserved_rng(loader):
        result = search(
            measure,
            cpu_workers=limits.cpu_workers,
            consumption_rate=consumption_rate,
            memory_bytes=limits.memory_bytes,
            shm_bytes=limits.shm_bytes,
            raise_for_io=hard_cap is None,
            ceiling=limits.ceiling_workers,
            own=None
            if capped
            else (loader.num_workers, loader.prefetch_factor if loader.num_workers else None),
        )
        # Inside the preserved random state: timing samples runs the dataset's transforms.
        data_path = _data_path(loader, result, consumption_rate, pin_memory)
    return result, data_path


def _plan(
    loader: DataLoader[Any],
    result: SearchResult,
    limits: Limits,
    method: str,
    *,
    consumption_rate: float | None,
    time_budget_s: float,
    pin_memory: bool,
    data_path: DataPathAdvice | None,
    started: float,
) -> LoaderPlan:
    """The plan from the search's result: the chosen settings, persistence, the reasons."""
    from torch.utils.data import IterableDataset

    from lightning_maxtp.loader.budget import budget_from
    from lightning_maxtp.loader.explain import explain
    from lightning_maxtp.loader.order import keeps_order_when_persistent, persistence

    budget = budget_from(result, limits, time_budget_s)
    chosen = result.chosen
    persistent, persistent_why = persistence(
        chosen, _batches(loader), method, keeps_order=keeps_order_when_persistent(loader)
    )
    if result.own_kept or (
        chosen is not None and chosen.key() == (loader.num_workers, loader.prefetch_factor or 0)
    ):
        # The loader's own workers stay as they are, persistence included.
        persistent, persistent_why = loader.persistent_workers, ""
    text = explain(result, budget, consumption_rate, persistent_why, data_path)
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
        pin_memory=pin_memory,
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
        before={k: getattr(loader, k) for k in LOADER_KNOBS},
        elapsed_s=time.perf_counter() - started,
        notes=tuple(notes),
        data_path=data_path,
        user_worker_init_fn=unwrap_worker_init_fn(loader.worker_init_fn),
        forked_workers=method == "fork",
    )
