"""``maxtp pack --backend ray``: each job one Ray task, on Ray's own scheduling and retries.

``run_ray_jobs`` is ``run_jobs(backend="ray")``; the task and the driver that follows it are in
``ray_task``, the resources each task asks for in ``ray_placement``, the cluster in
``ray_cluster``. Importing it does not import Ray.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_maxtp.pack.ray_placement import RayPlan
from lightning_maxtp.pack.results import PackResult
from lightning_maxtp.pack.runner import run_jobs
from lightning_maxtp.pack.spec import JobSpec

__all__ = ["run_ray_jobs"]


def run_ray_jobs(jobs: Sequence[JobSpec] | RayPlan, **options: Any) -> PackResult:
    """Run every job as a Ray task; return when all have ended (``run_jobs(backend="ray")``).

    ``lightning_maxtp`` must be importable on every node (installed there, as for
    ``BatchInferencePool(backend="ray")``); the jobs' commands and ``cwd`` are the nodes'. Each
    job is one ``ray.remote`` task asking for the resources ``plan_ray_pack`` gives it, its
    thread variables in ``runtime_env``, rerun by Ray (``max_retries``, ``retry_exceptions``)
    when its process is killed or its worker or node dies, up to its ``retries``.

    ``options`` are ``run_jobs``'s (``address``, ``log_dir``, ``fail_fast``, ``retry_oom``,
    ``progress``, ``status_line``, ``poll_interval_s``) and ``plan_ray_pack``'s
    (``gpu_size_gib``, ``default_gpu_memory_gib``, ``default_cpu_threads``), with
    ``max_parallel``: the most tasks submitted at once (default: all; Ray queues what does not
    fit). With ``progress``, a Ray instance started here also shows the jobs' output as they
    run (Ray's driver logging).

    Args:
        jobs: The jobs, or a plan from ``plan_ray_pack``.
        **options: See above.

    Returns:
        Every job's result, as the local backend gives it, with ``backend="ray"``.

    Raises:
        ImportError: Without Ray installed (the ``[ray]`` extra).
        ValueError: For bad input or a job no node can hold, before anything starts.
    """
    return run_jobs(jobs, backend="ray", **options)
