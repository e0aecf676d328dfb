"""Time a real Lightning ``Trainer.fit``: samples/s between step boundaries, warm-up excluded.

The first steps of a fit pay for worker start-up, lazy initialisation, cudnn autotuning and
allocator growth; counting them would understate steady-state throughput, so ``time_fit`` starts
the clock only after ``warmup_steps`` batches. Readings are taken at the end of training batches
(after a CUDA synchronize on a GPU), so each timed step includes fetching its batch: a slow input
pipeline shows up in the number, as it does in real training.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

__all__ = ["Measurement", "StepTimer", "time_fit"]


@dataclass(frozen=True)
class Measurement:
    """Samples processed in a timed interval.

    Attributes:
        samples: Samples in the timed steps.
        seconds: Wall time of the timed steps.
        steps: Timed steps (0 when not step-based).
        warmup_steps: Steps run before the clock started.
    """

    samples: int
    seconds: float
    steps: int = 0
    warmup_steps: int = 0

    @property
    def samples_per_s(self) -> float:
        """Throughput; 0 for an empty interval."""
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view, throughput included."""
        return {
            "samples": self.samples,
            "seconds": self.seconds,
            "steps": self.steps,
            "warmup_steps": self.warmup_steps,
            "samples_per_s": self.samples_per_s,
        }


def _batch_size(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor."""
    while isinstance(batch, list | tuple | dict):
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    if not isinstance(batch, torch.Tensor):
        raise TypeError(f"cannot count samples in a batch of {type(batch).__name__}")
    return int(batch.shape[0])


class StepTimer(pl.Callback):
    """Starts the clock after ``warmup_steps`` batches and stops it after ``steps`` more.

    Both readings come at the end of a training batch, so the timed interval holds whole
    steps: fetching the batch (data loading), forward, backward and optimizer step. On CUDA the
    device is synchronized before each reading, so queued kernels are counted.
    """

    def __init__(self, warmup_steps: int, steps: int) -> None:
        self.warmup_steps, self.steps = warmup_steps, steps
        self.batches = self.samples = 0
        self.start: float | None = None
        self.stop: float | None = None

    @staticmethod
    def _now(trainer: pl.Trainer) -> float:
        device = trainer.strategy.root_device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self.batches += 1
        if self.batches == self.warmup_steps:
            self.start = self._now(trainer)
        elif self.warmup_steps < self.batches <= self.warmup_steps + self.steps:
            self.samples += _batch_size(batch)
            if self.batches == self.warmup_steps + self.steps:
                self.stop = self._now(trainer)


def _shutdown_workers(loader: DataLoader[Any]) -> None:
    """Stop a loader's (persistent) worker processes, if any are left."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
    loader._iterator = None


def time_fit(
    module: pl.LightningModule,
    loader: DataLoader[Any],
    *,
    warmup_steps: int = 3,
    steps: int = 20,
    accelerator: str = "auto",
    precision: str = "32-true",
    trainer_kwargs: Mapping[str, Any] | None = None,
) -> Measurement:
    """Time ``steps`` training steps of a real ``Trainer.fit`` after ``warmup_steps`` steps.

    The Trainer runs on one device with no logger, checkpointing, progress bar or model
    summary, no validation, and ``max_steps = warmup_steps + steps``.

    Args:
        module: The LightningModule to train.
        loader: Training DataLoader with at least ``warmup_steps + steps`` batches (an epoch
            boundary inside the timed steps would time worker restarts).
        warmup_steps: Untimed steps first (at least 1: the first step starts workers).
        steps: Timed steps.
        accelerator: Trainer accelerator.
        precision: Trainer precision, e.g. ``"32-true"`` or ``"bf16-mixed"``.
        trainer_kwargs: Further Trainer arguments (override the ones above; ``callbacks`` are
            added after the step timer).

    Returns:
        Samples and seconds of the timed steps.
    """
    if warmup_steps < 1 or steps < 1:
        raise ValueError(f"need warmup_steps >= 1 and steps >= 1, got {warmup_steps}, {steps}")
    total = warmup_steps + steps
    if len(loader) < total:
        raise ValueError(f"loader has {len(loader)} batches, the timed fit needs {total}")
    timer = StepTimer(warmup_steps, steps)
    kwargs: dict[str, Any] = {
        "accelerator": accelerator,
        "devices": 1,
        "precision": precision,
        "max_steps": total,
        "max_epochs": 1,
        "limit_val_batches": 0,
        "num_sanity_val_steps": 0,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        **(trainer_kwargs or {}),
    }
    kwargs["callbacks"] = [timer, *(trainer_kwargs or {}).get("callbacks", [])]
    trainer = pl.Trainer(**kwargs)
    try:
        trainer.fit(module, train_dataloaders=loader)
    finally:
        _shutdown_workers(loader)
    if timer.start is None or timer.stop is None:
        raise RuntimeError(f"fit ended after {timer.batches} of {total} steps")
    return Measurement(timer.samples, timer.stop - timer.start, steps, warmup_steps)
