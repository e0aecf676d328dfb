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


class ConvModel(pl.LightningModule):
    """A small conv net on 3-channel images (Adam: a fused step exists on the CPU).

    Args:
        nan_under_autocast: Losses turn NaN when the step runs under autocast (a model whose
            numbers break in low precision) ...
        nan_from_step: ... from this training step on.
        slow_channels_last: Each step sleeps 60 ms while the weights are channels_last (a
            layout slower here, whatever the machine's load).
        slow_fp32: Each step sleeps 150 ms outside autocast (mixed precision pays for sure: on
            an AVX2-only CPU beside two other test processes, a bf16 step of 8x8 images took
            ~90 ms against ~25 ms in fp32, more than a 60 ms sleep made up for).
        step_sleep_s: Every step sleeps this long: the step, not the loader, sets the pace
            even on a loaded machine (a data-bound reading would send the loop to the loader).
    """

    def __init__(
        self,
        nan_under_autocast: bool = False,
        nan_from_step: int = 0,
        slow_channels_last: bool = False,
        slow_fp32: bool = False,
        step_sleep_s: float = 0.0,
    ) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10),
        )  # fmt: skip
        self.nan_under_autocast, self.nan_from_step = nan_under_autocast, nan_from_step
        self.slow_channels_last, self.slow_fp32 = slow_channels_last, slow_fp32
        self.step_sleep_s = step_sleep_s
        self.losses: list[float] = []
        self.input_channels_last: list[bool] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        import time

        x, y = batch
        self.input_channels_last.append(
            x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
        )
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        autocast = torch.is_autocast_enabled("cpu")
        if self.nan_under_autocast and autocast and self.global_step >= self.nan_from_step:
            loss = loss * float("nan")
        slow_layout = self.slow_channels_last and not self.net[0].weight.is_contiguous()
        if slow_layout:
            time.sleep(0.06)  # far beyond what another job's load moves a step
        if self.slow_fp32 and not autocast:
            time.sleep(0.15)
        time.sleep(self.step_sleep_s)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def image_loader(
    size: int = 2048, batch_size: int = 32, side: int = 8
) -> torch.utils.data.DataLoader[Any]:
    """Random 3 x ``side`` x ``side`` images with 10 classes, in memory.

    Small images by default: the planted sleeps (60 ms) must outweigh what the math costs on
    any CPU. On one without native bf16 (AVX2 only), a ``ConvModel`` step under bf16 autocast
    took 164 ms at 32x32 against 33 ms in fp32, so ``slow_fp32`` did not make bf16 pay there;
    at 8x8 it is 16 ms against 6 ms.
    """
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(size, 3, side, side, generator=generator)
    labels = torch.randint(0, 10, (size,), generator=generator)
    data = torch.utils.data.TensorDataset(images, labels)
    return torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=True)
