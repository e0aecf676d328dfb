"""Plain results of ``maxtp pack``: ``PackPlan``, ``JobResult``, ``PackResult``."""

from __future__ import annotations

import dataclasses
import signal
from dataclasses import dataclass
from typing import Any

from lightning_maxtp._job_spec import JobSpec
from lightning_maxtp._pack_format import format_plan, format_result
from lightning_maxtp._placement import Capacity, Demand, Step


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
        return format_plan(self)


@dataclass(frozen=True)
class JobResult:
    """How one job ended."""

    name: str
    command: str
    status: str
    """``"ok"``, ``"failed"``, ``"oom"`` (failed with a GPU out-of-memory error), ``"stopped"``
    (killed by ``fail_fast`` or an interrupt) or ``"not_run"``."""
    exit_code: int | None
    """Exit code of the job's main process; ``-N`` when signal N ended it."""
    wall_s: float | None
    gpu: int | None
    threads: int | None
    peak_rss_bytes: int | None
    """Largest resident memory of the job's process tree (sampled), in bytes."""
    log_path: str | None
    attempts: int = 1

    @property
    def failed(self) -> bool:
        """Whether the job ran and did not exit 0."""
        return self.status in ("failed", "oom")

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class PackResult:
    """Every job's outcome, in job order."""

    jobs: tuple[JobResult, ...]
    wall_s: float
    log_dir: str
    interrupted: str | None = None
    """Name of the signal that stopped the run (``"SIGINT"``), or ``None``."""

    @property
    def num_failed(self) -> int:
        """Jobs that ran and failed."""
        return sum(j.failed for j in self.jobs)

    @property
    def exit_code(self) -> int:
        """The CLI's exit code: failed jobs (at most 125); 128 + signal when interrupted."""
        if self.interrupted is not None:
            return 128 + int(getattr(signal, self.interrupted, signal.SIGINT))
        return min(self.num_failed, 125)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view (the output of ``maxtp pack --json``)."""
        return {
            "jobs": [j.to_dict() for j in self.jobs],
            "wall_s": self.wall_s,
            "log_dir": self.log_dir,
            "interrupted": self.interrupted,
            "num_failed": self.num_failed,
            "exit_code": self.exit_code,
        }

    def __str__(self) -> str:
        return format_result(self)
