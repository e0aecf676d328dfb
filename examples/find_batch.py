"""Find the fastest batch for a model, print the plan, then train with it.

A small MLP classifier on random in-memory data (no download). ``find_batch_size`` runs from a
callback's ``on_fit_start`` (where ``MaxThroughputCallback`` will call it): it doubles the batch
until out of memory (on a GPU) or the cap (``--max-batch-size``, on a CPU where nothing raises),
times each size with the real training step, picks the smallest batch within 3 % of the best
throughput and prints every trial. ``plan.apply(trainer)`` then sets the batch size the loader
reads and the gradient accumulation, and the fit continues with them.

``--global-batch keep`` (the default) keeps the global batch of ``--batch-size`` samples and
reaches the fastest micro-batch by accumulation; ``--global-batch grow`` trains at the fastest
batch and scales the learning rate (linear for SGD) with a warm-up.

Usage: ``python examples/find_batch.py [--batch-size N] [--global-batch keep|grow] [--smoke]``
"""

from __future__ import annotations

import argparse
import logging
import warnings
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from lightning_maxtp import BatchSizePlan, find_batch_size


class Classifier(pl.LightningModule):
    """An MLP whose ``train_dataloader`` reads ``self.hparams.batch_size``."""

    def __init__(self, batch_size: int, width: int, samples: int, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
            nn.Linear(width, 10),
        )  # fmt: skip
        self.batches_seen: list[int] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """Cross-entropy of the MLP on one batch."""
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """Record the size of each batch the fit trains on (the search's steps skip this hook)."""
        self.batches_seen.append(batch[0].shape[0])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """SGD with momentum: the linear learning-rate rule applies with ``--global-batch grow``."""
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)

    def train_dataloader(self) -> DataLoader[Any]:
        """Random data; the batch size comes from ``hparams``, which ``plan.apply`` sets."""
        gen = torch.Generator().manual_seed(0)
        n = self.hparams.samples
        data = TensorDataset(torch.randn(n, 64, generator=gen), torch.randint(0, 10, (n,)))
        return DataLoader(data, batch_size=self.hparams.batch_size, shuffle=True, drop_last=True)


class FindBatch(pl.Callback):
    """Search in ``on_fit_start`` (model on its device, optimizer built), then apply."""

    def __init__(self, **search: Any) -> None:
        self.search = search
        self.plan: BatchSizePlan | None = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Search, print the plan, apply it."""
        self.plan = find_batch_size(pl_module, trainer=trainer, **self.search)
        print(self.plan, flush=True)
        self.plan.apply(trainer)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=256, help="batch before the search")
    parser.add_argument("--global-batch", choices=("keep", "grow"), default="keep")
    parser.add_argument("--max-batch-size", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps after the search")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (seconds; for tests)")
    args = parser.parse_args()
    if args.batch_size < 1 or args.steps < 1:
        parser.error(
            f"need --batch-size >= 1 and --steps >= 1, got {args.batch_size}, {args.steps}"
        )
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", module="lightning")
    if args.smoke:
        width, cap, steps, budget = 64, 64, 2, 5.0
    else:
        width, cap, steps, budget = 512, args.max_batch_size, args.steps, 20.0
    pl.seed_everything(0, verbose=False)
    module = Classifier(args.batch_size, width, samples=max(4 * cap, 4 * args.batch_size))
    callback = FindBatch(max_batch_size=cap, global_batch=args.global_batch, time_budget_s=budget)
    trainer = pl.Trainer(
        max_steps=steps, devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
    )  # fmt: skip
    trainer.fit(module)
    plan = callback.plan
    assert plan is not None
    sizes = ", ".join(str(b) for b in sorted(set(module.batches_seen)))
    print(
        f"\ntrained {trainer.global_step} optimizer steps with batch {sizes} x accumulate "
        f"{trainer.accumulate_grad_batches} (plan: {plan.batch_size} x "
        f"{plan.accumulate_grad_batches}); lr {trainer.optimizers[0].param_groups[0]['lr']:g}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
