"""SIGINT and SIGTERM while ``maxtp pack`` runs: every job is stopped before the command ends.

The first signal is recorded on the run (``interrupted``); the local runner then raises ``Stop``
out of its loop, the Ray runner's loop sees the record. A second Ctrl-C does not break the
cleanup.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Protocol

__all__ = ["Interruptible", "Signals", "Stop", "signals_stop"]


class Stop(BaseException):
    """Raised by our signal handler in the main thread."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class Interruptible(Protocol):
    """A run a signal can stop: the handler records the signal's name here first."""

    interrupted: str | None


class Signals:
    """SIGINT and SIGTERM while a run goes on: recorded on the run, raised as ``Stop`` or not.

    ``deferred()`` holds the ``Stop`` back until the block ends, in software: blocking the
    signals with ``pthread_sigmask`` instead would pass the blocked mask on to every job started
    inside the block, and a job that never sees SIGTERM cannot save its work when preempted.
    """

    def __init__(self, run: Interruptible, *, raise_stop: bool = True) -> None:
        """Handle signals for ``run``.

        Args:
            run: Where the first signal's name is recorded (``run.interrupted``).
            raise_stop: Raise ``Stop`` (else only record it, for a loop that checks the run:
                Ray runs Python's signal handlers inside its own calls and turns what they
                raise into a ``SystemError``).
        """
        self.run, self.raise_stop = run, raise_stop
        self._depth = 0
        self._held: int | None = None

    def handler(self, signum: int, frame: object) -> None:
        """The signal handler: record the first signal, then raise now or when allowed."""
        if self.run.interrupted is not None:  # a second Ctrl-C must not break the cleanup
            return
        self.run.interrupted = signal.Signals(signum).name
        if not self.raise_stop:
            return
        if self._depth:
            self._held = signum
            return
        raise Stop(signum)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Inside, a signal's ``Stop`` waits for the block's end (what it records stays whole)."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        if not self._depth and self._held is not None:
            signum, self._held = self._held, None
            raise Stop(signum)


@contextlib.contextmanager
def signals_stop(signals: Signals) -> Iterator[None]:
    """While inside, SIGINT and SIGTERM go to ``signals.handler`` (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stops = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, signals.handler) for sig in stops}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
