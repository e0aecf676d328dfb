"""The callback examples run end to end with tiny sizes (real fits on the CPU)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers.scripts import run_example

ROOT = Path(__file__).resolve().parents[2]


def _run(script: str, *args: str, cwd: Path) -> str:
    return run_example(Path(script), *args, cwd=cwd).stdout


@pytest.mark.slow
def test_train_with_callback_then_read_its_report(tmp_path: Path) -> None:
    report = tmp_path / "report"
    out = _run(str(ROOT / "examples" / "callback_train.py"), "--smoke", "--report-dir",
               str(report), cwd=tmp_path)  # fmt: skip
    assert re.search(r"^maxtp: tuning: \d+ knob trial\(s\) in [\d.]+ s", out, flags=re.M)
    # The workers alone, or with their persistence in the same trial.
    trial = r"^  num_workers: 0 -> \d+(, persistent_workers=True)?: [\d.]+ -> [\d.]+ samples/s"
    assert re.search(trial, out, flags=re.M)
    shown = _run(str(ROOT / "examples" / "callback_report.py"), str(report), cwd=tmp_path)
    assert re.search(
        r"^throughput over the run: [\d.]+ samples/s, bottleneck now: \w+", shown, re.M
    )
    change = (
        r"^  t=[\d.]+s num_workers: num_workers=0(, persistent_workers=False)? -> "
        r"num_workers=\d+(, persistent_workers=True)? \(trying: "
    )
    assert re.search(change, shown, flags=re.M)
    assert "  maxtp: tuning: " in shown and "left for you:" in shown
    assert f"files: report.json, report.md, timeline.png in {report}" in shown


def test_one_line_example_runs_with_the_callback(tmp_path: Path) -> None:
    out = _run(str(ROOT / "examples" / "callback_one_line.py"), "--maxtp", "--steps", "40",
               cwd=tmp_path)  # fmt: skip
    assert re.search(r"^with MaxThroughputCallback: 40 steps in [\d.]+ s", out, flags=re.M)


@pytest.mark.slow
def test_allow_all_example_shows_the_guard_undoing_a_broken_bf16(tmp_path: Path) -> None:
    out = _run(str(ROOT / "examples" / "callback_allow_all.py"), "--steps", "60", "--allow",
               "precision", "--break-bf16", cwd=tmp_path)  # fmt: skip
    assert re.search(r"^allow=precision: 60 steps in [\d.]+ s, batch size now 32$", out, re.M)
    assert re.search(r"^  precision: guarded \([+-]\d+%\)$", out, re.M)
