"""The batch-size search as a pure function over a ``trial(batch_size, timed)`` callable.

Nothing here imports torch: a trial is anything that runs (or fakes) training steps at one batch
size and says whether they fit and how fast they ran, so the search order, the cap, the
bisection, the margin, the time budget and the knee can be tested exactly on a CPU.

The order of trials:

1. **double**: ``init, 2*init, 4*init, ...`` while they fit; a size past the cap is replaced by
   the cap itself (phase ``cap``), which is tested like any other size before it can be chosen.
2. **bisect**: between the largest size that fit and the first that did not, until they are
   adjacent; that largest size is the ceiling.
3. **refine**: when the fastest eligible size is also the largest one timed (throughput still
   rising) and the safe maximum is larger, the safe maximum is timed too.

A size is *eligible* when it fit, was timed and is at most the safe maximum:
``floor((1 - margin) * ceiling)`` when memory ended the search, the largest size that fit
otherwise. The pick is the smallest eligible size within ``tolerance`` of the best throughput.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from lightning_maxtp._units import format_bytes

__all__ = ["SearchOutcome", "TrialResult", "knee", "search_batch_size"]

Bound = Literal["memory", "cap", "time_budget"]


def gib(nbytes: int | None) -> str:
    """Memory of a trial: GiB with two decimals (``-`` when not measured), as in the table."""
    return format_bytes(nbytes, unit="GiB", digits=2, missing="-")


@dataclass(frozen=True)
class TrialResult:
    """What one trial at one batch size measured."""

    batch_size: int
    fits: bool
    samples_per_s: float | None = None
    """Throughput of the timed steps; ``None`` for a fit check or a size that did not fit."""
    peak_memory_bytes: int | None = None
    """Peak memory during the trial (device allocator on a GPU, process peak RSS on a CPU)."""
    seconds: float = 0.0
    """Wall time of the whole trial, clean-up included (what the time budget counts)."""
    error: str | None = None
    """Why the size did not fit: the out-of-memory message, or the memory limit it exceeded."""
    phase: str = ""
    """Set by the search: ``double``, ``cap``, ``bisect`` or ``refine``."""

    def __str__(self) -> str:
        if not self.fits:
            return f"batch {self.batch_size}: does not fit ({self.error})"
        rate = "not timed" if self.samples_per_s is None else f"{self.samples_per_s:,.1f} samples/s"
        peak = "" if self.peak_memory_bytes is None else f", peak {gib(self.peak_memory_bytes)}"
        return f"batch {self.batch_size}: fits, {rate}{peak}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "batch_size": self.batch_size,
            "fits": self.fits,
            "samples_per_s": self.samples_per_s,
            "peak_memory_bytes": self.peak_memory_bytes,
            "seconds": self.seconds,
            "error": self.error,
            "phase": self.phase,
        }


Trial = Callable[[int, bool], TrialResult]
"""``trial(batch_size, timed)``: run training steps at ``batch_size``; time them if ``timed``."""


@dataclass(frozen=True)
class SearchOutcome:
    """Every trial in order, and what the search concluded from them."""

    trials: tuple[TrialResult, ...]
    largest_fit: int
    """Largest size that fit (0 when none did)."""
    first_oom: int | None
    """Smallest size that did not fit, if any was tried."""
    bound: Bound
    """What ended the doubling: out of memory (or the memory limit), the cap, the time budget."""
    safe_max: int
    """Largest size the pick may take (the margin applied when memory bounded the search)."""
    fastest: int | None
    """The pick: smallest eligible size within the tolerance of the best throughput."""
    best: int | None
    """Eligible size with the highest measured throughput."""
    budget_exhausted: bool
    """True when the time budget stopped the search before it was done."""

    @property
    def ceiling(self) -> int | None:
        """Largest size that fit when memory bounded the search; ``None`` when it did not."""
        return self.largest_fit if self.bound == "memory" and self.largest_fit > 0 else None


class _OutOfTime(Exception):
    """Raised inside the search when the next trial would overrun the time budget."""


def knee(rows: list[TrialResult], tolerance: float) -> tuple[int, int] | None:
    """``(smallest size within tolerance of the best, best size)`` among timed rows that fit."""
    timed = [r for r in rows if r.fits and r.samples_per_s is not None]
    if not timed:
        return None
    best = max(timed, key=lambda r: (r.samples_per_s or 0.0, -r.batch_size))
    good = (1.0 - tolerance) * (best.samples_per_s or 0.0)
    pick = min(r.batch_size for r in timed if (r.samples_per_s or 0.0) >= good)
    return pick, best.batch_size


def _project_peak(rows: list[TrialResult], batch_size: int) -> int | None:
    """Peak memory at ``batch_size``, extrapolated from the two largest sizes that fit."""
    known = sorted(
        (r for r in rows if r.fits and r.peak_memory_bytes is not None),
        key=lambda r: r.batch_size,
    )
    if len(known) < 2 or known[-1].batch_size == known[-2].batch_size:
        return None
    a, b = known[-2], known[-1]
    assert a.peak_memory_bytes is not None and b.peak_memory_bytes is not None
    slope = (b.peak_memory_bytes - a.peak_memory_bytes) / (b.batch_size - a.batch_size)
    if slope <= 0:
        return None
    return int(b.peak_memory_bytes + slope * (batch_size - b.batch_size))


class _Search:
    """The state of one search: the rows so far and the two bounds of the bisection."""

    def __init__(self, trial: Trial, time_budget_s: float, memory_limit_bytes: int | None) -> None:
        self.trial, self.budget, self.limit = trial, time_budget_s, memory_limit_bytes
        self.rows: list[TrialResult] = []

    def _estimate(self, batch_size: int) -> float:
        """Seconds the next trial may take: a line through the last two trials that fit.

        The first trial also pays one-time costs (kernel selection, lazy initialization), so
        scaling it alone would overstate the second: until two trials fit, no estimate.
        """
        fitted = [r for r in self.rows if r.fits and r.seconds > 0]
        last = fitted[-1] if fitted else None
        older = [r for r in fitted[:-1] if last is not None and r.batch_size != last.batch_size]
        if last is None or not older:
            return 0.0
        prev = older[-1]
        slope = (last.seconds - prev.seconds) / (last.batch_size - prev.batch_size)
        return max(last.seconds, last.seconds + slope * (batch_size - last.batch_size))

    def run(self, batch_size: int, phase: str, timed: bool) -> bool:
        """One trial, unless the budget or the memory projection rules it out."""
        spent = sum(r.seconds for r in self.rows)
        if spent > 0 and (spent >= self.budget or spent + self._estimate(batch_size) > self.budget):
            raise _OutOfTime
        limit = self.limit
        projected = None if limit is None else _project_peak(self.rows, batch_size)
        if limit is not None and projected is not None and projected > limit:
            note = f"projected peak {gib(projected)} > limit {gib(limit)} (not run)"
            self.rows.append(TrialResult(batch_size, False, None, projected, 0.0, note, phase))
            return False
        result = replace(self.trial(batch_size, timed), phase=phase)
        assert result.batch_size == batch_size, (result.batch_size, batch_size)
        peak = result.peak_memory_bytes
        if result.fits and limit is not None and peak is not None and peak > limit:
            note = f"peak {gib(peak)} > limit {gib(limit)}"
            result = replace(result, fits=False, samples_per_s=None, error=note)
        self.rows.append(result)
        return result.fits

    def eligible(self, safe_max: int) -> list[TrialResult]:
        return [r for r in self.rows if r.batch_size <= safe_max]


def search_batch_size(
    trial: Trial,
    *,
    init: int,
    cap: int,
    margin: float,
    tolerance: float,
    time_budget_s: float,
    memory_limit_bytes: int | None = None,
) -> SearchOutcome:
    """Find the ceiling by doubling and bisection, then the throughput knee below the margin.

    Args:
        trial: Runs one trial; the search only sees its ``TrialResult``.
        init: First size tried.
        cap: Largest size tried (tested itself before it can be chosen).
        margin: Share of the ceiling kept free.
        tolerance: A size within this share of the best throughput counts as fast enough.
        time_budget_s: No trial starts when the spent time plus its estimate would pass this
            (the estimate needs two trials that fit, so those always run).
        memory_limit_bytes: When set, a size whose projected or measured peak exceeds it
            counts as not fitting (the CPU's RAM guard: the kernel kills a process that runs
            out of RAM instead of raising).

    Returns:
        The trials in order and the conclusions; ``largest_fit == 0`` when nothing fit.
    """
    assert 1 <= init <= cap and 0.0 <= margin < 1.0 and 0.0 <= tolerance < 1.0
    search = _Search(trial, time_budget_s, memory_limit_bytes)
    low, high = 0, None
    bound: Bound = "memory"
    out_of_time = False
    try:
        size = init
        while search.run(size, "cap" if size == cap and size != init else "double", True):
            low = size
            if size >= cap:
                bound = "cap"
                break
            size = min(2 * size, cap)
        else:
            high = size
        while high is not None and high - low > 1:
            mid = (low + high) // 2
            # Time a midpoint only if it can still end up under the margin.
            maybe_eligible = mid <= math.floor((1.0 - margin) * (high - 1))
            if search.run(mid, "bisect", maybe_eligible):
                low = mid
            else:
                high = mid
    except _OutOfTime:
        out_of_time = True
        if high is None and bound != "cap":
            bound = "time_budget"
    if low == 0:
        return SearchOutcome(tuple(search.rows), 0, high, bound, 0, None, None, out_of_time)
    safe_max = max(1, math.floor((1.0 - margin) * low)) if bound == "memory" else low
    pick, best, out_of_time = _pick(search, safe_max, tolerance, out_of_time)
    return SearchOutcome(tuple(search.rows), low, high, bound, safe_max, pick, best, out_of_time)


def _pick(
    search: _Search, safe_max: int, tolerance: float, out_of_time: bool
) -> tuple[int | None, int | None, bool]:
    """The knee under ``safe_max``, timing ``safe_max`` first if throughput was still rising."""
    found = knee(search.eligible(safe_max), tolerance)
    timed = [r.batch_size for r in search.eligible(safe_max) if r.samples_per_s is not None]
    rising = found is None or (found[1] == max(timed) and safe_max > max(timed))
    if rising and not out_of_time:
        try:
            search.run(safe_max, "refine", True)
        except _OutOfTime:
            out_of_time = True
        found = knee(search.eligible(safe_max), tolerance)
    if found is None:
        # Nothing under the margin was timed (the budget ran out): the largest size that fit.
        fits = [r.batch_size for r in search.eligible(safe_max) if r.fits]
        return max(fits, default=None), None, out_of_time
    return found[0], found[1], out_of_time
