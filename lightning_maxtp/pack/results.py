"""How the jobs of ``maxtp pack`` ended: ``JobResult``, ``PackResult``, and the text tables."""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lightning_maxtp._units import format_bytes

__all__ = ["JobResult", "PackResult", "gib_column", "not_run", "text_table"]


def gib_column(nbytes: int | None) -> str:
    """GiB with one decimal, without the unit (the column names it); ``-`` for none or 0."""
    return format_bytes(nbytes or None, unit="GiB", missing="-", suffix=False)


@dataclass(frozen=True)
class JobResult:
    """How one job ended."""

    name: str
    command: str
    status: str
    """``"ok"``, ``"failed"``, ``"oom"`` (failed with a GPU out-of-memory error), ``"lost"``
    (its Ray node or worker died and no retry was left), ``"stopped"`` (killed by ``fail_fast``
    or an interrupt) or ``"not_run"``."""
    exit_code: int | None
    """Exit code of the job's main process; ``-N`` when signal N ended it."""
    wall_s: float | None
    gpu: int | None
    """The GPU the job saw (its index on its node); ``None`` for a CPU job."""
    threads: int | None
    peak_rss_bytes: int | None
    """Largest resident memory of the job's process tree (sampled), in bytes."""
    log_path: str | None
    """The last attempt's log; earlier attempts' logs end in ``.retry<N>.log`` before it."""
    attempts: int = 1
    node: str | None = None
    """Host name of the machine the job ran on (its last attempt)."""
    earlier: tuple[str, ...] = ()
    """How each earlier attempt ended (``"killed by SIGKILL on node-a after 3.1 s"``), oldest
    first. Only the last attempt counts in the result."""

    @property
    def failed(self) -> bool:
        """Whether the job ran and did not exit 0."""
        return self.status in ("failed", "oom", "lost")

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
    backend: str = "local"
    """``"local"`` (this machine) or ``"ray"`` (a Ray cluster)."""

    @property
    def num_failed(self) -> int:
        """Jobs that ran and failed."""
        return sum(j.failed for j in self.jobs)

    @property
    def exit_code(self) -> int:
        """The CLI's exit code: 0 every job ok, 1 a job failed, 128 + signal when interrupted.

        Not the number of failed jobs: two failures would read as 2, which is argparse's code
        for bad arguments (``maxtp pack`` keeps 2 for those); ``num_failed`` has the count.
        """
        if self.interrupted is not None:
            return 128 + int(getattr(signal, self.interrupted, signal.SIGINT))
        return 1 if self.num_failed else 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view (the output of ``maxtp pack --json``)."""
        return {
            "jobs": [j.to_dict() for j in self.jobs],
            "wall_s": self.wall_s,
            "log_dir": self.log_dir,
            "backend": self.backend,
            "interrupted": self.interrupted,
            "num_failed": self.num_failed,
            "exit_code": self.exit_code,
        }

    def __str__(self) -> str:
        """The summary table: one row per job, then earlier attempts, then the totals."""
        on_nodes = self.backend != "local"
        rows = [
            [
                j.name,
                j.status,
                "-" if j.exit_code is None else str(j.exit_code),
                "-" if j.wall_s is None else f"{j.wall_s:.1f}",
                *([j.node or "-"] if on_nodes else []),
                "-" if j.gpu is None else str(j.gpu),
                format_bytes(
                    j.peak_rss_bytes or None, unit="MiB", digits=0, missing="-", suffix=False
                ),
                str(j.attempts),
                j.log_path or "-",
            ]
            for j in self.jobs
        ]
        header = ["job", "status", "exit", "wall s", *(["node"] if on_nodes else []), "gpu"]
        header += ["peak MiB", "tries", "log"]
        retried = [
            f"{j.name} attempt {n}: {how}"
            for j in self.jobs
            for n, how in enumerate(j.earlier, start=1)
        ]
        ok = sum(j.status == "ok" for j in self.jobs)
        tail = f"{ok}/{len(self.jobs)} ok, {self.num_failed} failed, {self.wall_s:.1f} s"
        if self.backend != "local":
            tail += f" on {self.backend}"
        if self.interrupted:
            tail += f", interrupted by {self.interrupted}"
        return "\n".join([*text_table(header, rows), *retried, tail])


def not_run(name: str, command: str, earlier: Sequence[str] = ()) -> JobResult:
    """The result of a job stopped before its turn (or before its next attempt started)."""
    return JobResult(
        name,
        command,
        status="not_run",
        exit_code=None,
        wall_s=None,
        gpu=None,
        threads=None,
        peak_rss_bytes=None,
        log_path=None,
        attempts=len(earlier),
        earlier=tuple(earlier),
    )


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows of left-aligned columns, the header first."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]
