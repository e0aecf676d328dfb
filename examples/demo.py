"""The demo behind ``bash examples/demo.sh``: one line added to a Lightning fit makes it faster.

It generates a small JPEG classification data set on local disk (no download) and reads it as if
it sat on network storage (each file read waits ``--read-latency-ms`` first, 5 ms by default,
like NFS or an object store; 0 reads the local disk as it is). It then trains a MobileNetV3 the
way Lightning's defaults leave it (batch 32, images read and decoded in the main process) with
``MaxThroughputCallback(report_dir=...)`` added, every tuning setting at its default (``--smoke``
shortens the windows to fit its 24 steps). The callback measures a baseline, names the
bottleneck, changes one safe knob at a time on real training steps (kept only when measurably
faster, else reverted) and prints its few lines: the plan, the baseline, one line per trial, the
result and its cost, what holds the run now, and where the report is. ``--explain`` adds the
machine probe, the data set-up, the settings in force and the diagnosis.

On a small CPU-only machine the model's arithmetic and the JPEG decoding share the same cores, so
with local files there is little a loader setting can win (the callback then measures that and
keeps the defaults); waiting reads are what workers hide on any machine, and what a GPU host's
decode-bound loader looks like at scale.

Usage: ``python examples/demo.py [--steps N] [--images N] [--read-latency-ms MS] [--explain]
[--smoke]``
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the demo reuses the benchmark workloads from this checkout


def explain(callback: Any, fit_s: float) -> None:
    """``--explain``: the settings in force and the diagnosis, beyond the callback's lines."""
    tuning, report = callback.tuning, callback.report
    print(f"fit {fit_s:.0f} s, {tuning.tuning_s:.0f} s of it tuning on real steps")
    print(f"settings now: {', '.join(f'{k}={v}' for k, v in tuning.settings.items())}")
    print(f"stopped: {tuning.stop_reason}")
    for diagnosis in report.diagnoses[:1]:
        print(f"diagnosis: {diagnosis.summary}")


def main() -> int:
    parser = argparse.ArgumentParser(description="lightning_maxtp demo")
    parser.add_argument("--steps", type=int, default=120, help="training steps (tuning included)")
    parser.add_argument("--images", type=int, default=1024, help="JPEG images to generate")
    parser.add_argument("--data-dir", type=Path, default=ROOT / ".maxtp" / "demo-data")
    parser.add_argument("--model", default="mobilenet_v3_small", help="a torchvision model name")
    parser.add_argument(
        "--read-latency-ms", type=float, default=5.0,
        help="wait per file read, as on network storage (0: the local disk as it is)",
    )  # fmt: skip
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (seconds; for tests)")
    parser.add_argument(
        "--explain", action="store_true",
        help="also show the machine probe, the data set-up and the settings and diagnosis after",
    )  # fmt: skip
    args = parser.parse_args()
    if args.steps < 1 or args.images < 32:
        parser.error(f"need --steps >= 1 and --images >= 32, got {args.steps} and {args.images}")
    if not args.read_latency_ms >= 0:
        parser.error(f"--read-latency-ms must be >= 0, got {args.read_latency_ms}; e.g. 5 or 0")

    if args.explain:
        from lightning_maxtp import inspect_resources

        where = args.data_dir.parent if args.data_dir.parent.exists() else "."
        print(f"the machine (maxtp inspect):\n{inspect_resources(where)}\n")

    import lightning.pytorch as pl

    # The demo shows what the callback prints: Lightning's banners and warnings say nothing new.
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", module="lightning")
    warnings.filterwarnings("ignore", module="torch.utils.data")

    from benchmarks.workloads.jpeg import (
        ImageClassifier,
        JpegFolderDataset,
        JpegSpec,
        LoaderSettings,
        generate_jpeg_dataset,
        make_loader,
    )
    from lightning_maxtp import MaxThroughputCallback

    pl.seed_everything(0, verbose=False)
    crop = 64
    steps = 24 if args.smoke else args.steps
    spec = JpegSpec(images=64 if args.smoke else args.images, image_size=4 * crop)
    t0 = time.perf_counter()
    root = generate_jpeg_dataset(args.data_dir / spec.slug(), spec)
    if args.explain:
        print(f"data: {spec.images} JPEGs of {spec.image_size}px in {root}, ready in "
              f"{time.perf_counter() - t0:.1f} s (generated once, then reused)")  # fmt: skip
    latency = args.read_latency_ms / 1000
    dataset = JpegFolderDataset(root, crop=crop, read_latency_s=latency)

    report_dir = args.data_dir.parent / "demo-report"
    # --smoke shortens the windows to fit its 24 steps; the full demo runs the defaults.
    shorter = (
        {"warmup_steps": 2, "window_steps": 4, "loader_time_budget_s": 3} if args.smoke else {}
    )
    callback = MaxThroughputCallback(report_dir=report_dir, **shorter)  # type: ignore[arg-type]
    reads = f"{args.read_latency_ms:g} ms reads" if latency else "local reads"
    print(f"demo: {args.model} on {spec.images} JPEGs ({reads}), {steps} steps, "
          "defaults + MaxThroughputCallback()")  # fmt: skip
    trainer = pl.Trainer(
        max_steps=steps, logger=False, enable_checkpointing=False, enable_model_summary=False,
        enable_progress_bar=False, callbacks=[callback],
    )  # fmt: skip
    loader = make_loader(dataset, LoaderSettings(batch_size=32), steps=steps)
    t0 = time.perf_counter()
    trainer.fit(ImageClassifier(args.model, num_classes=spec.classes), train_dataloaders=loader)
    if args.explain:
        explain(callback, time.perf_counter() - t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
