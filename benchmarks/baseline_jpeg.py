"""Baseline: JPEG training with Lightning's defaults vs. settings an expert tunes by hand.

What it measures: training samples/s of a torchvision model on a local JPEG data set (file read,
JPEG decode, RandomResizedCrop, flip, normalize, then forward/backward/step), with two configs
timed A/B/A/B in one run:

* ``lightning-defaults``: what a user gets without tuning - batch 32, ``num_workers=0`` (decode
  in the training process), fp32, no pinned memory.
* ``hand-tuned``: what an expert would set on this machine, sized from ``inspect_resources()``:
  the probe's DataLoader worker budget per device process, persistent workers, prefetch factor 4,
  and on a GPU also pinned memory, ``bf16-mixed``, channels_last and a larger batch.

Why: this is the gap lightning_maxtp has to close automatically; later benchmarks compare the
plugin against both ends. Run from the repository root::

    python -m benchmarks.baseline_jpeg            # default sizes, a few minutes on 2 CPU cores
    python -m benchmarks.baseline_jpeg --smoke    # tiny sizes, seconds (checks the plumbing)
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.runner import Config, Measurement, report, run_ab, time_fit
from benchmarks.workloads.jpeg import (
    ImageClassifier,
    JpegFolderDataset,
    JpegSpec,
    LoaderSettings,
    default_data_dir,
    generate_jpeg_dataset,
    make_loader,
)
from lightning_maxtp.resources import inspect_resources

log = logging.getLogger(__name__)

SMOKE = {
    "images": 64,
    "image_size": 64,
    "crop": 32,
    "classes": 4,
    "warmup_steps": 1,
    "steps": 2,
    "rounds": 2,
}
"""Sizes ``--smoke`` uses (options given explicitly still win)."""
GPU_BATCH_FACTOR = 4
"""On a GPU the hand-tuned batch is this many times the default batch (unless given)."""


@dataclass(frozen=True)
class RunSettings:
    """Everything a config sets: DataLoader knobs, Trainer precision and memory format."""

    loader: LoaderSettings = field(default_factory=LoaderSettings)
    precision: str = "32-true"
    channels_last: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Flat JSON-safe view."""
        return {
            **self.loader.to_dict(),
            "precision": self.precision,
            "channels_last": self.channels_last,
        }


def default_settings(batch_size: int = 32) -> RunSettings:
    """What Lightning + a plain DataLoader give without tuning."""
    return RunSettings(LoaderSettings(batch_size=batch_size))


def tuned_settings(*, gpu: bool, workers: int, batch_size: int) -> RunSettings:
    """What an expert sets on a machine with ``workers`` CPU workers per device process.

    Args:
        gpu: Whether training runs on a CUDA GPU (enables pinned memory, bf16 and NHWC).
        workers: DataLoader worker budget (``Resources.advice.cpu_workers_per_process``).
        batch_size: Batch size to use.

    Returns:
        The settings.
    """
    loader = LoaderSettings(
        batch_size=batch_size,
        num_workers=workers,
        prefetch_factor=4 if workers > 0 else None,
        pin_memory=gpu,
        persistent_workers=workers > 0,
    )
    return RunSettings(loader, "bf16-mixed" if gpu else "32-true", channels_last=gpu)


def run_once(
    dataset: JpegFolderDataset, settings: RunSettings, args: argparse.Namespace
) -> Measurement:
    """One timed fit of a freshly initialised model with ``settings``."""
    module = ImageClassifier(
        args.model,
        len(dataset.classes),
        optimizer=args.optimizer,
        lr=args.lr,
        channels_last=settings.channels_last,
    )
    steps = args.warmup_steps + args.steps + settings.loader.queue_depth  # loading to the end
    loader = make_loader(dataset, settings.loader, steps=steps)
    return time_fit(
        module,
        loader,
        warmup_steps=args.warmup_steps,
        steps=args.steps,
        precision=settings.precision,
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.baseline_jpeg",
        description="Lightning defaults vs. hand-tuned settings on a generated JPEG data set.",
    )
    p.add_argument("--images", type=int, default=1024, help="images to generate (default 1024)")
    p.add_argument("--image-size", type=int, default=160, help="image side in px (default 160)")
    p.add_argument("--crop", type=int, default=128, help="RandomResizedCrop side (default 128)")
    p.add_argument("--classes", type=int, default=10, help="classes (default 10)")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality (default 90)")
    p.add_argument("--seed", type=int, default=0, help="data set seed (default 0)")
    p.add_argument("--model", default="resnet18", help="torchvision model (default resnet18)")
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adamw", "adam"])
    p.add_argument("--lr", type=float, default=0.1, help="learning rate (default 0.1)")
    p.add_argument("--batch-size", type=int, default=32, help="default config's batch (32)")
    p.add_argument(
        "--tuned-batch-size",
        type=int,
        default=None,
        help=f"hand-tuned batch (default: --batch-size, x{GPU_BATCH_FACTOR} on a GPU)",
    )
    p.add_argument("--warmup-steps", type=int, default=3, help="untimed steps per fit (3)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per fit (20)")
    p.add_argument("--rounds", type=int, default=4, help="A/B rounds (4)")
    p.add_argument("--data-dir", type=Path, default=None, help="default: ~/.cache/lightning_maxtp")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON line here")
    p.add_argument("--table-out", type=Path, default=None, help="also write the table here")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: a run of seconds")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
    logging.getLogger("benchmarks").addHandler(handler)
    logging.getLogger("benchmarks").setLevel(logging.INFO)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=r".*LeafSpec")

    import torch

    resources = inspect_resources()
    gpu = bool(resources.gpus) and torch.cuda.is_available()
    spec = JpegSpec(args.images, args.image_size, args.classes, args.quality, args.seed)
    root = generate_jpeg_dataset(args.data_dir or default_data_dir(spec), spec)
    dataset = JpegFolderDataset(root, crop=args.crop)
    tuned_batch = args.tuned_batch_size or args.batch_size * (GPU_BATCH_FACTOR if gpu else 1)
    workers = resources.advice.cpu_workers_per_process
    settings = {
        "lightning-defaults": default_settings(args.batch_size),
        "hand-tuned": tuned_settings(gpu=gpu, workers=workers, batch_size=tuned_batch),
    }
    configs = [
        Config(name, partial(run_once, dataset, s, args), s.to_dict())
        for name, s in settings.items()
    ]
    params = {
        **spec.to_dict(),
        "crop": args.crop,
        "model": args.model,
        "optimizer": args.optimizer,
        "lr": args.lr,
        "warmup_steps": args.warmup_steps,
        "steps": args.steps,
        "device": torch.cuda.get_device_name(0) if gpu else "cpu",
        "torch_threads": torch.get_num_threads(),
        "smoke": args.smoke,
    }
    result = run_ab(
        "baseline_jpeg",
        configs,
        rounds=args.rounds,
        params=params,
        machine=resources.to_dict(),
    )
    report(result, json_out=args.out, table_out=args.table_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
