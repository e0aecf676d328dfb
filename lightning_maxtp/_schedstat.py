"""A process's CPU time and run-queue wait from ``/proc/<pid>/task/*/schedstat`` (Linux).

Wall time is a poor denominator on a shared machine: a CPU-bound process that waits for a core
looks, by its CPU seconds per second, as if it waited on I/O. The kernel counts the time each
thread spent runnable but not running; adding it back gives what the process *asked* for.
Hypervisor steal is in neither figure. Off Linux (or without schedstats) the reader returns None.
"""

from __future__ import annotations

import os


def schedstat_ns(pid: int | str = "self") -> tuple[int, int] | None:
    """``(on a CPU, waiting for a CPU)`` in nanoseconds, summed over ``pid``'s threads.

    Args:
        pid: The process; ``"self"`` for this one.

    Returns:
        The two totals, or None when the process or the kernel's schedstat files are absent.
    """
    on_cpu = waiting = 0
    found = False
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                run, wait = f.read().split()[:2]
            on_cpu, waiting = on_cpu + int(run), waiting + int(wait)
        except (OSError, ValueError):
            continue
        found = True
    return (on_cpu, waiting) if found else None
