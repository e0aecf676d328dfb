"""Tune a DataLoader alone and print the plan: ``python examples/tune_loader.py``.

The loader decodes small JPEGs held in memory (generated here, no download), crops and flips
them: the kind of per-sample CPU work that decides how many workers a GPU needs. The example
measures that pipeline with ``tune_dataloader`` (within the probe's CPU budget unless
``--max-workers`` is given) and prints the ``LoaderPlan``: the settings, every candidate measured,
the budget and why. With ``--consumption-rate`` (samples/s your training step takes), the plan
also says whether the loader outruns the device by 25 %, and what to do if it cannot.

To use a plan in training: ``apply_loader_plan(trainer, plan)`` before ``trainer.fit(...)``.
"""

from __future__ import annotations

import argparse
import io
import json
import sys

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from lightning_maxtp import tune_dataloader


class InMemoryJpegs(Dataset[tuple[torch.Tensor, int]]):
    """``count`` JPEGs encoded once in memory; each sample is decoded, cropped and flipped."""

    def __init__(self, count: int, side: int = 160, crop: int = 112) -> None:
        rng = np.random.default_rng(0)
        self.crop, self.images = crop, []
        for _ in range(count):
            pixels = rng.normal(128, 40, (side, side, 3)).clip(0, 255).astype(np.uint8)
            buffer = io.BytesIO()
            Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
            self.images.append(buffer.getvalue())

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        with Image.open(io.BytesIO(self.images[index])) as image:
            rgb = image.convert("RGB")
        x, y = torch.randint(0, rgb.width - self.crop + 1, (2,)).tolist()
        patch = rgb.crop((x, y, x + self.crop, y + self.crop))
        if torch.rand(()) < 0.5:
            patch = patch.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        pixels = torch.from_numpy(np.asarray(patch, dtype=np.float32) / 255.0)
        return pixels.permute(2, 0, 1).contiguous(), index % 10


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=256, help="JPEGs to generate (256)")
    parser.add_argument("--batch-size", type=int, default=16, help="batch size (16)")
    parser.add_argument("--time-budget", type=float, default=6.0, help="tuning seconds (6)")
    parser.add_argument("--max-workers", type=int, default=None, help="default: the probe's")
    parser.add_argument("--consumption-rate", type=float, default=None, help="samples/s")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    args = parser.parse_args()
    if args.images < args.batch_size or args.batch_size < 1:
        parser.error(f"need --images >= --batch-size >= 1, got {args.images}, {args.batch_size}")

    loader = DataLoader(InMemoryJpegs(args.images), batch_size=args.batch_size, shuffle=True)
    try:
        plan = tune_dataloader(
            loader,
            consumption_rate=args.consumption_rate,
            time_budget_s=args.time_budget,
            max_workers=args.max_workers,
        )
    except ValueError as exc:
        parser.error(str(exc))
    print(json.dumps(plan.to_dict(), indent=1) if args.json else plan)
    return 0


if __name__ == "__main__":
    sys.exit(main())
