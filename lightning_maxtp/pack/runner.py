"""``run_jobs``: run every job of ``maxtp pack``, starting jobs as capacity frees up.

Each job writes its output to its own log; a failed job does not stop the others unless
``fail_fast``; Ctrl-C or SIGTERM stops every job's process group before returning.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from lightning_maxtp._log import prefixed
from lightning_maxtp.pack import proc
from lightning_maxtp.pack.placement import Demand, Placement, Step, assign
from lightning_maxtp.pack.plan import PackPlan, plan_pack
from lightning_maxtp.pack.results import JobResult, PackResult, gib_column
from lightning_maxtp.pack.spec import JobSpec

__all__ = ["default_log_dir", "run_jobs"]

log = logging.getLogger(__name__)
_SAMPLE_INTERVAL_S = 0.5
"""Seconds between RSS samples of a job's tree (a psutil tree walk scans every process)."""


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
    folder.mkdir(parents=True, exist_ok=True)
    run = _Run(
        plan,
        folder,
        fail_fast=fail_fast,
        retry_oom=retry_oom,
        progress=progress,
        status_line=status_line,
    )
    with _signals_stop(run):
        run.loop(poll_interval_s)
    return run.result()


class _Stop(BaseException):
    """Raised by our signal handler in the main thread."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _signals_stop(run: _Run) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        if run.interrupted is None:  # a second Ctrl-C must not break the cleanup
            run.interrupted = signal.Signals(signum).name
            raise _Stop(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    stops = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)


def default_log_dir() -> Path:
    """``maxtp-pack-logs/<date-time>-<pid>`` under the current directory."""
    return Path("maxtp-pack-logs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


class _Run:
    """The runner's mutable state (one call of ``run_jobs``)."""

    def __init__(
        self,
        plan: PackPlan,
        folder: Path,
        *,
        fail_fast: bool,
        retry_oom: bool,
        progress: IO[str] | None,
        status_line: bool,
    ) -> None:
        self.plan, self.folder = plan, folder
        self.fail_fast, self.retry_oom = fail_fast, retry_oom
        self.progress, self.status_line = progress, status_line
        self.pending: list[Demand] = list(plan.demands)
        self.running: dict[int, tuple[Placement, proc.Child]] = {}
        self.results: dict[int, JobResult] = {}
        self.attempts: dict[int, int] = {}
        self.interrupted: str | None = None
        self.started = time.monotonic()
        self._last_status = ""

    def loop(self, poll_interval_s: float) -> None:
        try:
            while self.pending or self.running:
                self._reap()
                if self.fail_fast and any(r.failed for r in self.results.values()):
                    self._event("a job failed and fail_fast is set: stopping the others")
                    break
                self._start(assign(self.pending, self.plan.capacity, self._placed()))
                self._status()
                time.sleep(poll_interval_s)
        except (_Stop, KeyboardInterrupt):
            self.interrupted = self.interrupted or "SIGINT"
            self._event(f"{self.interrupted}: stopping every job")
        finally:
            self._stop_all()
            if self.status_line and self.progress is not None and self.progress.isatty():
                self.progress.write("\n")

    def _placed(self) -> list[Placement]:
        return [placement for placement, _ in self.running.values()]

    def _start(self, step: Step) -> None:
        for placement in step.starts:
            demand = placement.demand
            job = self.plan.jobs[demand.job]
            self.pending.remove(demand)
            attempt = self.attempts[demand.job] = self.attempts.get(demand.job, 0) + 1
            env = placement.env()
            suffix = "" if attempt == 1 else f".retry{attempt - 1}"
            path = self.folder / f"{demand.job + 1:02d}-{_safe(demand.name)}{suffix}.log"
            header = (
                f"# maxtp pack: {demand.name} (attempt {attempt})\n# command: {job.command_text}"
                f"\n# env: {' '.join(f'{k}={v}' for k, v in env.items())}\n"
            )
            try:
                with _signals_deferred():  # a child started but not recorded would be orphaned
                    child = proc.start(job, env, path, header)
                    self.running[demand.job] = (placement, child)
            except OSError as err:
                path.write_text(f"{header}# could not start: {err}\n")
                self._finish(
                    placement=placement, child=None, code=127, status="failed", path=path, wall=0.0
                )
                continue
            where = f"GPU {placement.gpu.index}" if placement.gpu else "CPU"
            self._event(f"start {demand.name} on {where} ({demand.threads} threads) -> {path}")

    def _reap(self) -> None:
        """Collect ended jobs: record them, or queue an OOM retry."""
        now = time.monotonic()
        for job, (placement, child) in list(self.running.items()):
            if now - child.sampled >= _SAMPLE_INTERVAL_S:
                proc.sample(child)
                child.sampled = now
            with _signals_deferred():  # a reaped job must reach the results
                code = proc.reap(child)
                if code is None:
                    continue
                del self.running[job]
                oom = code != 0 and proc.log_shows_oom(child)
                if oom and self.retry_oom and self.attempts[job] == 1:
                    self.pending.insert(0, dataclasses.replace(placement.demand, alone=True))
                    self._event(f"{placement.demand.name} ran out of GPU memory: retrying alone")
                    continue
                self._finish(
                    placement=placement,
                    child=child,
                    code=code,
                    status="ok" if code == 0 else "oom" if oom else "failed",
                    path=child.log_path,
                    wall=now - child.started,
                )

    def _finish(
        self,
        *,
        placement: Placement,
        child: proc.Child | None,
        code: int | None,
        status: str,
        path: Path,
        wall: float,
    ) -> None:
        demand = placement.demand
        self.results[demand.job] = JobResult(
            name=demand.name,
            command=self.plan.jobs[demand.job].command_text,
            status=status,
            exit_code=code,
            wall_s=round(wall, 3),
            gpu=placement.gpu.index if placement.gpu else None,
            threads=demand.threads,
            peak_rss_bytes=(child.peak_rss_bytes or None) if child is not None else None,
            log_path=str(path),
            attempts=self.attempts.get(demand.job, 1),
        )
        self._event(f"{status:<6} {demand.name}: exit {code} after {wall:.1f} s")

    def _stop_all(self) -> None:
        for placement, child in list(self.running.values()):
            proc.kill(child)
            wall = time.monotonic() - child.started
            self._finish(
                placement=placement,
                child=child,
                code=child.popen.returncode,
                status="stopped",
                path=child.log_path,
                wall=wall,
            )
        self.running.clear()

    def _event(self, text: str) -> None:
        log.info(prefixed("pack: %s"), text)
        if self.progress is not None:
            clear = "\r\x1b[K" if self.status_line and self.progress.isatty() else ""
            self.progress.write(f"{clear}[maxtp pack] {text}\n")
            self.progress.flush()

    def _status(self) -> None:
        if not (self.status_line and self.progress is not None):
            return
        text = status_text(
            self.plan,
            self._placed(),
            len(self.pending),
            self.results.values(),
            time.monotonic() - self.started,
        )
        if self.progress.isatty():
            self.progress.write(f"\r\x1b[K{text}")
        else:
            counts = text.split("]", 1)[1]  # a new line only when the counts change
            if counts != self._last_status:
                self.progress.write(f"{text}\n")
            self._last_status = counts
        self.progress.flush()

    def result(self) -> PackResult:
        results = [
            self.results.get(d.job)
            or JobResult(
                d.name,
                self.plan.jobs[d.job].command_text,
                status="not_run",
                exit_code=None,
                wall_s=None,
                gpu=None,
                threads=None,
                peak_rss_bytes=None,
                log_path=None,
                attempts=0,
            )
            for d in self.plan.demands
        ]
        return PackResult(
            jobs=tuple(results),
            wall_s=round(time.monotonic() - self.started, 3),
            log_dir=str(self.folder),
            interrupted=self.interrupted,
        )


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:60] or "job"


def status_text(
    plan: PackPlan,
    running: Sequence[Placement],
    queued: int,
    done: Iterable[JobResult],
    elapsed_s: float,
) -> str:
    """One line: running/queued/done counts and each GPU's jobs and declared memory."""
    finished = list(done)
    failed = sum(j.failed for j in finished)
    text = (
        f"[maxtp pack {elapsed_s:.0f}s] {len(running)} running, {queued} queued, "
        f"{len(finished)} done ({failed} failed)"
    )
    cap = plan.capacity
    if not cap.gpus:
        used = sum(p.demand.threads for p in running)
        return f"{text} | CPU {used}/{cap.cpu_threads} threads"
    parts = []
    for gpu in cap.gpus:
        here = [p.demand for p in running if p.gpu is not None and p.gpu.index == gpu.index]
        mem = sum(d.gpu_bytes or gpu.usable_bytes for d in here)
        parts.append(
            f"GPU {gpu.index}: {len(here)} jobs {gib_column(mem)}/"
            f"{gib_column(gpu.usable_bytes)} GiB"
        )
    return f"{text} | " + " | ".join(parts)
