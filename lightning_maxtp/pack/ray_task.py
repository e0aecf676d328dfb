"""The Ray task of ``maxtp pack --backend ray`` and the driver that follows the tasks.

Each job is one ``ray.remote`` task (``run_attempt``) with the resources ``ray_placement``
planned (``num_gpus``, a share of one GPU where the job declares its memory, ``num_cpus``,
``memory``); the thread variables, and for a CPU job an empty ``CUDA_VISIBLE_DEVICES``, are set
in the job's own process, under the job's own ``env`` (not the task's ``runtime_env``: see
``_submit``); Ray sets the GPUs it assigned. Ray reruns a task whose worker or node died, and
one whose job was killed by a signal (``JobKilled`` in ``retry_exceptions``), up to the job's
``retries`` (``max_retries``). An out-of-memory job is the exception: the local rule
(``proc.rerun``) runs it once more with a whole GPU, which needs a new task, submitted here. The
driver follows the tasks with ``ray.wait``; Ctrl-C is ``ray.cancel``, forced after a grace
period.

On its node the task runs the command through ``proc`` (as the local runner does) and copies
its output to the Ray worker's stderr as it comes: Ray's driver logging shows it live
(``log_to_driver``) and keeps it in the node's worker logs. Each attempt puts a ``start`` and an
``end`` record (with the attempt's whole output) in a ``ray.util.queue.Queue``: the driver
writes each attempt's log from them and learns of attempts Ray reran, which it would not see
otherwise (``attempts`` and ``earlier`` in the result). ``progress.Book`` records the results, as
for the local runner. Not a streaming task (``num_returns="streaming"``): its public readers can
wait without a limit on a task that is being cancelled, which only a private Ray call avoided.

A job must not outlive its task: a cancelled task stops the job's process tree (SIGTERM, SIGKILL
after 5 s); the job runs in its worker's process group, which Ray ends when the worker itself
dies (a crash, a forced cancel) on a cluster started with ``RAY_process_group_cleanup_enabled``
(see ``ray_cluster.GROUP_CLEANUP``; a local instance started here sets it).

Importing this module imports neither Ray, torch nor lightning: Ray workers import it by
reference, and it must stay cheap there.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from lightning_maxtp.pack import proc
from lightning_maxtp.pack.placement import THREAD_VARIABLES, job_env
from lightning_maxtp.pack.progress import Book, Progress, counts_text
from lightning_maxtp.pack.ray_cluster import connect, import_ray, plan_ray_pack
from lightning_maxtp.pack.ray_placement import RayDemand, RayPlan
from lightning_maxtp.pack.results import PackResult
from lightning_maxtp.pack.signals import signals_stop
from lightning_maxtp.pack.spec import JobSpec, check_jobs

__all__ = ["JobKilled", "run_attempt", "run_on_ray"]

STOP_GRACE_S = 15.0
"""Seconds cancelled tasks get to stop their jobs (each job's own grace is 5 s) before they are
killed with their workers."""
_POLL_INTERVAL_S = 0.05
"""Seconds between checks of a running job on its node: has it ended, has it written (its new
output goes to the worker's stderr, where Ray's log monitor reads it)."""
_SAMPLE_INTERVAL_S = 0.5


class JobKilled(Exception):
    """A job's process was killed by a signal it did not send itself: Ray runs the task again."""


def run_on_ray(
    jobs: Sequence[JobSpec] | RayPlan,
    address: str | None,
    folder: Path,
    progress: Progress,
    *,
    fail_fast: bool,
    retry_oom: bool,
    poll_interval_s: float,
    max_parallel: int | None = None,
    gpu_size_gib: float | None = None,
    default_gpu_memory_gib: float | None = None,
    default_cpu_threads: int | None = None,
) -> PackResult:
    """``run_jobs(backend="ray")`` once its arguments are checked (see ``run_ray_jobs``).

    Raises:
        ImportError: Without Ray installed (the ``[ray]`` extra).
        ValueError: For bad input or a job no node can hold, before anything starts.
    """
    if max_parallel is not None and (isinstance(max_parallel, bool) or max_parallel < 1):
        raise ValueError(f"`max_parallel` must be >= 1 or None, got {max_parallel!r}")
    if not isinstance(jobs, RayPlan):  # bad input is refused before Ray starts (seconds)
        check_jobs(jobs, default_gpu_memory_gib, default_cpu_threads)
    owned = connect(address, log_to_driver=progress.stream is not None)
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
        folder.mkdir(parents=True, exist_ok=True)
        book = Book(plan.jobs, [d.name for d in plan.demands], folder, progress, "ray")
        with signals_stop(book):
            _RayRun(plan, book, fail_fast=fail_fast, retry_oom=retry_oom).loop(
                poll_interval_s, max_parallel
            )
        return book.result()
    finally:
        if owned:
            import_ray().shutdown()


def _interruptible() -> None:
    """Give this worker Python's own SIGINT handler if it inherited SIGINT ignored.

    ``ray.cancel`` stops a running task by interrupting its worker's main thread; a worker
    started from a shell's background job (a CI script, ``nohup``) inherits SIGINT ignored, and
    Ray's interrupt then fails with a ``TypeError`` instead of stopping the task.
    """
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers; Ray runs tasks there
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def run_attempt(job: JobSpec, index: int, events: Any, env: dict[str, str]) -> int:
    """The Ray task: one attempt of job ``index`` on this node; its exit code.

    ``env``: the thread variables (and for a CPU job an empty ``CUDA_VISIBLE_DEVICES``) the job
    runs with, on top of the worker's environment and under the job's own ``env``.

    Puts ``{"kind": "start", ...}`` (host, GPUs, the variables pack set) in ``events`` once the
    command runs, and ``{"kind": "end", ...}`` (exit code, wall time, peak memory, the whole
    output) when it has ended or was stopped; both carry ``index``.

    Raises:
        JobKilled: When a killing signal ended the job (Ray reruns it while retries are left).
    """
    import ray  # the worker has it; importing it at module level would cost the driver's CLI

    _interruptible()
    start = {
        "kind": "start",
        "job": index,
        "host": socket.gethostname(),
        "node_id": ray.get_runtime_context().get_node_id(),
        "gpus": [str(g) for g in ray.get_gpu_ids()],
        # what pack set (the job's own env may hold secrets: not sent)
        "env": {
            k: env.get(k, os.environ.get(k, ""))
            for k in (*THREAD_VARIABLES, "CUDA_VISIBLE_DEVICES")
        },
        "worker_pid": os.getpid(),
    }
    end: dict[str, Any] = {"kind": "end", "job": index, "exit_code": 127, "oom": False}
    began = time.monotonic()
    # The output's file leaves the folder as soon as the job and this worker have it open
    # (``_run``): a worker killed with SIGKILL, as a lost node's, leaves nothing in /tmp.
    with tempfile.TemporaryDirectory(prefix="maxtp-pack-") as folder:  # gone already: no error
        path = Path(folder) / "output.log"
        try:
            _run(job, path, start, end, events, env=env)
        finally:  # also when cancelled: the driver's log gets what the job wrote
            end.setdefault("output", b"")
            end["wall_s"] = time.monotonic() - began
            events.put(end)
    if proc.killed_by(end["exit_code"], shell=job.shell) is not None:
        raise JobKilled(end["exit_code"])
    return int(end["exit_code"])


def _run(
    job: JobSpec,
    path: Path,
    start: dict[str, Any],
    end: dict[str, Any],
    events: Any,
    *,
    env: dict[str, str],
) -> None:
    """Run the command with its output to ``path``, copied to this worker's stderr as it comes.

    ``start`` goes to ``events`` once the command runs (the queue's actor may still be starting:
    the job does not wait for it). Fills in ``end`` (exit code, peak memory, the whole output,
    whether it shows a GPU OOM) as it learns them, so a cancelled run still reports what it
    had. ``path`` and its folder are removed once the job and this worker hold the file open.
    """
    path.touch()  # opened to read before the job starts: a failed open leaves no job behind
    output = open(path, "rb")  # noqa: SIM115 - closed below, after the job's whole output
    try:
        # In the worker's process group, which Ray ends with the worker (a crash, a forced cancel)
        child = proc.start(job, env, path, header="", new_session=False)
    except OSError as err:
        output.close()
        events.put(start)
        end["output"] = f"# could not start: {err}\n".encode()
        return
    try:
        _leave(path)
        events.put(start)
        sampled = 0.0
        while proc.reap(child) is None:
            if time.monotonic() - sampled >= _SAMPLE_INTERVAL_S:
                child.tree.sample()
                sampled = time.monotonic()
            _forward(output)
            time.sleep(_POLL_INTERVAL_S)
        _forward(output)
    finally:  # Ray's cancel (a KeyboardInterrupt here) stops the job's whole tree first
        try:
            if child.popen.returncode is None:
                proc.kill(child)
        finally:  # what the job wrote and how it ended reach the driver even if the kill raised
            with output:
                output.seek(0)
                end["output"] = output.read()
            end["exit_code"] = child.popen.returncode
            end["peak_rss_bytes"] = child.tree.peak_rss_bytes or None
            end["oom"] = child.popen.returncode != 0 and proc.output_shows_oom(end["output"])


def _leave(path: Path) -> None:
    """Remove ``path`` and its folder while the job and the worker hold it open (it lives on)."""
    try:
        path.unlink()
        path.parent.rmdir()
    except OSError as err:  # the folder goes when the attempt ends, unless the worker is killed
        print(f"maxtp pack: {path.parent} stays until the attempt ends: {err}", file=sys.stderr)


def _forward(output: IO[bytes]) -> None:
    if data := output.read():
        os.write(sys.stderr.fileno(), data)


@dataclass
class _Job:
    """One job's task and its attempt now (mutable, runner-internal)."""

    demand: RayDemand
    ref: Any = None
    """The task's ``ObjectRef``; ``None`` before it is submitted and after it ended."""
    path: Path | None = None
    """The log of the attempt that started last."""
    start: dict[str, Any] | None = None
    started: float = 0.0
    end: dict[str, Any] | None = None
    """The end record of the attempt that started last, once it has ended."""
    cancelled: bool = False


class _RayRun:
    """The Ray runner's mutable state (one call of ``run_ray_jobs``)."""

    def __init__(self, plan: RayPlan, book: Book, *, fail_fast: bool, retry_oom: bool) -> None:
        self.ray = import_ray()
        self.plan, self.book = plan, book
        self.fail_fast, self.retry_oom = fail_fast, retry_oom
        self.jobs = [_Job(d) for d in plan.demands]
        self.pending: list[_Job] = list(self.jobs)
        self.events: Any = None
        """The tasks' records (a ``ray.util.queue.Queue``), once ``loop`` runs."""
        self._remote = self.ray.remote(run_attempt)

    @property
    def _submitted(self) -> dict[Any, _Job]:
        return {job.ref: job for job in self.jobs if job.ref is not None}

    def loop(self, poll_interval_s: float, max_parallel: int | None) -> None:
        from ray.util.queue import Queue

        def collect() -> bool:
            self._poll(poll_interval_s)
            return bool(self.pending or self._submitted)

        def advance() -> None:
            while self.pending and (max_parallel is None or len(self._submitted) < max_parallel):
                self._submit(self.pending.pop(0))
            self._status()

        self.events = Queue(actor_options={"num_cpus": 0})
        try:
            self.book.drive(collect, advance, self._stop_all, fail_fast=self.fail_fast)
        finally:
            self.events.shutdown()

    def _submit(self, job: _Job, *, whole_gpu: bool = False) -> None:
        demand, spec = job.demand, self.plan.jobs[job.demand.job]
        if whole_gpu and demand.num_gpus:
            job.demand = demand = replace(demand, num_gpus=1.0)
        variables = job_env(demand.threads, "")
        if demand.num_gpus:  # Ray sets the GPUs it assigns; it leaves the variable alone at 0
            del variables["CUDA_VISIBLE_DEVICES"]
        # Ray's retries count from this task: the attempts before it are spent
        retries = max(0, spec.retries - self.book.attempts.get(demand.job, 0))
        # The variables go to the job's own process, not the task's ``runtime_env``: a task
        # with a runtime_env cannot run on Ray's prestarted workers. Measured on 2 CPUs, four
        # small torch jobs on a running local Ray took 8.7 s before this runner and 11.7 s
        # through runtime_env (medians of 2 rounds, alternated).
        job.ref = self._remote.options(
            **demand.options(),
            max_retries=retries,
            retry_exceptions=[JobKilled],
            name=f"maxtp-pack:{demand.name}",
        ).remote(spec, demand.job, self.events, variables)

    def _poll(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for a task to end; take every record, then every end."""
        refs = list(self._submitted)
        if refs:
            self.ray.wait(refs, num_returns=1, timeout=timeout_s)
            refs = self.ray.wait(refs, num_returns=len(refs), timeout=0)[0]
        if count := self.events.qsize():  # a task's records are in before its ref is ready
            for record in self.events.get_nowait_batch(count):
                job = self.jobs[record["job"]]
                if record["kind"] == "start":
                    self._started(job, record)
                else:
                    self._ended(job, record)
        for ref in refs:
            self._final(self._submitted[ref], ref)

    def _started(self, job: _Job, start: dict[str, Any]) -> None:
        if job.start is not None and job.end is None:  # Ray reran a task whose worker died
            self._append(job, "\n# the Ray task was lost: its worker or node died\n")
            self.book.again(
                job.demand.job,
                f"lost on {job.start['host']} (its Ray worker or node died)",
                job.path,
            )
        demand = job.demand
        resources = ", ".join(f"{k}={v:g}" for k, v in demand.options().items())
        env = " ".join(f"{k}={v}" for k, v in start["env"].items())
        _, job.path, header = self.book.next_attempt(
            demand.job,
            ray_task=resources,
            node=f"{start['host']} (Ray worker pid {start['worker_pid']})",
            env=env,
        )
        job.path.write_text(header)
        job.start, job.started, job.end = start, time.monotonic(), None
        gpus = ",".join(start["gpus"])
        where = f"{start['host']} GPU {gpus}" if gpus else f"{start['host']} CPU"
        self.book.progress.event(
            f"start {demand.name} on {where} ({demand.threads} threads) -> {job.path}"
        )

    def _ended(self, job: _Job, end: dict[str, Any]) -> None:
        job.end = end
        self._append(job, end["output"])
        spec, code = self.plan.jobs[job.demand.job], end["exit_code"]
        killed = proc.killed_by(code, shell=spec.shell)
        if (
            killed is not None
            and not job.cancelled
            and self.book.attempts[job.demand.job] <= spec.retries
        ):
            host = (job.start or {}).get("host", "its node")
            self.book.again(
                job.demand.job,
                f"killed by {killed} on {host} after {end['wall_s']:.1f} s",
                job.path,
            )

    def _final(self, job: _Job, ref: Any) -> None:
        """The task's end: the job's result, or the OOM rule's new task."""
        job.ref = None
        exceptions = self.ray.exceptions
        try:
            self.ray.get(ref)
        except JobKilled:  # no retry left: the end record says how it ended
            pass
        except exceptions.RayError as err:
            # A task this runner cancelled may end in any error: Ray interrupts its worker, and a
            # worker that inherited SIGINT ignored fails inside Ray's own interrupt (TypeError).
            if job.cancelled or isinstance(err, exceptions.TaskCancelledError):
                self._stopped(job, "\n# cancelled\n")
            elif isinstance(err, exceptions.RayTaskError):  # our task's own code raised
                self._append(job, f"\n# the Ray task failed: {err}\n")
                self._finish(job, "failed")
            else:  # its worker or node died, no retry left
                first = (str(err).strip().splitlines() or [""])[0]
                self._append(job, f"\n# the Ray task was lost: {type(err).__name__}: {first}\n")
                self._finish(job, "lost")
            return
        assert job.end is not None, "a task's end record is queued before it returns"
        code, oom = job.end["exit_code"], job.end["oom"]
        spec = self.plan.jobs[job.demand.job]
        again = proc.rerun(
            code,
            oom=oom,
            shell=spec.shell,
            attempt=self.book.attempts[job.demand.job],
            retries=spec.retries,
            retry_oom=self.retry_oom,
        )
        if again is not None and not job.cancelled:  # out of GPU memory: a whole GPU, new task
            host = (job.start or {}).get("host", "its node")
            self.book.again(
                job.demand.job, f"{again[0]} on {host} after {job.end['wall_s']:.1f} s", job.path
            )
            self._submit(job, whole_gpu=again[1])
            return
        self._finish(job, "ok" if code == 0 else "oom" if oom else "failed")  # ended by itself

    def _stopped(self, job: _Job, note: str) -> None:
        if job.start is None:  # never ran: not_run, without a log
            return
        self._append(job, note)
        self._finish(job, "stopped")

    def _finish(self, job: _Job, status: str) -> None:
        start, end = job.start or {}, job.end or {}
        gpus = start.get("gpus") or []
        assert job.path is not None, "an attempt that ended has a log"
        self.book.finish(
            job.demand.job,
            status=status,
            code=end.get("exit_code"),
            wall_s=end.get("wall_s", time.monotonic() - job.started),
            log_path=job.path,
            node=start.get("host"),
            gpu=int(gpus[0]) if len(gpus) == 1 and str(gpus[0]).isdigit() else None,
            threads=job.demand.threads,
            peak_rss_bytes=end.get("peak_rss_bytes"),
        )

    def _append(self, job: _Job, data: bytes | str) -> None:
        """Add to the log of the job's attempt now (a task that failed before it started: new)."""
        if job.path is None:
            _, job.path, header = self.book.next_attempt(job.demand.job)
            job.path.write_text(header)
        with open(job.path, "ab") as log:
            log.write(data.encode() if isinstance(data, str) else data)

    def _stop_all(self) -> None:
        """Cancel every task; each stops its job's tree. Past the grace, kill the workers."""
        for job in self._submitted.values():
            job.cancelled = True
            self.ray.cancel(job.ref)
        deadline = time.monotonic() + STOP_GRACE_S
        while self._submitted and time.monotonic() < deadline:
            self._poll(0.1)
        for job in list(self._submitted.values()):
            self.ray.cancel(job.ref, force=True)
            job.ref = None
            self._stopped(job, "\n# killed with its Ray worker after the grace period\n")

    def _status(self) -> None:
        running = [j for j in self.jobs if j.ref is not None and j.start is not None]
        queued = len(self.pending) + len(self._submitted) - len(running)
        elapsed = time.monotonic() - self.book.started
        parts = [counts_text(len(running), queued, self.book.results.values(), elapsed)]
        hosts: dict[str, list[RayDemand]] = {}
        for job in running:
            hosts.setdefault(str((job.start or {}).get("host")), []).append(job.demand)
        for host, here in hosts.items():
            gpus, cpus = sum(d.num_gpus for d in here), sum(d.num_cpus for d in here)
            parts.append(f"{host}: {len(here)} jobs, {gpus:g} GPU, {cpus:g} CPU")
        self.book.progress.status(" | ".join(parts))
