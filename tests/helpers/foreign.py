"""A live process that is someone else's: not this one, not an ancestor, not a descendant.

What NVML lists for another user's job on a shared GPU. Started once per test process (a
double fork: its parent exits, so it belongs to no one here), killed when the process exits.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys

import psutil

_CODE = """
import os, time
child = os.fork()
if child:
    print(child, flush=True)
    os._exit(0)
os.setsid()
for fd in (0, 1, 2):
    os.close(fd)
time.sleep(3600)
"""

_started: list[int] = []


def foreign_pid() -> int:
    """The pid of a sleeping process that belongs to no process of this test run's tree."""
    if not _started or not psutil.pid_exists(_started[-1]):
        out = subprocess.run(
            [sys.executable, "-c", _CODE], stdin=subprocess.DEVNULL, capture_output=True,
            text=True, check=True, timeout=60,
        )  # fmt: skip
        _started.append(int(out.stdout.split()[0]))
        atexit.register(_kill, _started[-1])
    return _started[-1]


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
