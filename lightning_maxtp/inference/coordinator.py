"""The coordinator loop of ``BatchInferencePool``: worker slots, dispatch, results, replacement."""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from lightning_maxtp.inference.batching import compact
from lightning_maxtp.inference.records import (
    InferenceError,
    InferenceStats,
    ItemError,
    WorkerSpec,
    WorkerStats,
)
from lightning_maxtp.inference.worker import receive, send, worker_main

PREFETCH = 2
"""Batches a worker holds: one running, one loading in its I/O threads."""
PROGRESS_INTERVAL_S = 5.0
_POLL_S = 1.0
_batch_ids = itertools.count()  # unique across runs: a late result of an abandoned run is stale


@dataclass(eq=False)
class Batch:
    """Items sent together; ``remaining`` counts those not yet handed to the caller."""

    id: int
    entries: list[tuple[int, Any]]
    attempts: int = 0
    remaining: int = 0


@dataclass(eq=False)
class Slot:
    """One worker position; a replacement process takes over the slot of a dead one."""

    worker_id: int
    spec: WorkerSpec
    process: Any = None
    conn: Connection | None = None
    ready: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    assigned: dict[int, Batch] = field(default_factory=dict)
    restarts: int = 0
    failures_in_row: int = 0


_ENVIRONMENT_LOCK = threading.Lock()
"""``os.environ`` is the process's: one start at a time changes it for its child."""


@contextlib.contextmanager
def child_environment(spec: WorkerSpec) -> Iterator[None]:
    """``os.environ`` as the worker must start with, put back after: its GPU and thread counts.

    Set here, in the parent, around ``start()``: a spawned child re-imports the user's main
    module before ``worker_main`` runs, and a module that touches CUDA at import would otherwise
    open every GPU the parent sees (and size its thread pools from the whole machine).
    """
    wanted = dict.fromkeys(("OMP_NUM_THREADS", "MKL_NUM_THREADS"), str(spec.torch_threads))
    if spec.cuda_visible_devices is not None:
        wanted["CUDA_VISIBLE_DEVICES"] = spec.cuda_visible_devices
    with _ENVIRONMENT_LOCK:
        saved = {name: os.environ.get(name) for name in wanted}
        os.environ.update(wanted)
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def start_slot(context: Any, slot: Slot, payload: bytes) -> None:
    """Spawn the slot's worker process, with its environment (``child_environment``)."""
    parent, child = context.Pipe(duplex=True)
    process = context.Process(
        target=worker_main,
        args=(child, slot.spec, payload),
        name=f"maxtp-inference-{slot.worker_id}",
        daemon=True,  # multiprocessing ends daemons at interpreter exit even if close() never ran
    )
    with child_environment(slot.spec):
        process.start()
    child.close()
    slot.process, slot.conn, slot.ready, slot.info, slot.assigned = process, parent, False, {}, {}


def stop_slots(slots: list[Slot], *, timeout_s: float) -> None:
    """Ask every worker to stop, wait up to ``timeout_s``, then terminate and reap the rest."""
    for slot in slots:
        if slot.conn is not None:
            with contextlib.suppress(OSError):  # already gone
                send(slot.conn, ("stop",))
    deadline = time.monotonic() + timeout_s
    for slot in slots:
        if slot.process is not None:
            slot.process.join(max(0.0, deadline - time.monotonic()))
    for slot in slots:
        process = slot.process
        if process is not None and process.is_alive():
            process.terminate()
            process.join(2.0)
            if process.is_alive():
                process.kill()
                process.join()
        if slot.conn is not None:
            slot.conn.close()
        if process is not None:
            process.close()
        slot.process, slot.conn, slot.ready, slot.assigned = None, None, False, {}


class Run:
    """One ``map``/``imap``: pulls batches, dispatches them, collects and yields outcomes."""

    def __init__(
        self,
        slots: list[Slot],
        payload: bytes,
        *,
        batch_size: int,
        max_in_flight: int,
        on_error: str,
        max_retries: int,
        progress: bool,
        start_timeout_s: float,
        offset: int = 0,
        started: float | None = None,
        on_message: Callable[[Run, Slot, tuple[Any, ...]], None] | None = None,
        watch: Callable[[Run], None] | None = None,
    ) -> None:
        self.slots = slots
        self.payload = payload
        self.batch_size = batch_size
        self.max_in_flight = max_in_flight
        self.on_error = on_error
        self.max_retries = max_retries
        self.progress = progress
        self.start_timeout_s = start_timeout_s
        self.active = True
        self.open: dict[int, Batch] = {}
        self.todo: deque[Batch] = deque()
        self.done: dict[int, tuple[bool, Any, Batch]] = {}
        self.pulled = self.outputs = self.retries = self.first_count = 0
        self.errors: list[ItemError] = []
        self.items = [0] * len(slots)
        self.batches = [0] * len(slots)
        self.restarts0 = [s.restarts for s in slots]
        self.started = started or time.monotonic()
        self.first_sent: float | None = None
        self.first_result: float | None = None
        self.finished: float | None = None
        self._last_progress = self.started
        self.offset = offset
        self.on_message = on_message
        self.watch = watch
        # Set by ``watch``: pull no more, end once the open batches are back (the rest stays in
        # the iterator). ``search``: batch-size search options for the next batch sent.
        self.stop_pulling = False
        self.search: dict[str, Any] | None = None

    @property
    def finished_items(self) -> int:
        """Items back from the workers (outputs and errors)."""
        return self.outputs + len(self.errors)

    def add_slot(self, slot: Slot) -> None:
        """Count a slot started during the run (more model copies once memory was measured)."""
        if slot not in self.slots:  # the pool's list may be this run's own
            self.slots.append(slot)
        self.items, self.batches = [*self.items, 0], [*self.batches, 0]
        self.restarts0.append(slot.restarts)

    def stats(self) -> InferenceStats:
        """Counts so far (final once the run has ended)."""
        end = self.finished or time.monotonic()
        first = self.first_result
        return InferenceStats(
            items=self.pulled,
            outputs=self.outputs,
            errors=tuple(sorted(self.errors, key=lambda e: e.index)),
            retries=self.retries,
            elapsed_s=end - self.started,
            startup_s=(first or end) - self.started,
            steady_items=self.finished_items - self.first_count,
            steady_s=end - first if first is not None else 0.0,
            workers=tuple(
                WorkerStats(
                    s.worker_id,
                    s.spec.device,
                    self.items[i],
                    self.batches[i],
                    s.restarts - self.restarts0[i],
                )
                for i, s in enumerate(self.slots)
            ),
        )

    def abandon(self) -> None:
        """Forget outstanding batches: results still in flight will be dropped as stale."""
        if self.active:
            self.active = False
            self.finished = time.monotonic()
        self.open.clear()
        self.todo.clear()
        self.done.clear()

    def results(  # noqa: PLR0912 - one loop: pull, send, hand over in order, wait
        self, iterator: Iterator[Any], *, ordered: bool
    ) -> Iterator[Any]:
        """The generator behind ``imap``."""
        source = enumerate(iterator, start=self.offset)
        exhausted = False
        next_index = self.offset
        try:
            while True:
                while not (exhausted or self.stop_pulling) and len(self.open) < self.max_in_flight:
                    entries = list(itertools.islice(source, self.batch_size))
                    exhausted = len(entries) < self.batch_size
                    if entries:
                        entries = compact(entries)
                        batch = Batch(next(_batch_ids), entries, remaining=len(entries))
                        self.pulled += len(entries)
                        self.open[batch.id] = batch
                        self.todo.append(batch)
                self._dispatch()
                while self.done:
                    index = next_index if ordered else next(iter(self.done))
                    if index not in self.done:
                        break
                    ok, value, batch = self.done.pop(index)
                    next_index += ordered
                    batch.remaining -= 1
                    if batch.remaining == 0:
                        del self.open[batch.id]
                    if ok or self.on_error == "return":
                        yield value
                    elif self.on_error == "raise":
                        raise InferenceError(value)
                if (exhausted or self.stop_pulling) and not self.open:
                    break
                if not (exhausted or self.stop_pulling) and len(self.open) < self.max_in_flight:
                    continue  # outputs were handed over: pull and send more before waiting
                self._pump()
                if self.watch is not None:
                    self.watch(self)
        finally:
            self.abandon()
            if self.progress:
                sys.stderr.write(f"[maxtp] {self.stats()}\n")

    def _dispatch(self) -> None:
        while self.todo:
            free = [
                s
                for s in self.slots
                if s.ready and s.conn is not None and len(s.assigned) < PREFETCH
            ]
            if not free:
                return
            slot = min(free, key=lambda s: len(s.assigned))
            batch = self.todo.popleft()
            assert slot.conn is not None
            search, self.search = self.search, None
            try:
                send(slot.conn, ("batch", batch.id, batch.entries, search))
            except OSError:
                self.todo.appendleft(batch)
                self.search = search
                slot.ready = False  # dead: its sentinel fires and _pump replaces it
                continue
            slot.assigned[batch.id] = batch
            self.first_sent = self.first_sent or time.monotonic()

    def _pump(self) -> None:
        live = [s for s in self.slots if s.conn is not None and s.process is not None]
        conns: dict[Any, Slot] = {s.conn: s for s in live}
        sentinels: dict[Any, Slot] = {s.process.sentinel: s for s in live}
        ready = wait([*conns, *sentinels], timeout=_POLL_S)
        dead: list[Slot] = []
        for obj in ready:
            slot = conns.get(obj) or sentinels[obj]
            if not self._drain(slot) or obj in sentinels:
                dead.append(slot)
        for slot in dict.fromkeys(dead):
            self._drain(slot)  # results it sent before dying still count
            self._replace(slot)
        now = time.monotonic()
        if not any(s.ready for s in self.slots) and now - self.started > self.start_timeout_s:
            raise RuntimeError(
                f"no inference worker became ready within {self.start_timeout_s:.0f} s; "
                "check that model_factory returns, or raise `start_timeout_s`"
            )
        if self.progress and now - self._last_progress >= PROGRESS_INTERVAL_S:
            self._last_progress = now
            stats = self.stats()
            devices = ", ".join(f"{d} {n}" for d, n in stats.per_device.items())
            sys.stderr.write(
                f"[maxtp] {stats.outputs + len(stats.errors)}/{stats.items} items, "
                f"{stats.items_per_s:.1f} items/s ({devices})\n"
            )

    def _drain(self, slot: Slot) -> bool:
        """Handle every message waiting from ``slot``; False once its pipe is closed."""
        while slot.conn is not None:
            try:
                if not slot.conn.poll():
                    return True
                message = receive(slot.conn)
            except (EOFError, OSError):
                return False
            kind = message[0]
            if kind == "ready":
                slot.ready, slot.info = True, message[1]
            elif kind == "fatal":
                raise RuntimeError(
                    f"inference worker #{slot.worker_id} ({slot.spec.device}) could not build "
                    f"the model; fix model_factory (the worker's traceback follows)\n{message[1]}"
                )
            elif kind == "result":
                self._collect(slot, message[1], message[2], message[3])
            elif self.on_message is not None:
                self.on_message(self, slot, message)
        return False

    def _collect(
        self, slot: Slot, batch_id: int, outputs: list[tuple[int, Any]], errors: list[ItemError]
    ) -> None:
        batch = slot.assigned.pop(batch_id, None)
        slot.failures_in_row = 0
        if batch is None or self.open.get(batch_id) is not batch:
            return  # a stale result from an abandoned run
        self.items[slot.worker_id] += len(batch.entries)
        self.batches[slot.worker_id] += 1
        self.outputs += len(outputs)
        self.errors += errors
        if self.first_result is None:
            self.first_result, self.first_count = time.monotonic(), self.finished_items
        for index, output in outputs:
            self.done[index] = (True, output, batch)
        for error in errors:
            self.done[error.index] = (False, error, batch)
        assert len(outputs) + len(errors) == len(batch.entries), "a worker lost an item"

    def _retry(self, batch: Batch, cause: str) -> None:
        """Send a dead worker's batch again, or fail its items after ``max_retries``."""
        if self.open.get(batch.id) is not batch:
            return  # all its items were handed over already
        batch.attempts += 1
        if batch.attempts <= self.max_retries:
            self.retries += 1
            self.todo.appendleft(batch)
            return
        for index, item in batch.entries:
            error = ItemError(
                index,
                "worker",
                "WorkerDied",
                f"{cause} on this item's batch {batch.attempts} time(s); "
                f"max_retries={self.max_retries}",
                item_repr=repr(item)[:200],
            )
            self.errors.append(error)
            self.done[index] = (False, error, batch)

    def _replace(self, slot: Slot) -> None:
        process = slot.process
        process.join(5.0)
        code = process.exitcode
        assert slot.conn is not None
        slot.conn.close()
        process.close()
        for batch in slot.assigned.values():
            self._retry(batch, f"the worker process died (exit code {code})")
        slot.failures_in_row += 1
        if slot.failures_in_row > self.max_retries + 2:
            slot.process, slot.conn, slot.assigned = None, None, {}
            raise RuntimeError(
                f"inference worker #{slot.worker_id} ({slot.spec.device}) died "
                f"{slot.failures_in_row} times without finishing a batch (last exit code "
                f"{code}); see its output above"
            )
        slot.restarts += 1
        start_slot(multiprocessing.get_context("spawn"), slot, self.payload)
