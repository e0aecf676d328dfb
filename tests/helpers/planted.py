"""Planted bottlenecks on the CPU: real datasets and models whose limit is known by construction.

Each workload is a real ``Trainer.fit``; the tests check that ``diagnose`` names the planted
limit. Sizes keep every fit to a few seconds on 2 shared cores: the rules compare shares of the
step, so the absolute speed of the machine does not matter.
"""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

FEATURES = 32


class HeavyTransformDataset(Dataset[tuple[torch.Tensor, int]]):
    """Pure-Python CPU work per sample (a stand-in for decode + augment)."""

    def __init__(self, size: int = 4096, work: int = 20_000) -> None:
        self.size, self.work = size, work

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        acc = 0
        for k in range(self.work):  # holds the GIL and one core, like PIL decoding
            acc += k * k % 7
        return torch.full((FEATURES,), float(acc % 3)), i % 2


class SlowStorageDataset(Dataset[tuple[torch.Tensor, int]]):
    """Every read waits on "storage" (a sleep: latency without CPU, like a network disk)."""

    def __init__(self, size: int = 4096, latency_s: float = 0.002) -> None:
        self.size, self.latency_s = size, latency_s

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.latency_s)
        return torch.zeros(FEATURES), i % 2


class ReadyBatches(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Whole batches already in memory: fetching one costs an index (a well-fed job)."""

    def __init__(self, batches: int = 64, batch_size: int = 64, features: int = FEATURES) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(batches, batch_size, features, generator=g)
        self.y = torch.randint(0, 2, (batches, batch_size), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class Mlp(pl.LightningModule):
    """An MLP classifier; ``hidden`` and ``depth`` set how heavy the step is."""

    def __init__(self, features: int = FEATURES, hidden: int = 64, depth: int = 1) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(features, hidden), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(hidden, hidden), nn.ReLU()]
        self.net = nn.Sequential(*layers, nn.Linear(hidden, 2))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(
    module: pl.LightningModule,
    loader: DataLoader[Any],
    callbacks: list[pl.Callback],
    steps: int,
    **trainer_kwargs: Any,
) -> pl.Trainer:
    """A quiet CPU fit of ``steps`` batches."""
    kwargs: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "max_steps": steps,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
    }
    trainer = pl.Trainer(callbacks=callbacks, **(kwargs | trainer_kwargs))
    trainer.fit(module, loader)
    return trainer


def data_pipeline_job() -> tuple[pl.LightningModule, DataLoader[Any]]:
    """Heavy Python transform, 0 workers, tiny model: the loader is the limit."""
    return Mlp(), DataLoader(HeavyTransformDataset(), batch_size=16, num_workers=0)


def storage_job() -> tuple[pl.LightningModule, DataLoader[Any]]:
    """Reads that wait without CPU, 2 workers: the loader waits on storage.

    A batch every ~50 ms (16 reads of 6 ms, 2 workers) against a ~1 ms step: still mostly data
    wait when other jobs slow the step twentyfold (a 2-thread torch step on busy cores).
    """
    loader = DataLoader(SlowStorageDataset(latency_s=0.006), batch_size=16, num_workers=2)
    return Mlp(), loader


def compute_job() -> tuple[pl.LightningModule, DataLoader[Any]]:
    """A heavy MLP on ready batches: torch's compute threads are the limit.

    Heavy enough (~130 ms steps here) that the loop's own time between batches, which counts
    as data wait and grows when other jobs take the cores, stays far under the 5 % line.
    """
    data = ReadyBatches(batches=16, batch_size=128, features=512)
    return Mlp(features=512, hidden=2048, depth=3), DataLoader(data, batch_size=None)


def well_fed_job() -> tuple[pl.LightningModule, DataLoader[Any]]:
    """A moderate model fed from ready batches: the data side must raise no alarm."""
    data = ReadyBatches(batches=32, batch_size=256)
    return Mlp(hidden=512, depth=6), DataLoader(data, batch_size=None)
