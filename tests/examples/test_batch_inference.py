"""The ``examples/batch_inference.py`` script: streams records through the pool, checks them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_batch_inference_example_scores_every_record_and_reports_the_corrupt_one(
    tmp_path: Path,
) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "batch_inference.py"), "--items", "40",
         "--batch-size", "8", "--workers", "1"],
        capture_output=True, text=True, timeout=300, check=True, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    ).stdout  # fmt: skip
    assert re.search(r"^  cpu: 1 worker\(s\) x \d+ torch thread\(s\)", out, re.M), out
    assert "error: item 13 (13) failed in load: ValueError: record 13 is corrupt" in out
    assert "scored 39 of 40 records, 0 mismatches vs. one process" in out
    assert re.search(r"^inference: 40 items in [\d.]+ s .* 39 outputs, 1 errors", out, re.M)
