"""Suite-wide fixtures: every test must leave no child process, extra thread or variable behind."""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time
from collections.abc import Iterator

import psutil
import pytest

_GRACE_S = 10.0


_SINGLETONS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
"""Helpers multiprocessing starts once per interpreter and keeps until it exits: not leaks."""


def _children() -> set[int]:
    found = set()
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if any(name in " ".join(child.cmdline()) for name in _SINGLETONS):
                continue
        found.add(child.pid)
    return found


def _threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.is_alive() and not t.daemon}


@pytest.fixture(autouse=True)
def no_leaked_processes_or_threads() -> Iterator[None]:
    """Fail a test that leaks child processes or non-daemon threads (after a grace period)."""
    children_before, threads_before = _children(), _threads()
    yield
    deadline = time.monotonic() + _GRACE_S
    while True:
        gc.collect()  # DataLoader iterators shut their workers down when collected
        leaked_children = _children() - children_before
        leaked_threads = _threads() - threads_before
        if not (leaked_children or leaked_threads) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for pid in leaked_children:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()
    assert not leaked_children, f"test left child processes behind: {sorted(leaked_children)}"
    assert not leaked_threads, f"test left threads behind: {[t.name for t in leaked_threads]}"


@pytest.fixture(autouse=True)
def restored_environment() -> Iterator[None]:
    """Put ``os.environ`` back after each test.

    Lightning's in-process launchers (``ddp_fork``) set ``MASTER_PORT``, ``PL_GLOBAL_SEED`` and
    more and leave them: a later test's subprocesses would inherit a fixed port instead of
    finding a free one.
    """
    saved = dict(os.environ)
    yield
    for key in set(os.environ) - set(saved):
        del os.environ[key]
    for key, value in saved.items():
        if os.environ.get(key) != value:
            os.environ[key] = value
