"""What runs on a Ray node for ``maxtp pack --backend ray``: one job's command, streamed back.

``job_task`` is a generator: Ray runs it as a streaming task (``num_returns="streaming"``) and the
submitting machine reads what it yields as it comes, in order:

- ``{"kind": "start", ...}`` once the command runs: the host, its pid, the GPUs Ray gave the task
  and the variables set;
- ``{"kind": "out", "data": bytes}`` chunks of the command's output (stdout and stderr);
- ``{"kind": "end", ...}`` with the exit code, wall time and the tree's peak memory.

The command runs in its own session, with ``CUDA_VISIBLE_DEVICES`` from the GPUs Ray assigned
(empty for a CPU job) and the thread variables from its CPU share. Cancelling the task (Ray
raises ``TaskCancelledError`` in it) stops the whole process tree before the task ends; if the
worker itself dies (a lost node, ``kill -9``), the kernel kills the command's main process
(``PR_SET_PDEATHSIG``), since nothing in the worker can run any more.

Importing this module imports neither Ray, torch nor lightning: Ray workers import it by
reference, and it must stay cheap there.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from lightning_maxtp.pack.placement import job_env
from lightning_maxtp.pack.proc import Tree

__all__ = ["gpu_memory_bytes", "job_task"]

FLUSH_INTERVAL_S = 0.25
"""Seconds between output chunks sent back (each one is a small object in Ray's store)."""
_SAMPLE_INTERVAL_S = 0.5
_STOP_GRACE_S = 5.0
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> Callable[[], None]:
    """What the child runs before ``exec``: the kernel sends it SIGKILL when this worker dies.

    ``prctl`` is looked up here, before the fork: the child of a threaded process must not
    ``dlopen``. A worker that died before the call left the child orphaned already: it exits.
    """
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def in_child() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(137)

    return in_child


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

    gpu_ids = [str(g) for g in ray.get_gpu_ids()]
    variables = {**job_env(threads, ",".join(gpu_ids)), **env}
    start = {
        "kind": "start",
        "host": socket.gethostname(),
        "node_id": ray.get_runtime_context().get_node_id(),
        "gpus": gpu_ids,
        "env": variables,
    }
    started = time.monotonic()
    try:
        popen = subprocess.Popen(
            command if shell else list(command),
            shell=shell,
            cwd=cwd,
            env={**os.environ, **variables},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent(),  # noqa: PLW1509 - a prctl call, as Ray does itself
        )
    except OSError as err:
        yield {**start, "pid": None}
        yield {"kind": "out", "data": f"# could not start: {err}\n".encode()}
        yield {"kind": "end", "exit_code": 127, "wall_s": 0.0, "peak_rss_bytes": None}
        return
    assert popen.stdout is not None
    tree = Tree(popen.pid)
    output = _Output(popen.stdout.fileno())
    try:
        yield {**start, "pid": popen.pid}
        sampled = 0.0
        while (code := popen.poll()) is None:
            now = time.monotonic()
            if now - sampled >= _SAMPLE_INTERVAL_S:
                tree.sample()
                sampled = now
            if data := output.take():
                yield {"kind": "out", "data": data}
            time.sleep(FLUSH_INTERVAL_S)
        wall = time.monotonic() - started
        tree.signal(signal.SIGKILL)  # leftovers of a finished job are orphans: end them
        output.thread.join(timeout=2.0)
        if data := output.take():
            yield {"kind": "out", "data": data}
        peak = tree.peak_rss_bytes or None
        yield {"kind": "end", "exit_code": code, "wall_s": wall, "peak_rss_bytes": peak}
    finally:
        if popen.returncode is None:  # cancelled (or the consumer went away): stop the tree
            _stop(popen, tree)
        popen.stdout.close()


def _stop(popen: subprocess.Popen[bytes], tree: Tree) -> None:
    """SIGTERM to the job's tree, SIGKILL after a grace period, then reap it."""
    with contextlib.suppress(Exception):
        tree.sample()
    tree.signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        popen.wait(timeout=_STOP_GRACE_S)
    tree.signal(signal.SIGKILL)
    popen.wait()


def gpu_memory_bytes() -> int | None:
    """The smallest GPU's total memory on this node, read by NVML; ``None`` when it can't tell.

    Ray reports GPUs as counts only; jobs that declare their GPU memory need the GPU's size to
    ask for the right share of one.
    """
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no nvidia-ml-py, or no driver on this node
        return None
    try:
        sizes = [
            int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total)
            for i in range(pynvml.nvmlDeviceGetCount())
        ]
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return min(sizes, default=None)
