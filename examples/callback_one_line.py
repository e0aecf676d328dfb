"""Tuning an existing project with one line: add ``MaxThroughputCallback()`` to the Trainer.

Below is an ordinary Lightning project (a LightningModule and a LightningDataModule whose loader
uses Lightning's defaults). Run it as is, then with ``--maxtp``, which adds exactly one line:

    trainer = pl.Trainer(..., callbacks=[MaxThroughputCallback()])

Nothing else changes: same data, same samples in the same order, same model math.

Usage: ``python examples/callback_one_line.py [--maxtp] [--steps N]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from callback_train import SlowStorageDataset, TinyClassifier

from lightning_maxtp import MaxThroughputCallback


class ExistingData(pl.LightningDataModule):
    """The user's data module, untouched."""

    def train_dataloader(self) -> DataLoader[Any]:
        """Lightning's defaults: no workers, no prefetch, no pinning."""
        return DataLoader(SlowStorageDataset(), batch_size=16, shuffle=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--maxtp", action="store_true", help="add the one line")
    parser.add_argument("--steps", type=int, default=120)
    args = parser.parse_args()
    pl.seed_everything(0, verbose=False)
    callbacks: list[pl.Callback] = []
    if args.maxtp:
        callbacks.append(MaxThroughputCallback(warmup_steps=3, window_steps=8))  # the one line
    trainer = pl.Trainer(
        max_steps=args.steps, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
    )  # fmt: skip
    start = time.perf_counter()
    trainer.fit(TinyClassifier(), datamodule=ExistingData())
    seconds = time.perf_counter() - start
    label = "with" if args.maxtp else "without"
    rate = args.steps * 16 / seconds
    print(f"{label} MaxThroughputCallback: {args.steps} steps in {seconds:.1f} s ({rate:.0f} "
          "samples/s, tuning included)")  # fmt: skip


if __name__ == "__main__":
    main()
