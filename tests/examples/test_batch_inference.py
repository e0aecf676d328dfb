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
         "--batch-size", "auto"],
        capture_output=True, text=True, timeout=300, check=True, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    ).stdout  # fmt: skip
    # 40 records are too few to pay for worker processes: they ran in the script's process.
    assert re.search(r"^inference plan: measured, \d+ worker\(s\), batch size \d+$", out, re.M), out
    assert "  decided: batch size: batch " in out and "  decided: inline: " in out
    assert "error: item 13 (13) failed in load: ValueError: record 13 is corrupt" in out
    assert "scored 39 of 40 records, 0 mismatches vs. one process" in out
    assert re.search(
        r"^inference \(inline\): 40 items in [\d.]+ s, end to end [\d.]+ items/s .*steady "
        r"[\d.]+ items/s; 39 outputs, 1 errors",
        out,
        re.M,
    ), out
