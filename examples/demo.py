"""The demo behind ``bash examples/demo.sh``: one line added to a Lightning fit makes it faster.

It probes the machine, generates a small JPEG classification data set on local disk (no
download) and reads it as if it sat on network storage (each file read waits ``--read-latency-ms``
first, 5 ms by default, like NFS or an object store; 0 reads the local disk as it is). It then
trains a MobileNetV3 the way Lightning's defaults leave it (batch 32, images read and decoded in
the main process) with ``MaxThroughputCallback()`` added. The callback measures a baseline,
names the bottleneck, changes one safe loader knob at a time (kept only if >= 5 % faster, else
reverted) on real training steps, and writes a report. The demo prints what was tuned, the
before/after throughput, what still limits the run, and where the report files are.

On a small CPU-only machine the model's arithmetic and the JPEG decoding share the same cores, so
with local files there is little a loader setting can win (the callback then measures that and
keeps the defaults); waiting reads are what workers hide on any machine, and what a GPU host's
decode-bound loader looks like at scale.

Usage: ``python examples/demo.py [--steps N] [--images N] [--read-latency-ms MS] [--smoke]``
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


def show(callback: Any, fit_s: float, report_dir: Path) -> None:
    """Step 4: what was tuned, before/after throughput, what is left, where the report is."""
    tuning, report = callback.tuning, callback.report
    print(f"\n== 4. result ({fit_s:.0f} s fit, {tuning.tuning_s:.0f} s of it tuning on real steps)")
    for trial in tuning.trials:
        print(f"   tried {trial}")
    if not tuning.trials:
        print("   no knob tried: " + tuning.stop_reason)
    before, after = tuning.baseline_samples_per_s, tuning.tuned_samples_per_s
    if before and after:
        print(f"   throughput: {before:.1f} -> {after:.1f} img/s ({after / before:.2f}x defaults)")
    print(f"   settings now: {', '.join(f'{k}={v}' for k, v in tuning.settings.items())}")
    print(f"   stopped: {tuning.stop_reason}")
    print(f"   diagnosis now: {report.bottleneck}")
    if report.limit is not None:  # MFU against this machine's measured peak, or the loader's share
        print(f"     distance to the limit: {report.limit}")
    for diagnosis in report.diagnoses[:1]:
        print(f"     {diagnosis.summary}")
        for rec in diagnosis.recommendations[:3]:
            print(f"     next (for you): {rec}")
    files = ", ".join(sorted(p.name for p in report_dir.iterdir()))
    print(f"   report files: {files} in {report_dir}")


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
    args = parser.parse_args()
    if args.steps < 1 or args.images < 32:
        parser.error(f"need --steps >= 1 and --images >= 32, got {args.steps} and {args.images}")
    if not args.read_latency_ms >= 0:
        parser.error(f"--read-latency-ms must be >= 0, got {args.read_latency_ms}; e.g. 5 or 0")

    from lightning_maxtp import inspect_resources

    res = inspect_resources(args.data_dir.parent if args.data_dir.parent.exists() else ".")
    print("== 1. the machine (maxtp inspect)\n")
    print(res)

    import lightning.pytorch as pl

    # Keep the demo's output to what it measures: Lightning's banners say nothing new here.
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    progress = logging.getLogger("lightning.pytorch.utilities.rank_zero")  # the callback's lines
    progress.setLevel(logging.INFO)
    progress.addFilter(lambda record: str(record.msg).startswith("maxtp"))
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
    print(f"\n== 2. data: {spec.images} JPEGs of {spec.image_size}px in {args.data_dir}")
    t0 = time.perf_counter()
    root = generate_jpeg_dataset(args.data_dir / spec.slug(), spec)
    print(f"   ready in {time.perf_counter() - t0:.1f} s (generated once, then reused)")
    latency = args.read_latency_ms / 1000
    if latency:
        print(f"   read as from network storage: each file read waits {args.read_latency_ms:g} ms"
              " (--read-latency-ms 0 for the local disk)")  # fmt: skip
    dataset = JpegFolderDataset(root, crop=crop, read_latency_s=latency)

    report_dir = args.data_dir.parent / "demo-report"
    window = 4 if args.smoke else 12
    callback = MaxThroughputCallback(
        warmup_steps=2 if args.smoke else 4, window_steps=window, settle_steps=2,
        loader_time_budget_s=3 if args.smoke else 10, monitor_window_steps=window,
        report_dir=report_dir, verbose=True,
    )  # fmt: skip
    print(f"\n== 3. training {args.model} at {crop}px for {steps} steps, Lightning defaults "
          "(batch 32, 0 workers) + callbacks=[MaxThroughputCallback()]\n")  # fmt: skip
    trainer = pl.Trainer(
        max_steps=steps, logger=False, enable_checkpointing=False, enable_model_summary=False,
        enable_progress_bar=False, callbacks=[callback],
    )  # fmt: skip
    loader = make_loader(dataset, LoaderSettings(batch_size=32), steps=steps)
    t0 = time.perf_counter()
    trainer.fit(ImageClassifier(args.model, num_classes=spec.classes), train_dataloaders=loader)
    fit_s = time.perf_counter() - t0

    show(callback, fit_s, report_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
