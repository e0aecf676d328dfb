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


def _ray_processes() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.is_running()]


@contextlib.contextmanager
def local_ray(**init: Any) -> Iterator[Any]:
    """``ray.init(**init)`` with the settings every test module needs; yields its context.

    ray.init sets variables of its own (RAY_AUTH_MODE): all are put back after, and every
    process it started is gone.
    """
    saved = dict(os.environ)  # before the import, which sets RAY_CLIENT_MODE
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
        _, alive = psutil.wait_procs(_ray_processes(), timeout=10)
        for process in alive:
            process.kill()
