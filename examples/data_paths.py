"""When the CPUs are the limit: the same fit with the usual CPU pipeline, then a faster data path.

A small conv net trains on JPEGs this script writes (photo-like, ``--size`` px), with
``MaxThroughputCallback()`` on. "before" is the usual pipeline: decode, ``RandomResizedCrop``,
flip, ``ToTensor``, ``Normalize`` in the loader's workers. "after" is one of the three paths of
``lightning_maxtp.data``:

- ``uint8``: the pipeline ends in ``ToUint8()``; ``DeviceTransform()`` normalizes after the
  batch reaches the device (a quarter of the bytes cross from the workers).
- ``encoded``: ``EncodedImages`` + ``collate_encoded``: workers only read files;
  ``DeviceTransform(decode=True, crop=...)`` decodes and crops on the device (nvJPEG on CUDA;
  on a CPU device the same call decodes on the CPU, so this path pays only with a GPU).
- ``pre-encoded``: ``pre_encode`` once (LitData), then ``open_pre_encoded`` with the crop and
  flip applied after reading; no decode in the epochs after.

It prints each fit's samples/s and wall time, and what the callback's diagnosis says about the
data path. Usage: ``python examples/data_paths.py [--after uint8|encoded|pre-encoded|all]
[--steps N] [--images N]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms as T
from torchvision.transforms import v2

from lightning_maxtp import MaxThroughputCallback
from lightning_maxtp.data import (
    DeviceTransform,
    EncodedImages,
    ToUint8,
    collate_encoded,
    open_pre_encoded,
    pre_encode,
)

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def write_jpegs(root: Path, count: int, size: int) -> list[tuple[Path, int]]:
    """``count`` photo-like JPEGs (waves plus noise) in 10 classes: ``(path, label)`` pairs."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    pairs = []
    for i in range(count):
        label = i % 10
        angle = np.pi * label / 10
        waves = np.sin(2 * np.pi * rng.uniform(3, 9) * (np.cos(angle) * xx + np.sin(angle) * yy))
        base = 128 + 60 * waves[..., None] * np.array([1.0, 0.6 + label / 25, 0.3])
        pixels = np.clip(base + rng.normal(0, 18, (size, size, 3)), 0, 255).astype(np.uint8)
        path = root / f"{i:05d}.jpg"
        Image.fromarray(pixels).save(path, quality=90)
        pairs.append((path, label))
    return pairs


class Files(Dataset[tuple[Any, int]]):
    """The user's dataset: ``(transform(PIL image), label)`` per file."""

    def __init__(self, samples: list[tuple[Path, int]], transform: Any) -> None:
        # `samples` as ImageFolder names it: the diagnosis then times the files' decode too
        self.samples, self.transform = samples, transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path, label = self.samples[index]
        with Image.open(path) as image:
            return self.transform(image.convert("RGB")), label


class ConvNet(pl.LightningModule):
    """The user's model, unchanged by every data path."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
        )  # fmt: skip

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """Cross-entropy on normalized float images, whichever path made them."""
        x, y = batch
        assert x.dtype == torch.float32, x.dtype
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """SGD."""
        return torch.optim.SGD(self.parameters(), lr=0.05)


def loader_for(path: str, pairs: list[tuple[Path, int]], work: Path, args: Any) -> tuple:
    """The DataLoader and the callbacks each path needs (what the user changes)."""
    geometry = [T.RandomResizedCrop(args.crop), T.RandomHorizontalFlip()]
    common = {"batch_size": args.batch_size, "num_workers": 2}
    if path == "before":
        cpu = T.Compose([*geometry, T.ToTensor(), T.Normalize(MEAN, STD)])
        return DataLoader(Files(pairs, cpu), shuffle=True, **common), []
    if path == "uint8":
        data = Files(pairs, T.Compose([*geometry, ToUint8()]))
        return DataLoader(data, shuffle=True, **common), [DeviceTransform(MEAN, STD)]
    if path == "encoded":
        loader = DataLoader(EncodedImages(pairs), shuffle=True, collate_fn=collate_encoded,
                            **common)  # fmt: skip
        return loader, [DeviceTransform(MEAN, STD, decode=True, crop=args.crop, flip=True)]
    started = time.perf_counter()
    print(pre_encode(pairs, work / "pre-encoded", max_side=args.size, num_workers=2))
    print(f"  (a one-off {time.perf_counter() - started:.1f} s; every later fit reads it)")
    crops = v2.Compose([v2.RandomResizedCrop(args.crop), v2.RandomHorizontalFlip()])
    data = open_pre_encoded(work / "pre-encoded", crops, shuffle=True)
    return DataLoader(data, **common), [DeviceTransform(MEAN, STD)]


def fit(path: str, pairs: list[tuple[Path, int]], work: Path, args: Any) -> float:
    """One fit with the callback; prints its rate and the data-path advice; returns samples/s."""
    loader, extra = loader_for(path, pairs, work, args)
    callback = MaxThroughputCallback(warmup_steps=3, window_steps=10, max_workers=2)
    trainer = pl.Trainer(
        max_steps=args.steps, max_epochs=-1, accelerator="cpu", logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[callback, *extra],
    )  # fmt: skip
    pl.seed_everything(0, verbose=False)
    started = time.perf_counter()
    trainer.fit(ConvNet(), train_dataloaders=loader)
    wall = time.perf_counter() - started
    report = callback.report
    assert report is not None
    print(f"{path:>11}: {report.samples_per_s:7.1f} samples/s in force, {args.steps} steps in "
          f"{wall:.1f} s, bottleneck now: {report.bottleneck}")  # fmt: skip
    advice = [r for d in report.diagnoses for r in d.recommendations if r.knob == "data path"]
    for rec in advice[:1]:
        print(f"             the diagnosis names: {rec.proposed} ({rec.reason})")
    return report.samples_per_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--after", default="uint8", choices=["uint8", "encoded", "pre-encoded",
                                                             "all"])  # fmt: skip
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--images", type=int, default=600)
    parser.add_argument("--size", type=int, default=192, help="JPEG side in px (192)")
    parser.add_argument("--crop", type=int, default=64, help="training crop in px (64)")
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    after = ["uint8", "encoded", "pre-encoded"] if args.after == "all" else [args.after]
    with tempfile.TemporaryDirectory(prefix="maxtp-data-paths-") as tmp:
        work = Path(tmp)
        pairs = write_jpegs(work / "jpeg", args.images, args.size)
        rates = {path: fit(path, pairs, work, args) for path in ["before", *after]}
    for path in after:
        print(f"{path} vs before: {rates[path] / rates['before']:.2f}x samples/s")


if __name__ == "__main__":
    main()
