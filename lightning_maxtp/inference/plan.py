"""Which worker processes a pool starts: GPUs from the probe, workers from memory, CPU budget."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from lightning_maxtp._units import format_bytes
from lightning_maxtp.inference.records import InferencePlan, WorkerSpec
from lightning_maxtp.resources.gpus import child_visible_id
from lightning_maxtp.resources.probe import DEFAULT_HEADROOM_BYTES, Resources, workers_for_memory

log = logging.getLogger(__name__)

MAX_WORKERS_PER_GPU = 4
"""Cap of the memory rule: past a few model copies a GPU is saturated, more only add contention."""
CPU_THREADS_PER_WORKER = 4
"""Most torch threads a GPU worker gets for its host-side work (collate, pinning copies)."""
MAX_CPU_WORKERS = 8
"""On a CPU-only host, one single-threaded process per core up to this many model copies (then
more threads each): independent processes never wait at an intra-op barrier, which on a shared
machine made 2 threads 2-3x slower than 1 (measured on the 2-core development VM under load)."""

Devices = str | int | Sequence[int]


def plan_workers(
    resources: Resources,
    *,
    devices: Devices = "auto",
    workers_per_device: int | str = "auto",
    model_bytes: int | None = None,
    io_threads: int | None = None,
    headroom_bytes: int = DEFAULT_HEADROOM_BYTES,
) -> InferencePlan:
    """The worker processes for ``resources`` (pure: the probe result in, the plan out).

    GPUs: ``devices="auto"`` takes every GPU the probe found free (GPUs running other processes
    are skipped) and falls back to the CPU when there is none. Per GPU, ``"auto"`` starts
    ``(free - headroom) // model_bytes`` workers capped at ``MAX_WORKERS_PER_GPU`` when
    ``model_bytes`` is given (a GPU where not even one fits is skipped), else one. The CPU
    budget (``cpu.effective`` minus one core per GPU worker) is split into I/O threads.

    CPU: ``"auto"`` starts one process per core (at most ``MAX_CPU_WORKERS``, then more
    threads each); processes x torch threads stay within ``cpu.effective``.

    Raises:
        ValueError: For a malformed ``devices`` or ``workers_per_device``, ``devices="cuda"``
            without a usable GPU, or an explicit GPU index the probe did not find.
    """
    if not (workers_per_device == "auto" or _positive_int(workers_per_device)):
        raise ValueError(
            f"`workers_per_device` must be 'auto' or an int >= 1, got {workers_per_device!r}"
        )
    if io_threads is not None and not _positive_int(io_threads):
        raise ValueError(f"`io_threads` must be None or an int >= 1, got {io_threads!r}")
    cores = max(1, resources.cpu.effective)
    if devices == "cpu" or (devices == "auto" and not resources.gpus):
        return _cpu_plan(cores, workers_per_device, io_threads)
    skipped: list[tuple[int, str]] = []
    notes: list[str] = []
    known = {g.index: g for g in resources.gpus}
    ordinals = _gpu_ordinals(resources, devices, skipped)
    unknown = [i for i in ordinals if i not in known]
    if unknown:
        raise ValueError(
            f"`devices` names GPU(s) {unknown} but the probe found {sorted(known)}; "
            "pass devices='auto' or one of those ordinals"
        )
    per_gpu: dict[int, int] = {}
    for index in ordinals:
        if workers_per_device != "auto":
            per_gpu[index] = int(workers_per_device)
        elif model_bytes is None:
            per_gpu[index] = 1
        else:
            free = known[index].memory_free_bytes
            fit = workers_for_memory(
                free, model_bytes, headroom_bytes=headroom_bytes, max_workers=MAX_WORKERS_PER_GPU
            )
            if fit == 0:
                skipped.append((index, _too_small(free, model_bytes, headroom_bytes)))
            else:
                per_gpu[index] = fit
    if not per_gpu:
        if devices == "auto":
            notes.append("no usable GPU: running on the CPU")
            plan = _cpu_plan(cores, workers_per_device, io_threads)
            return InferencePlan(plan.workers, tuple(skipped), tuple(notes) + plan.notes)
        raise ValueError(
            f"`devices={devices!r}` left no usable GPU ({skipped}); free a GPU, lower "
            "`model_bytes`, or pass devices='cpu'"
        )
    threads, io = cpu_split(cores, sum(per_gpu.values()), io_threads)
    workers = tuple(
        WorkerSpec(
            f"cuda:{index}", child_visible_id(index, resources.cuda_visible_devices), threads, io
        )
        for index, count in per_gpu.items()
        for _ in range(count)
    )
    return InferencePlan(workers, tuple(skipped), tuple(notes))


def cpu_split(cores: int, copies: int, io_threads: int | None = None) -> tuple[int, int]:
    """``(torch threads, I/O threads)`` of each of ``copies`` GPU workers sharing ``cores``.

    Each copy's share of the cores its main threads leave: I/O threads load and decode (the
    given ``io_threads``, else the whole share), torch threads a quarter of it, at most
    ``CPU_THREADS_PER_WORKER``. More copies on the same cores: smaller shares.
    """
    copies = max(1, copies)
    budget = max(1, (cores - copies) // copies)
    return max(1, min(CPU_THREADS_PER_WORKER, budget // 4)), io_threads or budget


def _gpu_ordinals(
    resources: Resources, devices: Devices, skipped: list[tuple[int, str]]
) -> list[int]:
    if devices in ("auto", "cuda"):
        skipped += [(b.index, b.reason) for b in resources.advice.busy_gpus]
        return list(resources.advice.free_gpus)
    if isinstance(devices, int) and not isinstance(devices, bool) and devices >= 0:
        return [devices]
    if isinstance(devices, Sequence) and not isinstance(devices, str) and devices:
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in devices):
            raise ValueError(f"`devices` must hold GPU ordinals (ints), got {devices!r}")
        return list(devices)
    raise ValueError(
        f"`devices` must be 'auto', 'cpu', 'cuda', a GPU ordinal or a list of them, got {devices!r}"
    )


def _cpu_plan(cores: int, workers_per_device: int | str, io_threads: int | None) -> InferencePlan:
    notes: list[str] = []
    if workers_per_device == "auto":
        # As many processes as allowed, unless a few fewer (with more threads each) use more
        # cores: 12 cores give 6 x 2, not 8 x 1.
        cap = min(cores, MAX_CPU_WORKERS)
        candidates = range(max(1, cap // 2), cap + 1)
        processes = max(candidates, key=lambda p: (p * (cores // p), p))
    else:
        processes = int(workers_per_device)
        if processes > cores:
            notes.append(
                f"{processes} CPU workers on {cores} usable core(s): oversubscribed, "
                "expect each to run slower"
            )
    threads = max(1, cores // processes)
    # The items' load/preprocess share the same cores as the forward: one I/O thread overlaps
    # loading with compute without taking a core away from it.
    workers = tuple(WorkerSpec("cpu", "", threads, io_threads or 1) for _ in range(processes))
    return InferencePlan(workers, (), tuple(notes))


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _too_small(free: int | None, model_bytes: int, headroom_bytes: int) -> str:
    if free is None:
        return "free memory unknown"
    return (
        f"{format_bytes(free)} free < {format_bytes(model_bytes)} per worker + "
        f"{format_bytes(headroom_bytes)} headroom"
    )
