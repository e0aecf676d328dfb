"""Plain data of the inference pool: the worker plan, per-item errors and run statistics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

STAGES = ("load", "preprocess", "forward", "worker")
"""Where an item can fail: in ``load``, ``preprocess``, the model's ``forward``, or with its
worker (the process died on this batch more than ``max_retries`` times)."""


@dataclass(frozen=True)
class WorkerSpec:
    """One worker process: where it runs and how many threads it may use."""

    device: str
    """``"cuda:<ordinal>"`` (ordinal as the coordinator sees it) or ``"cpu"``."""
    cuda_visible_devices: str | None
    """What the worker sets ``CUDA_VISIBLE_DEVICES`` to before CUDA starts (``""`` hides all)."""
    torch_threads: int
    """``torch.set_num_threads`` in the worker (intra-op threads)."""
    io_threads: int
    """Threads running ``load`` and ``preprocess`` in the worker."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "device": self.device,
            "cuda_visible_devices": self.cuda_visible_devices,
            "torch_threads": self.torch_threads,
            "io_threads": self.io_threads,
        }


@dataclass(frozen=True)
class InferencePlan:
    """The workers a pool starts, and why."""

    workers: tuple[WorkerSpec, ...]
    """The worker processes (for ``mode="inline"``: the ones a trial would start)."""
    skipped_gpus: tuple[tuple[int, str], ...] = ()
    """``(ordinal, reason)`` for every GPU left out (busy, or too little free memory)."""
    notes: tuple[str, ...] = field(default=())
    mode: str = "processes"
    """Where batches run now: ``processes``, ``inline`` (the calling process), ``measured``
    (inline first, processes when a trial shows they are faster) or ``ray``."""
    decisions: tuple[str, ...] = ()
    """What the pool measured and decided, in order (shape trials, batch size, more copies)."""
    batch_size: int | None = None
    """The batch size in use (``None`` until ``batch_size="auto"`` has searched)."""

    @property
    def devices(self) -> tuple[str, ...]:
        """Distinct devices, in worker order."""
        return tuple(dict.fromkeys(w.device for w in self.workers))

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "workers": [w.to_dict() for w in self.workers],
            "skipped_gpus": [{"index": i, "reason": r} for i, r in self.skipped_gpus],
            "notes": list(self.notes),
            "mode": self.mode,
            "decisions": list(self.decisions),
            "batch_size": self.batch_size,
        }

    def __str__(self) -> str:
        batch = (
            "batch size auto (not searched yet)"
            if self.batch_size is None
            else (f"batch size {self.batch_size}")
        )
        lines = [f"inference plan: {self.mode}, {len(self.workers)} worker(s), {batch}"]
        for device in self.devices:
            specs = [w for w in self.workers if w.device == device]
            lines.append(
                f"  {device}: {len(specs)} worker(s) x {specs[0].torch_threads} torch thread(s), "
                f"{specs[0].io_threads} I/O thread(s)"
            )
        lines += [f"  skipped cuda:{i}: {reason}" for i, reason in self.skipped_gpus]
        lines += [f"  note: {n}" for n in self.notes]
        lines += [f"  decided: {d}" for d in self.decisions]
        return "\n".join(lines)


@dataclass(frozen=True)
class ItemError:
    """One input that produced no output, with its position in the input."""

    index: int
    stage: str
    """One of ``STAGES``."""
    error_type: str
    message: str
    traceback: str = ""
    item_repr: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "index": self.index,
            "stage": self.stage,
            "error_type": self.error_type,
            "message": self.message,
            "traceback": self.traceback,
            "item_repr": self.item_repr,
        }

    def __str__(self) -> str:
        item = f" ({self.item_repr})" if self.item_repr else ""
        return f"item {self.index}{item} failed in {self.stage}: {self.error_type}: {self.message}"


class InferenceError(RuntimeError):
    """Raised by ``map``/``imap`` with ``on_error="raise"``; ``.error`` says which item and why."""

    def __init__(self, error: ItemError) -> None:
        detail = f"\n{error.traceback}" if error.traceback else ""
        super().__init__(
            f"{error}; pass on_error='skip' or on_error='return' to keep going{detail}"
        )
        self.error = error


@dataclass(frozen=True)
class WorkerStats:
    """What one worker slot did in a run (a replaced worker keeps its slot)."""

    worker_id: int
    device: str
    items: int
    batches: int
    restarts: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "worker_id": self.worker_id,
            "device": self.device,
            "items": self.items,
            "batches": self.batches,
            "restarts": self.restarts,
        }


@dataclass(frozen=True)
class InferenceStats:
    """One ``map``/``imap`` run: throughput, per-worker counts, retries and errors.

    Two rates, both labelled: ``items_per_s`` is end to end (what the caller waited, start-up
    included when this run paid it: workers spawning, models building), ``steady_items_per_s``
    counts only the items finished after the first output came back, over the time after it.
    """

    items: int
    """Inputs pulled from the iterable."""
    outputs: int
    errors: tuple[ItemError, ...]
    """Every failed item, by index."""
    retries: int
    """Batches sent again because their worker died."""
    elapsed_s: float
    """From the ``map``/``imap`` call (the pool's start, for its first run) to the end."""
    workers: tuple[WorkerStats, ...]
    startup_s: float = 0.0
    """Part of ``elapsed_s`` before the first output: start-up plus the first batch."""
    steady_items: int = 0
    """Items finished (output or error) after the first output."""
    steady_s: float = 0.0
    """Seconds from the first output to the end."""
    mode: str = "processes"
    """Where the batches ran: ``processes``, ``inline`` (the calling process), both (``inline
    then processes``), or ``ray``."""

    @property
    def items_per_s(self) -> float:
        """End to end: inputs finished (output or error) per second, start-up included."""
        return (self.outputs + len(self.errors)) / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def steady_items_per_s(self) -> float:
        """Steady: items finished after the first output, per second after it."""
        return self.steady_items / self.steady_s if self.steady_s > 0 else 0.0

    @property
    def per_device(self) -> dict[str, int]:
        """Items finished per device."""
        counts: dict[str, int] = {}
        for w in self.workers:
            counts[w.device] = counts.get(w.device, 0) + w.items
        return counts

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "items": self.items,
            "outputs": self.outputs,
            "errors": [e.to_dict() for e in self.errors],
            "retries": self.retries,
            "elapsed_s": self.elapsed_s,
            "startup_s": self.startup_s,
            "items_per_s": self.items_per_s,
            "steady_items": self.steady_items,
            "steady_s": self.steady_s,
            "steady_items_per_s": self.steady_items_per_s,
            "mode": self.mode,
            "per_device": self.per_device,
            "workers": [w.to_dict() for w in self.workers],
        }

    def __str__(self) -> str:
        devices = ", ".join(f"{d} {n}" for d, n in self.per_device.items())
        restarts = sum(w.restarts for w in self.workers)
        return (
            f"inference ({self.mode}): {self.items} items in {self.elapsed_s:.2f} s, "
            f"end to end {self.items_per_s:.1f} items/s (start-up and first batch "
            f"{self.startup_s:.2f} s), steady {self.steady_items_per_s:.1f} items/s; "
            f"{self.outputs} outputs, {len(self.errors)} errors, {self.retries} retried "
            f"batches, {restarts} worker restarts; per device: {devices or 'none'}; per worker: "
            + ", ".join(f"#{w.worker_id} {w.items}" for w in self.workers)
        )
