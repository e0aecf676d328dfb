"""What ``maxtp pack`` shows and records while it runs, on either backend.

``Progress`` writes the event lines and the live status line; ``Book`` is the one results path
both runners share: each job's attempts and their logs, how earlier attempts ended, its result.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO

from lightning_maxtp._log import prefixed
from lightning_maxtp.pack.results import JobResult, PackResult, not_run
from lightning_maxtp.pack.spec import JobSpec

__all__ = ["Book", "Progress", "counts_text", "default_log_dir"]

log = logging.getLogger(__name__)


def default_log_dir() -> Path:
    """``maxtp-pack-logs/<date-time>-<pid>`` under the current directory."""
    return Path("maxtp-pack-logs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def counts_text(running: int, queued: int, done: Iterable[JobResult], elapsed_s: float) -> str:
    """``[maxtp pack 12s] 2 running, 1 queued, 3 done (0 failed)``: the status line's head."""
    finished = list(done)
    failed = sum(j.failed for j in finished)
    return (
        f"[maxtp pack {elapsed_s:.0f}s] {running} running, {queued} queued, "
        f"{len(finished)} done ({failed} failed)"
    )


class Progress:
    """One line per event (job start, end, retry) and a live status line, on ``stream``.

    On a terminal the status line is rewritten in place; elsewhere a new one is written only
    when its counts change, so a log file does not fill with them.
    """

    def __init__(self, stream: IO[str] | None, *, status_line: bool) -> None:
        self.stream, self.status_line = stream, status_line
        self._tty = stream is not None and stream.isatty()
        self._last_counts = ""

    def event(self, text: str) -> None:
        """Log ``text`` and write it as its own line."""
        log.info(prefixed("pack: %s"), text)
        if self.stream is not None:
            clear = "\r\x1b[K" if self.status_line and self._tty else ""
            self.stream.write(f"{clear}[maxtp pack] {text}\n")
            self.stream.flush()

    def status(self, text: str) -> None:
        """Show the status line ``[maxtp pack 12s] counts | where``."""
        if not (self.status_line and self.stream is not None):
            return
        if self._tty:
            self.stream.write(f"\r\x1b[K{text}")
        else:
            counts = text.split("]", 1)[1]
            if counts != self._last_counts:
                self.stream.write(f"{text}\n")
            self._last_counts = counts
        self.stream.flush()

    def close(self) -> None:
        """End the status line on a terminal."""
        if self.status_line and self._tty and self.stream is not None:
            self.stream.write("\n")


class Book:
    """What a run records, the same on both backends: attempts, logs, earlier ends, results.

    ``interrupted`` is where ``signals.Signals`` writes the signal that stops the run.
    """

    def __init__(
        self,
        jobs: Sequence[JobSpec],
        names: Sequence[str],
        folder: Path,
        progress: Progress,
        backend: str,
    ) -> None:
        self.jobs, self.names, self.folder = tuple(jobs), tuple(names), folder
        self.progress, self.backend = progress, backend
        self.attempts: dict[int, int] = {}
        self.earlier: dict[int, list[str]] = {}
        self.results: dict[int, JobResult] = {}
        self.interrupted: str | None = None
        self.started = time.monotonic()

    def next_attempt(self, job: int, **header: str) -> tuple[int, Path, str]:
        """Count a new attempt of ``job``: its number, its log's path and the log's header.

        The log is ``<folder>/03-name.log`` for a job's first attempt, ``03-name.retry1.log``
        for the next; its header is ``# ...`` lines (the job's own output follows).
        """
        number = self.attempts[job] = self.attempts.get(job, 0) + 1
        name = self.names[job]
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:60] or "job"
        suffix = "" if number == 1 else f".retry{number - 1}"
        path = self.folder / f"{job + 1:02d}-{safe}{suffix}.log"
        lines = [
            f"maxtp pack: {name} (attempt {number})",
            f"command: {self.jobs[job].command_text}",
        ]
        lines += [f"{key}: {value}" for key, value in header.items()]
        return number, path, "".join(f"# {line}\n" for line in lines)

    def again(self, job: int, how: str, log_path: Path | None) -> None:
        """Record how an attempt ended that runs again (``how``: ``"killed by SIGKILL ..."``)."""
        self.earlier.setdefault(job, []).append(how)
        kept = f" ({log_path} kept)" if log_path is not None else ""
        self.progress.event(f"{self.names[job]} {how}: running it again{kept}")

    def finish(
        self,
        job: int,
        *,
        status: str,
        code: int | None,
        wall_s: float,
        log_path: Path,
        node: str | None,
        gpu: int | None,
        threads: int,
        peak_rss_bytes: int | None,
    ) -> None:
        """Record ``job``'s result (its last attempt) and say so."""
        self.results[job] = JobResult(
            name=self.names[job],
            command=self.jobs[job].command_text,
            status=status,
            exit_code=code,
            wall_s=round(wall_s, 3),
            gpu=gpu,
            threads=threads,
            peak_rss_bytes=peak_rss_bytes,
            log_path=str(log_path),
            attempts=self.attempts.get(job, 1),
            node=node,
            earlier=tuple(self.earlier.get(job, ())),
        )
        self.progress.event(f"{status:<6} {self.names[job]}: exit {code} after {wall_s:.1f} s")

    def drive(
        self,
        collect: Callable[[], bool],
        advance: Callable[[], None],
        stop: Callable[[], None],
        *,
        fail_fast: bool,
    ) -> None:
        """A runner's loop, the same on both backends.

        ``collect`` takes the jobs that ended (and says whether any job is left), ``advance``
        starts more; until no job is left, a signal came, or (``fail_fast``) a job failed. Then
        ``stop`` stops every job still running, whatever ended the loop.
        """
        try:
            while collect() and self.interrupted is None:
                if fail_fast and any(r.failed for r in self.results.values()):
                    self.progress.event("a job failed and fail_fast is set: stopping the others")
                    break
                advance()
        except KeyboardInterrupt:  # Ctrl-C outside our handler's reach
            self.interrupted = self.interrupted or "SIGINT"
        finally:
            if self.interrupted is not None:
                self.progress.event(f"{self.interrupted}: stopping every job")
            stop()
            self.progress.close()

    def result(self) -> PackResult:
        """Every job's result in job order; a job that never ended is ``not_run``."""
        jobs = tuple(
            self.results.get(i) or not_run(name, job.command_text, self.earlier.get(i, ()))
            for i, (job, name) in enumerate(zip(self.jobs, self.names, strict=True))
        )
        return PackResult(
            jobs=jobs,
            wall_s=round(time.monotonic() - self.started, 3),
            log_dir=str(self.folder),
            interrupted=self.interrupted,
            backend=self.backend,
        )
