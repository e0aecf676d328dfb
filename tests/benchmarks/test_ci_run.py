"""``python -m benchmarks.run``: the CI benchmark mode and its regression gate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.run import compare, main

ROOT = Path(__file__).resolve().parents[2]


def _result(ratio: float, rate: float) -> dict[str, object]:
    return {"cases": {"slow_storage": {
        "ratio": {"defaults": 1.0, "callback": ratio},
        "median_samples_per_s": {"defaults": 100.0, "callback": rate},
    }}}  # fmt: skip


def test_compare_flags_only_falls_beyond_the_limit() -> None:
    base = _result(2.0, 200.0)
    assert compare(_result(1.85, 185.0), base, 0.10) == []
    (line,) = compare(_result(1.70, 185.0), base, 0.10)
    assert line == "slow_storage/callback ratio: 2.000 -> 1.700 (-15.0%, limit -10%)"
    (line,) = compare(_result(2.0, 170.0), base, 0.10, gate="absolute")
    assert line.startswith("slow_storage/callback median_samples_per_s: 200.000 -> 170.000")
    assert compare(_result(1.0, 1.0), {"cases": {}}, 0.10) == []  # a new case has no baseline


def test_bad_arguments_exit_2(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--suite", "tiny", "--baseline", str(tmp_path / "missing.json")])
    assert exc.value.code == 2


def test_tiny_suite_writes_json_and_the_gate_fails_on_a_regression(tmp_path: Path) -> None:
    baseline = tmp_path / "base.json"
    baseline.write_text(json.dumps(_result(100.0, 1e9)))  # unreachable: must be a regression
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--suite", "tiny", "--json", str(out),
         "--baseline", str(baseline), "--max-regression", "0.10"],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "REGRESSION slow_storage/callback ratio: 100.000 -> " in proc.stdout
    assert "benchmark gate: FAILED" in proc.stdout
    result = json.loads(out.read_text())
    assert result["schema"] == "maxtp-ci-bench/1"
    case = result["cases"]["slow_storage"]
    assert case["ratio"]["defaults"] == 1.0 and case["ratio"]["callback"] > 0
    assert len(case["samples_per_s"]["callback"]) == 1
    assert compare(result, result, 0.10) == []  # a run never regresses against itself
