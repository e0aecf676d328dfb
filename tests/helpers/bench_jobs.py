"""Job functions for ``maxtp bench`` tests: a compute-bound job, a planted slowdown, broken ones.

``MAXTP_TEST_SLOW_MS`` adds that many milliseconds of sleep to every training step: the planted
slowdown a CI gate must catch. ``MAXTP_TEST_FAIL_AT`` makes the training step raise at that step.
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

    def __init__(self, width: int = 512) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(128, width), nn.ReLU(), nn.Linear(width, width),
                                 nn.ReLU(), nn.Linear(width, 10))  # fmt: skip
        self.slow_s = float(os.environ.get("MAXTP_TEST_SLOW_MS", "0")) / 1000
        self.fail_at = int(os.environ.get("MAXTP_TEST_FAIL_AT", "-1"))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_step == self.fail_at:
            raise RuntimeError(f"planted failure at step {self.global_step}")
        if self.slow_s:
            time.sleep(self.slow_s)
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

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
