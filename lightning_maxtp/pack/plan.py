"""Where each job of ``maxtp pack`` starts first, and what waits: ``plan_pack(jobs) -> PackPlan``.

Starts nothing. The placement rules are in ``placement`` (pure); this module gathers the
capacity from the probe and the jobs' declared needs and gives the first round as plain data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lightning_maxtp.pack.placement import (
    Capacity,
    Demand,
    Step,
    assign,
    capacity_from_resources,
    resolve_demands,
)
from lightning_maxtp.pack.results import gib_column, text_table
from lightning_maxtp.pack.spec import JobSpec, check_jobs
from lightning_maxtp.resources.probe import DEFAULT_HEADROOM_BYTES, Resources, inspect_resources

__all__ = ["PackPlan", "plan_pack"]


@dataclass(frozen=True)
class PackPlan:
    """Where each job starts first, and what waits (the first round of placement)."""

    jobs: tuple[JobSpec, ...]
    capacity: Capacity
    demands: tuple[Demand, ...]
    first: Step

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "capacity": self.capacity.to_dict(),
            "jobs": [
                {**dataclasses.asdict(d), "command": j.command_text}
                for j, d in zip(self.jobs, self.demands, strict=True)
            ],
            "starts": [
                {"job": p.demand.name, "gpu": p.gpu.index if p.gpu else None, "env": p.env()}
                for p in self.first.starts
            ],
            "waits": [{"job": w.name, "reason": w.reason} for w in self.first.waits],
        }

    def __str__(self) -> str:
        """Each job, where it starts (or why it waits), its threads and declared memory."""
        cap = self.capacity
        if cap.gpus:
            where = ", ".join(
                f"GPU {g.index} ({gib_column(g.usable_bytes)} GiB usable)" for g in cap.gpus
            )
        else:
            where = f"CPU only, {cap.cpu_threads} threads"
        lines = [f"pack plan: {len(self.jobs)} jobs on {where}"]
        lines += [f"skipped GPU {b.index}: {b.reason}" for b in cap.skipped_gpus]
        starts = {p.demand.job: p for p in self.first.starts}
        waits = {w.job: w.reason for w in self.first.waits}
        rows = []
        for job, demand in zip(self.jobs, self.demands, strict=True):
            placement = starts.get(demand.job)
            if placement is None:
                state = f"waits: {waits.get(demand.job, '?')}"
            elif placement.gpu is not None:
                state = f"starts on GPU {placement.gpu.index}"
            else:
                state = "starts on CPU"
            gpu_mem = gib_column(demand.gpu_bytes) if demand.gpu_bytes or not cap.gpus else "whole"
            rows.append(
                [
                    demand.name,
                    state,
                    str(demand.threads),
                    gpu_mem,
                    gib_column(demand.ram_bytes),
                    job.command_text[:60],
                ]
            )
        header = ["job", "first round", "threads", "gpu GiB", "ram GiB", "command"]
        return "\n".join([*lines, *text_table(header, rows)])


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
    jobs = check_jobs(jobs, default_gpu_memory_gib, default_cpu_threads)
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
