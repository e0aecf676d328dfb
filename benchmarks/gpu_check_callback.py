"""GPU check for ``MaxThroughputCallback`` on the JPEG ResNet-50 workload.

On one GPU (reference, one H200 with 16 CPUs, measured by hand: Lightning defaults 201 img/s,
expert hand-tuned 2,493, machine ceiling ~5,000): Lightning defaults (batch 32, 0 workers,
fp32) vs. the same with the callback (``allow="safe"``: loader knobs and cudnn.benchmark) vs.
the callback with ``allow="all"`` from the same defaults (precision, channels_last, TF32,
compile, fused optimizer, the batch grown by ``find_batch_size``) vs. the expert's hand
configuration (batch 256, CPUs - 1 workers, prefetch 4, pinned, persistent, bf16-mixed,
channels_last; ``--compact``) or the best loader of a short sweep (the other profiles); then
what each loop kept, its whole-fit wall-clock and why it stopped.

Rows (printed as measured): each run's rate; the targets ``allow="all"`` >= 4,500 img/s and
``allow="safe"`` >= 2,000 (reported); **the better callback run >= 0.9x the expert** (fails
below). Without a GPU (or with ``--smoke``) the plumbing runs on the CPU with tiny sizes and
the GPU rows are reported as skipped.

Usage: ``PYTHONPATH=. python benchmarks/gpu_check_callback.py [--smoke] [--compact | --quick |
--allow-all] [--out FILE]`` (``--compact``: 1,024 images, no sweep, four fits, the run inside
``gpu_check_all``'s compact profile; ``--quick``: workers 0/8/15, no ``allow="all"``;
``--allow-all``: the quick sizes with a one-point sweep and the ``allow="all"`` run.)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import targets  # noqa: E402

GPU_ARGS = [
    "--device", "cuda", "--model", "resnet50", "--images", "4096", "--image-size", "288",
    "--crop", "224", "--steps", "30", "--warmup", "100", "--warmup-callback", "100",
    "--window", "12", "--max-trials", "4", "--loader-budget", "15", "--rounds", "1",
    "--sweep-workers", "0,4,8,15", "--read-latency-ms", "0", "--also-allow", "all",
]  # fmt: skip
QUICK_ARGS = [
    "--device", "cuda", "--model", "resnet50", "--images", "1024", "--image-size", "288",
    "--crop", "224", "--steps", "20", "--warmup", "100", "--warmup-callback", "100",
    "--window", "12", "--max-trials", "4", "--loader-budget", "10", "--rounds", "1",
    "--sweep-workers", "0,8,15", "--read-latency-ms", "0",
]  # fmt: skip
"""The GPU run inside ``gpu_check_all`` (its 8-minute slot): 1,024 images, 20 timed steps, a
3-point sweep."""
ALLOW_ARGS = [
    *QUICK_ARGS[: QUICK_ARGS.index("--sweep-workers")], "--sweep-workers", "15",
    "--read-latency-ms", "0", "--also-allow", "all",
]  # fmt: skip
"""``--allow-all``: the quick sizes, the expert's 15 workers as the sweep, and ``allow="all"``."""
COMPACT_ARGS = [
    "--device", "cuda", "--model", "resnet50", "--images", "1024", "--image-size", "288",
    "--crop", "224", "--steps", "20", "--warmup", "40", "--warmup-callback", "100",
    "--warmup-all", "160", "--window", "12", "--max-trials", "4", "--max-trials-all", "8",
    "--loader-budget", "10", "--rounds", "1", "--sweep-workers", "none", "--read-latency-ms", "0",
    "--also-allow", "all", "--expert",
]  # fmt: skip
"""``--compact`` (``gpu_check_all``'s compact profile): no sweep; Lightning's defaults, the
callback with ``allow="safe"`` and with ``allow="all"`` from them, and the expert's hand
configuration, one fit each."""
TARGETS = targets.CALLBACK
"""Steady samples/s each callback run should reach on one H200 (reported, not asserted)."""
EXPERT_SHARE = 0.9
"""The callback from defaults must reach this share of the expert's hand configuration."""


def main() -> int:
    """Run the check; print each row as measured, the table and one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a shorter GPU run")
    parser.add_argument(
        "--compact", action="store_true", help="defaults, safe, all, the expert; no sweep"
    )
    parser.add_argument("--allow-all", action="store_true",
                        help="the quick sizes plus the allow='all' run")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    import torch

    from benchmarks.callback_jpeg import main as bench
    from benchmarks.checks import check, finish

    gpu = torch.cuda.is_available() and not args.smoke
    if gpu:
        argv = (COMPACT_ARGS if args.compact else ALLOW_ARGS if args.allow_all
                else QUICK_ARGS if args.quick else GPU_ARGS)  # fmt: skip
    else:
        argv = ["--smoke", *(["--also-allow", "all", "--expert"] if args.compact else [])]
        argv += ["--also-allow", "all"] if args.allow_all and not args.compact else []
    result = bench(argv, name="gpu_check_callback")
    keys = ("allow", "kept", "batch_size", "fit_s", "trials", "stop_reason", "tuning_s",
            "finished_before_timing")  # fmt: skip
    medians = result["medians"]
    rows: list[dict[str, Any]] = []
    if not gpu:
        check(rows, "GPU", None, "resnet50 on cuda skipped (no GPU or --smoke): CPU plumbing")
    for name in ("lightning-defaults", "sweep-best", "expert"):
        if name in medians:
            check(rows, name, None, f"{medians[name]:,.0f} img/s")
    for name, target in TARGETS.items():
        if name in medians:
            rate = medians[name]
            text = f"{rate:,.0f} img/s, {rate / target:.2f}x the target"
            check(rows, f"{name} (target {target:,.0f} img/s)", None, text)
    if "expert" in medians:
        best = max((n for n in TARGETS if n in medians), key=lambda n: medians[n], default=None)
        if best is not None:
            share = medians[best] / medians["expert"]
            check(rows, f"callback from defaults >= {EXPERT_SHARE}x the expert",
                  share >= EXPERT_SHARE if gpu else None,
                  f"{best} {medians[best]:,.0f} vs expert {medians['expert']:,.0f} img/s "
                  f"({share:.2f}x)")  # fmt: skip
    for run in result["params"]["callback_runs"]:
        kept = ", ".join(f"{k} -> {v}" for k, v, _ in run["kept"]) or "nothing"
        check(rows, f"callback allow={run['allow']!r} ran", True,
              f"kept {kept}; batch {run['batch_size']}; {run['stop_reason']}; "
              f"fit {run['fit_s']:.1f} s")  # fmt: skip
    runs = [{k: run[k] for k in keys} for run in result["params"]["callback_runs"]]
    return finish("gpu_check_callback", rows, args.out, medians=medians, callback_runs=runs,
                  gpu=torch.cuda.get_device_name(0) if gpu else None)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
