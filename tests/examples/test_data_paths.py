"""The data-paths example runs every path end to end with tiny sizes (real fits on the CPU)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_every_data_path_trains_and_the_diagnosis_names_one(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "data_paths.py"), "--after", "all", "--steps",
         "40", "--images", "96", "--size", "64", "--crop", "32", "--batch-size", "16"],
        capture_output=True, text=True, timeout=300, check=True, cwd=tmp_path,
    )  # fmt: skip
    out = proc.stdout
    for path in ("before", "uint8", "encoded", "pre-encoded"):
        assert re.search(rf"^ *{path}: +[\d.]+ samples/s in force, 40 steps", out, re.M), out
    for path in ("uint8", "encoded", "pre-encoded"):
        assert re.search(rf"^{path} vs before: [\d.]+x samples/s$", out, re.M)
    assert "pre-encoded 96 samples as uint8" in out
    # Each fit's diagnosis: a data-bound one names the data path to take, with its numbers.
    named = re.findall(r"^ +the diagnosis names: (\w+) \(needs ~\d+ workers, (.*)\)$", out, re.M)
    assert named, out  # every fit here waits on its loader (0 workers, 2 CPUs)
    assert {path for path, _ in named} <= {"uint8_to_device", "gpu_decode", "pre_encode"}, named
    assert all("short of the device's" in why for _, why in named), named
