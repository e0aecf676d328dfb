"""What runs on a Ray node for ``maxtp pack --backend ray``: one job's command, streamed back.

``job_task`` is a generator: Ray runs it as a streaming task (``num_returns="streaming"``) and the
submitting machine reads what it yields as it comes, in order:

- ``{"kind": "start", ...}`` once the command runs: the host, the Ray worker's and the keeper's
  pids, the GPUs Ray gave the task and the variables pack set;
- ``{"kind": "out", "data": bytes}`` chunks of the command's output (stdout and stderr);
- ``{"kind": "end", ...}`` with the exit code, wall time and the tree's peak memory.

The command runs in its own session, with ``CUDA_VISIBLE_DEVICES`` from the GPUs Ray assigned
(empty for a CPU job) and the thread variables from its CPU share. Cancelling the task (Ray
raises ``TaskCancelledError`` in it) stops the whole process tree before the task ends; if the
worker itself dies (a crash, ``kill -9``, a forced cancel), nothing in it can run any more, so
the job runs under a small keeper (``GUARD``) that sees the worker go and ends the job's
process group.

Importing this module imports neither Ray, torch nor lightning: Ray workers import it by
reference, and it must stay cheap there.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from lightning_maxtp.pack.placement import job_env
from lightning_maxtp.pack.proc import Tree

__all__ = ["gpu_memory_bytes", "job_task"]

FLUSH_INTERVAL_S = 0.25
"""Seconds between output chunks sent back (each one is a small object in Ray's store)."""
_SAMPLE_INTERVAL_S = 0.5
_STOP_GRACE_S = 5.0


GUARD = r"""
import os, signal, sys, threading
alive, status, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
if os.fork():  # the launcher ends at once: the guard is no child of the worker
    os._exit(0)
def watch():  # EOF: the worker is gone (crashed, killed, lost): end the job's whole group
    while os.read(alive, 1):
        pass
    os.killpg(0, signal.SIGKILL)
signal.signal(signal.SIGTERM, lambda *_: None)  # a stop sent to the group is for the job
threading.Thread(target=watch, daemon=True).start()
os.write(status, f"{os.getpid()}\n".encode())
pid = os.fork()
if pid == 0:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.close(alive)
    os.close(status)
    try:
        os.execvp(argv[0], argv)
    except OSError as err:
        sys.stderr.write(f"# could not start: {err}\n")
        os._exit(127)
while True:
    try:
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        break
    except InterruptedError:
        continue
os.write(status, f"{code}\n".encode())
os._exit(0)
"""
"""The job's keeper on the node: a few lines of Python (no imports of ours). Started through a
launcher that exits at once, so it is no child of the Ray worker: a worker that exits (a forced
cancel) SIGKILLs its own children first, and the keeper must outlive it to act. It reads the
worker's end of a pipe: end of file means the worker is gone, however it ended (a crash,
``kill -9``, the kernel's OOM killer, a forced cancel), and it then kills the job's whole
process group, grandchildren too. It runs the command, and writes its own pid, then the
command's exit code (``-N`` for signal N), to a status pipe the task reads."""


class _Output:
    """Reads a pipe in a thread; ``take()`` hands over what came since the last call."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._chunks: list[bytes] = []
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._read, name="maxtp-pack-output", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while chunk := os.read(self._fd, 65536):
            with self._lock:
                self._chunks.append(chunk)

    def take(self) -> bytes:
        with self._lock:
            data, self._chunks = b"".join(self._chunks), []
        return data


def _interruptible() -> None:
    """Give this worker Python's own SIGINT handler if it inherited SIGINT ignored.

    ``ray.cancel`` stops a running task by interrupting its worker; a worker started from a
    shell's background job (a CI script, ``nohup``) inherits SIGINT ignored, and Ray's interrupt
    then fails with a ``TypeError`` instead of stopping the task.
    """
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers; Ray runs tasks there
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def job_task(
    command: str | Sequence[str],
    *,
    shell: bool,
    cwd: str | None,
    env: Mapping[str, str],
    threads: int,
) -> Iterator[dict[str, Any]]:
    """Run one job's command on this node and yield its start, output and end (see above).

    Args:
        command: A shell line (``shell=True``) or an argument vector.
        shell: Whether ``command`` runs through ``/bin/sh -c``.
        cwd: Working directory on the node (``None``: the worker's).
        env: The job's own variables; they win over the ones set here.
        threads: The thread variables' value (its CPU share).
    """
    import ray  # the worker has it; importing it at module level would cost the driver's CLI

    _interruptible()
    gpu_ids = [str(g) for g in ray.get_gpu_ids()]
    ours = job_env(threads, ",".join(gpu_ids))
    variables = {**ours, **env}
    start = {
        "kind": "start",
        "host": socket.gethostname(),
        "node_id": ray.get_runtime_context().get_node_id(),
        "gpus": gpu_ids,
        "env": ours,  # what pack set (the job's own env may hold secrets: not sent)
        "worker_pid": os.getpid(),
    }
    started = time.monotonic()
    argv = ["/bin/sh", "-c", str(command)] if shell else [str(arg) for arg in command]
    try:
        launcher, alive_w, status = _launch(argv, cwd, {**os.environ, **variables})
    except OSError as err:
        yield {**start, "pid": None}
        yield {"kind": "out", "data": f"# could not start: {err}\n".encode()}
        yield {"kind": "end", "exit_code": 127, "wall_s": 0.0, "peak_rss_bytes": None}
        return
    assert launcher.stdout is not None
    output = _Output(launcher.stdout.fileno())
    launcher.wait()  # it forks the keeper and ends
    # The launcher's session is the job's group; the keeper's few MiB are not the job's.
    tree = Tree(status.keeper(), group=launcher.pid, root_counted=False)
    code: int | None = None
    try:
        yield {**start, "pid": tree.pid}
        sampled = 0.0
        while (code := status.code(FLUSH_INTERVAL_S)) is None and not status.closed:
            now = time.monotonic()
            if now - sampled >= _SAMPLE_INTERVAL_S:
                tree.sample()
                sampled = now
            if data := output.take():
                yield {"kind": "out", "data": data}
        wall = time.monotonic() - started
        if code is None:  # the keeper died without a word (killed itself): so did the job
            code = -int(signal.SIGKILL)
        tree.signal(signal.SIGKILL)  # leftovers of a finished job are orphans: end them
        output.thread.join(timeout=2.0)
        if data := output.take():
            yield {"kind": "out", "data": data}
        peak = tree.peak_rss_bytes or None
        yield {"kind": "end", "exit_code": code, "wall_s": wall, "peak_rss_bytes": peak}
    finally:
        try:
            if code is None:  # cancelled (or the consumer went away): stop the tree
                _stop(tree, status)
        finally:
            os.close(alive_w)  # past this, the keeper ends the group itself
            status.close()
            launcher.stdout.close()


def _launch(
    argv: list[str], cwd: str | None, env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], int, _Status]:
    """Start the keeper (through its launcher) for ``argv``; the pipes' ends this side keeps."""
    alive_r, alive_w = os.pipe()  # this worker holds alive_w: its death closes it
    status_r, status_w = os.pipe()
    try:
        launcher = subprocess.Popen(
            [sys.executable, "-c", GUARD, str(alive_r), str(status_w), *argv],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=(alive_r, status_w),
        )
    except OSError:
        for fd in (alive_r, alive_w, status_r, status_w):
            os.close(fd)
        raise
    os.close(alive_r)
    os.close(status_w)
    return launcher, alive_w, _Status(status_r)


class _Status:
    """The keeper's status pipe: its pid, then the job's exit code, one line each."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lines: list[int] = []
        self._buffer = b""
        self.closed = False

    def _read(self, timeout_s: float) -> None:
        if self.closed or not select.select([self._fd], [], [], timeout_s)[0]:
            return
        chunk = os.read(self._fd, 4096)
        if not chunk:
            self.closed = True
            return
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        self._lines += [int(line) for line in lines if line.strip()]

    def keeper(self) -> int:
        """The keeper's pid (waits for its first line)."""
        while not self._lines and not self.closed:
            self._read(1.0)
        return self._lines[0] if self._lines else -1

    def code(self, timeout_s: float) -> int | None:
        """The job's exit code once it has ended; ``None`` after ``timeout_s`` without it."""
        if len(self._lines) < 2:
            self._read(timeout_s)
        return self._lines[1] if len(self._lines) > 1 else None

    def close(self) -> None:
        os.close(self._fd)


def _stop(tree: Tree, status: _Status) -> None:
    """SIGTERM to the job's group, SIGKILL after a grace period (or once it has ended).

    The signals are sent whatever happens first: ``Tree.sample`` skips processes that went
    (``psutil.Error``) itself, so what it raises is a bug, raised once the job is stopped.
    """
    try:
        tree.sample()  # descendants that left the job's group get the signals too
    finally:
        tree.signal(signal.SIGTERM)
        deadline = time.monotonic() + _STOP_GRACE_S
        while status.code(0.1) is None and not status.closed and time.monotonic() < deadline:
            pass
        tree.signal(signal.SIGKILL)


def gpu_memory_bytes() -> tuple[int | None, str | None]:
    """The smallest GPU's total memory on this node, read by NVML, or ``None`` and why not.

    Ray reports GPUs as counts only; jobs that declare their GPU memory need the GPU's size to
    ask for the right share of one. This runs on the node, whose log the submitting machine
    does not show, so the reason comes back with the answer. An error NVML does not raise (a
    bug) is raised: the submitting machine reports the failed task.
    """
    try:
        import pynvml
    except ImportError as err:
        return None, f"nvidia-ml-py is not installed there ({err})"
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError, OSError) as err:
        return None, f"NVML did not start ({type(err).__name__}: {err})"
    try:
        sizes = [
            int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total)
            for i in range(pynvml.nvmlDeviceGetCount())
        ]
    except pynvml.NVMLError as err:
        return None, f"NVML could not read a GPU's memory ({type(err).__name__}: {err})"
    finally:
        with contextlib.suppress(pynvml.NVMLError):  # a failed shutdown changes no answer
            pynvml.nvmlShutdown()
    if not sizes:
        return None, "NVML lists no GPU there"
    return min(sizes), None
