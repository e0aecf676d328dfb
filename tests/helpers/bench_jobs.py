"""Job functions for ``maxtp bench`` tests: a compute-bound job, a planted slowdown, broken ones.

``MAXTP_TEST_SLOW_MS`` adds that many milliseconds of sleep to every training step: the planted
slowdown a CI gate must catch. ``job_10pct_slower`` is the job at 0.9x its rate whatever the
machine's speed: each step spins for a ninth of the previous step's own time.
``MAXTP_TEST_FAIL_AT`` makes the training step raise at that step.
"""

from __future__ import annotations

import os
import time
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class ComputeNet(pl.LightningModule):
    """An MLP whose step is a few milliseconds of matrix products on a small CPU."""

    def __init__(self, width: int = 512, slow_share: float = 0.0) -> None:
        super().__init__()
        self.slow_share = slow_share
        self._last: float | None = None
        self._spun = 0.0
        self.net = nn.Sequential(nn.Linear(128, width), nn.ReLU(), nn.Linear(width, width),
                                 nn.ReLU(), nn.Linear(width, 10))  # fmt: skip
        self.slow_s = float(os.environ.get("MAXTP_TEST_SLOW_MS", "0")) / 1000
        self.fail_at = int(os.environ.get("MAXTP_TEST_FAIL_AT", "-1"))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_step == self.fail_at:
            raise RuntimeError(f"planted failure at step {self.global_step}")
        if self.slow_s:
            time.sleep(self.slow_s)
        if self.slow_share:
            self._spin()
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def _spin(self) -> None:
        # Spinning, not sleeping: a sleep here overshoots by up to ~13 ms, longer than a step.
        now = time.perf_counter()
        if self._last is not None:
            work = now - self._last - self._spun
            extra = work * self.slow_share / (1 - self.slow_share)
            while time.perf_counter() < now + extra:
                pass
            self._spun = extra
        self._last = now

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _loader(batch_size: int = 64) -> DataLoader[Any]:
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(2048, 128, generator=generator),
                         torch.randint(0, 10, (2048,), generator=generator))  # fmt: skip
    return DataLoader(data, batch_size=batch_size, shuffle=True)


def job() -> dict[str, Any]:
    """The compute-bound job."""
    return {"model": ComputeNet(), "train_dataloaders": _loader()}


def job_10pct_slower() -> dict[str, Any]:
    """The compute-bound job, 10 % slower (0.9x its samples/s), as a regression would make it."""
    return {"model": ComputeNet(slow_share=0.1), "train_dataloaders": _loader()}


def job_far_slower() -> dict[str, Any]:
    """The compute-bound job at 0.2x its samples/s: a regression no loaded machine hides.

    At 0.4x, one round of five under a parallel test run read 1.12x: the job it was paired with
    ran its 30 steps at a third of its rate while the other side's ran unhindered.
    """
    return {"model": ComputeNet(slow_share=0.8), "train_dataloaders": _loader()}


def job_with_configs(config: str) -> dict[str, Any]:
    """A job that builds its own variants: ``narrow`` has a quarter of the width."""
    if config not in ("defaults", "maxtp", "narrow"):
        raise ValueError(f"unknown config {config!r}")
    width = 128 if config == "narrow" else 512
    return {"model": ComputeNet(width), "train_dataloaders": _loader(), "trainer_kwargs": {}}


def raises() -> dict[str, Any]:
    """A job function that fails while building its job."""
    raise FileNotFoundError("data/train.csv")


def not_a_job() -> list[int]:
    """Returns something that is not a job."""
    return [1, 2, 3]


NOT_CALLABLE = 3
