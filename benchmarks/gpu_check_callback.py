"""GPU check for ``MaxThroughputCallback`` on the JPEG ResNet-50 workload.

On one GPU (reference, one H200 with 16 CPUs: Lightning defaults 201 img/s, expert hand-tuned
2,493, machine ceiling ~5,000): Lightning defaults (batch 32, 0 workers, fp32) vs. the same
with the callback (``allow="safe"``: loader knobs and cudnn.benchmark) vs. the best loader of
a short sweep (0/4/8/15 workers x prefetch 2/4) vs. the callback with ``allow="all"`` from the
same defaults (precision, channels_last, TF32, compile, fused optimizer, the batch grown by
``find_batch_size``), one A/B/C/D round after the sweep; then what each loop kept, with its
gain, its whole-fit wall-clock and why it stopped. Targets: ``allow="all"`` >= 4,500 img/s
steady, ``allow="safe"`` >= 2,000 (``targets`` in the JSON line). Without a GPU (or with
``--smoke``) the plumbing runs on the CPU with tiny sizes and the GPU items are reported as
skipped.

Usage: ``PYTHONPATH=. python benchmarks/gpu_check_callback.py [--smoke | --quick | --allow-all]
[--out FILE]`` (``--quick``: 1,024 images, 20 timed steps, workers 0/8/15, no ``allow="all"``
run: the run inside ``gpu_check_all``; ``--allow-all``: the quick sizes with a one-point sweep
(15 workers, prefetch 2/4) and the ``allow="all"`` run, about 4 minutes.)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

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
TARGETS = {"callback-all": 4500.0, "callback": 2000.0}
"""Steady samples/s each callback run should reach on one H200 (issue [4])."""


def main() -> int:
    """Run the check; print the table, the loop's story, and one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a shorter GPU run (gpu_check_all)")
    parser.add_argument("--allow-all", action="store_true",
                        help="the quick sizes plus the allow='all' run")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    import torch

    from benchmarks.callback_jpeg import main as bench

    gpu = torch.cuda.is_available() and not args.smoke
    argv = (ALLOW_ARGS if args.allow_all else QUICK_ARGS if args.quick else GPU_ARGS) if gpu \
        else ["--smoke", *(["--also-allow", "all"] if args.allow_all else [])]  # fmt: skip
    result = bench([*argv, *(["--out", str(args.out)] if args.out else [])],
                   name="gpu_check_callback")  # fmt: skip
    keys = ("allow", "kept", "batch_size", "fit_s", "trials", "stop_reason", "tuning_s",
            "finished_before_timing")  # fmt: skip
    medians = result["medians"]
    summary = {
        "gpu": torch.cuda.get_device_name(0) if gpu else None,
        "skipped": [] if gpu else ["resnet50 on cuda (no GPU or --smoke): CPU plumbing only"],
        "medians": medians,
        "callback_runs": [{k: run[k] for k in keys} for run in result["params"]["callback_runs"]],
        "targets": {
            name: {
                "target": target,
                "samples_per_s": medians[name],
                "ok": medians[name] >= target if gpu else None,
            }
            for name, target in TARGETS.items()
            if name in medians
        },
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
