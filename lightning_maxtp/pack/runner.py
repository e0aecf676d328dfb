"""``run_jobs``: run every job of ``maxtp pack``, starting jobs as capacity frees up.

Each job writes its output to its own log; a failed job does not stop the others unless
``fail_fast``; a killed job is rerun up to its ``retries``; Ctrl-C or SIGTERM stops every job's
process group before returning. ``backend="ray"`` hands the same jobs to ``ray_runner``.
"""

from __future__ import annotations

import dataclasses
import socket
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any

from lightning_maxtp._checks import SECONDS, refuse_bool
from lightning_maxtp.pack import proc
from lightning_maxtp.pack.placement import Demand, Placement, Step, assign
from lightning_maxtp.pack.plan import PackPlan, plan_pack
from lightning_maxtp.pack.progress import (
    Progress,
    attempt_log_path,
    counts_text,
    default_log_dir,
    log_header,
)
from lightning_maxtp.pack.results import JobResult, PackResult, gib_column, not_run
from lightning_maxtp.pack.signals import Signals, Stop, signals_stop
from lightning_maxtp.pack.spec import JobSpec

__all__ = ["BACKENDS", "run_jobs", "status_text"]

BACKENDS = ("local", "ray")
_SAMPLE_INTERVAL_S = 0.5
"""Seconds between RSS samples of a job's tree (a psutil tree walk scans every process)."""


def run_jobs(
    jobs: Sequence[JobSpec] | PackPlan,
    *,
    backend: str = "local",
    address: str | None = None,
    log_dir: str | Path | None = None,
    fail_fast: bool = False,
    retry_oom: bool = False,
    progress: IO[str] | None = None,
    status_line: bool = False,
    poll_interval_s: float = 0.1,
    **plan_kwargs: Any,
) -> PackResult:
    """Run every job, as many at once as the machine (or Ray cluster) holds; return when all end.

    Args:
        jobs: The jobs (or, for the local backend, a plan from ``plan_pack``).
        backend: ``"local"``: this machine's free GPUs or CPU shares. ``"ray"``: a Ray task per
            job on a Ray cluster (needs the ``[ray]`` extra; see ``ray_runner.run_ray_jobs``).
        address: The Ray cluster (``"auto"``, ``"ray://head:10001"``); ``None``: the one
            ``RAY_ADDRESS`` names, else a local Ray instance. Only with ``backend="ray"``.
        log_dir: Folder for the logs, one per job (default: ``maxtp-pack-logs/<time>``).
        fail_fast: Stop every job at the first failure.
        retry_oom: Run a job that failed with a GPU out-of-memory error once more, with its GPU
            to itself.
        progress: Stream for one line per job start and end (e.g. ``sys.stderr``).
        status_line: Also write a live status line (running/queued/done, per-GPU use).
        poll_interval_s: Seconds between checks of the running jobs.
        **plan_kwargs: Passed to ``plan_pack`` (local) or ``run_ray_jobs`` (Ray).

    Returns:
        Every job's result. After SIGINT or SIGTERM the jobs are stopped and the result says so
        (``interrupted``) instead of the signal propagating.

    Raises:
        ValueError: For an unknown ``backend``, or ``address`` without ``backend="ray"``.
        ImportError: For ``backend="ray"`` without Ray installed.
    """
    if backend not in BACKENDS:
        raise ValueError(f"`backend` must be one of {BACKENDS}, got {backend!r}")
    refuse_bool("poll_interval_s", poll_interval_s, SECONDS, 0.1)
    if backend == "ray":
        from lightning_maxtp.pack.ray_runner import run_ray_jobs

        if isinstance(jobs, PackPlan):
            raise ValueError(
                "`jobs` is a PackPlan (this machine's placement); with backend='ray' pass the "
                "JobSpecs themselves (plan.jobs)"
            )
        return run_ray_jobs(
            jobs,
            address=address,
            log_dir=log_dir,
            fail_fast=fail_fast,
            retry_oom=retry_oom,
            progress=progress,
            status_line=status_line,
            poll_interval_s=poll_interval_s,
            **plan_kwargs,
        )
    if address is not None:
        raise ValueError(
            f"`address` ({address!r}) names a Ray cluster; pass backend='ray' with it "
            "(maxtp pack --backend ray --address ...)"
        )
    plan = jobs if isinstance(jobs, PackPlan) else plan_pack(jobs, **plan_kwargs)
    folder = Path(log_dir) if log_dir is not None else default_log_dir()
    folder.mkdir(parents=True, exist_ok=True)
    run = _Run(
        plan,
        folder,
        fail_fast=fail_fast,
        retry_oom=retry_oom,
        progress=Progress(progress, status_line=status_line),
    )
    with signals_stop(run.signals):
        run.loop(poll_interval_s)
    return run.result()


class _Run:
    """The runner's mutable state (one call of ``run_jobs``)."""

    def __init__(
        self,
        plan: PackPlan,
        folder: Path,
        *,
        fail_fast: bool,
        retry_oom: bool,
        progress: Progress,
    ) -> None:
        self.plan, self.folder = plan, folder
        self.fail_fast, self.retry_oom = fail_fast, retry_oom
        self.progress = progress
        self.pending: list[Demand] = list(plan.demands)
        self.running: dict[int, tuple[Placement, proc.Child]] = {}
        self.results: dict[int, JobResult] = {}
        self.attempts: dict[int, int] = {}
        self.earlier: dict[int, list[str]] = {}
        self.interrupted: str | None = None
        self.signals = Signals(self)
        self.started = time.monotonic()
        self.node = socket.gethostname()

    def loop(self, poll_interval_s: float) -> None:
        try:
            while self.pending or self.running:
                self._reap()
                if self.fail_fast and any(r.failed for r in self.results.values()):
                    self.progress.event("a job failed and fail_fast is set: stopping the others")
                    break
                self._start(assign(self.pending, self.plan.capacity, self._placed()))
                self._status()
                time.sleep(poll_interval_s)
        except (Stop, KeyboardInterrupt):
            self.interrupted = self.interrupted or "SIGINT"
            self.progress.event(f"{self.interrupted}: stopping every job")
        finally:
            self._stop_all()
            self.progress.close()

    def _placed(self) -> list[Placement]:
        return [placement for placement, _ in self.running.values()]

    def _start(self, step: Step) -> None:
        for placement in step.starts:
            demand = placement.demand
            job = self.plan.jobs[demand.job]
            self.pending.remove(demand)
            attempt = self.attempts[demand.job] = self.attempts.get(demand.job, 0) + 1
            env = placement.env()
            path = attempt_log_path(self.folder, demand.job, demand.name, attempt)
            header = log_header(
                demand.name,
                attempt,
                job.command_text,
                env=" ".join(f"{k}={v}" for k, v in env.items()),
            )
            try:
                with self.signals.deferred():  # a child started but not recorded would be orphaned
                    child = proc.start(job, env, path, header)
                    self.running[demand.job] = (placement, child)
            except OSError as err:
                path.write_text(f"{header}# could not start: {err}\n")
                self._finish(
                    placement=placement, child=None, code=127, status="failed", path=path, wall=0.0
                )
                continue
            where = f"GPU {placement.gpu.index}" if placement.gpu else "CPU"
            self.progress.event(
                f"start {demand.name} on {where} ({demand.threads} threads) -> {path}"
            )

    def _reap(self) -> None:
        """Collect ended jobs: record them, or queue a retry (killed, or OOM when asked)."""
        now = time.monotonic()
        for job, (placement, child) in list(self.running.items()):
            if now - child.sampled >= _SAMPLE_INTERVAL_S:
                child.tree.sample()
                child.sampled = now
            with self.signals.deferred():  # a reaped job must reach the results
                code = proc.reap(child)
                if code is None:
                    continue
                del self.running[job]
                wall = now - child.started
                oom = code != 0 and proc.log_shows_oom(child.log_path, child.log_offset)
                if self._retried(placement.demand, code, oom, child.log_path, wall):
                    continue
                self._finish(
                    placement=placement,
                    child=child,
                    code=code,
                    status="ok" if code == 0 else "oom" if oom else "failed",
                    path=child.log_path,
                    wall=wall,
                )

    def _retried(self, demand: Demand, code: int, oom: bool, log: Path, wall: float) -> bool:
        """Queue the job again when ``proc.rerun`` says so (an OOM: alone); say so."""
        spec = self.plan.jobs[demand.job]
        again = proc.rerun(
            code,
            oom=oom,
            shell=spec.shell,
            attempt=self.attempts[demand.job],
            retries=spec.retries,
            retry_oom=self.retry_oom,
        )
        if again is None:
            return False
        why, alone = again
        how = f"{why} after {wall:.1f} s"
        self.earlier.setdefault(demand.job, []).append(how)
        self.pending.insert(0, dataclasses.replace(demand, alone=True) if alone else demand)
        self.progress.event(f"{demand.name} {how}: running it again ({log} kept)")
        return True

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
            peak_rss_bytes=(child.tree.peak_rss_bytes or None) if child is not None else None,
            log_path=str(path),
            attempts=self.attempts.get(demand.job, 1),
            node=self.node,
            earlier=tuple(self.earlier.get(demand.job, ())),
        )
        self.progress.event(f"{status:<6} {demand.name}: exit {code} after {wall:.1f} s")

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

    def _status(self) -> None:
        self.progress.status(
            status_text(
                self.plan,
                self._placed(),
                len(self.pending),
                self.results.values(),
                time.monotonic() - self.started,
            )
        )

    def result(self) -> PackResult:
        results = [
            self.results.get(d.job)
            or not_run(d.name, self.plan.jobs[d.job].command_text, self.earlier.get(d.job, ()))
            for d in self.plan.demands
        ]
        return PackResult(
            jobs=tuple(results),
            wall_s=round(time.monotonic() - self.started, 3),
            log_dir=str(self.folder),
            interrupted=self.interrupted,
        )


def status_text(
    plan: PackPlan,
    running: Sequence[Placement],
    queued: int,
    done: Iterable[JobResult],
    elapsed_s: float,
) -> str:
    """One line: running/queued/done counts and each GPU's jobs and declared memory."""
    text = counts_text(len(running), queued, done, elapsed_s)
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
