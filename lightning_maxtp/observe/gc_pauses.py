"""Garbage-collection pauses, timed exactly: how much of the step time Python's collector takes.

A step that builds large object graphs (Python-side data structures, lists of tensors, many
small objects from a loader in the main process) makes CPython's cyclic collector run, and a
generation-2 collection walks every tracked object: a pause of milliseconds to seconds that
shows as a step far above the median. ``GcPauses`` times every collection through
``gc.callbacks`` (the interpreter calls it at the start and the end of each), keeps them with
their generation and end time, and ``summary`` says, for a span of the clock, how many there
were, their total and longest pause, and their share of that span's step time.
"""

from __future__ import annotations

import bisect
import gc
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["SLOW_STEP_FACTOR", "GcPause", "GcPauses", "GcSummary"]

SLOW_STEP_FACTOR = 2.0
"""A step longer than this many median steps, overlapping a full collection, is put down to it."""


@dataclass(frozen=True)
class GcPause:
    """One collection: its generation, when it ended (``time.perf_counter``) and how long."""

    generation: int
    end_s: float
    seconds: float


@dataclass(frozen=True)
class GcSummary:
    """The collections of one span of steps."""

    count: int
    total_s: float
    longest_s: float
    gen2: int
    """Generation-2 (full) collections among them."""
    share: float
    """``total_s`` over the span's step time (0..1)."""
    slow_steps: int = 0
    """Steps longer than ``SLOW_STEP_FACTOR`` median steps that overlap a full collection."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "count": self.count,
            "total_s": self.total_s,
            "longest_s": self.longest_s,
            "gen2": self.gen2,
            "share": self.share,
            "slow_steps": self.slow_steps,
        }

    def __str__(self) -> str:
        slow = f"; {self.slow_steps} slow step(s) during a full one" if self.slow_steps else ""
        return (
            f"GC: {self.count} collection(s) ({self.gen2} full), {self.total_s * 1e3:.1f} ms, "
            f"longest {self.longest_s * 1e3:.1f} ms, {self.share:.1%} of step time{slow}"
        )


class GcPauses:
    """Times every garbage collection while installed (``install``/``uninstall``, idempotent).

    Args:
        keep: The most pauses kept (the oldest are dropped first).
    """

    def __init__(self, keep: int = 10_000) -> None:
        if keep < 1:
            raise ValueError(f"`keep` must be >= 1, got {keep}")
        self.keep = keep
        self.pauses: list[GcPause] = []
        self._started: float | None = None

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._started = now
            return
        if self._started is None:  # installed mid-collection
            return
        self.pauses.append(GcPause(int(info.get("generation", 0)), now, now - self._started))
        self._started = None
        if len(self.pauses) > self.keep:
            del self.pauses[: len(self.pauses) - self.keep]

    @property
    def installed(self) -> bool:
        """Whether the interpreter calls it at every collection."""
        return self._callback in gc.callbacks

    def install(self) -> None:
        """Start timing collections."""
        if not self.installed:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        """Stop timing collections (the pauses so far are kept)."""
        while self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def summary(
        self,
        start_s: float,
        end_s: float,
        step_s: float,
        steps: Sequence[tuple[float, float]] = (),
    ) -> GcSummary:
        """The collections that ended between ``start_s`` and ``end_s`` (``perf_counter``).

        Args:
            start_s: The span's start.
            end_s: The span's end.
            step_s: The span's step time, the share's denominator.
            steps: ``(end, duration)`` of each step in the span, in order: only the pauses
                that overlap one are counted (not those between timed steps), and a slow step
                that overlaps a full collection is counted in ``slow_steps``.
        """
        inside = [p for p in self.pauses if start_s <= p.end_s <= end_s]
        if steps:  # not the gaps between timed steps (validation, a checkpoint, blocked time)
            inside = _during(inside, steps)
        total = sum(p.seconds for p in inside)
        return GcSummary(
            count=len(inside),
            total_s=total,
            longest_s=max((p.seconds for p in inside), default=0.0),
            gen2=sum(1 for p in inside if p.generation == 2),
            share=total / step_s if step_s > 0 else 0.0,
            slow_steps=_slow_during_full(inside, steps),
        )

    def clear_before(self, t_s: float) -> None:
        """Forget the pauses that ended before ``t_s`` (a window closed: they are summarized)."""
        self.pauses = [p for p in self.pauses if p.end_s >= t_s]


def _during(pauses: list[GcPause], steps: Sequence[tuple[float, float]]) -> list[GcPause]:
    """The pauses that overlap one of ``steps`` (``(end, duration)``, in order, disjoint)."""
    ends = [end for end, _ in steps]
    out = []
    for p in pauses:
        # The first step ending after the pause began is the only one that can overlap it.
        i = bisect.bisect_right(ends, p.end_s - p.seconds)
        if i < len(steps) and steps[i][0] - steps[i][1] < p.end_s:
            out.append(p)
    return out


def _slow_during_full(pauses: list[GcPause], steps: Sequence[tuple[float, float]]) -> int:
    """Steps above ``SLOW_STEP_FACTOR`` median steps that overlap a generation-2 pause."""
    full = [(p.end_s - p.seconds, p.end_s) for p in pauses if p.generation == 2]
    if not full or not steps:
        return 0
    slow = SLOW_STEP_FACTOR * statistics.median(d for _, d in steps)
    return sum(1 for end, d in steps if d > slow and any(a < end and b > end - d for a, b in full))
