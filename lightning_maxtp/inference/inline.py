"""Batches run in the calling process: a plain batched loop, with loading overlapped.

``InlineRun`` pulls batches from the input one at a time, runs them on a ``BatchRunner`` built
in the caller (the next batch loads on the I/O threads while the current one runs) and yields
the outcomes in input order. It is the measured plan's first shape and its fallback.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

from lightning_maxtp.inference.records import InferenceError, ItemError
from lightning_maxtp.inference.runner import BatchRunner, Entries


class InlineRun:
    """One stretch of inline batches over a shared iterator.

    Args:
        runner: The caller's model copy.
        on_error: As the pool's.
        offset: Index of the next item of ``iterator`` in the whole input.
    """

    def __init__(self, runner: BatchRunner, *, on_error: str, offset: int = 0) -> None:
        self.runner = runner
        self.on_error = on_error
        self.next_index = offset
        self.pulled = self.outputs = self.batches = 0
        self.errors: list[ItemError] = []
        self.started = time.monotonic()
        self.first_result: float | None = None
        self.first_count = 0
        self.last_result: float | None = None
        self.exhausted = False

    @property
    def finished_items(self) -> int:
        """Items done (outputs and errors)."""
        return self.outputs + len(self.errors)

    def steady_rate(self) -> float:
        """Items/s after the first batch (its one-time costs left out); 0 before two batches."""
        if self.first_result is None or self.last_result is None:
            return 0.0
        seconds = self.last_result - self.first_result
        done = self.finished_items - self.first_count
        return done / seconds if seconds > 0 and done > 0 else 0.0

    def results(
        self,
        iterator: Iterator[Any],
        *,
        batch_size: Callable[[], int],
        stop: Callable[[InlineRun], bool],
        head: Entries | None = None,
    ) -> Iterator[Any]:
        """Outcomes in input order until the input ends or ``stop(self)`` says so.

        Args:
            iterator: The input; only the batches run are taken from it.
            batch_size: The size of the next batch (it may change between batches).
            stop: Asked before each batch is pulled; ``True`` leaves the rest in ``iterator``.
            head: Entries already pulled, run first.
        """
        batches = self._batches(iterator, batch_size, stop, head)
        for entries, (outputs, errors) in self.runner.stream(batches):
            now = time.monotonic()
            self.batches += 1
            self.outputs += len(outputs)
            self.errors += errors
            if self.first_result is None:
                self.first_result, self.first_count = now, self.finished_items
            self.last_result = now
            done = {index: output for index, output in outputs}
            done.update({error.index: error for error in errors})
            for index, _ in entries:
                value = done[index]
                if not isinstance(value, ItemError) or self.on_error == "return":
                    yield value
                elif self.on_error == "raise":
                    raise InferenceError(value)

    def _batches(
        self,
        iterator: Iterator[Any],
        batch_size: Callable[[], int],
        stop: Callable[[InlineRun], bool],
        head: Entries | None,
    ) -> Iterator[Entries]:
        if head:
            self.pulled += len(head)
            self.next_index = head[-1][0] + 1
            yield head
        while not stop(self):
            size = batch_size()
            entries = list(zip(itertools.count(self.next_index), itertools.islice(iterator, size)))
            self.pulled += len(entries)
            self.next_index += len(entries)
            if entries:
                yield entries
            if len(entries) < size:
                self.exhausted = True
                return
