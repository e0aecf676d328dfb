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
