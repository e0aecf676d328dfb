"""GPU check for the resource probe: is ``maxtp inspect --json`` right on a GPU host?

What it checks, against torch.cuda as the reference, in a few seconds:

1. ``maxtp inspect --json`` answers, how long it takes, and that NVML was used.
2. Every visible GPU: count, total memory and compute capability agree with torch.
3. ``CUDA_VISIBLE_DEVICES`` forms: an index, a UUID prefix, and a bad value (a note, no crash).
4. A foreign process: a detached process (not our child) allocates GPU memory; the probe must
   list it as foreign and drop that GPU from the free list.
5. The GPU-marked tests of ``tests/resources/test_probe.py``.
6. ``maxtp inspect --peak``: the measured matmul peak per dtype (fp32, tf32, bf16, fp16), each
   positive and, where the datasheet knows the GPU, between 30 % and 105 % of its value (on a
   CPU: fp32 only, positive).

Prints a table, then one JSON line. On a machine without a GPU (``--smoke``, or automatically)
the GPU items are reported as skipped, so the script itself can be tested on a CPU.

Usage: ``PYTHONPATH=. python benchmarks/gpu_check_inspect.py [--out FILE]``
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.checks import check, finish, run_gpu_tests

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
ALLOCATE = (
    "import time, torch; x = torch.empty(int(2 * 2**30), dtype=torch.uint8, device='cuda'); "
    "print('ready', flush=True); time.sleep(120)"
)


def inspect_json(extra_env: dict[str, str] | None = None) -> tuple[dict[str, Any], float]:
    env = {**ENV, **(extra_env or {})}
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "lightning_maxtp.cli", "inspect", "--json"],
        capture_output=True, text=True, env=env, check=True, timeout=60,
    )  # fmt: skip
    return json.loads(out.stdout), time.perf_counter() - start


def peak_check(rows: list[dict[str, Any]], gpu: bool) -> None:
    """``maxtp inspect --peak``, measured afresh into a temporary cache."""
    import tempfile

    with tempfile.TemporaryDirectory() as cache:
        env = {**ENV, "XDG_CACHE_HOME": cache}
        out = subprocess.run(
            [sys.executable, "-m", "lightning_maxtp.cli", "inspect", "--refresh-peak", "--json"],
            capture_output=True, text=True, env=env, check=True, timeout=300,
        )  # fmt: skip
    peak = json.loads(out.stdout)["peak"]
    wanted = {"fp32", "tf32", "bf16", "fp16"} if gpu else {"fp32"}
    got = {r["dtype"]: r["flops_per_s"] for r in peak["rates"]}
    check(rows, "peak dtypes", wanted <= set(got), f"{sorted(got)} in {peak['measured_s']:.1f} s")
    for dtype, rate in got.items():
        sheet = peak["datasheet"].get(dtype)
        share = "" if sheet is None else f", {rate / sheet:.0%} of the datasheet"
        ok = rate > 0 and (sheet is None or 0.3 <= rate / sheet <= 1.05)
        check(rows, f"peak {dtype}", ok, f"{rate / 1e12:,.2f} TFLOP/s{share}")


def gpu_checks(rows: list[dict[str, Any]], data: dict[str, Any]) -> None:
    import torch

    count = torch.cuda.device_count()
    check(rows, "backend is nvml", data["gpu_backend"] == "nvml", data["gpu_backend"])
    found = len(data["gpus"])
    check(rows, "gpu count", found == count, f"probe {found}, torch {count}")
    for gpu in data["gpus"]:
        props = torch.cuda.get_device_properties(gpu["index"])
        ratio = gpu["memory_total_bytes"] / props.total_memory
        check(rows, f"gpu {gpu['index']} memory total", 0.98 < ratio < 1.02, f"ratio {ratio:.4f}")
        cc = f"{props.major}.{props.minor}"
        check(rows, f"gpu {gpu['index']} capability", gpu["compute_capability"] == cc, cc)
    first = data["gpus"][0]
    one, _ = inspect_json({"CUDA_VISIBLE_DEVICES": str(first["physical_index"])})
    check(rows, "CUDA_VISIBLE_DEVICES=<index>", len(one["gpus"]) == 1, f"{len(one['gpus'])} gpu")
    by_uuid, _ = inspect_json({"CUDA_VISIBLE_DEVICES": first["uuid"][:12]})
    same = [g["uuid"] for g in by_uuid["gpus"]] == [first["uuid"]]
    check(rows, "CUDA_VISIBLE_DEVICES=<uuid prefix>", same, first["uuid"][:12])
    bad, _ = inspect_json({"CUDA_VISIBLE_DEVICES": "bogus"})
    noted = any("CUDA_VISIBLE_DEVICES" in n for n in bad["notes"]) and not bad["gpus"]
    check(rows, "CUDA_VISIBLE_DEVICES=bogus", noted, (bad["notes"] or ["no note"])[0][:70])
    foreign_check(rows, first)


def foreign_check(rows: list[dict[str, Any]], first: dict[str, Any]) -> None:
    # bash backgrounds the allocator and exits, so it is re-parented: not our child, not "own".
    env = {**ENV, "CUDA_VISIBLE_DEVICES": str(first["physical_index"])}
    script = f'{sys.executable} -c "{ALLOCATE}" > /tmp/maxtp_alloc.log 2>&1 & echo $!'
    pid = int(subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                             env=env, check=True).stdout.split()[0])  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "ready" not in Path("/tmp/maxtp_alloc.log").read_text():
            if time.monotonic() > deadline:
                raise TimeoutError("allocator did not start within 60 s")
            time.sleep(0.2)
        data, _ = inspect_json()
        gpu = next(g for g in data["gpus"] if g["uuid"] == first["uuid"])
        pids = [p["pid"] for p in gpu["processes"] or [] if not p["own"]]
        check(rows, "foreign process listed", pid in pids, f"pid {pid} in {pids}")
        busy = [b["index"] for b in data["advice"]["busy_gpus"]]
        check(rows, "busy GPU left out of free list", gpu["index"] in busy, f"busy {busy}")
    finally:
        os.kill(pid, signal.SIGKILL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="skip GPU items (CPU test run)")
    parser.add_argument("--out", type=Path, help="also write the JSON line to this file")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    data, seconds = inspect_json()
    check(rows, "maxtp inspect --json answers", True, f"{seconds:.2f} s (target < 2 s)")
    has_gpu = bool(data["gpus"]) and not args.smoke
    if has_gpu:
        gpu_checks(rows, data)
        run_gpu_tests(rows, "tests/resources/test_probe.py", "real_gpu")
    else:
        check(rows, "GPU checks", None, "skipped: no GPU visible (or --smoke)")
    peak_check(rows, has_gpu)
    return finish(
        "gpu_check_inspect", rows, args.out, inspect_seconds=round(seconds, 3), machine=data
    )


if __name__ == "__main__":
    sys.exit(main())
