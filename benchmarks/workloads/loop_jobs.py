"""The jobs the scoreboard holds the closed loop to: each a whole Lightning fit, built fresh.

Every job is a ``Job``: how to build its module and its loaders for given loader settings, and
how the Trainer runs it (steps, or epochs with validation). The scoreboard times whole fits of
the same job by hand (fixed settings) and with ``MaxThroughputCallback`` (from the user's
settings), in turn.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import ConcatDataset, DataLoader, Dataset, TensorDataset

from benchmarks.workloads.ci import LatencyDataset, TinyMLP

__all__ = ["Job", "SmallConv", "ValidatedClassifier", "jpeg_dataset"]


class SmallConv(pl.LightningModule):
    """Two strided 3x3 convolutions and a linear head: a step far cheaper than its JPEGs.

    Args:
        channels: Width of the second convolution.
        optimizer: ``"sgd"`` or ``"adam"``.
    """

    def __init__(self, channels: int = 32, optimizer: str = "sgd") -> None:
        super().__init__()
        self.optimizer_name = optimizer
        self.net = nn.Sequential(
            nn.Conv2d(3, 8, 3, stride=4, padding=1), nn.ReLU(),
            nn.Conv2d(8, channels, 3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 10),
        )  # fmt: skip

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """Cross-entropy on one batch."""
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """SGD, or Adam (which has a fused step to try)."""
        if self.optimizer_name == "adam":
            return torch.optim.Adam(self.parameters(), lr=1e-3)
        return torch.optim.SGD(self.parameters(), lr=0.05)


class ValidatedClassifier(pl.LightningModule):
    """A torchvision model with a validation step (its loss logged), for short-epoch jobs."""

    def __init__(self, model_name: str = "mobilenet_v3_small") -> None:
        super().__init__()
        import torchvision

        self.model = torchvision.models.get_model(model_name, weights=None, num_classes=10)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """Cross-entropy on one batch."""
        x, y = batch
        return nn.functional.cross_entropy(self.model(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        """The validation loss, logged once per epoch."""
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.model(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """SGD with momentum."""
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def jpeg_dataset(image_size: int, crop: int, images: int = 1024, repeat: int = 1) -> Dataset[Any]:
    """The generated JPEG set (cached on disk), decoded and cropped; ``repeat`` times over."""
    from benchmarks.workloads.jpeg import (
        JpegFolderDataset,
        JpegSpec,
        default_data_dir,
        generate_jpeg_dataset,
    )

    spec = JpegSpec(images=images, image_size=image_size)
    root: Path = generate_jpeg_dataset(default_data_dir(spec), spec)
    base = JpegFolderDataset(root, crop=crop)
    return base if repeat == 1 else ConcatDataset([base] * repeat)


def conv_images(samples: int, side: int = 32) -> Dataset[Any]:
    """Random ``3 x side x side`` images with 10 classes, in memory."""
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(samples, 3, side, side, generator=generator)
    return TensorDataset(images, torch.randint(0, 10, (samples,), generator=generator))


def latency_dataset(samples: int, latency_s: float) -> Dataset[Any]:
    """Items that each wait ``latency_s`` on a read before they exist (``ci.LatencyDataset``)."""
    return LatencyDataset(samples, latency_s)


@dataclass(frozen=True)
class Job:
    """One workload, runnable at any loader settings.

    Attributes:
        name: Its name in the scoreboard.
        module: Builds a fresh LightningModule.
        train: The train data set (built once, shared by the fits).
        batch_size: Samples per batch.
        steps: ``max_steps`` of a fit (or ``None`` with ``epochs``).
        epochs: ``max_epochs`` of a fit with validation (``limit_train_batches`` per epoch).
        epoch_batches: Train batches per epoch (``limit_train_batches``).
        val: The validation data set (``None``: no validation).
        val_batches: Validation batches per epoch.
        shuffle: Whether the train loader shuffles.
        trainer: Further Trainer arguments.
    """

    name: str
    module: Callable[[], pl.LightningModule]
    train: Dataset[Any]
    batch_size: int = 32
    steps: int | None = None
    epochs: int | None = None
    epoch_batches: int | None = None
    val: Dataset[Any] | None = None
    val_batches: int = 2
    shuffle: bool = True
    trainer: dict[str, Any] = field(default_factory=dict)

    def loaders(
        self, workers: int, persistent: bool, prefetch: int | None = None
    ) -> tuple[DataLoader[Any], DataLoader[Any] | None]:
        """The train loader (and the validation one, alike) at these settings."""
        args: dict[str, Any] = {
            "batch_size": self.batch_size,
            "num_workers": workers,
            "persistent_workers": persistent and workers > 0,
            "prefetch_factor": (prefetch or 2) if workers else None,
        }
        train = DataLoader(self.train, shuffle=self.shuffle, drop_last=True, **args)
        val = None if self.val is None else DataLoader(self.val, **args)
        return train, val

    def fit(
        self,
        workers: int,
        *,
        persistent: bool = True,
        prefetch: int | None = None,
        callbacks: list[pl.Callback] | None = None,
    ) -> float:
        """One fresh fit at these settings; its wall-clock from ``fit`` to its return."""
        pl.seed_everything(0, verbose=False)
        limits: dict[str, Any] = (
            {"max_steps": self.steps}
            if self.epochs is None
            else {
                "max_epochs": self.epochs,
                "limit_train_batches": self.epoch_batches,
                "limit_val_batches": self.val_batches,
                "num_sanity_val_steps": 0,
            }
        )
        trainer = pl.Trainer(
            accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks or [],
            **limits, **self.trainer,
        )  # fmt: skip
        train, val = self.loaders(workers, persistent, prefetch)
        module = self.module()
        start = time.perf_counter()
        trainer.fit(module, train, val)
        return time.perf_counter() - start


def tiny_mlp() -> pl.LightningModule:
    """``ci.TinyMLP``: a step of about a millisecond."""
    return TinyMLP()
