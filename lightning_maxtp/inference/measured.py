"""The measured plan of a CPU pool: inline first, worker processes only when they pay.

One ``map``/``imap`` of a pool on ``mode="auto"`` without a GPU runs as a ``MeasuredRun``:

1. batches run inline (``InlineRun``) and the inline rate is measured after the first one;
2. ``shape.decide_shape`` says whether the rest is long enough to try worker processes; if so
   they are spawned while the inline loop keeps going;
3. once every worker is ready (one that cannot start reverts the trial), the rest of the
   input goes to them (``coordinator.Run``) for a measuring window; ``shape.judge_trial``
   keeps them, or they finish their open batches, stop, and the rest runs inline again.

Nothing is lost or repeated across the hand-overs: each stretch takes its batches from the same
iterator, numbered from where the previous one stopped. Every verdict is kept for ``pool.plan``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from lightning_maxtp.inference.coordinator import Run, Slot
from lightning_maxtp.inference.inline import InlineRun
from lightning_maxtp.inference.records import InferenceStats, WorkerStats
from lightning_maxtp.inference.runner import BatchRunner, Entries
from lightning_maxtp.inference.shape import (
    PROBE_S,
    WINDOW_BATCHES,
    WINDOW_S,
    Verdict,
    decide_shape,
    judge_trial,
)
from lightning_maxtp.inference.worker import receive


class MeasuredRun:
    """One measured ``map``/``imap``; ``pool`` supplies the runner, the slots and the verdicts.

    Args:
        runner: The caller's model copy.
        build_s: Seconds ``runner`` took to build.
        workers: Worker processes a trial would start.
        cores: Usable CPUs.
        remaining: Length of the input when known.
        shape: The pool's shape so far (``None``: undecided; ``inline``: no more trials).
        start_workers: Spawns the slots (non-blocking) and returns them.
        stop_workers: Stops them.
        make_run: A ``coordinator.Run`` over the slots, given ``offset`` and ``watch``.
        decided: Called with each verdict (the pool records it in its plan).
        batch_size: The current batch size.
        on_error: As the pool's.
        started: When the caller's wait began (the pool's start, for its first run).
    """

    def __init__(
        self,
        runner: BatchRunner,
        *,
        build_s: float,
        workers: int,
        cores: int,
        remaining: int | None,
        shape: str | None,
        start_workers: Callable[[], list[Slot]],
        stop_workers: Callable[[], None],
        make_run: Callable[[int, Callable[[Run], None]], Run],
        decided: Callable[[Verdict], None],
        batch_size: Callable[[], int],
        on_error: str,
        started: float,
        progress: bool = False,
    ) -> None:
        self.runner, self.build_s, self.workers, self.cores = runner, build_s, workers, cores
        self.remaining, self.shape = remaining, shape
        self.start_workers, self.stop_workers, self.make_run = start_workers, stop_workers, make_run
        self.decided, self.batch_size, self.on_error = decided, batch_size, on_error
        self.started, self.progress = started, progress
        self.parts: list[InlineRun | Run] = []
        self.slots: list[Slot] = []
        self.inline_rate = 0.0
        self.window: tuple[float, int, int] | None = None
        self.finished: float | None = None

    def results(
        self, iterator: Iterator[Any], *, ordered: bool, head: Entries | None = None
    ) -> Iterator[Any]:
        """The generator behind a measured ``imap`` (``head``: entries already pulled)."""
        try:
            inline = InlineRun(self.runner, on_error=self.on_error)
            self.parts.append(inline)
            yield from inline.results(
                iterator, batch_size=self.batch_size, stop=self._stop_inline, head=head
            )
            if inline.exhausted and self.shape is None and not self.slots:
                self.decided(
                    Verdict(
                        "probe",
                        f"inline: all {inline.finished_items} items ran while the inline "
                        f"rate was being measured ({time.monotonic() - inline.started:.2f} s)",
                    )
                )
            if inline.exhausted and self.slots and self.shape is None:
                self.decided(
                    Verdict(
                        "unfinished",
                        "trial unfinished: the input ended before the worker "
                        "processes were ready (they stay for the next run)",
                    )
                )
            if inline.exhausted or not self.slots:
                return
            run = self.make_run(inline.next_index, self._judge)
            self.parts.append(run)
            yield from run.results(iterator, ordered=ordered)
            if self.shape is None:
                self._judge(run, ended=True)
            if self.shape is None:
                self.decided(Verdict("unfinished", "trial unfinished: the input ended during it"))
                self.stop_workers()
            if not run.stop_pulling:
                return
            self.stop_workers()
            rest = InlineRun(self.runner, on_error=self.on_error, offset=run.offset + run.pulled)
            self.parts.append(rest)
            yield from rest.results(iterator, batch_size=self.batch_size, stop=lambda _: False)
        finally:
            self.finished = time.monotonic()
            if self.progress:
                sys.stderr.write(f"[maxtp] {self.stats()}\n")

    def _stop_inline(self, inline: InlineRun) -> bool:
        if self.shape in ("inline", "reverted"):
            return False
        if self.slots:
            failure = _start_failure(self.slots)
            if failure is None:
                return all(slot.ready for slot in self.slots)
            # A worker that cannot start ends the trial, not the run: the rest runs inline.
            self.decided(Verdict("reverted", f"processes reverted: {failure}; the rest ran inline"))
            self.shape = "reverted"
            self.stop_workers()
            self.slots = []
            return False
        rate = inline.steady_rate()
        assert inline.first_result is not None or rate == 0.0
        if inline.batches < 2 or rate == 0.0 or time.monotonic() - inline.started < PROBE_S:
            return False
        self.inline_rate = rate
        left = None if self.remaining is None else self.remaining - inline.pulled
        verdict = decide_shape(
            inline_rate=rate,
            done=inline.finished_items,
            remaining=left,
            inline_s=time.monotonic() - inline.started,
            workers=self.workers,
            cores=self.cores,
            build_s=self.build_s,
        )
        if verdict.mode == "wait":
            return False
        self.decided(verdict)
        if verdict.mode == "inline":
            self.shape = "inline"
        else:
            self.slots = self.start_workers()
        return False

    def _judge(self, run: Run, *, ended: bool = False) -> None:
        # Each worker's first batch pays its one-time costs (lazy kernel set-up, first
        # allocations): the window starts once every worker has returned one.
        now = time.monotonic()
        # As many workers as can hold a batch at once (fewer when max_in_flight is small).
        busy = min(len(run.slots), run.max_in_flight)
        if self.window is None:
            if sum(1 for b in run.batches if b) >= busy:
                self.window = (now, run.finished_items, sum(run.batches))
            return
        began, items, batches = self.window
        seconds = now - began
        enough = sum(run.batches) - batches >= WINDOW_BATCHES * busy
        if not enough or (seconds < WINDOW_S and not ended):
            return
        rate = (run.finished_items - items) / seconds
        verdict = judge_trial(rate, self.inline_rate, busy)
        self.decided(verdict)
        self.shape = verdict.mode
        run.watch = None
        if verdict.mode == "reverted":
            run.stop_pulling = True

    def stats(self) -> InferenceStats:
        """The whole run's counts, its parts merged (final once it has ended)."""
        end = self.finished or time.monotonic()
        items = outputs = retries = before = 0
        errors: list[Any] = []
        first: float | None = None
        first_count = 0
        workers: list[WorkerStats] = []
        for part in self.parts:
            if first is None and part.first_result is not None:
                first, first_count = part.first_result, before + part.first_count
            if isinstance(part, Run):
                stats = part.stats()
                retries += stats.retries
                workers += stats.workers
            items += part.pulled
            outputs += part.outputs
            errors += part.errors
            before += part.finished_items
        inline = [p for p in self.parts if isinstance(p, InlineRun)]
        done, batches = sum(p.finished_items for p in inline), sum(p.batches for p in inline)
        workers.insert(0, WorkerStats(-1, f"{self.runner.spec.device} (inline)", done, batches, 0))
        kinds = ["inline" if isinstance(p, InlineRun) else "processes" for p in self.parts]
        return InferenceStats(
            items=items,
            outputs=outputs,
            errors=tuple(sorted(errors, key=lambda e: e.index)),
            retries=retries,
            elapsed_s=end - self.started,
            workers=tuple(workers),
            startup_s=(first or end) - self.started,
            steady_items=before - first_count,
            steady_s=end - first if first is not None else 0.0,
            mode=" then ".join(kinds) or "inline",
        )


def _start_failure(slots: list[Slot]) -> str | None:
    """Read the workers' start-up messages without waiting; why one failed, if one did."""
    for slot in slots:
        while not slot.ready and slot.conn is not None and slot.conn.poll():
            try:
                message = receive(slot.conn)
            except (EOFError, OSError):
                code = slot.process.exitcode if slot.process is not None else None
                return f"worker #{slot.worker_id} died while starting (exit code {code})"
            if message[0] == "ready":
                slot.ready, slot.info = True, message[1]
            elif message[0] == "fatal":
                last = message[1].strip().splitlines()[-1] if message[1].strip() else "?"
                return f"worker #{slot.worker_id} could not build the model ({last})"
    return None
