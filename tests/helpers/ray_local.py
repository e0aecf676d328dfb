"""A local Ray instance for a test module: started once, everything it changed put back after."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from typing import Any

import psutil


def closed_port() -> int:
    """A local port nothing listens on once this returns (a Ray address nobody answers at)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _children() -> dict[int, psutil.Process]:
    return {p.pid: p for p in psutil.Process().children(recursive=True) if p.is_running()}


@contextlib.contextmanager
def local_ray(**init: Any) -> Iterator[Any]:
    """``ray.init(**init)`` with the settings every test module needs; yields its context.

    ray.init sets variables of its own (RAY_AUTH_MODE): all are put back after, and every
    process it started is gone.
    """
    saved = dict(os.environ)  # before the import, which sets RAY_CLIENT_MODE
    before = set(_children())
    import ray

    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # no usage report sent anywhere
    context = ray.init(
        include_dashboard=False, log_to_driver=False,
        # Idle workers exit at once: each test must leave no child process behind. Ray starts
        # its workers at nice 15; beside other tests at nice 0 (the parallel pass) they starved:
        # the inference module took 276 s there against 44 s alone, and with two busy loops
        # beside it the shared actors were not ready in 60 s. At nice 0 they take their share.
        _system_config={"num_workers_soft_limit": 0, "idle_worker_killing_time_threshold_ms": 100,
                        "worker_niceness": 0},
        **init,
    )  # fmt: skip
    try:
        yield context
    finally:
        ray.shutdown()
        os.environ.clear()
        os.environ.update(saved)
        # The per-test leak check leaves Ray's pooled workers to this one: none may outlive
        # the instance (30 s: a worker still starting on a loaded machine exits when it finds
        # its raylet gone).
        started = [p for pid, p in _children().items() if pid not in before]
        _, alive = psutil.wait_procs(started, timeout=30)
        survivors = [f"{p.pid}" for p in alive]
        for process in alive:
            with contextlib.suppress(psutil.Error):
                process.kill()
        assert not survivors, f"Ray processes outlived ray.shutdown(): {survivors}"
