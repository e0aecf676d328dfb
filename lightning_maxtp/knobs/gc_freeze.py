"""``gc``: Python's garbage collector made to leave the long-lived objects alone.

A fit's model, optimizer and dataset objects live for the whole run, yet every full collection
walks them again; and with CPython's default generation-0 threshold (700 allocations) a step that
creates many small containers triggers hundreds of collections. ``gc.freeze()`` after setup moves
every object alive now into a permanent generation no collection scans, and a raised
generation-0 threshold makes collections rarer. Same math: only when unreachable cycles are
freed changes. Tried only when a window measured collections as a share of step time (the
diagnosis names it), judged like any knob, and put back when the fit ends: ``gc.unfreeze()``
and the thresholds as they were.
"""

from __future__ import annotations

import gc
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from typing_extensions import override

from lightning_maxtp.knobs.base import BaseKnob, FitView

__all__ = ["GEN0_THRESHOLD", "GcFreeze"]

GEN0_THRESHOLD = 50_000
"""Allocations between generation-0 collections while the knob is on (CPython's default: 700);
a step's short-lived garbage is freed by reference counting either way."""


class GcFreeze(BaseKnob):
    """``gc.freeze()`` and a generation-0 threshold of ``GEN0_THRESHOLD`` (process-wide)."""

    name = "gc"
    reason = "garbage collection leaves the fit's long-lived objects alone and runs less often"
    changes = (
        "``gc.freeze()`` (the objects alive at the trial: model, optimizer, dataset; no "
        f"collection scans them again) and a generation-0 threshold of {GEN0_THRESHOLD:,} instead "
        "of CPython's 700; ``gc.unfreeze()`` and the thresholds put back when the fit ends"
    )
    preset: ClassVar[Literal["safe", "all"]] = "safe"
    # Before compile: a host_overhead finding that names collections points here first.
    tried_for: ClassVar[Mapping[str, int]] = {"host_overhead": -1}
    named_only = True
    context_field: ClassVar[str | None] = "gc_tuned"

    def __init__(self) -> None:
        self._was: tuple[int, int, int] | None = None
        self._froze = False

    @override
    def current(self, fit: FitView) -> bool:
        return gc.get_threshold()[0] >= GEN0_THRESHOLD

    @override
    def apply(self, fit: FitView, value: Any) -> None:
        if value:
            if self._was is None:
                self._was = gc.get_threshold()
            # Objects the user froze themselves stay frozen: unfreeze would thaw them too, so
            # the knob then only raises the threshold.
            if not self._froze and gc.get_freeze_count() == 0:
                gc.collect()  # garbage pending now must not be frozen (it may hold tensors)
                gc.freeze()  # every object alive now: the model, optimizer, dataset
                self._froze = True
            gc.set_threshold(GEN0_THRESHOLD, *self._was[1:])
        else:
            self.restore(fit)

    @override
    def restore(self, fit: FitView) -> None:
        if self._froze:
            gc.unfreeze()
            self._froze = False
        if self._was is not None:
            gc.set_threshold(*self._was)
            self._was = None
