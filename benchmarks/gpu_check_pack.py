"""GPU check for ``maxtp pack``: small training jobs packed onto one GPU vs. in turn.

What it checks, in about two minutes on an H200:

1. The plan: N jobs declaring 2 GiB each all start at once, co-located on the free GPU(s),
   each with ``CUDA_VISIBLE_DEVICES`` set.
2. The same N small training jobs (``examples/pack_train.py``: a small MLP, import torch, CUDA
   init, a few thousand steps) run one after another (``max_parallel=1``) and packed; every job
   must have trained on the GPU. Reported: both total wall times and their ratio.
3. A real CUDA out-of-memory error (a job allocating more than the GPU has) is recognised as
   ``oom`` and, with ``retry_oom``, retried once alone.
4. With Ray installed (the ``[ray]`` extra): the packed jobs again with ``backend="ray"`` on a
   local Ray instance. Every job must train on the device, the GPU's size must come from NVML
   on the node (so the 2 GiB jobs ask for a share of one GPU), and the result must have the
   local backend's keys. Skipped, and said so, without Ray.

Prints a table, then one JSON line. Without a GPU (``--smoke``, or automatically) the GPU items
are skipped and item 2 runs two tiny jobs on the CPU, packed only, to test the plumbing.

Usage: ``PYTHONPATH=. python benchmarks/gpu_check_pack.py [--jobs 8] [--steps 3000] [--smoke]
[--out FILE]``
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.checks import check, finish
from lightning_maxtp.pack import JobSpec, PackResult, plan_pack, run_jobs
from lightning_maxtp.resources import inspect_resources

ROOT = Path(__file__).resolve().parents[1]
TRAIN = str(ROOT / "examples" / "pack_train.py")
OOM = "import torch; torch.empty(2**50, dtype=torch.uint8, device='cuda')"


def train_jobs(num_jobs: int, steps: int, width: int) -> list[JobSpec]:
    return [
        JobSpec((sys.executable, TRAIN, "--seed", str(i), "--steps", str(steps), "--width",
                 str(width), "--batch", "512"), name=f"seed{i}", gpu_memory_gib=2)
        for i in range(num_jobs)
    ]  # fmt: skip


def timed(
    jobs: list[JobSpec], max_parallel: int | None, backend: str = "local"
) -> tuple[float, PackResult, list[str]]:
    with tempfile.TemporaryDirectory() as logs:
        start = time.perf_counter()
        result = run_jobs(
            jobs, backend=backend, log_dir=logs, max_parallel=max_parallel, poll_interval_s=0.02
        )
        wall = time.perf_counter() - start
        last = [
            (Path(j.log_path).read_text().strip().splitlines() or [""])[-1] if j.log_path else ""
            for j in result.jobs
        ]
    return wall, result, last


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="skip GPU items (CPU test run)")
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--out", type=Path, help="also write the JSON line to this file")
    args = parser.parse_args()
    res = inspect_resources()
    has_gpu = bool(res.advice.free_gpus) and not args.smoke
    if not has_gpu:
        args.jobs, args.steps, args.width = 2, 3, 64
    rows: list[dict[str, Any]] = []
    jobs = train_jobs(args.jobs, args.steps, args.width)
    plan = plan_pack(jobs, resources=res if has_gpu else None)
    if has_gpu:
        gpus = sorted({p.gpu.index for p in plan.first.starts if p.gpu is not None})
        check(rows, "plan: all jobs start at once", len(plan.first.starts) == len(jobs),
              f"{len(plan.first.starts)}/{len(jobs)} start, on GPU(s) {gpus}")  # fmt: skip
    else:
        check(rows, "plan on GPU", None, "skipped: no free GPU (or --smoke)")
    # Without a GPU the jobs run once, packed: the ratio means nothing on two CPU cores, and
    # the smoke run must stay short on a loaded CI runner (the Ray item starts Ray too).
    seq_s, seq, seq_last = timed(jobs, 1) if has_gpu else (None, None, [])
    packed_s, packed, packed_last = timed(jobs, None)
    device = "cuda" if has_gpu else "cpu"
    on_device = all(f"device {device}" in line for line in seq_last + packed_last)
    ok = (seq is None or seq.num_failed == 0) and packed.num_failed == 0 and on_device
    check(rows, f"every job trained on {device}", ok, packed_last[0][:90])
    ratio = None
    if seq_s is None:
        check(rows, "packed vs one after another", None,
              f"skipped: no free GPU (or --smoke); packed {packed_s:.1f} s")  # fmt: skip
    else:
        ratio = seq_s / packed_s
        check(rows, "packed vs one after another", ratio > 1.0,
              f"{seq_s:.1f} s -> {packed_s:.1f} s ({ratio:.2f}x), {args.jobs} jobs x "
              f"{args.steps} steps")  # fmt: skip
    peaks = [j.peak_rss_bytes or 0 for j in packed.jobs]
    check(rows, "peak RSS reported", all(peaks), f"max {max(peaks) / 2**20:.0f} MiB")
    if has_gpu:
        with tempfile.TemporaryDirectory() as logs:
            oom = run_jobs([JobSpec((sys.executable, "-c", OOM), name="oom")], log_dir=logs,
                           retry_oom=True).jobs[0]  # fmt: skip
        check(rows, "real CUDA OOM recognised, retried", (oom.status, oom.attempts) == ("oom", 2),
              f"status {oom.status}, attempts {oom.attempts}")  # fmt: skip
    else:
        check(rows, "real CUDA OOM", None, "skipped: no free GPU (or --smoke)")
    on_ray = ray_item(rows, jobs, device, packed)
    print(packed)
    return finish(
        "gpu_check_pack", rows, args.out, jobs=args.jobs, steps=args.steps, width=args.width,
        sequential_s=None if seq_s is None else round(seq_s, 3), packed_s=round(packed_s, 3),
        ratio=None if ratio is None else round(ratio, 3),
        packed=packed.to_dict(), ray=on_ray, machine=res.to_dict(),
    )  # fmt: skip


def ray_item(
    rows: list[dict[str, Any]], jobs: list[JobSpec], device: str, local: PackResult
) -> dict[str, Any] | None:
    """Item 4: the same jobs as Ray tasks on a local Ray instance (skipped without Ray)."""
    if importlib.util.find_spec("ray") is None:
        check(rows, "backend ray", None, "skipped: Ray is not installed (the [ray] extra)")
        return None
    import ray

    from lightning_maxtp.pack.ray_cluster import plan_ray_pack

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    start = time.perf_counter()
    ray.init(include_dashboard=False, log_to_driver=False)
    init_s = time.perf_counter() - start
    try:
        plan = plan_ray_pack(jobs)
        shares = sorted({d.num_gpus for d in plan.demands})
        if device == "cuda":
            check(rows, "ray: GPU size read by NVML on the node", plan.gpu_bytes is not None,
                  f"{(plan.gpu_bytes or 0) / 2**30:.1f} GiB, num_gpus {shares}")  # fmt: skip
        wall_s, result, last = timed(jobs, None, backend="ray")
    finally:
        ray.shutdown()
    on_device = all(f"device {device}" in line for line in last)
    check(rows, f"ray: every job trained on {device}", result.num_failed == 0 and on_device,
          f"{wall_s:.1f} s (local packed {local.wall_s:.1f} s), ray.init {init_s:.1f} s, "
          f"nodes {sorted({j.node for j in result.jobs})}")  # fmt: skip
    same = result.to_dict().keys() == local.to_dict().keys() and [
        j.keys() for j in result.to_dict()["jobs"]
    ] == [j.keys() for j in local.to_dict()["jobs"]]
    check(rows, "ray: the local backend's result keys", same, f"backend {result.backend}")
    return {"wall_s": round(wall_s, 3), "init_s": round(init_s, 3), "result": result.to_dict()}


if __name__ == "__main__":
    sys.exit(main())
