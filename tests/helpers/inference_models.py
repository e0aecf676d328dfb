"""Picklable model factories and item functions for the ``BatchInferencePool`` tests.

Kept free of lightning and pytest imports: the spawned workers import this module.
"""

from __future__ import annotations

import time
from typing import Any

import torch

FEATURES = 4
POISON_LOAD = "bad-load"
"""An item ``load_vector`` refuses."""


def make_linear() -> torch.nn.Module:
    """The same small linear model in every process (fixed seed)."""
    torch.manual_seed(0)
    return torch.nn.Linear(FEATURES, 3)


class SlowModel(torch.nn.Module):
    """``make_linear`` that takes ``delay_s`` per batch and refuses rows marked negative."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.inner = make_linear()
        self.delay_s = delay_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (x[:, 0] < 0).any():
            raise ValueError("negative item in the batch")
        time.sleep(self.delay_s)
        return self.inner(x)  # type: ignore[no-any-return]


def make_model(delay_s: float = 0.0) -> torch.nn.Module:
    """A ``SlowModel``: pass ``functools.partial(make_model, delay_s)`` as the factory."""
    return SlowModel(delay_s)


def load_vector(item: Any) -> torch.Tensor:
    """Item ``i`` -> ``[i, i+1, i+2, i+3] / 10``; a negative ``i`` gives a row the model refuses."""
    if item == POISON_LOAD:
        raise OSError(f"cannot read {item!r}")
    return (torch.arange(FEATURES, dtype=torch.float32) + float(item)) / 10


def reference(items: list[int]) -> list[torch.Tensor]:
    """What the pool must return for ``items``: one process, one batch."""
    model = make_linear().eval()
    with torch.inference_mode():
        out = model(torch.stack([load_vector(i) for i in items]))
    return list(out.unbind(0))


class PlacedModel(torch.nn.Module):
    """``make_linear`` that sleeps ``caller_s`` per batch in the calling process and
    ``worker_s`` in a spawned worker: plants which shape of a measured pool is faster."""

    def __init__(self, caller_s: float, worker_s: float) -> None:
        super().__init__()
        import multiprocessing

        self.inner = make_linear()
        self.delay_s = worker_s if multiprocessing.parent_process() is not None else caller_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay_s)
        return self.inner(x)  # type: ignore[no-any-return]


def make_placed(caller_s: float, worker_s: float) -> torch.nn.Module:
    """A ``PlacedModel``: pass ``functools.partial(make_placed, caller_s, worker_s)``."""
    return PlacedModel(caller_s, worker_s)


def make_caller_only(caller_s: float) -> torch.nn.Module:
    """A ``PlacedModel`` in the calling process; raises in a spawned worker (a factory that only
    works where it was defined, as in a notebook)."""
    import multiprocessing

    if multiprocessing.parent_process() is not None:
        raise RuntimeError("this factory only works in the calling process")
    return PlacedModel(caller_s, 0.0)
