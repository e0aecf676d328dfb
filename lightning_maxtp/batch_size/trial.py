"""One batch-size trial: real training steps on a replicated example batch, timed and measured.

A trial replicates the user's example batch to the candidate size on the device (so data
loading is not part of the measurement), runs one warm-up step (optimizer state creation, cudnn
autotuning, allocator growth) and then the timed steps, synchronizing the device before each
clock reading. A fit check (``timed=False``) runs two steps: the second is the first one that
holds the optimizer state, gradients and activations at once, i.e. the steady-state peak.

After every trial, whether it fit or not, the captured training state is restored and the
allocator emptied, so each trial starts from the same state and memory.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch import nn

from lightning_maxtp.batch_size.oom import (
    describe_oom,
    free_memory,
    is_oom_error,
    read_peak_memory,
    release_exception,
    reset_peak_memory,
)
from lightning_maxtp.batch_size.search import TrialResult
from lightning_maxtp.batch_size.snapshot import TrainingState
from lightning_maxtp.batch_size.steps import Step

__all__ = ["TrialRunner", "agree", "batch_length", "replicate_batch", "synchronize"]

MIN_TIMED_S = 0.05
"""Shortest timed interval: tiny models step in microseconds, below the clock's noise."""
MAX_TIMED_STEPS = 4096


def batch_length(batch: Any) -> int | None:
    """Samples in a batch: the first dimension of its first tensor (``None`` without one)."""
    found: list[int] = []

    def visit(t: torch.Tensor) -> torch.Tensor:
        if not found and t.dim() > 0:
            found.append(int(t.shape[0]))
        return t

    apply_to_collection(batch, torch.Tensor, visit)
    return found[0] if found else None


def replicate_batch(batch: Any, length: int, size: int) -> Any:
    """The batch at ``size`` samples: sliced when smaller, samples repeated in order when larger.

    Tensors whose first dimension is not ``length`` (masks shared by all samples, scalars) and
    non-tensor leaves are passed through unchanged.
    """
    if size == length:
        return batch
    indices: dict[torch.device, torch.Tensor] = {}

    def grow(t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 0 or t.shape[0] != length:
            return t
        if size < length:
            return t[:size]
        if t.device not in indices:
            indices[t.device] = torch.arange(size, device=t.device) % length
        return t.index_select(0, indices[t.device])

    return apply_to_collection(batch, torch.Tensor, grow)


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels, so a clock reading counts them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
    elif device.type == "xpu":  # pragma: no cover - no XPU in CI
        torch.xpu.synchronize(device)


def agree(result: TrialResult, device: torch.device) -> TrialResult:
    """Merge one trial over all ranks, identically on each: the slowest and the largest count.

    It fits only if it fit on every rank; throughput is the slowest rank's (synchronous data
    parallelism runs at its pace), peak memory and seconds the largest. Every rank reaches this
    collective after its own trial, fit or out of memory, so none can wait forever.
    """
    import torch.distributed as dist

    where = device if dist.get_backend() == "nccl" else torch.device("cpu")
    mine = torch.tensor(
        [
            float(result.fits),
            -1.0 if result.samples_per_s is None else result.samples_per_s,
            -1.0 if result.peak_memory_bytes is None else float(result.peak_memory_bytes),
            result.seconds,
        ],
        dtype=torch.float64,
        device=where,
    )
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    rows = torch.stack(gathered).cpu().tolist()
    failed = [rank for rank, row in enumerate(rows) if row[0] < 0.5]
    speeds = [row[1] for row in rows]
    peaks = [row[2] for row in rows if row[2] >= 0]
    error = result.error
    if failed and result.fits:
        error = f"out of memory on rank(s) {failed}"
    return TrialResult(
        batch_size=result.batch_size,
        fits=not failed,
        samples_per_s=None if failed or min(speeds) < 0 else min(speeds),
        peak_memory_bytes=int(max(peaks)) if peaks else None,
        seconds=max(row[3] for row in rows),
        error=None if not failed else error,
    )


class TrialRunner:
    """``runner(batch_size, timed) -> TrialResult``, the callable the search drives."""

    def __init__(
        self,
        *,
        step: Step,
        example: Any,
        state: TrainingState,
        device: torch.device,
        steps_per_trial: int,
        distributed: bool = False,
        modules: Sequence[nn.Module] = (),
    ) -> None:
        length = batch_length(example)
        if length is None or length < 1:
            raise ValueError(
                "the example `batch` must contain a tensor whose first dimension is the batch "
                f"(got {type(example).__name__} without one); pass one batch from your loader"
            )
        self.step, self.example, self.length = step, example, length
        self.state, self.device = state, device
        self.steps_per_trial, self.distributed = steps_per_trial, distributed
        self.modules = tuple(modules)
        self._first = True

    def _timed(self, batch: Any, batch_size: int) -> float:
        """Median samples/s of chunks of ``steps_per_trial`` steps, run for ``MIN_TIMED_S``.

        One synchronization per chunk keeps kernels queued back to back as in training. Steps
        of a tiny model take microseconds, so one chunk would time mostly the clock and any
        preemption by another process; the median over many chunks ignores such stalls.
        """
        synchronize(self.device)
        start = clock = time.perf_counter()
        rates: list[float] = []
        while True:
            for _ in range(self.steps_per_trial):
                self.step(batch)
            synchronize(self.device)
            now = time.perf_counter()
            rates.append(batch_size * self.steps_per_trial / max(now - clock, 1e-9))
            clock = now
            if now - start >= MIN_TIMED_S or len(rates) * self.steps_per_trial >= MAX_TIMED_STEPS:
                return statistics.median(rates)

    def __call__(self, batch_size: int, timed: bool) -> TrialResult:
        """Run one trial at ``batch_size`` (timed or only checked for fit) and restore state."""
        start = time.perf_counter()
        if self._first:
            free_memory(self.device)
            self._first = False
        peak_valid = reset_peak_memory(self.device)
        speed: float | None = None
        error: str | None = None
        batch: Any = None
        for module in self.modules:
            module.train()  # restore() puts back the caller's flags after every trial
        try:
            batch = replicate_batch(self.example, self.length, batch_size)
            self.step(batch)  # warm-up: optimizer state, autotuning, allocator growth
            if timed:
                speed = self._timed(batch, batch_size)
            else:
                self.step(batch)
                synchronize(self.device)
        except Exception as exc:
            if not is_oom_error(exc):
                raise
            error = describe_oom(exc)
            release_exception(exc)
        finally:
            batch = None
            peak = read_peak_memory(self.device) if peak_valid else None
            self.state.restore()
        # A failed step can leave reference cycles holding its tensors; a step that finished
        # frees them by reference counting, and a collection costs ~0.1 s with torch loaded.
        free_memory(self.device, collect=error is not None)
        fits = error is None
        result = TrialResult(
            batch_size=batch_size,
            fits=fits,
            samples_per_s=speed if fits else None,
            peak_memory_bytes=peak,
            seconds=time.perf_counter() - start,
            error=error,
        )
        return agree(result, self.device) if self.distributed else result
