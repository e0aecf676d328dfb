"""``MaxThroughputCallback`` from a LightningCLI config file: the script itself stays as it is.

The callback goes in the config's ``trainer.callbacks`` (``examples/callback_cli.yaml``), its
arguments under ``init_args``. LightningCLI checks them when it parses: an unknown knob name in
``allow`` or capture mode fails before the fit starts, and so does a value the callback refuses.

Usage: ``python examples/callback_cli.py fit --config examples/callback_cli.yaml``
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.cli import LightningCLI
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from callback_train import SlowStorageDataset, TinyClassifier


class SlowData(pl.LightningDataModule):
    """Samples read with a few milliseconds of latency each, loaded with Lightning's defaults."""

    def __init__(self, batch_size: int = 16) -> None:
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader[Any]:
        """No workers, no prefetch, no pinning: where the callback starts from."""
        return DataLoader(SlowStorageDataset(), batch_size=self.batch_size, shuffle=True)


def main() -> None:
    LightningCLI(TinyClassifier, SlowData)


if __name__ == "__main__":
    main()
