"""Let the callback change the math too: ``MaxThroughputCallback(allow="all")``.

A small conv net trained on in-memory images with Lightning's defaults (fp32, batch 32). With
``allow="all"`` the loop may also try bf16 autocast, channels_last, TF32 and cudnn.benchmark
(CUDA), torch.compile, a fused optimizer step and a grown batch (the module builds its loader
from ``self.batch_size``, so ``find_batch_size`` can change it before training). Each is one
trial on real steps, kept only when it pays beyond the noise; those that round differently run
under the numerics guard, which reverts a trial and restores the model and optimizer when a
loss goes non-finite or rises out of the reference's band. ``--break-bf16`` plants a model
whose loss turns NaN under autocast, to watch the guard undo it.

On a small CPU with bf16 kernels (AVX-512) bf16 autocast usually pays (~1.2x); on one without
them it is emulated, many times slower, and not tried (``LIGHTNING_MAXTP_CPU_BF16=1`` tries it
anyway, as ``--break-bf16`` does, to show the guard). channels_last does not pay (~0.8x), and a
short fit's tuning budget leaves compile out (compiling takes tens of seconds on few cores).

Usage: ``python examples/callback_allow_all.py [--steps N] [--allow all|safe|NAMES]
[--break-bf16]`` (``NAMES``: comma-separated, e.g. ``precision,channels_last``)
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_maxtp import MaxThroughputCallback
from lightning_maxtp.knobs.precision import CPU_BF16_ENV


class ConvNet(pl.LightningModule):
    """The user's model: builds its own loader from ``self.batch_size``."""

    def __init__(self, batch_size: int = 32, break_bf16: bool = False) -> None:
        super().__init__()
        self.batch_size, self.break_bf16 = batch_size, break_bf16
        self.net = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
        )  # fmt: skip
        generator = torch.Generator().manual_seed(0)
        self.images = torch.randn(4096, 3, 32, 32, generator=generator)
        self.labels = torch.randint(0, 10, (4096,), generator=generator)

    def train_dataloader(self) -> DataLoader[Any]:
        """Lightning's defaults, at the batch size the module holds."""
        data = TensorDataset(self.images, self.labels)
        return DataLoader(data, batch_size=self.batch_size, shuffle=True)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """Cross-entropy (NaN under autocast with ``break_bf16``)."""
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        if self.break_bf16 and torch.is_autocast_enabled(x.device.type):
            loss = loss * float("nan")  # a model whose numbers break in low precision
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """Adam, which has a fused step."""
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--allow", default="all", help="all, safe, or names, comma-separated")
    parser.add_argument("--break-bf16", action="store_true")
    args = parser.parse_args()
    if args.break_bf16:  # the guard needs a bf16 trial, even where bf16 would be emulated
        os.environ.setdefault(CPU_BF16_ENV, "1")
    allow: Any = args.allow if args.allow in ("all", "safe") else tuple(args.allow.split(","))
    pl.seed_everything(0, verbose=False)
    callback = MaxThroughputCallback(allow=allow, warmup_steps=3, window_steps=10)
    trainer = pl.Trainer(
        max_steps=args.steps, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
    )  # fmt: skip
    model = ConvNet(break_bf16=args.break_bf16)
    start = time.perf_counter()
    trainer.fit(model)
    print(f"allow={args.allow}: {args.steps} steps in {time.perf_counter() - start:.1f} s, "
          f"batch size now {model.batch_size}")  # fmt: skip
    for trial in callback.trials:
        print(f"  {trial.knob}: {trial.verdict} ({trial.gain:+.0%})")


if __name__ == "__main__":
    main()
