"""SIGINT and SIGTERM while ``maxtp pack`` runs: every job is stopped before the command ends.

The handler only records the first signal on the run (``interrupted``); each runner's loop
checks it between its polls and then stops every job. Nothing is raised from the handler: an
exception landing between starting a child and recording it would orphan the child, and Ray
runs Python's signal handlers inside its own calls and turns what they raise into a
``SystemError``. A second Ctrl-C does not break the cleanup.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Protocol

__all__ = ["Interruptible", "signals_stop"]


class Interruptible(Protocol):
    """A run a signal can stop: the handler records the signal's name here."""

    interrupted: str | None


@contextlib.contextmanager
def signals_stop(run: Interruptible) -> Iterator[None]:
    """While inside, SIGINT and SIGTERM are recorded on ``run`` (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        if run.interrupted is None:  # a second Ctrl-C must not change what is reported
            run.interrupted = signal.Signals(signum).name

    stops = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, handler) for sig in stops}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
