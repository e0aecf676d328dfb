"""Models that run out of memory above a planted batch size, for the batch-size search tests.

The error is a real ``torch.OutOfMemoryError`` (the type the CUDA caching allocator raises),
raised in the forward pass or only in the backward pass; ``AllocatorOOM`` instead asks the CPU
allocator for an impossible block, so the error is the allocator's own ``RuntimeError`` and is
recognised by its message.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

FEATURES, CLASSES = 16, 4


def oom_message(batch: int, where: str) -> str:
    return f"CUDA out of memory. Tried to allocate {batch} MiB (planted, {where})"


class _RaiseInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, threshold: int) -> torch.Tensor:
        ctx.threshold = threshold
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        if grad.shape[0] > ctx.threshold:
            raise torch.OutOfMemoryError(oom_message(grad.shape[0], "backward"))
        return grad, None


def make_net() -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(FEATURES, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, CLASSES)
    )


class PlantedOOM(nn.Module):
    """A small MLP with BatchNorm that fails above ``threshold`` samples.

    Args:
        threshold: Largest batch that fits.
        where: ``"forward"``, ``"backward"`` (only the backward pass fails) or ``"allocator"``
            (the CPU allocator's own error, for the message fallback).
    """

    def __init__(self, threshold: int, where: str = "forward") -> None:
        super().__init__()
        self.threshold, self.where = threshold, where
        self.net = make_net()
        self.calls: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(x.shape[0])
        over = x.shape[0] > self.threshold
        if over and self.where == "forward":
            raise torch.OutOfMemoryError(oom_message(x.shape[0], "forward"))
        if over and self.where == "allocator":
            torch.empty(2**50, dtype=torch.uint8)  # DefaultCPUAllocator: can't allocate memory
        h = self.net(x)
        return _RaiseInBackward.apply(h, self.threshold) if self.where == "backward" else h


def loss_fn(model: nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


def example_batch(n: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, FEATURES, generator=gen), torch.randint(0, CLASSES, (n,), generator=gen)


class PlantedModule(pl.LightningModule):
    """A LightningModule around ``PlantedOOM`` whose loader reads ``hparams.batch_size``."""

    def __init__(
        self,
        threshold: int = 1_000_000,
        batch_size: int = 8,
        lr: float = 0.1,
        where: str = "forward",
        samples: int = 256,
        optimizer: str = "sgd",
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = PlantedOOM(threshold, where)
        self.seen_batches: list[int] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = loss_fn(self.model, batch)
        self.log("loss", loss)
        return loss

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.seen_batches.append(int(batch[0].shape[0]))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.hparams.optimizer == "adam":
            return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)

    def train_dataloader(self) -> DataLoader[Any]:
        x, y = example_batch(self.hparams.samples, seed=1)
        return DataLoader(TensorDataset(x, y), batch_size=self.hparams.batch_size, drop_last=True)
