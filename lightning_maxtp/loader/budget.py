"""The limits ``tune_dataloader`` respects: workers from CPUs, RAM and ``/dev/shm``.

CPU: the probe's rule, ``(effective CPUs - device processes) // device processes``, where the
device processes are the DDP ranks on this node (one main thread each stays free), is where the
search starts being cautious; it may go past it, each worker gaining >= 5 %, up to the probe's
ceiling (every core on a GPU host, twice the cores on a CPU-only host, per rank). RAM: half of
what the probe finds available, shared by the ranks on this node, divided by the largest
worker's measured memory (USS: what the worker holds alone, without pages it shares with the
main process). ``/dev/shm``: half of its free space, shared likewise, divided by the batches a
worker keeps in flight (``prefetch_factor`` x measured batch bytes).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from lightning_maxtp.observe.thresholds import IO_WORKER_FACTOR
from lightning_maxtp.resources.probe import worker_ceiling, workers_per_process

if TYPE_CHECKING:
    from lightning_maxtp.loader.candidate import SearchResult
    from lightning_maxtp.resources.probe import Resources

__all__ = [
    "MEMORY_SHARE",
    "SHM_SHARE",
    "Limits",
    "LoaderBudget",
    "budget_from",
    "limits_from",
    "most_workers",
]

MEMORY_SHARE = 0.5
"""Share of available RAM one loader's workers may take (the rest is headroom for training)."""
SHM_SHARE = 0.5
"""Share of free ``/dev/shm`` one loader's in-flight batches may take."""


@dataclass(frozen=True)
class Limits:
    """Limits known before measuring (plain data from the probe and the caller's overrides)."""

    probe_workers: int
    """Workers the CPUs allow per device process (also sizes thread pools in workers)."""
    cpu_workers: int
    """Worker cap for the search: ``max_workers`` when given, else ``probe_workers``."""
    cpu_source: str
    memory_bytes: int | None
    shm_bytes: int | None
    ceiling_workers: int | None = None
    """Most workers the search may reach past ``cpu_workers`` when each still gains (``None``:
    not past it: the caller's ``max_workers``)."""
    ranks: int = 1
    """Device processes on this node sharing its CPUs."""


def most_workers(limits: Limits) -> int:
    """The most workers the search may try with ``limits``, before RAM and ``/dev/shm``.

    The ceiling, or the CPU budget raised for reads that wait (``IO_WORKER_FACTOR`` times at
    most), whichever is larger; the caller's ``max_workers`` when it set the CPU cap.
    """
    if limits.ceiling_workers is None:
        return limits.cpu_workers
    return max(limits.ceiling_workers, IO_WORKER_FACTOR * max(limits.cpu_workers, 1))


def limits_from(
    res: Resources,
    *,
    max_workers: int | None,
    local_world_size: int | None,
    memory_budget_bytes: int | None,
) -> Limits:
    """CPU, RAM and ``/dev/shm`` limits for one device process's loader."""
    ranks = local_world_size
    env = os.environ.get("LOCAL_WORLD_SIZE", "")
    if ranks is None:
        ranks = int(env) if env.isdigit() and int(env) > 0 else res.advice.device_processes
    probe_workers = workers_per_process(res.cpu, ranks)
    source = f"probe: {res.cpu.effective} CPUs shared by {ranks} rank(s) on this node"
    ceiling = worker_ceiling(res.cpu, ranks, has_gpus=bool(res.gpus))
    avail, shm_free = res.memory.effective_available_bytes, res.memory.shm_free_bytes
    memory = memory_budget_bytes
    if memory is None and avail is not None:
        memory = int(avail * MEMORY_SHARE / ranks)
    return Limits(
        probe_workers=probe_workers,
        cpu_workers=probe_workers if max_workers is None else max_workers,
        cpu_source=source if max_workers is None else f"max_workers={max_workers}",
        memory_bytes=memory,
        shm_bytes=None if shm_free is None else int(shm_free * SHM_SHARE / ranks),
        ceiling_workers=ceiling if max_workers is None else None,
        ranks=ranks,
    )


@dataclass(frozen=True)
class LoaderBudget:
    """The limits the search respected.

    Attributes:
        max_workers: The binding worker cap (the smallest of the caps below).
        cpu_workers: Cap from CPUs: ``(effective CPUs - device processes) // device processes``,
            or ``max_workers`` when given.
        cpu_source: Where ``cpu_workers`` came from, in words.
        memory_bytes: RAM this loader's workers may use together (``None``: unknown).
        memory_workers: Cap from RAM and the measured worker memory (``None``: not binding).
        shm_bytes: ``/dev/shm`` the in-flight batches may use.
        shm_workers: Cap from ``/dev/shm`` and the measured batch size.
        worker_memory_bytes: Largest worker's memory (USS) measured.
        batch_bytes: Tensor bytes of one batch.
        limited_by: Which cap binds: ``cpu``, ``memory`` or ``shm``.
        time_budget_s: Seconds the tuning was allowed.
        io_workers: ``cpu_workers`` raised because loading in the main process kept the CPU
            busy only ``io_cpu_share`` of its time (it waits on reads); ``None``: not raised.
        io_cpu_share: That measured share.
        ceiling_workers: Most workers the search could reach past the CPU budget while each
            still gained >= 5 % (``None``: the caller's ``max_workers`` is a hard cap).
        past_budget: Whether the chosen setting has more workers than the CPU budget (after
            the raise for I/O): it paid on measurement.
    """

    max_workers: int
    cpu_workers: int
    cpu_source: str
    memory_bytes: int | None
    memory_workers: int | None
    shm_bytes: int | None
    shm_workers: int | None
    worker_memory_bytes: int | None
    batch_bytes: int | None
    limited_by: str
    time_budget_s: float
    io_workers: int | None = None
    io_cpu_share: float | None = None
    ceiling_workers: int | None = None
    past_budget: bool = False

    @property
    def budget_workers(self) -> int:
        """The CPU budget, raised for reads that wait: past it each worker had to gain."""
        return self.io_workers or self.cpu_workers

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return asdict(self)


def budget_from(result: SearchResult, limits: Limits, time_budget_s: float) -> LoaderBudget:
    """The budget as it stood at the end of the search (caps from measured memory included)."""
    memories = [c.worker_memory_bytes for c in result.candidates if c.worker_memory_bytes]
    batches = [c.batch_bytes for c in result.candidates if c.batch_bytes is not None]
    return LoaderBudget(
        max_workers=result.max_workers,
        cpu_workers=result.cpu_workers,
        cpu_source=limits.cpu_source,
        memory_bytes=limits.memory_bytes,
        memory_workers=result.memory_workers,
        shm_bytes=limits.shm_bytes,
        shm_workers=result.shm_workers,
        worker_memory_bytes=max(memories) if memories else None,
        batch_bytes=max(batches) if batches else None,
        limited_by=result.limited_by,
        time_budget_s=time_budget_s,
        io_workers=result.io_workers,
        io_cpu_share=next(
            (c.cpu_share for c in result.candidates if c.cpu_share is not None and c.complete),
            None,
        ),
        ceiling_workers=result.ceiling_workers,
        past_budget=result.chosen is not None and result.chosen.num_workers > result.budget_workers,
    )
