"""What a trial costs before its windows judge it: switches, measured after and predicted before.

A switch is paid in the steps right after it, which no window measures: a loader with workers
starts new workers that must load their first batches, and a compile compiles. ``Switches``
keeps the pending switch's place in the step log, charges its settle steps' excess over the
reference step when the next window starts (or the monitor takes over), learns what a worker
start costs from their excess over the step of the window after them, and predicts what the
next one costs. ``trial_risk_s`` adds what a losing trial loses before it is cut
short, so that a trial starts only when the budget left can pay for it at worst.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lightning_maxtp.knobs.registry import LOADER_SETTINGS, PERSISTENT, WORKERS
from lightning_maxtp.observe.job_model import PER_WORKER_S, WORKER_START_S

__all__ = [
    "LOSING_SHARE",
    "MEASURED_FLOOR",
    "PER_WORKER_S",
    "WORKER_START_S",
    "Switches",
    "only_persists",
    "queued_batches",
    "settle_excess_s",
    "starts_workers",
    "trial_risk_s",
    "worker_starts",
    "workers_after",
]

LOSING_SHARE = 0.5
"""A losing trial's first steps, until it is cut short, are taken to run each this share of a
reference step longer (at two thirds of the rate; the losing trials measured on 2 CPUs lost
4-40 % of the rate, a worker trial on 1 ms steps 66 %)."""


def settle_excess_s(step_s: Sequence[float], ref_step_s: float) -> float:
    """How much longer ``step_s`` took than as many steps at ``ref_step_s`` (never below 0)."""
    return max(0.0, sum(step_s) - ref_step_s * len(step_s))


def _loader_changes(change: Mapping[str, Any], settings: Mapping[str, Any]) -> bool:
    """Whether ``change`` moves a loader knob away from ``settings`` (a new loader iterator)."""
    return any(k in LOADER_SETTINGS and settings.get(k) != v for k, v in change.items())


def workers_after(change: Mapping[str, Any], settings: Mapping[str, Any]) -> int:
    """The DataLoader workers once ``settings`` switched to ``change``."""
    return int(change.get(WORKERS, settings.get(WORKERS)) or 0)


def starts_workers(change: Mapping[str, Any], settings: Mapping[str, Any]) -> bool:
    """Whether switching ``settings`` to ``change`` starts DataLoader workers anew.

    A loader knob changes and the loader has workers after it (a loader that loads in the main
    process, or a knob outside the loader, starts none).
    """
    return _loader_changes(change, settings) and workers_after(change, settings) > 0


def only_persists(change: Mapping[str, Any], settings: Mapping[str, Any]) -> bool:
    """Whether ``change`` only keeps ``settings``' workers alive between epochs.

    The same workers load the same batches, so no step runs slower under it; and going back
    restarts the workers, as ``settings`` already does at every epoch's start.
    """
    moved = {k: v for k, v in change.items() if k in LOADER_SETTINGS and settings.get(k) != v}
    workers = int(settings.get(WORKERS) or 0)
    return moved == {PERSISTENT: True} and workers > 0


def worker_starts(change: Mapping[str, Any], settings: Mapping[str, Any]) -> list[int]:
    """The workers each start of a trial of ``change`` from ``settings`` starts, at least.

    A trial switches to its settings and, when they lose, back (``starts_workers`` each way):
    ``[]``, ``[new]``, ``[old]`` or ``[new, old]`` worker counts. Making the workers persistent
    starts them once: the way back is the restart ``settings`` pays each epoch anyway.
    """
    if not _loader_changes(change, settings):
        return []
    old, new = int(settings.get(WORKERS) or 0), workers_after(change, settings)
    if only_persists(change, settings):
        return [new]
    return [n for n in (new, old) if n > 0]


def queued_batches(workers: int, prefetch_factor: int | None) -> int:
    """Batches that may be ready at once after ``workers`` start: what a settle drains first.

    Each worker's prefetched batches (``prefetch_factor``; ``None``: torch's default, 2), and
    one turn more: the first
    batches are taken as the workers come up one by one, and each batch taken asks its worker
    for another, loaded before the last worker is up. A window begun before they are used
    times the queue, not the workers: 23 workers that wait on reads, read two turns after
    their start, measured 9,128 samples/s, and the fit then ran at 6,478. Drained whatever
    the job model bounds the new settings by: the count it ranks best is the fewest that feed
    the step, where the loader is barely faster than the step (18 workers the model bounded by
    the step read 8,877 samples/s after one turn and a half, then ran at 5,500).
    """
    if workers <= 0:
        return 0
    return workers * (max(prefetch_factor or 2, 1) + 1)


def trial_risk_s(start_s: Sequence[float], early_steps: int, step_s: float) -> float:
    """What a trial costs at worst before its first window can revert it, seconds.

    Its worker starts (``start_s``, each one's expected cost), and its first ``early_steps``
    steps (read before a losing trial is cut short) each ``LOSING_SHARE`` of the reference's
    ``step_s`` longer (pass 0 for a change no step runs slower under: ``only_persists``).
    """
    return sum(start_s) + early_steps * step_s * LOSING_SHARE


MEASURED_FLOOR = 0.5
"""A start measured at nearly nothing (its first steps no slower than the reference's) still
predicts half the prior for the next: forking and a first batch are never free."""


@dataclass
class Switches:
    """The pending switch and what the worker starts measured so far cost (one fit)."""

    pending_from: int | None = None
    """Where in the step log the pending switch began (``None``: none pending)."""
    starts: int = 0
    """Workers the pending switch starts (0: none)."""
    queued: int = 0
    """Batches they may have ready at once (``queued_batches``): steps its settle drains."""
    switches: int = 0
    """Switches requested since the pending one began (a revert, then the next trial: 2)."""
    measured: list[tuple[float, int]] = field(default_factory=list)
    """``(excess seconds, workers started)`` of each worker start measured so far."""
    unrated: tuple[tuple[float, ...], int] | None = None
    """The last start's settle steps and workers, until the window after them gives the rate
    they are measured against (``rate_start``)."""

    def mark(self, at: int, *, starts: int, queued: int = 0) -> None:
        """A switch starting ``starts`` workers is requested with the step log at length ``at``.

        Switches requested before the next window (a revert, then the next trial) are paid in
        the same settle steps: the first one's place counts. ``queued``: the batches those
        workers may have ready at once (``queued_batches``).
        """
        if self.pending_from is None:
            self.pending_from = at
        self.starts = max(self.starts, starts)
        self.queued = max(self.queued, queued)
        self.switches += 1

    def charge(self, step_s: Sequence[float], ref_step_s: float) -> float:
        """The pending switch's settle steps are over (``step_s``): their excess, in seconds."""
        excess = settle_excess_s(step_s, ref_step_s)
        if self.starts and self.switches == 1:  # what one start cost, not two run together
            self.unrated = (tuple(step_s), self.starts)
        self.pending_from, self.starts, self.queued, self.switches = None, 0, 0, 0
        return excess

    def rate_start(self, step_s: float) -> None:
        """The window after a start closed at ``step_s`` a step: what the start cost is known.

        Its settle steps' excess over the settings' own step, not the reference's: from a
        reference that waited 100 ms a step on reads, 23 workers' start (a second) read as
        free beside the 69 steps after it, and 32 workers were then tried for a fit's last
        300 steps, where their start cost more than they saved.
        """
        if self.unrated is None:
            return
        steps, workers = self.unrated
        self.measured.append((settle_excess_s(steps, step_s), workers))
        self.unrated = None

    def start_s(self, workers: int) -> float:
        """What starting ``workers`` workers is expected to cost, seconds.

        The prior (``WORKER_START_S`` and ``PER_WORKER_S`` each), scaled by the dearest ratio
        of a start measured in this fit to the prior for its own worker count (at least
        ``MEASURED_FLOOR``).
        """
        prior = WORKER_START_S + PER_WORKER_S * workers
        if not self.measured:
            return prior
        scale = max(excess / (WORKER_START_S + PER_WORKER_S * n) for excess, n in self.measured)
        return prior * max(scale, MEASURED_FLOOR)

    @property
    def per_start(self) -> tuple[float, float]:
        """``(base, per worker)`` seconds of a start, as ``start_s`` predicts them."""
        scale = self.start_s(0) / WORKER_START_S
        return WORKER_START_S * scale, PER_WORKER_S * scale
