"""The demo behind ``bash examples/demo.sh``: probe the machine, then train on local JPEGs.

It generates a small JPEG classification data set on local disk (no download), then times a short
ResNet-18 training run twice: once as Lightning's defaults leave it (batch 32, data loaded in the
main process) and once with the DataLoader sized from the probe (``cpu_workers_per_process``
workers, persistent, prefetch 4). Finally it watches the defaults run with ``BottleneckMonitor``,
which names what limits it, with evidence and the next knob, and writes a report folder.
``MaxThroughputCallback`` (not built yet) will close the loop: apply, re-measure, keep or revert.

Usage: ``python examples/demo.py [--steps N] [--images N] [--smoke]``
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings
from pathlib import Path
from typing import Any

MIN_GAIN = 1.05
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the demo reuses the benchmark workloads from this checkout


def watch(args: argparse.Namespace, dataset: Any, build_model: Any, loader_fn: Any) -> None:
    """Step 5: one fit at Lightning's defaults under ``BottleneckMonitor``; print its verdict."""
    import lightning.pytorch as pl

    from lightning_maxtp import BottleneckMonitor

    window = 3 if args.smoke else 10
    report_dir = args.data_dir.parent / "demo-report"
    print(f"\n== 5. what limits the defaults run: BottleneckMonitor over {2 * window} steps")
    monitor = BottleneckMonitor(window_steps=window, report_dir=report_dir, verbose=False)
    trainer = pl.Trainer(
        max_steps=2 * window + 1, logger=False, enable_checkpointing=False,
        enable_model_summary=False, enable_progress_bar=False, callbacks=[monitor],
    )  # fmt: skip
    trainer.fit(build_model(), train_dataloaders=loader_fn(2 * window + 1))
    print("   " + monitor.report.summary().replace("\n", "\n   "))
    files = ", ".join(sorted(p.name for p in report_dir.iterdir()))
    print(f"   report files: {files} in {report_dir}")


def main() -> int:
    parser = argparse.ArgumentParser(description="lightning_maxtp demo")
    parser.add_argument("--steps", type=int, default=30, help="timed training steps per run")
    parser.add_argument("--images", type=int, default=768, help="JPEG images to generate")
    parser.add_argument("--data-dir", type=Path, default=ROOT / ".maxtp" / "demo-data")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (seconds; for tests)")
    args = parser.parse_args()
    if args.steps < 1 or args.images < 32:
        parser.error(f"need --steps >= 1 and --images >= 32, got {args.steps} and {args.images}")

    from lightning_maxtp import inspect_resources

    res = inspect_resources(args.data_dir.parent if args.data_dir.parent.exists() else ".")
    print("== 1. the machine (maxtp inspect)\n")
    print(res)

    import lightning.pytorch as pl

    # Keep the demo's output to what it measures: Lightning's banners say nothing new here.
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", module="lightning")

    from benchmarks.timing import time_fit
    from benchmarks.workloads.jpeg import (
        ImageClassifier,
        JpegFolderDataset,
        JpegSpec,
        LoaderSettings,
        generate_jpeg_dataset,
        make_loader,
    )

    pl.seed_everything(0, verbose=False)
    model_name, crop, warmup = ("resnet18", 64, 2) if args.smoke else ("resnet18", 112, 3)
    steps = 2 if args.smoke else args.steps
    spec = JpegSpec(images=64 if args.smoke else args.images, image_size=crop + crop // 4)
    print(f"\n== 2. data: {spec.images} JPEGs of {spec.image_size}px in {args.data_dir}")
    t0 = time.perf_counter()
    root = generate_jpeg_dataset(args.data_dir / spec.slug(), spec)
    print(f"   ready in {time.perf_counter() - t0:.1f} s (generated once, then reused)")
    dataset = JpegFolderDataset(root, crop=crop)

    workers = res.advice.cpu_workers_per_process
    defaults = LoaderSettings(batch_size=32)
    configs = {
        "lightning defaults": defaults,
        f"sized from probe ({workers} workers)": LoaderSettings(
            batch_size=32,
            num_workers=workers,
            prefetch_factor=4 if workers else None,
            persistent_workers=workers > 0,
        ),
    }
    print(f"\n== 3. training {model_name} at {crop}px: {warmup} warm-up + {steps} timed steps")
    rates: dict[str, float] = {}
    for name, settings in configs.items():
        loader = make_loader(dataset, settings, steps=warmup + steps)
        module = ImageClassifier(model_name, num_classes=spec.classes)
        rate = time_fit(module, loader, warmup_steps=warmup, steps=steps, accelerator="auto")
        rates[name] = rate.samples_per_s
        print(f"   {name:<32} {rate.samples_per_s:8.1f} img/s  ({rate.seconds:.1f} s timed)")
    base, tuned = rates.values()
    ratio = tuned / base
    print(f"\n== 4. result: the probe-sized loader runs at {ratio:.2f}x Lightning's defaults")
    if ratio < MIN_GAIN:
        print(
            f"   Below the {MIN_GAIN:.2f}x a knob must earn: on this machine the loader is not what"
            " sets the pace, so a tuner that only guessed from the probe would gain nothing."
        )
    watch(
        args,
        dataset,
        lambda: ImageClassifier(model_name, num_classes=spec.classes),
        lambda n: make_loader(dataset, defaults, steps=n),
    )
    print(
        "\n   MaxThroughputCallback (coming) acts on this: it changes one safe knob at a time"
        " and keeps it only when throughput rises >= 5 %."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
