"""Train with ``MaxThroughputCallback``: the loop tunes the DataLoader while the model trains.

The data set reads each sample with a few milliseconds of latency, like files on network storage,
and the loader starts at Lightning's defaults (no workers). The callback measures a baseline,
names the bottleneck (storage / data pipeline), raises ``num_workers``, keeps it only when the
run got measurably faster (beyond the noise between windows; the rule is ``tuning.judge``), and
prints a summary; ``--report-dir`` also writes the report files.

Usage: ``python examples/callback_train.py [--steps N] [--report-dir DIR] [--smoke]``
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_maxtp import MaxThroughputCallback


class SlowStorageDataset(Dataset[tuple[torch.Tensor, int]]):
    """``(features, label)`` after ``latency_s`` of waiting per sample (a remote read)."""

    def __init__(self, size: int = 2048, latency_s: float = 0.003) -> None:
        self.size, self.latency_s = size, latency_s

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.latency_s)
        generator = torch.Generator().manual_seed(index)
        return torch.randn(32, generator=generator), index % 4


class TinyClassifier(pl.LightningModule):
    """A small MLP: the step is cheap, so the loader sets the pace."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """Cross-entropy on one batch."""
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """Plain SGD."""
        return torch.optim.SGD(self.parameters(), lr=0.1)


def train(steps: int, report_dir: Path | None, window: int = 10) -> MaxThroughputCallback:
    """Fit ``TinyClassifier`` for ``steps`` steps with the callback; return the callback."""
    callback = MaxThroughputCallback(
        warmup_steps=3, window_steps=window, tune_loader=False, report_dir=report_dir
    )
    trainer = pl.Trainer(
        max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
    )  # fmt: skip
    loader = DataLoader(SlowStorageDataset(), batch_size=16, shuffle=True)  # Lightning defaults
    trainer.fit(TinyClassifier(), loader)
    return callback


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--report-dir", type=Path, default=None)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (for tests)")
    args = parser.parse_args()
    pl.seed_everything(0, verbose=False)
    callback = train(140 if args.smoke else args.steps, args.report_dir, 6 if args.smoke else 10)
    print(callback.tuning)


if __name__ == "__main__":
    main()
