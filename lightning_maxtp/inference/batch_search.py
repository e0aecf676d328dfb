"""``batch_size="auto"`` for inference: the fastest batch for one model copy, by measurement.

The search is ``batch_size.search`` (double to the memory ceiling, bisect, keep a margin, pick
the knee: the smallest size within ``tolerance`` of the best throughput); this is its trial. A
trial at size ``b`` repeats the prepared ``values`` cyclically to ``b`` items and times
``runner.forward`` on them end to end (collate, copy to the device, the model under
``inference_mode`` and autocast, copy back): what one batch costs the pool's main loop, whose
``load``/``preprocess`` run ahead on I/O threads. As in the worker, the next call is queued
before the previous one is waited for, so on a GPU two batches overlap as they will in the pool.
One warm-up call (autotuning, allocator growth), then timed calls for at least ``MIN_TIMED_S``
and ``MIN_TIMED_CALLS``; the rate is the median of the per-call rates, so one preemption on a
busy host does not decide the pick. A fit check (``timed=False``) is one call.

Memory. On a GPU the peak is the allocator's (``max_memory_allocated``, model included), and an
out-of-memory error means the size does not fit (its frames are released, the cache emptied).
The CPU kills a process out of RAM instead of raising, so there the peak is the growth of the
peak RSS (``VmHWM``, reset per trial) over the RSS after a one-item warm-up, and it must stay
under a limit: by default half the RAM available at the start (the rest is left to the other
workers and the I/O threads' items). A size whose measured or projected peak passes the limit
does not fit; where the peak cannot be read, no limit applies. Nothing here imports torch at
module level: spawned workers import this module before they set ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any

from lightning_maxtp._checks import SECONDS, SHARE, refuse_bool
from lightning_maxtp._units import format_bytes
from lightning_maxtp.batch_size.oom import (
    current_rss_bytes,
    describe_oom,
    free_memory,
    frozen_heap,
    is_oom_error,
    read_peak_memory,
    release_exception,
    reset_peak_memory,
)
from lightning_maxtp.batch_size.search import SearchOutcome, TrialResult, search_batch_size
from lightning_maxtp.inference.runner import BatchRunner

__all__ = ["InferenceBatchChoice", "search_inference_batch"]

MIN_TIMED_S = 0.1
"""Shortest timed interval of a trial: a small model's forward takes a millisecond or less."""
MIN_TIMED_CALLS = 2
"""And at least this many timed calls: one call at a large size can take most of a second."""
MAX_TIMED_CALLS = 1000
CPU_MEMORY_SHARE = 0.5
"""Default CPU limit: this share of the RAM available when the search starts."""


@dataclass(frozen=True)
class InferenceBatchChoice:
    """The batch size the search picked for one model copy, and what it measured."""

    batch_size: int
    """The pick: a size that was measured to fit (and timed, unless the time budget ran out)."""
    trials: tuple[TrialResult, ...]
    """Every trial, in order (``samples_per_s`` is items/s)."""
    bound: str
    """What ended the doubling: ``memory`` (or the memory limit), ``cap`` or ``time_budget``."""
    ceiling: int | None
    """Largest size that fit when memory bounded the search; ``None`` otherwise."""
    peak_memory_bytes: int | None
    """Peak memory at the pick: the GPU allocator's (model included), the RSS growth on the
    CPU; ``None`` where it cannot be read."""
    reason: str
    """One line for the pool's plan: the pick, its rate, the best, what bounded the search."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "batch_size": self.batch_size,
            "trials": [t.to_dict() for t in self.trials],
            "bound": self.bound,
            "ceiling": self.ceiling,
            "peak_memory_bytes": self.peak_memory_bytes,
            "reason": self.reason,
        }


def _synchronize(device: Any) -> None:
    """Wait for queued kernels, so a clock reading counts them."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def _wait(event: Any) -> None:
    if event is not None:
        event.synchronize()  # the output's non-blocking copy to the host is complete


class InferenceTrial:
    """``trial(batch_size, timed) -> TrialResult`` over ``runner.forward``, for the search."""

    def __init__(self, runner: BatchRunner, values: list[Any]) -> None:
        self.runner, self.values, self.device = runner, values, runner.device
        self._warm_up()
        # On the CPU the peak is reported as growth over the RSS of the warmed copy, so the
        # limit is what the batches may add; memory they leave held counts in later trials.
        cpu = self.device.type == "cpu"
        self.baseline = (current_rss_bytes() or 0) if cpu else 0

    def _warm_up(self) -> None:
        """One call on one item: one-time growth (thread pools, lazy init) is not the batch's."""
        try:
            _wait(self.runner.forward(self.values[:1])[1])
        except Exception as exc:
            if not is_oom_error(exc):
                raise  # a broken model fails here, before any trial
            release_exception(exc)  # the trials then find that nothing fits
        free_memory(self.device)

    def _timed(self, batch: list[Any]) -> float:
        """Median items/s of single calls, the next call queued before the previous is waited."""
        size = len(batch)
        start = clock = time.perf_counter()
        rates: list[float] = []
        waiting: list[Any] = []  # a GPU call queued and not waited for yet
        while True:
            event = self.runner.forward(batch)[1]
            # As in the worker, a GPU runs this call while the previous one is waited for.
            finished = [*waiting, event] if event is None else waiting
            waiting = [] if event is None else [event]
            for done in finished:
                _wait(done)
                now = time.perf_counter()
                rates.append(size / max(now - clock, 1e-9))
                clock = now
            enough = len(rates) >= MIN_TIMED_CALLS and clock - start >= MIN_TIMED_S
            if enough or len(rates) >= MAX_TIMED_CALLS:
                break
        for done in waiting:
            _wait(done)  # not counted: it ran while the last counted one was waited for
        return statistics.median(rates)

    def __call__(self, batch_size: int, timed: bool) -> TrialResult:
        """One trial at ``batch_size``; only an out-of-memory error is caught."""
        start = time.perf_counter()
        batch: list[Any] | None = None
        speed: float | None = None
        error: str | None = None
        peak_valid = reset_peak_memory(self.device)
        try:
            batch = [self.values[i % len(self.values)] for i in range(batch_size)]
            _wait(self.runner.forward(batch)[1])  # warm-up, or the whole fit check
            if timed:
                speed = self._timed(batch)
            _synchronize(self.device)
        except Exception as exc:
            if not is_oom_error(exc):
                raise
            error = describe_oom(exc)
            release_exception(exc)  # its frames hold the failed batch's tensors
        finally:
            batch = None
            peak = read_peak_memory(self.device) if peak_valid else None
        # A finished call frees its tensors by reference counting; only a failed one can leave
        # cycles behind, and a collection costs ~0.1 s with torch loaded.
        free_memory(self.device, collect=error is not None)
        if peak is not None and self.device.type == "cpu":
            peak = max(0, peak - self.baseline)
        return TrialResult(
            batch_size=batch_size,
            fits=error is None,
            samples_per_s=speed if error is None else None,
            peak_memory_bytes=peak,
            seconds=time.perf_counter() - start,
            error=error,
        )


def default_memory_limit(device: Any) -> int | None:
    """The limit a search applies when none is given: on the CPU, a share of the available RAM.

    A GPU raises a catchable out-of-memory error, so it needs none.
    """
    if device.type != "cpu":
        return None
    import psutil

    return max(1, int(CPU_MEMORY_SHARE * psutil.virtual_memory().available))


def _check(
    *,
    values: list[Any],
    init: int,
    cap: int,
    margin: float,
    tolerance: float,
    time_budget_s: float,
    memory_limit_bytes: int | None,
) -> None:
    def positive_int(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 1

    if not isinstance(values, list) or not values:
        raise ValueError(
            f"`values` must be a non-empty list of prepared items, got {values!r:.80}; pass a "
            "few items after load/preprocess (what `collate` takes)"
        )
    if not positive_int(init):
        raise ValueError(f"`init` must be an int >= 1, got {init!r}; 8 is a good start")
    if not positive_int(cap):
        raise ValueError(f"`cap` must be an int >= 1, got {cap!r}; e.g. 1024")
    refuse_bool("margin", margin, SHARE, 0.1)
    refuse_bool("tolerance", tolerance, SHARE, 0.03)
    refuse_bool("time_budget_s", time_budget_s, SECONDS, 20)
    if not (isinstance(margin, int | float) and 0.0 <= margin < 1.0):
        raise ValueError(f"`margin` must be in [0, 1), got {margin!r}; 0.1 keeps 10 % free")
    if not (isinstance(tolerance, int | float) and 0.0 <= tolerance < 1.0):
        raise ValueError(f"`tolerance` must be in [0, 1), got {tolerance!r}; 0.03 means 3 %")
    if not (isinstance(time_budget_s, int | float) and 0.0 < time_budget_s < math.inf):
        raise ValueError(f"`time_budget_s` must be a finite number > 0, got {time_budget_s!r}")
    if memory_limit_bytes is not None and not positive_int(memory_limit_bytes):
        raise ValueError(
            f"`memory_limit_bytes` must be None or an int >= 1, got {memory_limit_bytes!r}"
        )


def search_inference_batch(
    runner: BatchRunner,
    values: list[Any],
    *,
    init: int = 8,
    cap: int = 1024,
    margin: float = 0.1,
    tolerance: float = 0.03,
    time_budget_s: float = 20.0,
    memory_limit_bytes: int | None = None,
) -> InferenceBatchChoice:
    """Measure ``runner`` at growing batch sizes and pick the fastest that safely fits.

    Args:
        runner: The model copy (its device, collate, precision) the pool will run.
        values: A few prepared items (after ``load``/``preprocess``), repeated to each size.
        init: First size tried (lowered to ``cap`` when larger).
        cap: Largest size tried.
        margin: Share of the memory ceiling kept free when memory bounds the search.
        tolerance: A size within this share of the best throughput counts as fast enough.
        time_budget_s: No trial starts once the trials so far plus its estimate pass this.
        memory_limit_bytes: A size whose peak passes it does not fit: compared with the
            allocator's peak on a GPU, with the RSS growth on the CPU. ``None``: none on a GPU,
            half the available RAM on the CPU.

    Returns:
        The pick, every trial and a one-line reason. Afterwards the allocator's cache is empty
        and its peak reset, so a later reading (a copy's memory) sees the pool's batches only.

    Raises:
        ValueError: For an empty ``values`` or an argument out of range.
        RuntimeError: When no size fits, not even 1 (or the time budget ran out first).
        Exception: Anything the model raises other than an out-of-memory error.
    """
    _check(
        values=values,
        init=init,
        cap=cap,
        margin=margin,
        tolerance=tolerance,
        time_budget_s=time_budget_s,
        memory_limit_bytes=memory_limit_bytes,
    )
    device = runner.device
    limit = memory_limit_bytes if memory_limit_bytes is not None else default_memory_limit(device)
    free_memory(device, collect=False)  # frozen_heap collects
    # Frozen, a collection after an OOM scans what the trials made, not torch's own objects.
    with frozen_heap():
        trial = InferenceTrial(runner, values)
        try:
            outcome = search_batch_size(
                trial,
                init=min(init, cap),
                cap=cap,
                margin=margin,
                tolerance=tolerance,
                time_budget_s=time_budget_s,
                memory_limit_bytes=limit,
            )
        finally:
            free_memory(device)
            reset_peak_memory(device)
    rows = outcome.trials
    if outcome.fastest is None:
        last = next((r.error for r in reversed(rows) if not r.fits), None)
        why = "the time budget ran out first" if outcome.budget_exhausted else last
        raise RuntimeError(
            f"batch-size search on {device}: no batch size fit, not even {rows[-1].batch_size} "
            f"({why}); free memory on the device or shrink the model or its items"
        )
    pick = _row(rows, outcome.fastest)
    return InferenceBatchChoice(
        batch_size=outcome.fastest,
        trials=rows,
        bound=outcome.bound,
        ceiling=outcome.ceiling,
        peak_memory_bytes=pick.peak_memory_bytes,
        reason=_reason(outcome, cap=cap, margin=margin, tolerance=tolerance, limit=limit),
    )


def _row(rows: tuple[TrialResult, ...], size: int) -> TrialResult:
    """The last trial at ``size`` that fit, a timed one if any."""
    fits = [r for r in rows if r.batch_size == size and r.fits]
    timed = [r for r in fits if r.samples_per_s is not None]
    return (timed or fits)[-1]


def _rate(items_per_s: float | None) -> str:
    value = items_per_s or 0.0
    return f"{value:,.0f} items/s" if value >= 100 else f"{value:,.2f} items/s"


def _reason(
    outcome: SearchOutcome, *, cap: int, margin: float, tolerance: float, limit: int | None
) -> str:
    """``batch 256: 9,700 items/s, within 3% of the best 9,912 items/s (batch 512); ...``."""
    rows = outcome.trials
    assert outcome.fastest is not None
    pick = _row(rows, outcome.fastest)
    if pick.samples_per_s is None:
        head = f"batch {pick.batch_size}: the largest that fit, not timed (out of time)"
    elif outcome.best is None or outcome.best == pick.batch_size:
        head = f"batch {pick.batch_size}: {_rate(pick.samples_per_s)}, the fastest measured"
    else:
        best = _row(rows, outcome.best)
        head = (
            f"batch {pick.batch_size}: {_rate(pick.samples_per_s)}, within {tolerance:.0%} of "
            f"the best {_rate(best.samples_per_s)} (batch {best.batch_size})"
        )
    if outcome.bound == "memory":
        failed = next(r for r in rows if r.batch_size == outcome.first_oom and not r.fits)
        # The search's own notes for a size over the limit (an OOM message may say "limit").
        over_limit = (failed.error or "").startswith(("peak ", "projected peak "))
        what = (
            f"went over the {format_bytes(limit)} memory limit"
            if over_limit
            else ("ran out of memory")
        )
        tail = (
            f"{failed.batch_size} {what}; ceiling {outcome.largest_fit}, at most "
            f"{outcome.safe_max} with the {margin:.0%} margin"
        )
    elif outcome.bound == "cap":
        tail = f"stopped at the cap {cap}, which fit"
    else:
        tail = f"the time budget ended the doubling at {outcome.largest_fit}"
    if outcome.budget_exhausted and outcome.bound != "time_budget":
        tail += " (the time budget cut the search short)"
    return f"{head}; {tail}"
