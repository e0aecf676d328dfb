"""Child processes of ``maxtp pack``: start one job in its own session, sample, reap, kill.

The local runner and the Ray task (on its node) run each job through these. Each job runs in a
new session (``start_new_session=True``), so killing its process group stops the shell, the
trainer and its DataLoader workers together; psutil's view of the tree catches descendants that
moved to a session of their own. A job's output goes straight from the kernel into its log
(the log file is the child's stdout), so there is no capture code to replace.

Not a process pool (``concurrent.futures``, ``multiprocessing.Pool``): a pool runs Python
callables in worker processes it reuses, while a job here is a command whose whole process tree
must end with it, so the pool would only add a process between us and each job. Measured (a
shared two-CPU VM, ``/bin/true`` jobs, median of 5 rounds of 20): 0.62 ms per job with one
``Popen`` each, 0.89 ms per job through ``ProcessPoolExecutor(2)`` running ``subprocess.run``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psutil

from lightning_maxtp.pack.spec import JobSpec

OOM_MARKERS = (b"OutOfMemoryError", b"CUDA out of memory", b"CUBLAS_STATUS_ALLOC_FAILED")
"""Text in a failed job's log that means the GPU ran out of memory (torch >= 2.5 raises
``torch.OutOfMemoryError``; older ones ``torch.cuda.OutOfMemoryError``)."""
_OOM_TAIL_BYTES = 256 * 1024


@dataclass
class Tree:
    """A job's process group and every descendant seen in it, with their peak resident memory."""

    pid: int
    """The tree's root process."""
    seen: dict[int, psutil.Process] = field(default_factory=dict)
    peak_rss_bytes: int = 0
    own_group: bool = True
    """Whether the root leads a process group of its own (``start(new_session=True)``)."""

    def sample(self) -> None:
        """Add new descendants and update the peak RSS (the sum over the tree).

        Shared pages (forked DataLoader workers) count once per process, so the sum is an upper
        bound. ``wait4``'s ``ru_maxrss`` is no help: Linux carries the forking parent's peak
        over ``exec``, so every job would report at least its launcher's size.
        """
        with contextlib.suppress(psutil.Error):
            root = self.seen.get(self.pid) or psutil.Process(self.pid)
            self.seen.setdefault(self.pid, root)
            for proc in root.children(recursive=True):
                self.seen.setdefault(proc.pid, proc)
        total = 0
        for pid, proc in list(self.seen.items()):
            try:
                total += proc.memory_info().rss
            except psutil.Error:
                self.seen.pop(pid, None)
        self.peak_rss_bytes = max(self.peak_rss_bytes, total)

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the process group and to every process seen outside it."""
        if self.own_group:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)
        for proc in self.seen.values():
            if proc.pid == self.pid and self.own_group:
                continue
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)


@dataclass
class Child:
    """A running job's process and what was sampled from it (mutable, runner-internal)."""

    popen: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    log_offset: int
    started: float
    tree: Tree
    sampled: float = 0.0
    """``time.monotonic()`` of the last RSS sample."""

    @property
    def pid(self) -> int:
        """The job's main process (its process group has the same id)."""
        return self.popen.pid


def start(
    job: JobSpec, env: dict[str, str], log_path: Path, header: str, *, new_session: bool = True
) -> Child:
    """Start ``job`` with ``env`` added to this process's environment, output to ``log_path``.

    ``new_session=False`` keeps the job in this process's group (a Ray worker's, which Ray ends
    with the worker).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_file = open(log_path, "wb")  # noqa: SIM115 - closed by reap() or kill()
    log_file.write(header.encode())
    log_file.flush()
    offset = log_file.tell()
    args: str | list[str] = job.command if isinstance(job.command, str) else list(job.command)
    try:
        popen = subprocess.Popen(
            args,
            shell=job.shell,
            cwd=job.cwd,
            env={**os.environ, **env, **job.env},
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=new_session,
        )
    except OSError:
        log_file.close()
        raise
    tree = Tree(popen.pid, own_group=new_session)
    return Child(popen, log_path, log_file, offset, time.monotonic(), tree)


def reap(child: Child) -> int | None:
    """The exit code (``-N`` for signal N) if the job's main process ended, else ``None``."""
    try:
        pid, status = os.waitpid(child.pid, os.WNOHANG)
    except ChildProcessError:
        return child.popen.returncode
    if pid == 0:
        return None
    code = os.waitstatus_to_exitcode(status)
    child.popen.returncode = code  # we reaped it; keep Popen from waiting again
    child.tree.signal(signal.SIGKILL)  # leftovers of a finished job are orphans: end them
    child.log_file.close()
    return code


def kill(child: Child, grace_s: float = 5.0) -> None:
    """Stop the job's whole process group and every descendant seen: SIGTERM, then SIGKILL.

    The signals are sent whatever happens first: ``Tree.sample`` skips processes that went
    (``psutil.Error``) itself, so what it raises is a bug, raised once the job is stopped.
    """
    try:
        child.tree.sample()  # descendants that left the job's group get the signals too
    finally:
        child.tree.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and reap(child) is None:
            time.sleep(0.05)
        child.tree.signal(signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        if child.popen.returncode is None:
            _, status = os.waitpid(child.pid, 0)
            child.popen.returncode = os.waitstatus_to_exitcode(status)
    if not child.log_file.closed:
        child.log_file.close()


def log_shows_oom(log_path: Path, offset: int = 0) -> bool:
    """Whether a job's own output (its log after our header's ``offset`` bytes) shows an OOM."""
    try:
        with open(log_path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(offset, size - _OOM_TAIL_BYTES))
            tail = f.read()
    except OSError:
        return False
    return output_shows_oom(tail)


def output_shows_oom(output: bytes) -> bool:
    """Whether a job's own output (the end of it is read) shows an OOM."""
    tail = output[-_OOM_TAIL_BYTES:]
    return any(marker in tail for marker in OOM_MARKERS)


KILLING_SIGNALS = (signal.SIGKILL, signal.SIGTERM)
"""What the kernel's OOM killer, a preemption or an operator sends: a job ended by one of them
(not by us) may succeed when rerun, unlike one that exits with an error code."""


def killed_by(code: int | None, *, shell: bool) -> str | None:
    """The signal's name when exit code ``code`` means a killing signal ended the job, else None.

    A shell that ran the job without ``exec`` reports its child's death as ``128 + N``.
    """
    if code is None:
        return None
    for sig in KILLING_SIGNALS:
        if code == -sig or (shell and code == 128 + sig):
            return sig.name
    return None


def rerun(
    code: int, *, oom: bool, shell: bool, attempt: int, retries: int, retry_oom: bool
) -> tuple[str, bool] | None:
    """Whether a job's ended attempt runs again, and why (both backends' policy).

    A job killed by a killing signal runs again while it has ``retries`` left; one that ran
    out of GPU memory runs once more, with a GPU of its own, when ``retry_oom``.

    Args:
        code: The attempt's exit code.
        oom: Whether its log shows a GPU out-of-memory error (``log_shows_oom``).
        shell: Whether the command ran through ``/bin/sh -c`` (see ``killed_by``).
        attempt: The attempt's number, from 1.
        retries: The job's ``retries``.
        retry_oom: The run's ``retry_oom``.

    Returns:
        ``None`` (the attempt is the job's last), or why it ends (``"killed by SIGKILL"``) and
        whether the next attempt needs a GPU of its own.
    """
    killed = killed_by(code, shell=shell)
    if killed is not None and attempt <= retries:
        return f"killed by {killed}", False
    if code != 0 and oom and retry_oom and attempt == 1:
        return "out of GPU memory", True
    return None
