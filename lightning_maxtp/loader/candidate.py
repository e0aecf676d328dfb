"""What the DataLoader search measures and decides with: one measured setting, the search's result.

``LoaderCandidate`` is one setting measured alone (``measure``); ``SearchResult`` is what
the search (``search``) measured, chose and why it stopped; ``expected_rate`` and
``meets_target`` turn a candidate's numbers into what a training loop fed by it can reach.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from lightning_maxtp.observe.thresholds import MIN_GAIN

__all__ = [
    "DEEP_PREFETCH",
    "DEFAULT_PREFETCH",
    "IO_BOUND_SHARE",
    "LOADER_KNOBS",
    "MIN_TIMED_BATCHES",
    "TARGET_MARGIN",
    "LoaderCandidate",
    "SearchResult",
    "expected_rate",
    "meets_target",
    "rate_text",
]

LOADER_KNOBS = ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers")
"""The DataLoader settings the library may change (same math: they never change the batches)."""
TARGET_MARGIN = 1.25
"""The loader should outrun the device's consumption rate by this factor."""
DEFAULT_PREFETCH = 2
DEEP_PREFETCH = 4
IO_BOUND_SHARE = 0.5
"""Loading that keeps the CPU busy less than this share of its time is waiting on I/O."""
MIN_TIMED_BATCHES = 3
"""A candidate with fewer timed batches than this is reported but never chosen."""


@dataclass(frozen=True)
class LoaderCandidate:
    """One DataLoader setting as measured alone (no training), warm-up excluded.

    Attributes:
        num_workers: Worker processes (0: loading in the main process).
        prefetch_factor: Batches each worker loads ahead (``None`` without workers).
        pin_memory: Whether batches were copied to page-locked memory.
        samples_per_s: Steady-state samples/s of the loader alone.
        startup_s: From ``iter(loader)`` to the first batch: worker start-up plus one batch.
        timed_batches: Batches in the timed window.
        timed_s: Seconds of the timed window.
        main_thread_s_per_sample: Time the training process's main thread spends per sample to
            get it (all of the loading with 0 workers; receiving the batch with workers). It is
            serial with the training step, so it counts against the consumption rate.
        worker_memory_bytes: Memory of the largest worker (USS: what it holds alone), if any.
        batch_bytes: Bytes of tensors in one batch (what sits in ``/dev/shm`` per batch).
        sample_bytes: ``batch_bytes`` per sample.
        pixel_dtype: Dtype of the batch's largest 4-D tensor (``None``: no 4-D tensor).
        expected_rate: Samples/s training can reach with this setting,
            ``min(loader, 1 / (main thread + 1 / consumption))``. Without a consumption rate:
            the loader's rate with workers, and with 0 workers the same formula for a device
            as fast as the fastest loader setting measured.
        note: Why the candidate was not eligible, if it was not.
        cpu_share: With 0 workers, CPU seconds the process spent per second of loading,
            plus the seconds it waited for a busy core (``None`` with workers). Well under 1,
            loading mostly waits (on reads), so workers beyond the CPU budget can still pay.
    """

    num_workers: int
    prefetch_factor: int | None
    pin_memory: bool
    samples_per_s: float
    startup_s: float
    timed_batches: int
    timed_s: float
    main_thread_s_per_sample: float
    worker_memory_bytes: int | None = None
    batch_bytes: int | None = None
    sample_bytes: int | None = None
    pixel_dtype: str | None = None
    expected_rate: float = 0.0
    note: str = ""
    cpu_share: float | None = None

    @property
    def complete(self) -> bool:
        """Whether enough batches were timed for the rate to mean something."""
        return self.timed_batches >= MIN_TIMED_BATCHES

    def key(self) -> tuple[int, int]:
        """Sort key "cheapest first": fewer workers, then shallower prefetch."""
        return self.num_workers, self.prefetch_factor or 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {**asdict(self), "complete": self.complete}


@dataclass(frozen=True)
class SearchResult:
    """What the search measured, what it chose and why it stopped."""

    candidates: tuple[LoaderCandidate, ...]
    chosen: LoaderCandidate | None
    cpu_workers: int
    memory_workers: int | None
    """Worker cap from RAM (``None`` until a worker's memory was measured or without a budget)."""
    shm_workers: int | None
    stop: str
    """Why growing workers stopped: ``target``, ``no_gain``, ``cap`` or ``time``."""
    target_met: bool
    device_rate: float | None = None
    """The rate ``expected_rate`` assumed for the device: the consumption rate or the fastest
    loader rate measured."""
    io_workers: int | None = None
    """The CPU cap raised because loading waits on I/O (``None``: not raised)."""
    ceiling_workers: int | None = None
    """Most workers the search could reach past the CPU budget while each still gained
    (``None``: the budget was a hard cap)."""
    own: LoaderCandidate | None = None
    """The loader's own setting as measured beside the search's choice (``None``: it was the
    choice, or not measured)."""
    own_kept: bool = False
    """Whether the loader's own setting stayed because the choice did not beat it."""

    @property
    def budget_workers(self) -> int:
        """The CPU budget (raised for I/O): past it, each added worker must gain >= 5 %."""
        return self.io_workers or self.cpu_workers

    @property
    def cpu_cap(self) -> int:
        """The hard worker cap from CPUs: the ceiling, or the budget when there is none."""
        return max(self.ceiling_workers or 0, self.budget_workers)

    @property
    def max_workers(self) -> int:
        """The binding worker cap."""
        caps = [self.cpu_cap, self.memory_workers, self.shm_workers]
        return min(c for c in caps if c is not None)

    @property
    def limited_by(self) -> str:
        """Which cap binds: ``cpu``, ``memory`` or ``shm`` (the first of equals)."""
        caps = [("cpu", self.cpu_cap), ("memory", self.memory_workers)]
        caps.append(("shm", self.shm_workers))
        return min((v, i, k) for i, (k, v) in enumerate(caps) if v is not None)[2]


def expected_rate(candidate: LoaderCandidate, consumption_rate: float | None) -> float:
    """Samples/s a training loop can reach with ``candidate`` feeding a consumer of that rate.

    The main thread's share of loading is serial with the step; the workers' share overlaps.
    """
    rate = candidate.samples_per_s
    if consumption_rate is None or rate <= 0:
        return rate
    serial = candidate.main_thread_s_per_sample + 1.0 / consumption_rate
    return min(rate, 1.0 / serial)


def meets_target(candidate: LoaderCandidate, consumption_rate: float | None) -> bool:
    """The loader alone outruns the consumption rate by 1.25x.

    Loading in the main process must also cost the step less than 5 %, since it is serial
    with it. With workers, the hand-off of each batch costs the same whatever their number,
    so it cannot decide how many workers are needed.
    """
    if consumption_rate is None or not candidate.complete:
        return False
    if candidate.samples_per_s < TARGET_MARGIN * consumption_rate:
        return False
    serial = expected_rate(candidate, consumption_rate)
    return candidate.num_workers > 0 or serial * (1 + MIN_GAIN) >= consumption_rate


def rate_text(samples_per_s: float) -> str:
    """A rate for a table: no decimals from 100 samples/s up, one below."""
    return f"{samples_per_s:,.0f}" if samples_per_s >= 100 else f"{samples_per_s:.1f}"
