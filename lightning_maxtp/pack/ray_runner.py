"""``maxtp pack --backend ray``: the same jobs as Ray tasks over a cluster's GPUs and CPUs.

Each job becomes one streaming Ray task (``ray_task.job_task``) asking for the resources
``ray_placement`` planned; Ray's scheduler places it. The submitting machine writes every job's
output to its log as the task streams it, shows the same event lines and status line as the
local backend, and returns the same ``PackResult`` (with each job's node). Ray's own task retries
are off (``max_retries=0``): a retried streaming task would send its output twice. Instead a job
whose process was killed, or whose worker or node died, is submitted again up to its
``retries``, into a log of its own, and only its last attempt counts. Ctrl-C cancels every task;
each stops its job's process tree on its node before it ends.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from lightning_maxtp._compat.ray_streams import next_ready_ref
from lightning_maxtp.pack import proc
from lightning_maxtp.pack.progress import (
    Progress,
    attempt_log_path,
    counts_text,
    default_log_dir,
    log_header,
)
from lightning_maxtp.pack.ray_cluster import connect, import_ray, plan_ray_pack
from lightning_maxtp.pack.ray_placement import RayDemand, RayPlan
from lightning_maxtp.pack.ray_task import job_task
from lightning_maxtp.pack.results import JobResult, PackResult, not_run
from lightning_maxtp.pack.signals import Signals, signals_stop
from lightning_maxtp.pack.spec import JobSpec, check_jobs

__all__ = ["run_ray_jobs"]

STOP_GRACE_S = 15.0
"""Seconds cancelled tasks get to stop their jobs (the task's own grace is 5 s) before they are
killed with their workers."""
GET_TIMEOUT_S = 1.0
"""Most seconds one read of a task's item waits (it is in Ray's store, maybe on another node)."""


def run_ray_jobs(
    jobs: Sequence[JobSpec] | RayPlan,
    *,
    address: str | None = None,
    log_dir: str | Path | None = None,
    fail_fast: bool = False,
    retry_oom: bool = False,
    progress: IO[str] | None = None,
    status_line: bool = False,
    poll_interval_s: float = 0.1,
    max_parallel: int | None = None,
    gpu_size_gib: float | None = None,
    default_gpu_memory_gib: float | None = None,
    default_cpu_threads: int | None = None,
) -> PackResult:
    """Run every job as a Ray task; return when all have ended (``run_jobs(backend="ray")``).

    ``lightning_maxtp`` must be importable on every node (installed there, as for
    ``BatchInferencePool(backend="ray")``); the jobs' commands and ``cwd`` are the nodes'.

    Args:
        jobs: The jobs, or a plan from ``plan_ray_pack``.
        address: The cluster (``"auto"``, ``"ray://head:10001"``); ``None``: the one
            ``RAY_ADDRESS`` names, else a local Ray instance, shut down at the end. Ignored when
            Ray is already initialised in this process.
        log_dir: Folder for the logs on this machine (default: ``maxtp-pack-logs/<time>``).
        fail_fast: Cancel every task at the first failure.
        retry_oom: Run a job that failed with a GPU out-of-memory error once more with a
            whole GPU.
        progress: Stream for one line per job start and end (e.g. ``sys.stderr``).
        status_line: Also write a live status line (running/queued/done, per node).
        poll_interval_s: Seconds between checks of the tasks.
        max_parallel: Most tasks submitted at once (default: all; Ray queues what does not fit).
        gpu_size_gib: See ``plan_ray_pack``.
        default_gpu_memory_gib: See ``plan_ray_pack``.
        default_cpu_threads: See ``plan_ray_pack``.

    Returns:
        Every job's result, as the local backend gives it, with ``backend="ray"``.

    Raises:
        ImportError: Without Ray installed (the ``[ray]`` extra).
        ValueError: For a job no node can hold, before anything starts (see ``plan_ray``).
    """
    if max_parallel is not None and (isinstance(max_parallel, bool) or max_parallel < 1):
        raise ValueError(f"`max_parallel` must be >= 1 or None, got {max_parallel!r}")
    if gpu_size_gib is not None and not gpu_size_gib > 0:
        raise ValueError(f"`gpu_size_gib` must be > 0 or None, got {gpu_size_gib!r}")
    if not isinstance(jobs, RayPlan):  # bad input is refused before Ray starts (seconds)
        check_jobs(jobs, default_gpu_memory_gib, default_cpu_threads)
    owned = connect(address)
    try:
        plan = (
            jobs
            if isinstance(jobs, RayPlan)
            else plan_ray_pack(
                jobs,
                gpu_size_gib=gpu_size_gib,
                default_gpu_memory_gib=default_gpu_memory_gib,
                default_cpu_threads=default_cpu_threads,
            )
        )
        folder = Path(log_dir) if log_dir is not None else default_log_dir()
        folder.mkdir(parents=True, exist_ok=True)
        run = _RayRun(
            plan,
            folder,
            fail_fast=fail_fast,
            retry_oom=retry_oom,
            progress=Progress(progress, status_line=status_line),
            max_parallel=max_parallel,
        )
        with signals_stop(Signals(run, raise_stop=False)):
            run.loop(poll_interval_s)
        return run.result()
    finally:
        if owned:
            import_ray().shutdown()


@dataclass
class _Attempt:
    """One submitted task of a job (mutable, runner-internal)."""

    demand: RayDemand
    number: int
    task: Any
    """The task's ``ObjectRefGenerator``."""
    path: Path
    log: IO[bytes]
    offset: int
    """Bytes of our header in the log: the job's own output starts there."""
    start: dict[str, Any] | None = None
    """The task's first item, once the command runs."""
    started: float | None = None
    cancelled: bool = False
    ref: Any = None
    """A ref taken from the task whose object has not been read yet."""


class _RayRun:
    """The Ray runner's mutable state (one call of ``run_ray_jobs``)."""

    def __init__(
        self,
        plan: RayPlan,
        folder: Path,
        *,
        fail_fast: bool,
        retry_oom: bool,
        progress: Progress,
        max_parallel: int | None,
    ) -> None:
        self.ray = import_ray()
        self.plan, self.folder = plan, folder
        self.fail_fast, self.retry_oom = fail_fast, retry_oom
        self.progress, self.max_parallel = progress, max_parallel
        self.pending: list[RayDemand] = list(plan.demands)
        self.tasks: dict[int, _Attempt] = {}
        self.results: dict[int, JobResult] = {}
        self.attempts: dict[int, int] = {}
        self.earlier: dict[int, list[str]] = {}
        self.interrupted: str | None = None
        self.started = time.monotonic()
        self._remote = self.ray.remote(job_task)

    def loop(self, poll_interval_s: float) -> None:
        try:
            while (self.pending or self.tasks) and self.interrupted is None:
                self._submit()
                self._poll(poll_interval_s)
                if self.fail_fast and any(r.failed for r in self.results.values()):
                    self.progress.event("a job failed and fail_fast is set: stopping the others")
                    break
                self._status()
        except KeyboardInterrupt:  # Ctrl-C outside our handler's reach
            self.interrupted = self.interrupted or "SIGINT"
        finally:
            if self.interrupted is not None:
                self.progress.event(f"{self.interrupted}: cancelling every task")
            self._stop_all()
            self.progress.close()

    def _submit(self) -> None:
        while self.pending and (self.max_parallel is None or len(self.tasks) < self.max_parallel):
            demand = self.pending.pop(0)
            job = self.plan.jobs[demand.job]
            number = self.attempts[demand.job] = self.attempts.get(demand.job, 0) + 1
            path = attempt_log_path(self.folder, demand.job, demand.name, number)
            resources = ", ".join(f"{k}={v:g}" for k, v in demand.options().items())
            header = log_header(demand.name, number, job.command_text, ray_task=resources)
            log = open(path, "wb")  # noqa: SIM115 - closed when the attempt ends
            log.write(header.encode())
            log.flush()
            task = self._remote.options(
                **demand.options(),
                num_returns="streaming",
                max_retries=0,
                name=f"maxtp-pack:{demand.name}",
            ).remote(
                job.command,
                shell=job.shell,
                cwd=job.cwd,
                env=dict(job.env),
                threads=demand.threads,
            )
            self.tasks[demand.job] = _Attempt(demand, number, task, path, log, log.tell())

    def _poll(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for any task to send something; take all that came."""
        if not self.tasks:
            return
        self.ray.wait(
            [a.task for a in self.tasks.values()], num_returns=len(self.tasks), timeout=timeout_s
        )
        for attempt in list(self.tasks.values()):  # each drain returns at once
            self._drain(attempt)

    def _drain(self, attempt: _Attempt) -> None:
        """Handle every item ``attempt``'s task has sent so far, then how it ended if it has.

        Never waits on the task: Ray's own ways of reading a stream can wait without a limit on
        a task that is stopping (see ``_compat.ray_streams``), and a stuck driver could not
        stop the rest. A ref still on its way from its node is kept for the next poll.
        """
        while True:
            if attempt.ref is None:
                try:
                    attempt.ref = next_ready_ref(attempt.task)
                except StopIteration:  # ended with neither our last item nor an error
                    self._lost(attempt, "the task ended without a result")
                    return
                if attempt.ref is None:
                    return  # nothing more yet
            try:
                item = self.ray.get(attempt.ref, timeout=GET_TIMEOUT_S)
            except self.ray.exceptions.GetTimeoutError:
                return
            except self.ray.exceptions.RayError as err:  # a failed task's last ref is its error
                attempt.ref = None
                self._failed(attempt, err)
                return
            attempt.ref = None
            if self._handle(attempt, item):
                return

    def _failed(self, attempt: _Attempt, err: Exception) -> None:
        """The task raised: cancelled by us, our own code failed, or its worker or node died."""
        exceptions = self.ray.exceptions
        # A task this runner cancelled may end in any error: Ray interrupts its worker, and a
        # worker that inherited SIGINT ignored (a CI job started in the background) fails inside
        # Ray's own interrupt with a TypeError. It was stopped on purpose either way.
        if attempt.cancelled or isinstance(err, exceptions.TaskCancelledError):
            self._cancelled(attempt)
        elif isinstance(err, exceptions.RayTaskError):  # our task's own code raised
            self._write(attempt, f"\n# the Ray task failed: {err}\n".encode())
            self._done(attempt, code=None, status="failed", wall=self._wall(attempt))
        else:  # its worker or node died
            lines = str(err).strip().splitlines()
            self._lost(attempt, f"{type(err).__name__}: {lines[0] if lines else ''}")

    def _handle(self, attempt: _Attempt, item: dict[str, Any]) -> bool:
        """Take one item of the task; whether it was the last."""
        kind = item["kind"]
        if kind == "out":
            self._write(attempt, item["data"])
            return False
        if kind == "start":
            attempt.start, attempt.started = item, time.monotonic()
            env = " ".join(f"{k}={v}" for k, v in item["env"].items())
            pids = f"Ray worker pid {item['worker_pid']}, keeper pid {item['pid']}"
            self._write(attempt, f"# node: {item['host']} ({pids})\n# env: {env}\n")
            attempt.offset = attempt.log.tell()
            gpus = ",".join(item["gpus"])
            where = f"{item['host']} GPU {gpus}" if gpus else f"{item['host']} CPU"
            self.progress.event(
                f"start {attempt.demand.name} on {where} ({attempt.demand.threads} threads) "
                f"-> {attempt.path}"
            )
            return False
        assert kind == "end", item
        code, wall = item["exit_code"], float(item["wall_s"])
        attempt.log.close()
        oom = code != 0 and proc.log_shows_oom(attempt.path, attempt.offset)
        if self._retried(attempt, code, oom, wall):
            return True
        status = "ok" if code == 0 else "oom" if oom else "failed"
        self._done(attempt, code=code, status=status, wall=wall, peak=item["peak_rss_bytes"])
        return True

    def _retried(self, attempt: _Attempt, code: int, oom: bool, wall: float) -> bool:
        """Submit the job again when ``proc.rerun`` says so (an OOM: a whole GPU), not stopping."""
        if attempt.cancelled:
            return False
        demand, spec = attempt.demand, self.plan.jobs[attempt.demand.job]
        again = proc.rerun(
            code,
            oom=oom,
            shell=spec.shell,
            attempt=attempt.number,
            retries=spec.retries,
            retry_oom=self.retry_oom,
        )
        if again is None:
            return False
        why, whole_gpu = again
        how = f"{why} on {self._host(attempt)} after {wall:.1f} s"
        self._again(
            attempt, how, replace(demand, num_gpus=1.0) if whole_gpu and demand.num_gpus else demand
        )
        return True

    def _again(self, attempt: _Attempt, how: str, demand: RayDemand) -> None:
        del self.tasks[attempt.demand.job]
        self.earlier.setdefault(attempt.demand.job, []).append(how)
        self.pending.insert(0, demand)
        self.progress.event(f"{demand.name} {how}: running it again ({attempt.path} kept)")

    def _lost(self, attempt: _Attempt, why: str) -> None:
        """The task died without its end (a lost worker or node): retry, or record it lost.

        A task this runner cancelled can end this way too (``ray.cancel(force=True)`` kills its
        worker, which Ray may report as a crash): that is a stop, not a loss.
        """
        if attempt.cancelled:
            self._cancelled(attempt)
            return
        self._write(attempt, f"\n# the Ray task was lost: {why}\n".encode())
        attempt.log.close()
        wall = self._wall(attempt)
        retries = self.plan.jobs[attempt.demand.job].retries
        if attempt.number <= retries:
            self._again(attempt, f"lost on {self._host(attempt)} ({why})", attempt.demand)
        else:
            self._done(attempt, code=None, status="lost", wall=wall)

    def _cancelled(self, attempt: _Attempt) -> None:
        self._write(attempt, b"\n# cancelled\n")
        if attempt.start is None:  # never ran: not_run, and its empty log is no use
            del self.tasks[attempt.demand.job]
            attempt.log.close()
            attempt.path.unlink(missing_ok=True)
            return
        self._done(attempt, code=None, status="stopped", wall=self._wall(attempt))

    def _done(
        self,
        attempt: _Attempt,
        *,
        code: int | None,
        status: str,
        wall: float,
        peak: int | None = None,
    ) -> None:
        del self.tasks[attempt.demand.job]
        if not attempt.log.closed:
            attempt.log.close()
        demand, start = attempt.demand, attempt.start or {}
        gpus = start.get("gpus") or []
        self.results[demand.job] = JobResult(
            name=demand.name,
            command=self.plan.jobs[demand.job].command_text,
            status=status,
            exit_code=code,
            wall_s=round(wall, 3),
            gpu=int(gpus[0]) if len(gpus) == 1 and str(gpus[0]).isdigit() else None,
            threads=demand.threads,
            peak_rss_bytes=peak,
            log_path=str(attempt.path),
            attempts=attempt.number,
            node=start.get("host"),
            earlier=tuple(self.earlier.get(demand.job, ())),
        )
        self.progress.event(f"{status:<6} {demand.name}: exit {code} after {wall:.1f} s")

    def _write(self, attempt: _Attempt, data: bytes | str) -> None:
        if attempt.log.closed:
            return
        attempt.log.write(data.encode() if isinstance(data, str) else data)
        attempt.log.flush()

    def _wall(self, attempt: _Attempt) -> float:
        return 0.0 if attempt.started is None else time.monotonic() - attempt.started

    @staticmethod
    def _host(attempt: _Attempt) -> str:
        return str((attempt.start or {}).get("host", "its node"))

    def _stop_all(self) -> None:
        """Cancel every task; each stops its job's tree. Past the grace, kill the workers."""
        if not self.tasks:
            return
        for attempt in self.tasks.values():
            attempt.cancelled = True
            self.ray.cancel(attempt.task)
        deadline = time.monotonic() + STOP_GRACE_S
        while self.tasks and time.monotonic() < deadline:
            self._poll(0.1)
        for attempt in list(self.tasks.values()):
            self.ray.cancel(attempt.task, force=True)
            self._write(attempt, b"\n# killed with its Ray worker after the grace period\n")
            if attempt.start is None:
                self._cancelled(attempt)
            else:
                self._done(attempt, code=None, status="stopped", wall=self._wall(attempt))

    def _status(self) -> None:
        running = [a for a in self.tasks.values() if a.start is not None]
        queued = len(self.pending) + len(self.tasks) - len(running)
        text = counts_text(
            len(running), queued, self.results.values(), time.monotonic() - self.started
        )
        nodes = {n.node_id: n for n in self.plan.nodes}
        per_node: dict[str, list[_Attempt]] = {}
        for attempt in running:
            per_node.setdefault(str((attempt.start or {}).get("node_id")), []).append(attempt)
        parts = []
        for node_id, here in per_node.items():
            node = nodes.get(node_id)
            gpus = sum(a.demand.num_gpus for a in here)
            cpus = sum(a.demand.num_cpus for a in here)
            host = self._host(here[0])
            if node is None:
                parts.append(f"{host}: {len(here)} jobs")
                continue
            gpu_part = f", {gpus:g}/{node.gpus:g} GPU" if node.gpus else ""
            parts.append(f"{host}: {len(here)} jobs{gpu_part}, {cpus:g}/{node.cpus:g} CPU")
        self.progress.status(" | ".join([text, *parts]))

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
            backend="ray",
        )
