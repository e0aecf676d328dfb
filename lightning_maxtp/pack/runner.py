"""``run_jobs``: run every job of ``maxtp pack``, starting jobs as capacity frees up.

Each job writes its output to its own log; a failed job does not stop the others unless
``fail_fast``; a killed job is rerun up to its ``retries``; Ctrl-C or SIGTERM stops every job's
process group before returning. ``backend="ray"`` hands the same jobs to ``ray_task`` (one Ray
task each). Both backends record through one ``progress.Book`` (attempts, logs, results in job
order) and run one loop (``Book.drive``); what is left here is the local placement's rounds.
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
from lightning_maxtp.pack.progress import Book, Progress, counts_text, default_log_dir
from lightning_maxtp.pack.ray_placement import RayPlan
from lightning_maxtp.pack.results import JobResult, PackResult, gib_column
from lightning_maxtp.pack.signals import signals_stop
from lightning_maxtp.pack.spec import JobSpec

__all__ = ["BACKENDS", "run_jobs", "status_text"]

BACKENDS = ("local", "ray")
_SAMPLE_INTERVAL_S = 0.5
"""Seconds between RSS samples of a job's tree (a psutil tree walk scans every process)."""


def run_jobs(
    jobs: Sequence[JobSpec] | PackPlan | RayPlan,
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
        jobs: The jobs, or a plan: from ``plan_pack`` (local) or ``plan_ray_pack`` (Ray).
        backend: ``"local"``: this machine's free GPUs or CPU shares. ``"ray"``: a Ray task per
            job on a Ray cluster (needs the ``[ray]`` extra; see ``ray_runner.run_ray_jobs``).
        address: The Ray cluster (``"auto"``, ``"ray://head:10001"``); ``None``: the one
            ``RAY_ADDRESS`` names, else a local Ray instance, stopped at the end. Only with
            ``backend="ray"``; ignored when Ray is already initialised in this process.
        log_dir: Folder for the logs, one per job (default: ``maxtp-pack-logs/<time>``).
        fail_fast: Stop every job at the first failure.
        retry_oom: Run a job that failed with a GPU out-of-memory error once more, with its GPU
            to itself.
        progress: Stream for one line per job start and end (e.g. ``sys.stderr``); on a Ray
            instance started here it also shows the jobs' output (Ray's driver logging).
        status_line: Also write a live status line (running/queued/done, per GPU or node).
        poll_interval_s: Seconds between checks of the running jobs.
        **plan_kwargs: Passed to ``plan_pack`` (local) or, on Ray, ``plan_ray_pack``'s
            defaults and ``max_parallel`` (see ``run_ray_jobs``).

    Returns:
        Every job's result. After SIGINT or SIGTERM the jobs are stopped and the result says so
        (``interrupted``) instead of the signal propagating.

    Raises:
        ValueError: For an unknown ``backend``, ``address`` without ``backend="ray"``, or a job
            no GPU (or Ray node) could hold, before anything starts.
        ImportError: For ``backend="ray"`` without Ray installed.
    """
    if backend not in BACKENDS:
        raise ValueError(f"`backend` must be one of {BACKENDS}, got {backend!r}")
    refuse_bool("poll_interval_s", poll_interval_s, SECONDS, 0.1)
    folder = Path(log_dir) if log_dir is not None else default_log_dir()
    shown = Progress(progress, status_line=status_line)
    if backend == "ray":
        if isinstance(jobs, PackPlan):
            raise ValueError(
                "`jobs` is a PackPlan (this machine's placement); with backend='ray' pass the "
                "JobSpecs themselves (plan.jobs)"
            )
        from lightning_maxtp.pack.ray_task import run_on_ray

        return run_on_ray(
            jobs,
            address,
            folder,
            shown,
            fail_fast=fail_fast,
            retry_oom=retry_oom,
            poll_interval_s=poll_interval_s,
            **plan_kwargs,
        )
    if isinstance(jobs, RayPlan):
        raise ValueError("`jobs` is a RayPlan (a Ray cluster's); pass backend='ray' with it")
    if address is not None:
        raise ValueError(
            f"`address` ({address!r}) names a Ray cluster; pass backend='ray' with it "
            "(maxtp pack --backend ray --address ...)"
        )
    plan = jobs if isinstance(jobs, PackPlan) else plan_pack(jobs, **plan_kwargs)
    folder.mkdir(parents=True, exist_ok=True)
    book = Book(plan.jobs, [d.name for d in plan.demands], folder, shown, "local")
    with signals_stop(book):
        _Run(plan, book, fail_fast=fail_fast, retry_oom=retry_oom).loop(poll_interval_s)
    return book.result()


class _Run:
    """The runner's mutable state (one call of ``run_jobs``); what it records goes to ``book``."""

    def __init__(self, plan: PackPlan, book: Book, *, fail_fast: bool, retry_oom: bool) -> None:
        self.plan, self.book = plan, book
        self.fail_fast, self.retry_oom = fail_fast, retry_oom
        self.pending: list[Demand] = list(plan.demands)
        self.running: dict[int, tuple[Placement, proc.Child]] = {}
        self.node = socket.gethostname()

    def loop(self, poll_interval_s: float) -> None:
        def advance() -> None:
            self._start(assign(self.pending, self.plan.capacity, self._placed()))
            self._status()
            time.sleep(poll_interval_s)

        self.book.drive(self._reap, advance, self._stop_all, fail_fast=self.fail_fast)

    def _placed(self) -> list[Placement]:
        return [placement for placement, _ in self.running.values()]

    def _start(self, step: Step) -> None:
        for placement in step.starts:
            demand = placement.demand
            job = self.plan.jobs[demand.job]
            self.pending.remove(demand)
            env = placement.env()
            _, path, header = self.book.next_attempt(
                demand.job, env=" ".join(f"{k}={v}" for k, v in env.items())
            )
            try:
                self.running[demand.job] = (placement, proc.start(job, env, path, header))
            except OSError as err:
                path.write_text(f"{header}# could not start: {err}\n")
                self._finish(placement, None, code=127, status="failed", path=path, wall=0.0)
                continue
            where = f"GPU {placement.gpu.index}" if placement.gpu else "CPU"
            self.book.progress.event(
                f"start {demand.name} on {where} ({demand.threads} threads) -> {path}"
            )

    def _reap(self) -> bool:
        """Collect ended jobs: record them, or queue a retry (killed, or OOM when asked).

        Returns:
            Whether a job is left to run or to end.
        """
        now = time.monotonic()
        for job, (placement, child) in list(self.running.items()):
            if now - child.sampled >= _SAMPLE_INTERVAL_S:
                child.tree.sample()
                child.sampled = now
            code = proc.reap(child)
            if code is None:
                continue
            del self.running[job]
            wall = now - child.started
            oom = code != 0 and proc.log_shows_oom(child.log_path, child.log_offset)
            spec, demand = self.plan.jobs[job], placement.demand
            again = proc.rerun(
                code,
                oom=oom,
                shell=spec.shell,
                attempt=self.book.attempts[job],
                retries=spec.retries,
                retry_oom=self.retry_oom,
            )
            if again is not None:  # an OOM runs again alone
                why, alone = again
                self.book.again(job, f"{why} after {wall:.1f} s", child.log_path)
                self.pending.insert(0, dataclasses.replace(demand, alone=True) if alone else demand)
                continue
            status = "ok" if code == 0 else "oom" if oom else "failed"
            self._finish(placement, child, code=code, status=status, path=child.log_path, wall=wall)
        return bool(self.pending or self.running)

    def _finish(
        self,
        placement: Placement,
        child: proc.Child | None,
        *,
        code: int | None,
        status: str,
        path: Path,
        wall: float,
    ) -> None:
        self.book.finish(
            placement.demand.job,
            status=status,
            code=code,
            wall_s=wall,
            log_path=path,
            node=self.node,
            gpu=placement.gpu.index if placement.gpu else None,
            threads=placement.demand.threads,
            peak_rss_bytes=(child.tree.peak_rss_bytes or None) if child is not None else None,
        )

    def _stop_all(self) -> None:
        for placement, child in list(self.running.values()):
            proc.kill(child)
            wall = time.monotonic() - child.started
            code = child.popen.returncode
            self._finish(
                placement, child, code=code, status="stopped", path=child.log_path, wall=wall
            )
        self.running.clear()

    def _status(self) -> None:
        self.book.progress.status(
            status_text(
                self.plan,
                self._placed(),
                len(self.pending),
                self.book.results.values(),
                time.monotonic() - self.book.started,
            )
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
