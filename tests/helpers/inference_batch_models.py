"""Model factories with a known cost and memory per batch size, for the inference batch search.

Each model takes the default collate of ``item(i)`` rows (a ``(batch, FEATURES)`` tensor). Its
per-call time is a ``time.sleep`` of a chosen length, so throughput ratios hold on a loaded
machine (a sleep is barely stretched by other processes). Kept free of lightning and pytest
imports, like ``inference_models``: pass ``functools.partial(make_..., ...)`` as the factory.
"""

from __future__ import annotations

import time
import weakref

import torch

FEATURES = 4
MIB_FLOATS = 2**20 // 4
"""float32 elements in one MiB."""


def item(i: int) -> torch.Tensor:
    """A prepared item: what ``load``/``preprocess`` would have produced."""
    return torch.full((FEATURES,), float(i))


class CostModel(torch.nn.Module):
    """Sleeps ``delay_s`` per call up to ``knee`` rows, then ``jump`` times longer per row.

    ``jump=1`` makes the per-row cost constant past the knee (a plateau of throughput);
    ``jump=2`` doubles it (throughput halves); ``knee=None`` keeps the call's time fixed, so
    throughput grows with the batch without end.
    """

    def __init__(self, delay_s: float, knee: int | None, jump: float) -> None:
        super().__init__()
        self.delay_s, self.knee, self.jump = delay_s, knee, jump
        self.calls: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = int(x.shape[0])
        self.calls.append(rows)
        delay = self.delay_s
        if self.knee is not None and rows > self.knee:
            delay *= self.jump * rows / self.knee
        time.sleep(delay)
        return x * 2


def make_fixed_cost(delay_s: float = 0.02) -> torch.nn.Module:
    """The same time per call at any batch size."""
    return CostModel(delay_s, None, 1.0)


def make_knee(delay_s: float = 0.02, knee: int = 64, jump: float = 2.0) -> torch.nn.Module:
    """Fixed time per call up to ``knee`` rows, ``jump`` times the per-row cost above."""
    return CostModel(delay_s, knee, jump)


class OomAbove(torch.nn.Module):
    """Runs like ``make_fixed_cost`` up to ``limit`` rows; above, allocates and runs out of memory.

    The scratch tensor it allocates before raising is what a real failed forward leaves in its
    frames; ``scratch`` holds weak references to them, so a test can see that none survives.
    """

    def __init__(self, limit: int, delay_s: float, plain: bool) -> None:
        super().__init__()
        self.limit, self.delay_s, self.plain = limit, delay_s, plain
        self.scratch: list[weakref.ref[torch.Tensor]] = []
        self.calls: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = int(x.shape[0])
        self.calls.append(rows)
        if rows > self.limit:
            scratch = torch.ones(rows, 1024)
            self.scratch.append(weakref.ref(scratch))
            message = f"CUDA out of memory. Tried to allocate {rows} rows (limit {self.limit})"
            if self.plain:
                raise RuntimeError(message)
            raise torch.OutOfMemoryError(message)
        time.sleep(self.delay_s)
        return x * 2


def make_oom_above(limit: int = 100, delay_s: float = 0.02, plain: bool = False) -> OomAbove:
    """``OomAbove``: ``plain`` raises a ``RuntimeError`` with the CUDA message instead."""
    return OomAbove(limit, delay_s, plain)


class MemoryHungry(torch.nn.Module):
    """Touches ``mib_per_row`` MiB of fresh memory per row: RSS grows with the batch."""

    def __init__(self, mib_per_row: float) -> None:
        super().__init__()
        self.mib_per_row = mib_per_row

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = int(x.shape[0])
        scratch = torch.ones(rows, int(self.mib_per_row * MIB_FLOATS))  # written: resident
        return x * scratch[:, :1]


def make_memory_hungry(mib_per_row: float = 1.0) -> torch.nn.Module:
    """``MemoryHungry``."""
    return MemoryHungry(mib_per_row)


class Broken(torch.nn.Module):
    """Fails with an error that is not out of memory (a bug in the model)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError(f"bad input of shape {tuple(x.shape)}")


def make_broken() -> torch.nn.Module:
    """``Broken``."""
    return Broken()
