"""The CI suite's workload: a tiny MLP fed by a data set with per-sample read latency.

``latency_s`` > 0 models remote storage (the loader sets the pace; more workers pay even on two
CPUs); ``latency_s == 0`` is in-memory data (the step sets the pace; the callback must cost
nothing there).
"""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import Dataset


class LatencyDataset(Dataset[tuple[torch.Tensor, int]]):
    """``(features, label)`` of sample ``index`` after ``latency_s`` of waiting."""

    def __init__(self, size: int, latency_s: float) -> None:
        self.size, self.latency_s = size, latency_s

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self.latency_s > 0:
            time.sleep(self.latency_s)
        generator = torch.Generator().manual_seed(index)
        return torch.randn(64, generator=generator), index % 8


class TinyMLP(pl.LightningModule):
    """64 -> 256 -> 8 classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """Cross-entropy on one batch."""
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """Plain SGD."""
        return torch.optim.SGD(self.parameters(), lr=0.05)
