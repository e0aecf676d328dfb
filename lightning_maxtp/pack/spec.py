"""``JobSpec``: one independent job for ``maxtp pack`` (a command and what it declares it needs)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lightning_maxtp._checks import COUNT, refuse_bool

JOB_FIELDS = (
    "command",
    "name",
    "gpu_memory_gib",
    "cpu_threads",
    "memory_gib",
    "cwd",
    "env",
    "retries",
)
"""Fields a job may set, in a jobs file or as ``JobSpec`` arguments."""


@dataclass(frozen=True)
class JobSpec:
    """One independent job: a command and what it declares it needs.

    A string ``command`` runs through ``/bin/sh -c`` (pipes and redirections work); a sequence
    runs as an argument vector without a shell.
    """

    command: str | tuple[str, ...]
    """Shell command line, or an argument vector."""
    name: str | None = None
    """Label for logs and tables (default: ``job<N>``)."""
    gpu_memory_gib: float | None = None
    """GPU memory the job needs at its peak. ``None``: the job gets a GPU to itself."""
    cpu_threads: int | None = None
    """Threads the job may use (``OMP_NUM_THREADS`` and friends). ``None``: a fair share."""
    memory_gib: float | None = None
    """Host RAM the job needs at its peak; counted against available RAM. ``None``: not counted."""
    cwd: str | None = None
    """Working directory (default: the caller's)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment variables; they win over the ones pack sets."""
    retries: int = 0
    """Reruns of a job whose process was killed (SIGKILL or SIGTERM it did not send itself: the
    kernel's OOM killer, a preemption) or whose Ray node was lost. A job that exits with an
    error code is not rerun: it would fail again."""
    where: str = ""
    """Where the job was declared (``"jobs.json job 3"``), used in error messages."""

    def __post_init__(self) -> None:
        where = self.where or (f"job {self.name!r}" if self.name else "a job")
        if isinstance(self.command, str):
            if not self.command.strip():
                raise ValueError(f"{where}: `command` is empty; give the command line to run")
        elif isinstance(self.command, Sequence):
            argv = tuple(self.command)
            if not argv or not all(isinstance(a, str) for a in argv):
                raise ValueError(
                    f"{where}: `command` must be a non-empty string or list of strings, "
                    f"got {self.command!r}"
                )
            object.__setattr__(self, "command", argv)
        else:
            raise ValueError(
                f"{where}: `command` must be a string or a list of strings, got {self.command!r}"
            )
        for key in ("gpu_memory_gib", "memory_gib"):
            value = getattr(self, key)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or value <= 0
            ):
                raise ValueError(
                    f"{where}: `{key}` must be a number of GiB > 0, got {value!r}; "
                    f"e.g. {key}=12 for 12 GiB, or leave it out"
                )
        threads = self.cpu_threads
        if threads is not None and (
            isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
        ):
            raise ValueError(
                f"{where}: `cpu_threads` must be an integer >= 1, got {threads!r}; "
                "leave it out for a fair share of the CPUs"
            )
        retries = self.retries
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(
                f"{where}: `retries` must be an integer >= 0, got {retries!r}; e.g. retries=1 "
                "to rerun the job once if its process is killed or its node is lost"
            )
        if not isinstance(self.env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()
        ):
            raise ValueError(
                f"{where}: `env` must map names to strings, got {self.env!r}; "
                'quote numbers, e.g. {"SEED": "1"}'
            )
        object.__setattr__(self, "env", dict(self.env))
        if self.cwd is not None and not isinstance(self.cwd, str):
            raise ValueError(f"{where}: `cwd` must be a directory path string, got {self.cwd!r}")

    @property
    def shell(self) -> bool:
        """Whether the command runs through ``/bin/sh -c``."""
        return isinstance(self.command, str)

    @property
    def command_text(self) -> str:
        """The command as one line, for tables and logs."""
        import shlex

        return self.command if isinstance(self.command, str) else shlex.join(self.command)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view (the jobs-file form)."""
        return {
            "command": self.command if isinstance(self.command, str) else list(self.command),
            "name": self.name,
            "gpu_memory_gib": self.gpu_memory_gib,
            "cpu_threads": self.cpu_threads,
            "memory_gib": self.memory_gib,
            "cwd": self.cwd,
            "env": dict(self.env),
            "retries": self.retries,
        }

    def __str__(self) -> str:
        return f"{self.name or 'job'}: {self.command_text}"


def check_jobs(
    jobs: Sequence[JobSpec],
    default_gpu_memory_gib: float | None,
    default_cpu_threads: int | None,
) -> tuple[JobSpec, ...]:
    """The job list as a tuple, after the checks both backends make before planning.

    Raises:
        ValueError: No jobs, a name used twice (names name the logs), or a default out of range.
    """
    jobs = tuple(jobs)
    if not jobs:
        raise ValueError("`jobs` is empty; pass at least one JobSpec")
    refuse_bool("default_gpu_memory_gib", default_gpu_memory_gib, "GiB (a number > 0) or None", 8)
    refuse_bool("default_cpu_threads", default_cpu_threads, f"{COUNT} >= 1 or None", 2)
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
    return jobs
