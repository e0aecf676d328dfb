from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_demo_smoke_trains_with_the_callback_and_reports(tmp_path: Path) -> None:
    demo = str(ROOT / "examples" / "demo.py")
    out = subprocess.run(
        [sys.executable, demo, "--smoke", "--data-dir", str(tmp_path / "data")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,  # the callback logs its progress
        text=True, timeout=300, check=True, cwd=tmp_path,
    ).stdout  # fmt: skip
    assert "== 1. the machine (maxtp inspect)" in out
    assert re.search(r"^cpu .* effective$", out, flags=re.M)
    assert list(tmp_path.glob("data/jpeg-*/class_*/*.jpg")), "the demo generates its data locally"
    assert "+ callbacks=[MaxThroughputCallback()]" in out
    assert re.search(r"^maxtp: plan: \d+ usable CPUs", out, flags=re.M), "the plan is shown"
    assert re.search(r"^maxtp: baseline [\d.]+ samples/s over 4 steps", out, flags=re.M)
    assert re.search(r"^== 4\. result \(\d+ s fit, \d+ s of it tuning on real steps\)", out, re.M)
    assert re.search(r"^   throughput: [\d.]+ -> [\d.]+ img/s \(\d\.\d\dx defaults\)", out, re.M)
    assert re.search(r"^   settings now: num_workers=\d+, prefetch_factor=", out, flags=re.M)
    assert re.search(r"^   stopped: \S", out, flags=re.M)
    assert re.search(r"^   diagnosis now: \w+", out, flags=re.M)
    limit = (
        r"^     distance to the limit: (at [\d.]+% of this device's measured fp32 peak|"
        r"the loader gives [\d,]+ samples/s|loading runs in series with the step)"
    )
    assert re.search(limit, out, flags=re.M), "the demo says how far it runs from the limit"
    report = tmp_path / "demo-report"
    assert f"report files: report.json, report.md, timeline.png in {report}" in out
    written = json.loads((report / "report.json").read_text())
    assert "knob_changes" in written
    assert written["limit"]["limit"] in ("device", "loader") and written["limit"]["text"]
    assert written["tuning"]["cost"]["over_s"] == 0.0, "tuning kept within its budget"


def test_demo_rejects_bad_arguments() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py"), "--steps", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "need --steps >= 1 and --images >= 32, got 0 and 1024" in proc.stderr
