"""A process's CPU time and run-queue wait from ``/proc/<pid>/task/*/schedstat`` (Linux).

Wall time is a poor denominator on a shared machine: a CPU-bound process that waits for a core
looks, by its CPU seconds per second, as if it waited on I/O. The kernel counts the time each
thread spent runnable but not running; adding it back gives what the process *asked* for.
Hypervisor steal is in neither figure. Off Linux, or on a kernel built without schedstats (whose
files read ``0 0 0``), the readers return None.

The files are per thread, and a thread that exits takes its counts with it, so a process total
can go down. ``SchedClock`` therefore adds up per-thread differences between two readings.
"""

from __future__ import annotations

import functools
import os

__all__ = ["SchedClock", "schedstats_enabled", "thread_schedstat"]


def thread_schedstat(pid: int | str = "self") -> dict[str, tuple[int, int]] | None:
    """``{thread id: (ns on a CPU, ns waiting for a CPU)}`` for ``pid``'s live threads.

    Args:
        pid: The process; ``"self"`` for this one.

    Returns:
        The counts per thread, or None when the process or the kernel's schedstats are absent.
    """
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    out: dict[str, tuple[int, int]] = {}
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                run, wait = f.read().split()[:2]
            out[tid] = (int(run), int(wait))
        except (OSError, ValueError):
            continue  # the thread ended while listed
    return out if out and schedstats_enabled() else None


@functools.cache
def schedstats_enabled() -> bool:
    """Whether this kernel keeps the counts (built without them, every file reads ``0 0 0``).

    Judged on this process, which has certainly run; a process just started may not have yet.
    """
    try:
        with open("/proc/self/schedstat") as f:
            return int(f.read().split()[0]) > 0
    except (OSError, ValueError, IndexError):
        return False


class SchedClock:
    """Nanoseconds one process ran and waited for a CPU between successive ``advance`` calls.

    Args:
        pid: The process; ``"self"`` for this one.
    """

    def __init__(self, pid: int | str = "self") -> None:
        self._pid = pid
        self._last = thread_schedstat(pid)

    def advance(self) -> tuple[int, int] | None:
        """``(ns on a CPU, ns waiting)`` since the previous reading; None without two readings.

        Threads present in both readings count their difference; threads started since count
        in full (all their time is since then); threads that ended count nothing for the part
        after the previous reading (it is lost with them).
        """
        now = thread_schedstat(self._pid)
        last, self._last = self._last, now
        if now is None or last is None:
            return None
        run = wait = 0
        for tid, (r, w) in now.items():
            r0, w0 = last.get(tid, (0, 0))
            run, wait = run + max(0, r - r0), wait + max(0, w - w0)
        return run, wait
