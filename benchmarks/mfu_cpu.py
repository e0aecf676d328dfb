"""How far the reference CPU jobs run from this machine's limit: MFU against the measured peak.

Each reference job is a real ``Trainer.fit`` watched by ``BottleneckMonitor`` (its defaults:
the first batch's FLOPs counted once, the peak read from the cache or measured once). Per job
and round: the samples/s of the windows, the FLOPs per sample, the MFU, the bottleneck and the
report's headline distance ("at 38 % of this device's measured fp32 peak", or the loader's
share for a data-bound job). Jobs run in turn each round (A, B, C, A, B, C); the table gives
the median MFU over rounds and every round's value.

| job | what it is |
|---|---|
| large-mlp | 4 x 4096 MLP on in-memory vectors, batch 64 |
| transformer | 4-layer encoder (d_model 256) on in-memory token ids, batch 32 |
| tiny-mlp | 64-wide MLP on in-memory vectors, batch 32 (per-step overhead) |
| jpeg-mobilenet | mobilenet_v3_small on 160 px JPEGs, crop 64, 0 workers (data-bound) |

Usage: ``python -m benchmarks.mfu_cpu [--rounds 2] [--steps 40] [--out FILE] [--smoke]``
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from benchmarks.workloads.common import LoaderSettings, make_loader
from benchmarks.workloads.tensors import build_tensor_workload
from lightning_maxtp.callbacks import BottleneckMonitor
from lightning_maxtp.resources.peak import measure_peak

Job = Callable[[int], tuple[pl.LightningModule, DataLoader[Any]]]


def _tensors(name: str, batch: int) -> Job:
    def build(steps: int) -> tuple[pl.LightningModule, DataLoader[Any]]:
        work = build_tensor_workload(name, samples=batch * 8)
        return work.module, make_loader(work.dataset, LoaderSettings(batch), steps=steps)

    return build


def _jpeg(steps: int) -> tuple[pl.LightningModule, DataLoader[Any]]:
    from benchmarks.workloads.jpeg import (
        ImageClassifier,
        JpegFolderDataset,
        JpegSpec,
        default_data_dir,
        generate_jpeg_dataset,
    )

    spec = JpegSpec(images=512, image_size=160)
    root = generate_jpeg_dataset(default_data_dir(spec), spec)
    data = JpegFolderDataset(root, crop=64)
    module = ImageClassifier("mobilenet_v3_small")
    return module, make_loader(data, LoaderSettings(32), steps=steps)


JOBS: dict[str, Job] = {
    "large-mlp": _tensors("large-mlp", 64),
    "transformer": _tensors("transformer-tokens", 32),
    "tiny-mlp": _tensors("tiny-mlp", 32),
    "jpeg-mobilenet": _jpeg,
}


def once(job: str, steps: int, window: int) -> dict[str, Any]:
    """One watched fit of ``job``: its windows' MFU and the report's distance to the limit."""
    module, loader = JOBS[job](steps)
    monitor = BottleneckMonitor(window_steps=window, verbose=False)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = pl.Trainer(
            accelerator="cpu", max_steps=steps, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, callbacks=[monitor],
            default_root_dir=tmp,
        )  # fmt: skip
        trainer.fit(module, loader)
    report = monitor.report
    limit = report.limit
    util = None if limit is None else limit.utilization
    return {
        "samples_per_s": report.samples_per_s,
        "flops_per_sample": monitor.context.flops_per_sample,
        "mfu": None if util is None else util.mfu,
        "bottleneck": report.bottleneck,
        "limit": None if limit is None else str(limit),
        "limit_share": None if limit is None else limit.share,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--smoke", action="store_true", help="one round of 12 steps")
    args = parser.parse_args()
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    rounds, steps = (1, 12) if args.smoke else (args.rounds, args.steps)
    window = max(3, steps // 4)
    peak = measure_peak("cpu")
    print(peak)
    runs: dict[str, list[dict[str, Any]]] = {job: [] for job in JOBS}
    for r in range(rounds):
        for job in JOBS:
            runs[job].append(once(job, steps, window))
            print(f"round {r + 1} {job}: {runs[job][-1]['limit']}", flush=True)
    print(f"\n{'job':<16} {'samples/s':>10} {'GFLOP/sample':>13} {'MFU':>6}  bottleneck, distance")
    rows = []
    for job, results in runs.items():
        mfus = [x["mfu"] for x in results if x["mfu"] is not None]
        rate = statistics.median(x["samples_per_s"] for x in results)
        flops = results[-1]["flops_per_sample"]
        mfu = statistics.median(mfus) if mfus else None
        rows.append({"job": job, "samples_per_s": rate, "flops_per_sample": flops, "mfu": mfu,
                     "rounds": results})  # fmt: skip
        gflop = "-" if flops is None else f"{flops / 1e9:.3f}"
        shown = "-" if mfu is None else f"{mfu:.1%}"
        print(f"{job:<16} {rate:>10.1f} {gflop:>13} {shown:>6}  {results[-1]['bottleneck']}, "
              f"{results[-1]['limit']}")  # fmt: skip
    result = {"benchmark": "mfu_cpu", "peak": peak.to_dict(), "rows": rows,
              "threads": torch.get_num_threads(), "steps": steps}  # fmt: skip
    line = json.dumps(result, default=str)
    if args.out is not None:
        args.out.write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
