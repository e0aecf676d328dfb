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

import gc
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["GcPause", "GcPauses", "GcSummary"]


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

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "count": self.count,
            "total_s": self.total_s,
            "longest_s": self.longest_s,
            "gen2": self.gen2,
            "share": self.share,
        }

    def __str__(self) -> str:
        return (
            f"GC: {self.count} collection(s) ({self.gen2} full), {self.total_s * 1e3:.1f} ms, "
            f"longest {self.longest_s * 1e3:.1f} ms, {self.share:.1%} of step time"
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

    def summary(self, start_s: float, end_s: float, step_s: float) -> GcSummary:
        """The collections that ended between ``start_s`` and ``end_s`` (``perf_counter``).

        Args:
            start_s: The span's start.
            end_s: The span's end.
            step_s: The span's step time, the share's denominator.
        """
        inside = [p for p in self.pauses if start_s <= p.end_s <= end_s]
        total = sum(p.seconds for p in inside)
        return GcSummary(
            count=len(inside),
            total_s=total,
            longest_s=max((p.seconds for p in inside), default=0.0),
            gen2=sum(1 for p in inside if p.generation == 2),
            share=total / step_s if step_s > 0 else 0.0,
        )
