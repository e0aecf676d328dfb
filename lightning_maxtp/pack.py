"""``maxtp pack`` as a Python API: independent jobs run concurrently, one or more per free GPU.

``plan_pack(jobs)`` says where each job would start and what would wait (no process started);
``run_jobs(jobs)`` runs them all, keeps the machine busy as jobs end, writes each job's output to
its own log, and returns a ``PackResult`` (exit code, wall time, GPU, peak RSS per job). A failed
job does not stop the others unless ``fail_fast``; Ctrl-C or SIGTERM stops every job's process
group before returning. Placement rules: ``lightning_maxtp/_placement.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from lightning_maxtp._job_spec import JobSpec
from lightning_maxtp._jobs_file import load_jobs, parse_jobs
from lightning_maxtp._pack_run import default_log_dir, execute
from lightning_maxtp._pack_types import JobResult, PackPlan, PackResult
from lightning_maxtp._placement import assign, capacity_from_resources, resolve_demands
from lightning_maxtp.resources import DEFAULT_HEADROOM_BYTES, Resources, inspect_resources

__all__ = [
    "JobResult",
    "JobSpec",
    "PackPlan",
    "PackResult",
    "load_jobs",
    "parse_jobs",
    "plan_pack",
    "run_jobs",
]


def plan_pack(
    jobs: Sequence[JobSpec],
    *,
    resources: Resources | None = None,
    max_parallel: int | None = None,
    default_gpu_memory_gib: float | None = None,
    default_cpu_threads: int | None = None,
    headroom_bytes: int = DEFAULT_HEADROOM_BYTES,
) -> PackPlan:
    """Where each job would start and what would wait; starts nothing.

    Args:
        jobs: The jobs, in priority order.
        resources: The machine (default: ``inspect_resources()``).
        max_parallel: Most jobs running at once (default: as many as fit).
        default_gpu_memory_gib: GPU memory of a job that declares none (default: a whole GPU).
        default_cpu_threads: Threads of a job that declares none (default: a fair share).
        headroom_bytes: GPU memory left free on each GPU.

    Raises:
        ValueError: If there are no jobs, a job asks for more GPU memory than any free GPU has,
            or the machine's GPUs are all busy.
    """
    jobs = tuple(jobs)
    if not jobs:
        raise ValueError("`jobs` is empty; pass at least one JobSpec")
    if default_gpu_memory_gib is not None and default_gpu_memory_gib <= 0:
        raise ValueError(
            f"`default_gpu_memory_gib` must be > 0, got {default_gpu_memory_gib!r}; "
            "or None for a whole GPU per job"
        )
    if default_cpu_threads is not None and default_cpu_threads < 1:
        raise ValueError(f"`default_cpu_threads` must be >= 1, got {default_cpu_threads!r}")
    names = [j.name for j in jobs if j.name]
    if len(set(names)) != len(names):
        raise ValueError(f"job names must be unique (they name the logs), got {names!r}")
    resources = resources if resources is not None else inspect_resources()
    capacity = capacity_from_resources(
        resources, headroom_bytes=headroom_bytes, max_parallel=max_parallel
    )
    demands = resolve_demands(
        jobs,
        capacity,
        default_gpu_memory_gib=default_gpu_memory_gib,
        default_cpu_threads=default_cpu_threads,
    )
    return PackPlan(jobs, capacity, demands, assign(demands, capacity, ()))


def run_jobs(
    jobs: Sequence[JobSpec] | PackPlan,
    *,
    log_dir: str | Path | None = None,
    fail_fast: bool = False,
    retry_oom: bool = False,
    progress: IO[str] | None = None,
    status_line: bool = False,
    poll_interval_s: float = 0.1,
    **plan_kwargs: Any,
) -> PackResult:
    """Run every job, as many at once as the machine holds; return when all have ended.

    Args:
        jobs: The jobs (or a plan from ``plan_pack``).
        log_dir: Folder for the logs, one per job (default: ``maxtp-pack-logs/<time>``).
        fail_fast: Stop every job at the first failure.
        retry_oom: Run a job that failed with a GPU out-of-memory error once more, alone.
        progress: Stream for one line per job start and end (e.g. ``sys.stderr``).
        status_line: Also write a live status line (running/queued/done, per-GPU use).
        poll_interval_s: Seconds between checks of the running jobs.
        **plan_kwargs: Passed to ``plan_pack``.

    Returns:
        Every job's result. After SIGINT or SIGTERM the jobs are stopped and the result says so
        (``interrupted``) instead of the signal propagating.
    """
    plan = jobs if isinstance(jobs, PackPlan) else plan_pack(jobs, **plan_kwargs)
    folder = Path(log_dir) if log_dir is not None else default_log_dir()
    return execute(
        plan,
        folder,
        fail_fast=fail_fast,
        retry_oom=retry_oom,
        progress=progress,
        status_line=status_line,
        poll_interval_s=poll_interval_s,
    )
