from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_demo_smoke_prints_a_few_short_lines_and_reports(tmp_path: Path) -> None:
    demo = str(ROOT / "examples" / "demo.py")
    out = subprocess.run(
        [sys.executable, demo, "--smoke", "--data-dir", str(tmp_path / "data")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,  # the callback logs to stderr
        text=True, timeout=300, check=True, cwd=tmp_path,
    ).stdout  # fmt: skip
    lines = out.splitlines()
    assert len(lines) <= 8 and all(len(line) <= 100 for line in lines), out
    assert list(tmp_path.glob("data/jpeg-*/class_*/*.jpg")), "the demo generates its data locally"
    assert lines[0].endswith("+ MaxThroughputCallback()"), out
    assert re.search(r"^maxtp: plan: tune loader, threads", out, flags=re.M), "the plan is shown"
    assert re.search(r"^maxtp: baseline [\d.]+ samples/s, bottleneck \w+", out, flags=re.M)
    result = r"^maxtp: result: [\d.]+ -> [\d.]+ samples/s \(\d+\.\d\dx\); tuning cost [\d.]+ s"
    assert re.search(result, out, flags=re.M), out
    held = r"^maxtp: now (\w+-bound|no bottleneck above threshold)"
    assert re.search(held, out, flags=re.M), "what holds the run now"
    report = tmp_path / "demo-report"
    assert lines[-1] == "maxtp: report: demo-report/report.md", out  # relative to the cwd
    written = json.loads((report / "report.json").read_text())
    assert "knob_changes" in written and (report / "timeline.png").is_file()
    assert written["limit"]["limit"] in ("device", "loader") and written["limit"]["text"]
    assert written["tuning"]["cost"]["over_s"] == 0.0, "tuning kept within its budget"


def test_demo_rejects_bad_arguments() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py"), "--steps", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "need --steps >= 1 and --images >= 32, got 0 and 1024" in proc.stderr
