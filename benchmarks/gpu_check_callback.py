"""GPU check for ``MaxThroughputCallback`` on the JPEG ResNet-50 workload.

On one GPU (reference, one H200 with 16 CPUs: Lightning defaults 201 img/s, expert hand-tuned
2,493, machine ceiling ~5,000): Lightning defaults (batch 32, 0 workers, fp32) vs. the same
with the callback vs. the best loader of a short sweep (0/4/8/15 workers x prefetch 2/4), one
A/B/C round after the sweep, then what the loop did (every trial, kept or reverted, before and
after) and why it stopped. The callback changes only loader knobs, so the gap to the expert's
bf16 + batch 256 is the report's opt-in recommendations. Without a GPU (or with ``--smoke``)
the plumbing runs on the CPU with tiny sizes and the GPU items are reported as skipped.

Usage: ``PYTHONPATH=. python benchmarks/gpu_check_callback.py [--smoke | --quick] [--out FILE]``
(``--quick``: 1,024 images, 20 timed steps, workers 0/8/15, the run inside ``gpu_check_all``.)
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
    "--sweep-workers", "0,4,8,15", "--read-latency-ms", "0",
]  # fmt: skip
QUICK_ARGS = [
    "--device", "cuda", "--model", "resnet50", "--images", "1024", "--image-size", "288",
    "--crop", "224", "--steps", "20", "--warmup", "100", "--warmup-callback", "100",
    "--window", "12", "--max-trials", "4", "--loader-budget", "10", "--rounds", "1",
    "--sweep-workers", "0,8,15", "--read-latency-ms", "0",
]  # fmt: skip
"""The GPU run inside ``gpu_check_all`` (its 8-minute slot): 1,024 images, 20 timed steps, a
3-point sweep."""


def main() -> int:
    """Run the check; print the table, the loop's story, and one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a shorter GPU run (gpu_check_all)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    import torch

    from benchmarks.callback_jpeg import main as bench

    gpu = torch.cuda.is_available() and not args.smoke
    argv = (QUICK_ARGS if args.quick else GPU_ARGS) if gpu else ["--smoke"]
    result = bench([*argv, *(["--out", str(args.out)] if args.out else [])],
                   name="gpu_check_callback")  # fmt: skip
    summary = {
        "gpu": torch.cuda.get_device_name(0) if gpu else None,
        "skipped": [] if gpu else ["resnet50 on cuda (no GPU or --smoke): CPU plumbing only"],
        "medians": result["medians"],
        "callback_runs": [
            {k: run[k] for k in ("trials", "stop_reason", "tuning_s", "finished_before_timing")}
            for run in result["params"]["callback_runs"]
        ],
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
