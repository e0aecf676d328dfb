"""The pure placement planner of ``maxtp pack``: which job starts where, and what waits (why).

Plain data in and out, no processes: ``capacity_from_resources`` turns the probe's ``Resources``
into a ``Capacity``; ``resolve_demands`` turns job specs into ``Demand``s (rejecting a job no GPU
can ever hold); ``assign`` decides, given what runs now, which pending jobs start and where. The
runner calls ``assign`` again each time a job ends, so the machine stays busy.

Rules: one job per free GPU first (least-loaded GPU wins), then jobs co-located on a GPU while
their declared memory fits in its free memory minus one headroom; a job without a declared
memory gets a GPU to itself; GPUs with foreign processes are never used. Without GPUs, jobs share
the CPU budget: the sum of their threads stays within the usable CPUs. Declared RAM is summed
against available RAM. A job alone always starts (a too-large thread count is not an error).
Later jobs may start before an earlier one that waits (backfill): a job waiting for a whole GPU
can be delayed by smaller jobs behind it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lightning_maxtp._checks import COUNT, refuse_bool
from lightning_maxtp._units import GIB, format_bytes
from lightning_maxtp.pack.spec import JobSpec
from lightning_maxtp.resources.gpus import child_visible_id
from lightning_maxtp.resources.probe import DEFAULT_HEADROOM_BYTES, BusyGpu, Resources

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
"""Read by torch (OpenMP, MKL) and NumPy's BLAS at start-up; torch has no variable of its own."""


def job_env(threads: int, visible_gpus: str) -> dict[str, str]:
    """The variables a job gets: its thread count, and the GPUs it may see.

    An empty ``visible_gpus`` hides every GPU, so a CPU share cannot grab one by accident.
    """
    return {**dict.fromkeys(THREAD_VARIABLES, str(threads)), "CUDA_VISIBLE_DEVICES": visible_gpus}


@dataclass(frozen=True)
class GpuSlot:
    """A free GPU jobs may use."""

    index: int
    """CUDA ordinal in this process."""
    visible_id: str
    """What a child's ``CUDA_VISIBLE_DEVICES`` must say to see this GPU."""
    name: str | None
    usable_bytes: int
    """Free memory minus the headroom: what jobs on this GPU may declare in total."""


@dataclass(frozen=True)
class Capacity:
    """What jobs may share: free GPUs, the CPU thread budget, available RAM."""

    gpus: tuple[GpuSlot, ...]
    skipped_gpus: tuple[BusyGpu, ...]
    cpu_threads: int
    ram_bytes: int | None
    max_parallel: int | None = None
    headroom_bytes: int = DEFAULT_HEADROOM_BYTES

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "gpus": [vars(g).copy() for g in self.gpus],
            "skipped_gpus": [vars(b).copy() for b in self.skipped_gpus],
            "cpu_threads": self.cpu_threads,
            "ram_bytes": self.ram_bytes,
            "max_parallel": self.max_parallel,
            "headroom_bytes": self.headroom_bytes,
        }


@dataclass(frozen=True)
class Demand:
    """What one job needs, with the defaults filled in."""

    job: int
    """Position in the job list."""
    name: str
    gpu_bytes: int | None
    """Declared GPU memory; ``None`` on a GPU host means a whole GPU."""
    threads: int
    ram_bytes: int
    alone: bool = False
    """Run with nothing else on its GPU (or host): the OOM retry."""


@dataclass(frozen=True)
class Placement:
    """A job started (or to start) on a GPU or a CPU share."""

    demand: Demand
    gpu: GpuSlot | None

    def env(self) -> dict[str, str]:
        """Variables set for the job: its GPU and its thread count."""
        return job_env(self.demand.threads, self.gpu.visible_id if self.gpu is not None else "")


@dataclass(frozen=True)
class Wait:
    """A job that cannot start now, and why."""

    job: int
    name: str
    reason: str


@dataclass(frozen=True)
class Step:
    """One round of ``assign``: jobs that start now and jobs that wait."""

    starts: tuple[Placement, ...]
    waits: tuple[Wait, ...]


def capacity_from_resources(
    resources: Resources,
    *,
    headroom_bytes: int = DEFAULT_HEADROOM_BYTES,
    max_parallel: int | None = None,
) -> Capacity:
    """The shareable budget of a probed machine (pure).

    The CPU thread budget is the usable CPU count, or ``max_parallel`` when that is larger: a
    user who asks for more jobs than CPUs gets them, with one thread each.

    Raises:
        ValueError: If ``headroom_bytes`` < 0, ``max_parallel`` < 1, or the machine has GPUs but
            every one is busy with foreign processes.
    """
    refuse_bool("headroom_bytes", headroom_bytes, f"{COUNT} of bytes >= 0", 2 * GIB)
    refuse_bool("max_parallel", max_parallel, f"{COUNT} >= 1 or None", 4)
    if headroom_bytes < 0:
        raise ValueError(f"`headroom_bytes` must be >= 0, got {headroom_bytes!r}")
    if max_parallel is not None and max_parallel < 1:
        raise ValueError(f"`max_parallel` must be None or >= 1, got {max_parallel!r}")
    free = set(resources.advice.free_gpus)
    slots = tuple(
        GpuSlot(
            index=g.index,
            visible_id=child_visible_id(g.index, resources.cuda_visible_devices),
            name=g.name,
            usable_bytes=max(0, (g.memory_free_bytes or 0) - headroom_bytes),
        )
        for g in resources.gpus
        if g.index in free
    )
    if resources.gpus and not slots:
        reasons = "; ".join(f"GPU {b.index}: {b.reason}" for b in resources.advice.busy_gpus)
        raise ValueError(
            f"no free GPU to pack jobs on ({reasons}); wait for them, or run the jobs on the "
            'CPU with CUDA_VISIBLE_DEVICES=""'
        )
    return Capacity(
        gpus=slots,
        skipped_gpus=resources.advice.busy_gpus,
        # An explicit max_parallel above the CPU count oversubscribes on purpose (I/O-bound jobs).
        cpu_threads=max(1, resources.cpu.effective, max_parallel or 0),
        ram_bytes=resources.memory.effective_available_bytes,
        max_parallel=max_parallel,
        headroom_bytes=headroom_bytes,
    )


def resolve_demands(
    jobs: Sequence[JobSpec],
    capacity: Capacity,
    *,
    default_gpu_memory_gib: float | None = None,
    default_cpu_threads: int | None = None,
) -> tuple[Demand, ...]:
    """Each job's needs with defaults filled in; threads default to a fair share of the CPUs.

    Raises:
        ValueError: If a job declares more GPU memory than any free GPU offers, or more RAM than
            is available.
    """
    names = [job.name or f"job{i + 1}" for i, job in enumerate(jobs)]
    largest = max(capacity.gpus, key=lambda g: g.usable_bytes, default=None)
    gpu_bytes: list[int | None] = []
    for job, name in zip(jobs, names, strict=True):
        gib = job.gpu_memory_gib if job.gpu_memory_gib is not None else default_gpu_memory_gib
        need = int(gib * GIB) if gib is not None and capacity.gpus else None
        if need is not None and largest is not None and need > largest.usable_bytes:
            raise ValueError(
                f"{job.where or f'job {name!r}'}: `gpu_memory_gib` = {gib:g} is more than any "
                f"free GPU offers (largest: GPU {largest.index}, "
                f"{format_bytes(largest.usable_bytes + capacity.headroom_bytes)} free - "
                f"{format_bytes(capacity.headroom_bytes)} headroom = "
                f"{format_bytes(largest.usable_bytes)}); lower it, shrink the job, or lower "
                "the headroom"
            )
        ram = job.memory_gib
        if ram is not None and capacity.ram_bytes is not None and ram * GIB > capacity.ram_bytes:
            raise ValueError(
                f"{job.where or f'job {name!r}'}: `memory_gib` = {ram:g} is more than the "
                f"{format_bytes(capacity.ram_bytes)} of RAM available; lower it or free memory"
            )
        gpu_bytes.append(need)
    threads = default_cpu_threads or max(
        1, capacity.cpu_threads // _concurrency(gpu_bytes, capacity)
    )
    return tuple(
        Demand(
            job=i,
            name=name,
            gpu_bytes=gpu_bytes[i],
            threads=job.cpu_threads or threads,
            ram_bytes=int((job.memory_gib or 0) * GIB),
        )
        for i, (job, name) in enumerate(zip(jobs, names, strict=True))
    )


def _concurrency(gpu_bytes: Sequence[int | None], capacity: Capacity) -> int:
    """How many jobs may run at once, to size each one's default share of the CPUs."""
    n = len(gpu_bytes)
    if capacity.gpus:
        step = assign(
            [Demand(i, "", b, threads=1, ram_bytes=0) for i, b in enumerate(gpu_bytes)],
            capacity,
            (),
        )
        n = len(step.starts)
    else:
        n = min(n, capacity.cpu_threads)
    if capacity.max_parallel is not None:
        n = min(n, capacity.max_parallel)
    return max(1, n)


def assign(pending: Sequence[Demand], capacity: Capacity, running: Sequence[Placement]) -> Step:
    """Which pending jobs start now, and where; the others wait, each with its reason (pure).

    Args:
        pending: Jobs not started yet, in priority order.
        capacity: The machine's shareable budget.
        running: Placements of the jobs running now.
    """
    placed = list(running)
    starts: list[Placement] = []
    waits: list[Wait] = []
    for demand in pending:
        reason = _common_block(demand, capacity, placed)
        slot: GpuSlot | None = None
        if reason is None and capacity.gpus:
            slot, reason = _pick_gpu(demand, capacity, placed)
        if reason is not None:
            waits.append(Wait(demand.job, demand.name, reason))
            continue
        placement = Placement(demand, slot)
        placed.append(placement)
        starts.append(placement)
    return Step(tuple(starts), tuple(waits))


def _common_block(demand: Demand, capacity: Capacity, placed: Sequence[Placement]) -> str | None:
    if not placed:
        return None
    if capacity.max_parallel is not None and len(placed) >= capacity.max_parallel:
        return f"{len(placed)} jobs running, the most allowed (max_parallel)"
    if capacity.ram_bytes is not None and demand.ram_bytes:
        used = sum(p.demand.ram_bytes for p in placed)
        if used + demand.ram_bytes > capacity.ram_bytes:
            return (
                f"needs {format_bytes(demand.ram_bytes)} RAM, "
                f"{format_bytes(max(0, capacity.ram_bytes - used))} of the budget left"
            )
    if capacity.gpus:
        return None
    if demand.alone:
        return "retry runs alone: waiting for the running jobs to end"
    if any(p.demand.alone for p in placed):
        return "a retry is running alone"
    used = sum(p.demand.threads for p in placed)
    if used + demand.threads > capacity.cpu_threads:
        return (
            f"needs {demand.threads} CPU thread(s), "
            f"{max(0, capacity.cpu_threads - used)} of {capacity.cpu_threads} left"
        )
    return None


def _pick_gpu(
    demand: Demand, capacity: Capacity, placed: Sequence[Placement]
) -> tuple[GpuSlot | None, str | None]:
    fits: list[tuple[int, int, int, GpuSlot]] = []
    best_left = -1
    for gpu in capacity.gpus:
        here = [p.demand for p in placed if p.gpu is not None and p.gpu.index == gpu.index]
        if here and (demand.alone or demand.gpu_bytes is None):
            continue
        if any(d.alone or d.gpu_bytes is None for d in here):
            continue
        left = gpu.usable_bytes - sum(d.gpu_bytes or 0 for d in here)
        best_left = max(best_left, left)
        if demand.gpu_bytes is None or demand.gpu_bytes <= left:
            fits.append((len(here), -left, gpu.index, gpu))
    if fits:
        return min(fits)[3], None
    if demand.gpu_bytes is None or demand.alone:
        what = "a whole GPU" if demand.gpu_bytes is None else "its GPU alone (OOM retry)"
        return None, f"needs {what}; every free GPU has jobs on it"
    if best_left < 0:
        return None, "every free GPU is held by a job that needs it whole"
    return None, (
        f"needs {format_bytes(demand.gpu_bytes)} GPU memory, "
        f"at most {format_bytes(best_left)} left on a GPU"
    )
