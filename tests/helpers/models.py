"""Small LightningModules the callback tests train."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch


class IdModel(pl.LightningModule):
    """Records the sample ids it trains and validates on."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(16, 1)
        self.ids: list[int] = []
        self.val_batches = 0

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, idx = batch
        self.ids += idx.tolist()
        return self.layer(x).pow(2).mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.val_batches += 1

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class MatmulModel(pl.LightningModule):
    """Compute-bound on the CPU: a wide MLP whose step keeps torch's intra-op threads busy."""

    def __init__(self, features: int = 32, width: int = 1024) -> None:
        super().__init__()
        # Small inputs, wide layers: the batches cost the loader next to nothing.
        layers = [
            torch.nn.Linear(features, width),
            *(torch.nn.Linear(width, width) for _ in range(3)),
        ]
        self.net = torch.nn.Sequential(*layers)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-4)
