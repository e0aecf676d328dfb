"""Pieces shared by the workloads: DataLoader settings and a classification LightningModule base.

Benchmarks compare explicit settings, so nothing here picks values on its own: ``LoaderSettings``
holds every DataLoader knob that matters for throughput and ``make_loader`` applies it verbatim.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, RandomSampler

OPTIMIZERS = ("sgd", "adamw", "adam")
"""Optimizer names ``ClassifierModule`` accepts."""


@dataclass(frozen=True)
class LoaderSettings:
    """DataLoader knobs that decide input throughput.

    Attributes:
        batch_size: Samples per batch (every batch is full: ``drop_last=True``).
        num_workers: Worker processes (0 loads in the main process).
        prefetch_factor: Batches each worker loads ahead (ignored when ``num_workers == 0``).
        pin_memory: Copy batches to page-locked memory (only useful with a GPU).
        persistent_workers: Keep workers alive between epochs (ignored without workers).
    """

    batch_size: int = 32
    num_workers: int = 0
    prefetch_factor: int | None = None
    pin_memory: bool = False
    persistent_workers: bool = False

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")
        if self.num_workers < 0:
            raise ValueError(f"num_workers must not be negative, got {self.num_workers}")

    @property
    def queue_depth(self) -> int:
        """Batches the workers can hold ready at once (torch's default prefetch is 2).

        A timed fit's loader needs this many batches past its last step: otherwise the last
        steps train on a queue filled earlier, with no loading beside them, and a deep queue
        looks faster than it is.
        """
        return self.num_workers * (self.prefetch_factor or 2)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return asdict(self)


def make_loader(
    dataset: Dataset[Any],
    settings: LoaderSettings,
    *,
    steps: int | None = None,
    seed: int = 0,
) -> DataLoader[Any]:
    """A shuffling DataLoader built from explicit settings.

    Args:
        dataset: A map-style data set.
        settings: The DataLoader knobs, applied as given (``prefetch_factor`` and
            ``persistent_workers`` only where workers exist, since torch rejects them otherwise).
        steps: If given, the loader yields exactly this many full batches, drawing the data set
            again (a fresh permutation) as often as needed, so a timed run never crosses an epoch
            boundary. Otherwise one pass over the data set.
        seed: Seed of the shuffling generator.

    Returns:
        The DataLoader.
    """
    num_samples = len(dataset)  # type: ignore[arg-type]
    if steps is not None:
        if steps < 1:
            raise ValueError(f"steps must be at least 1, got {steps}")
        num_samples = steps * settings.batch_size
    workers = settings.num_workers > 0
    return DataLoader(
        dataset,
        batch_size=settings.batch_size,
        sampler=RandomSampler(
            dataset,  # type: ignore[arg-type]
            num_samples=num_samples,
            generator=torch.Generator().manual_seed(seed),
        ),
        num_workers=settings.num_workers,
        prefetch_factor=settings.prefetch_factor if workers else None,
        pin_memory=settings.pin_memory,
        persistent_workers=settings.persistent_workers and workers,
        drop_last=True,
    )


class ClassifierModule(pl.LightningModule):
    """Base LightningModule: cross-entropy on ``(inputs, labels)`` batches, one optimizer.

    Subclasses set ``self.model`` (or override ``forward``).

    Args:
        optimizer: ``"sgd"`` (momentum 0.9), ``"adamw"`` or ``"adam"``.
        lr: Learning rate.
    """

    model: nn.Module

    def __init__(self, *, optimizer: str = "sgd", lr: float = 0.01) -> None:
        super().__init__()
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
        self.optimizer_name = optimizer
        self.lr = lr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)  # type: ignore[no-any-return]

    def training_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> torch.Tensor:
        inputs, labels = batch
        return F.cross_entropy(self(inputs), labels)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = self.parameters()
        if self.optimizer_name == "sgd":
            return torch.optim.SGD(params, lr=self.lr, momentum=0.9)
        if self.optimizer_name == "adamw":
            return torch.optim.AdamW(params, lr=self.lr)
        return torch.optim.Adam(params, lr=self.lr)
