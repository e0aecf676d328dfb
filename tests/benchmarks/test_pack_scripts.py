"""The pack benchmark runs end to end (smoke sizes, on the CPU).

``gpu_check_pack.py --smoke`` is checked inside ``test_gpu_check_all.py``, which runs every GPU
check's smoke mode anyway (running it here too cost another ~20 s of the suite).
"""

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
