"""Fresh fits without paying Lightning's import each time: a fork server for the bench's children.

Every bench run must start clean (no caches, threads, compiled kernels or allocator state from
another run), which a new interpreter gives, at the price of importing torch and Lightning
again: ~7 s per run on a 2-CPU machine, more than the fit itself in a short CI gate. A fork
server pays that import once: a process that imports torch, Lightning and this package, never
runs anything, and forks one child per run. A forked child holds the imported modules and
nothing else; it calls ``lightning_maxtp.bench.child.main`` with the run's arguments (what
``python -m lightning_maxtp.bench.child`` runs), its output in its own log, its exit code
reported back.

The server is used only where forking after these imports is safe: on Linux, and only when the
imports left CUDA uninitialized (a forked child cannot use a CUDA context made before the
fork). Anywhere else, or with ``MAXTP_BENCH_FORK=0``, or when the server cannot start, each run
is a fresh ``python -m lightning_maxtp.bench.child`` as before.

Protocol (one JSON object per line): the server first prints ``{"ready": bool, "why": str}``;
for each request ``{"argv": [...], "log": path or null}`` on its stdin it prints
``{"pid": N}`` once the child is forked and ``{"pid": N, "code": C}`` once it has ended (a
child killed by a signal reports ``-signal``, as ``subprocess`` does). It exits at the end of
its stdin. This module imports neither torch nor lightning unless it runs as the server.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

__all__ = ["ForkServer", "fork_allowed"]

DISABLE_VAR = "MAXTP_BENCH_FORK"
"""Set to ``0`` to run every bench fit in a fresh interpreter instead of a forked one."""


def fork_allowed(env: dict[str, str]) -> bool:
    """Whether the children may be forked from a server (Linux, not turned off in ``env``)."""
    return sys.platform.startswith("linux") and env.get(DISABLE_VAR, "1") != "0"


class ForkServer:
    """The parent's handle on a fork server; a context manager that stops it on exit.

    Args:
        env: The server's (and so every child's) environment.
        stderr: Where the server and, for a request without a log, its children write.
        ready_timeout_s: Longest wait for the server's imports.
    """

    def __init__(self, env: dict[str, str], stderr: Any, ready_timeout_s: float = 300.0) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "lightning_maxtp.bench.forkserver"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
        assert self._proc.stdout is not None and self._proc.stdin is not None
        self._out: IO[bytes] = self._proc.stdout
        self._in: IO[bytes] = self._proc.stdin
        ready = self._read(ready_timeout_s)
        self.ready = bool(ready and ready.get("ready"))
        self.why = str(ready.get("why", "")) if ready else "it did not start"

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self, timeout_s: float) -> dict[str, Any] | None:
        """The server's next line, or None when it ended or said nothing in ``timeout_s``."""
        # Each line is read whole before the server writes the next, so the pipe's buffer is
        # empty whenever this waits and select sees every line.
        if not select.select([self._out], [], [], max(timeout_s, 0.0))[0]:
            return None
        line = self._out.readline()
        return json.loads(line) if line.strip() else None

    def run(self, argv: list[str], log: Path | None, timeout_s: float) -> int | None:
        """Run one child to its end.

        Args:
            argv: The arguments of ``lightning_maxtp.bench.child``.
            log: The child's stdout and stderr (None: the server's stderr).
            timeout_s: Longest the child may run; then it is killed.

        Returns:
            Its exit code, or None when it ran out of time (and was killed).

        Raises:
            RuntimeError: The server died.
        """
        request = {"argv": argv, "log": None if log is None else str(log)}
        try:
            self._in.write(json.dumps(request).encode() + b"\n")
            self._in.flush()
        except OSError as err:
            raise RuntimeError(f"the bench's fork server died: {err}") from None
        started = self._read(60.0)
        if started is None or "pid" not in started:
            raise RuntimeError("the bench's fork server died before forking a run")
        pid = int(started["pid"])
        ended = self._read(timeout_s)
        if ended is not None:
            return int(ended["code"])
        if self._proc.poll() is not None:
            raise RuntimeError("the bench's fork server died while a run was going on")
        with contextlib.suppress(ProcessLookupError):  # it may have ended just now
            os.kill(pid, signal.SIGKILL)
        self._read(10.0)  # its exit line, once the server has reaped it
        return None

    def close(self) -> None:
        """End the server (its stdin closes; it exits once no child is running)."""
        if self._proc.poll() is None:
            try:
                self._in.close()
                self._proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        self._out.close()


def _child(argv: list[str], log: str | None) -> int:
    """In the forked child: the streams, a fresh random state, then the bench child's main."""
    import random

    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    if log is not None:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    else:
        os.dup2(2, 1)
    random.seed()  # as a new interpreter would: children must not share one random stream
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    sys.argv = [str(Path(__file__).with_name("child.py")), *argv]
    from lightning_maxtp.bench.child import main

    try:
        return main(argv)
    except SystemExit as err:  # argparse
        return err.code if isinstance(err.code, int) else 1


def serve() -> int:
    """The server: import, say whether forking is safe, then fork a child per request line."""
    reply = sys.stdout.buffer
    try:
        import lightning.pytorch  # noqa: F401  (the import every child would pay)
        import torch

        import lightning_maxtp.bench.child
        import lightning_maxtp.callbacks  # the callback, for the maxtp config
        import lightning_maxtp.resources  # noqa: F401  (the first run probes the machine)

        initialized = torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
        ready, why = not initialized, "CUDA was initialized by the imports"
    except Exception as err:  # a broken install: the parent falls back and the child reports it
        ready, why = False, f"{type(err).__name__}: {err}"
    reply.write(json.dumps({"ready": ready, "why": "" if ready else why}).encode() + b"\n")
    reply.flush()
    if not ready:
        return 0
    for line in sys.stdin.buffer:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _child(list(request["argv"]), request["log"])
            except BaseException:  # a forked child must never return into the server's loop
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        reply.write(json.dumps({"pid": pid}).encode() + b"\n")
        reply.flush()
        _, status = os.waitpid(pid, 0)
        reply.write(json.dumps({"pid": pid, "code": os.waitstatus_to_exitcode(status)}).encode())
        reply.write(b"\n")
        reply.flush()
    return 0


if __name__ == "__main__":
    sys.exit(serve())
