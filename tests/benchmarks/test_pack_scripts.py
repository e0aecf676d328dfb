"""The pack benchmark and GPU check scripts run end to end (smoke sizes, on the CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def run(*args: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=180, check=True,
        env=ENV, cwd=ROOT,
    ).stdout  # fmt: skip
    return out.strip().splitlines()


def test_pack_cpu_benchmark_reports_both_configs() -> None:
    lines = run("-m", "benchmarks.pack_cpu", "--smoke", "--workload", "python")
    data = json.loads(lines[-1])
    assert data["benchmark"] == "pack_cpu" and data["params"]["jobs"] == 2
    assert list(data["medians"]) == ["one-after-another", "packed"]
    assert all(v > 0 for v in data["medians"].values())


def test_gpu_check_pack_smoke_skips_gpu_items() -> None:
    lines = run("benchmarks/gpu_check_pack.py", "--smoke")
    data = json.loads(lines[-1])
    assert data["failed"] == []
    assert {r["check"]: r["ok"] for r in data["rows"]} == {
        "plan on GPU": None,
        "every job trained on cpu": True,
        "packed vs one after another": None,
        "peak RSS reported": True,
        "real CUDA OOM": None,
    }
    assert data["sequential_s"] > 0 and data["packed_s"] > 0
