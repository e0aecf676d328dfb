from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_demo_smoke_probes_then_trains_twice(tmp_path: Path) -> None:
    demo = str(ROOT / "examples" / "demo.py")
    out = subprocess.run(
        [sys.executable, demo, "--smoke", "--data-dir", str(tmp_path / "data")],
        capture_output=True, text=True, timeout=300, check=True, cwd=tmp_path,
    ).stdout  # fmt: skip
    assert "== 1. the machine (maxtp inspect)" in out
    assert re.search(r"^cpu .* effective$", out, flags=re.M)
    rates = re.findall(r"^   (lightning defaults|sized from probe .*?)\s+([\d.]+) img/s", out, re.M)
    assert [name for name, _ in rates][:1] == ["lightning defaults"] and len(rates) == 2
    assert all(float(rate) > 0 for _, rate in rates)
    assert re.search(r"runs at \d+\.\d\dx Lightning's defaults", out)
    assert list(tmp_path.glob("data/jpeg-*/class_*/*.jpg")), "the demo generates its data locally"
    assert re.search(r"steps measured, [\d.]+ samples/s, .* bottleneck: \w+", out)
    assert "report files: report.json, report.md, timeline.png" in out


def test_demo_rejects_bad_arguments() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py"), "--steps", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "need --steps >= 1 and --images >= 32, got 0 and 768" in proc.stderr
