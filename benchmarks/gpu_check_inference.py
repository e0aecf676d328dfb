"""GPU check for ``BatchInferencePool``: JPEG ResNet-50 inference on one GPU.

What it measures, in one run (a few minutes on an H200 with 16 CPUs):

1. Throughput, A/B/C per round, batch 512, 1,024 JPEGs of 320 px read 8 times (8,192 items):
   the naive loop (one process, sequential decode, fp32; on the first 1,024 items only, it is
   slow), the expert loop (DataLoader with CPUs - 1 workers, persistent, prefetch 4, pinned
   memory, non-blocking copies, channels-last, bf16), the pool with everything ``"auto"``
   (``batch_size="auto"``: the batch-size search; copies per GPU from the first copy's measured
   memory), and the pool with ``pool_workers`` model copies on the GPU at batch 512. Reference
   figures (the reference job's anchors, same GPU): naive 289 img/s, expert 5,036 img/s; the
   targets are the auto pool >= 5,036 img/s and the best pool >= the expert loop.
2. Where the remaining gap is: the GPU's ceiling (ResNet-50 forward on a batch already on the
   GPU, bf16, channels-last) and the CPU's (one core's JPEG decode rate x (CPUs - 1)); the
   bound is the lower of the two (nvjpeg decodes ~18,000 img/s on an H200: the lever past it).
3. Worker facts: each pool worker saw its GPU through ``CUDA_VISIBLE_DEVICES``, ran bf16
   autocast, and did not import lightning.

Prints a table, then one JSON line. ``--smoke`` (automatic without a GPU) runs the same
comparison with tiny sizes on the CPU and reports the GPU items as skipped.

Usage: ``PYTHONPATH=. python benchmarks/gpu_check_inference.py [--smoke] [--out FILE]``
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.checks import add  # noqa: E402
from benchmarks.inference_jpeg import (  # noqa: E402
    DecodeDataset,
    _shutdown_loader,
    loader_pass,
    naive_pass,
    prepare_images,
    timed,
)
from benchmarks.targets import INFERENCE  # noqa: E402
from benchmarks.workloads.jpeg_inference import build_classifier, decode  # noqa: E402
from lightning_maxtp.resources.host import probe_cpus  # noqa: E402

FULL = {"images": 1024, "repeat": 8, "naive_images": 1024, "image_size": 320, "crop": 224,
        "model": "resnet50", "batch_size": 512, "rounds": 3, "pool_workers": 2}  # fmt: skip
QUICK = {**FULL, "repeat": 3, "rounds": 1}
"""``--quick`` (``gpu_check_all``'s compact profile): 3,072 images, one round."""
SMOKE = {"images": 48, "repeat": 1, "naive_images": 16, "image_size": 64, "crop": 32,
         "model": "resnet18", "batch_size": 16, "rounds": 1, "pool_workers": 2}  # fmt: skip
REFERENCE = INFERENCE


def gpu_ceiling(model_name: str, batch: int, crop: int) -> float:
    """Images/s of the bf16 forward on a resident uint8 batch: what the GPU alone allows."""
    model = build_classifier(model_name, 10, True).cuda()
    x = torch.randint(0, 256, (batch, 3, crop, crop), dtype=torch.uint8, device="cuda")
    with torch.inference_mode(), torch.autocast("cuda", torch.bfloat16):
        for _ in range(3):
            model(x)
        torch.cuda.synchronize()  # sync before reading the clock
        start, steps = time.perf_counter(), 10
        for _ in range(steps):
            model(x)
        torch.cuda.synchronize()
    return steps * batch / (time.perf_counter() - start)


def decode_rate(paths: list[str], crop: int) -> float:
    """Images/s one CPU core decodes (PIL decode + resize + crop to uint8)."""
    sample = paths[:200]
    start = time.perf_counter()
    for path in sample:
        decode(path, crop)
    return len(sample) / (time.perf_counter() - start)


def main() -> int:
    """Run the check; print the table and one JSON line."""
    from benchmarks.runner import Config, format_table, run_ab
    from lightning_maxtp.inference import BatchInferencePool

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--quick", action="store_true", help="3,072 images, one round")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    smoke = args.smoke or not cuda
    sizes = SMOKE if smoke else QUICK if args.quick else FULL
    cpus = probe_cpus().effective  # affinity and the cgroup quota
    workers = max(1, cpus - 1)
    # Generating JPEGs is slow (one process, ~50 ms each): a set of unique files read
    # ``repeat`` times costs the same decode per item, from the page cache like a warm data set.
    paths = prepare_images(sizes["images"], sizes["image_size"], None) * sizes["repeat"]
    batch, crop, name = sizes["batch_size"], sizes["crop"], sizes["model"]
    device = torch.device("cuda" if cuda else "cpu")
    factory = functools.partial(build_classifier, name, 10, cuda)
    load = functools.partial(decode, size=crop)
    checks: list[dict[str, Any]] = []
    params: dict[str, Any] = {**sizes, "loader_workers": workers, "device": str(device)}

    naive_model = build_classifier(name, 10).to(device)
    naive_paths = paths[: sizes["naive_images"]]
    naive_pass(naive_model, naive_paths[:batch], batch, crop)
    configs = [
        Config("naive", functools.partial(
            timed, functools.partial(naive_pass, naive_model, naive_paths, batch, crop))),
    ]  # fmt: skip
    expert = factory().to(device)
    loader = DataLoader(
        DecodeDataset(paths, crop), batch_size=batch, num_workers=workers, pin_memory=cuda,
        persistent_workers=True, prefetch_factor=4,
    )  # fmt: skip
    loader_pass(expert, loader, cuda)
    expert_run = functools.partial(loader_pass, expert, loader, cuda)
    configs.append(Config("expert", functools.partial(timed, expert_run)))
    pools = []
    try:
        for label, per_device, size in (
            ("pool", "auto", "auto"), ("pool xN", sizes["pool_workers"], batch),
        ):  # fmt: skip
            started = time.perf_counter()
            pool = BatchInferencePool(
                factory, load=load, batch_size=size, workers_per_device=per_device
            )
            pools.append(pool)
            pool.start()
            pool.map(paths[: batch * len(pool.plan.workers) * 2])
            params[f"{label} startup_s"] = round(time.perf_counter() - started, 2)
            params[f"{label} plan"] = str(pool.plan)

            def run(pool: BatchInferencePool = pool) -> int:
                return len(pool.map(paths))

            configs.append(Config(label, functools.partial(timed, run), {"plan": str(pool.plan)}))
        result = run_ab("gpu_check_inference", configs, rounds=sizes["rounds"], params=params)
        # Worker processes only: an inline model (the CPU smoke) lives in this process.
        for info in [i for i in pools[0].worker_info if i["pid"] != os.getpid()]:
            add(checks, {"check": "worker did not import lightning",
                           "ok": not info["lightning_imported"], "detail": str(info)})  # fmt: skip
            add(checks, {
                "check": "worker isolated to its GPU, bf16 autocast",
                "ok": (info["cuda_visible_devices"] not in (None, "") and info["autocast"]
                       == "torch.bfloat16") if cuda else None,
                "detail": f"CUDA_VISIBLE_DEVICES={info['cuda_visible_devices']!r}, "
                          f"autocast={info['autocast']}" if cuda else "skipped: no GPU",
            })  # fmt: skip
    finally:
        for pool in pools:
            pool.close()
        _shutdown_loader(loader)
    medians = result.medians()
    best_pool = max(medians["pool"], medians["pool xN"])
    core_rate = decode_rate(paths, crop)
    cpu_bound = core_rate * workers
    gpu_bound = gpu_ceiling(name, batch, crop) if cuda else None
    bound = min(cpu_bound, gpu_bound) if gpu_bound else cpu_bound
    gap = {
        "decode_per_core_img_s": round(core_rate, 1),
        "cpu_ceiling_img_s": round(cpu_bound, 1),
        "gpu_ceiling_img_s": round(gpu_bound, 1) if gpu_bound else None,
        "bound": "cpu decode" if bound == cpu_bound else "gpu",
        "pool_vs_expert": round(best_pool / medians["expert"], 3),
        "pool_vs_bound": round(best_pool / bound, 3),
        "reference": REFERENCE,
    }
    add(checks, {
        "check": "pool with batch_size='auto' >= the expert loop's anchor (5,036 img/s)",
        "ok": medians["pool"] >= REFERENCE["expert"] if cuda else None,
        "detail": f"pool {medians['pool']:.0f} img/s; {params['pool plan']!r}",
    })  # fmt: skip
    add(checks, {
        "check": "pool >= expert loop", "ok": best_pool >= medians["expert"] if cuda else None,
        "detail": f"pool {best_pool:.0f} vs expert {medians['expert']:.0f} img/s"
                  + ("" if cuda else " (CPU smoke: not the target)"),
    })  # fmt: skip
    print(format_table(result))
    print(f"\ngap: bound by {gap['bound']}: CPU ceiling {cpu_bound:.0f} img/s "
          f"({core_rate:.0f}/core x {workers}), GPU ceiling "
          f"{gap['gpu_ceiling_img_s'] or 'skipped (no GPU)'}; pool reaches "
          f"{gap['pool_vs_bound']:.0%} of the bound, "
          f"{gap['pool_vs_expert']:.2f}x the expert loop")  # fmt: skip
    for row in checks:
        status = {True: "ok", False: "FAIL", None: "skipped"}[row["ok"]]
        print(f"{status:8} {row['check']}: {row['detail']}")
    failed = [row["check"] for row in checks if row["ok"] is False]
    line = json.dumps({**result.to_dict(), "gap": gap, "checks": checks, "failed": failed,
                       "smoke": smoke})  # fmt: skip
    if args.out is not None:
        args.out.write_text(line + "\n")
    print(line, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
