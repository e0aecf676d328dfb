r"""A training job for ``maxtp bench``: the function returns the model and its data, nothing runs.

    maxtp bench examples/ci/bench_job.py:job --json baseline.json          # record a baseline
    maxtp bench examples/ci/bench_job.py:job --baseline baseline.json \\
        --markdown bench.md                                                 # gate a change

Copy this file's shape for your own job: build the LightningModule and the DataLoader (or
DataModule) exactly as your training script does, and return them. The bench runs the fit, in a
fresh process per configuration and round, with and without ``MaxThroughputCallback()``.

This one reads each sample from (simulated) network storage, 1 ms a read, then augments it on
the CPU, as many image jobs do: the DataLoader sets the pace until it gets worker processes.
"""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class AugmentedImages(Dataset[tuple[torch.Tensor, int]]):
    """Generated 3x72x72 uint8 images, "read", randomly cropped, flipped, blurred and normalized."""

    def __init__(
        self, count: int = 4096, side: int = 72, crop: int = 64, read_s: float = 0.001
    ) -> None:
        generator = torch.Generator().manual_seed(0)
        self.images = torch.randint(0, 256, (count, 3, side, side), dtype=torch.uint8,
                                    generator=generator)  # fmt: skip
        self.labels = torch.randint(0, 10, (count,), generator=generator)
        self.side, self.crop, self.read_s = side, crop, read_s

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.read_s)  # the read: waiting, not computing
        top, left = torch.randint(0, self.side - self.crop + 1, (2,)).tolist()
        image = self.images[index, :, top : top + self.crop, left : left + self.crop].float()
        if torch.rand(()) < 0.5:
            image = image.flip(-1)
        image = nn.functional.avg_pool2d(image[None], 3, stride=1, padding=1)[0]  # a blur
        mean, std = image.mean(dim=(1, 2), keepdim=True), image.std(dim=(1, 2), keepdim=True)
        return (image - mean) / (std + 1e-6), int(self.labels[index])


class SmallCNN(pl.LightningModule):
    """Two convolutions and a linear head: a few milliseconds a batch on a small CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
        )  # fmt: skip

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> Any:
        """Cross-entropy of one batch."""
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """SGD with momentum."""
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def job() -> dict[str, Any]:
    """The job as the training script writes it: Lightning's DataLoader defaults, no workers."""
    loader = DataLoader(AugmentedImages(), batch_size=64, shuffle=True)
    return {"model": SmallCNN(), "train_dataloaders": loader}
