"""The regression gate and the result's JSON and tables (pure: records made up here)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from lightning_maxtp.bench import BenchResult, compare, format_markdown, format_text
from lightning_maxtp.bench.reference import REFERENCE
from lightning_maxtp.bench.result import SCHEMA, Spread


def _run(config: str, steady: float, reference: float = 1000.0, r: int = 1) -> dict[str, Any]:
    return {
        "config": config, "round": r, "device": "cpu", "reference_samples_per_s": reference,
        "steady_samples_per_s": steady, "fit_samples_per_s": steady * 0.8,
        "fit_seconds": 10.0 / steady * 100, "tuning": None,
    }  # fmt: skip


def _result(rates: dict[str, list[float]], reference: float = 1000.0, **params: Any) -> BenchResult:
    runs = [_run(c, v, reference, r) for c, vs in rates.items() for r, v in enumerate(vs, 1)]
    return BenchResult(
        target="train.py:job", configs=tuple(rates),
        params={"steps": 100, "warmup": 10, "rounds": 3, "accelerator": "auto",
                "reference": REFERENCE, "device": "cpu", **params},
        runs=tuple(runs), machine={"hostname": "ci", "cpu": {"effective": 2}, "gpus": []},
        versions={"torch": "2.x"}, git={"commit": "abc123def456", "dirty": False},
    )  # fmt: skip


BASE = _result({"defaults": [100.0, 102.0, 98.0], "maxtp": [150.0, 155.0, 148.0]})


def test_spread_is_the_range_over_the_median() -> None:
    s = Spread.of([98.0, 100.0, 102.0])
    assert (s.median, s.low, s.high) == (100.0, 98.0, 102.0) and s.spread == pytest.approx(0.04)
    assert Spread.of([5.0]).spread == 0.0


def test_the_same_numbers_pass_and_a_clear_fall_fails() -> None:
    assert compare(BASE, BASE).passed
    slower = _result({"defaults": [70.0, 72.0, 71.0], "maxtp": [150.0, 151.0, 149.0]})
    gate = compare(slower, BASE, 0.10)
    assert not gate.passed and gate.exit_code == 1
    assert {(c.config, c.metric) for c in gate.regressions} == {("defaults", "steady"),
                                                               ("defaults", "fit")}  # fmt: skip
    line = str(gate.regressions[0])
    assert line.startswith("defaults steady samples/s per reference sample/s: 0.1000 -> 0.0710")
    assert "(-29.0%; limit -10%; rounds now 0.0700-0.0720, baseline 0.0980-0.1020)" in line
    assert "maxtp bench gate (ratio, limit -10% beyond the spread): FAILED" in str(gate)


def test_a_fall_within_the_limit_or_within_the_spread_is_no_regression() -> None:
    within_limit = _result({"defaults": [93.0, 94.0, 92.0], "maxtp": [150.0] * 3})
    assert compare(within_limit, BASE, 0.10).passed
    noisy = _result({"defaults": [60.0, 80.0, 99.0], "maxtp": [150.0] * 3})  # median -20 %
    gate = compare(noisy, BASE, 0.10)
    assert gate.passed, gate  # its fastest round is as fast as the baseline's slowest


def test_the_ratio_gate_travels_between_machines_and_absolute_does_not() -> None:
    # a runner half as fast: job and reference both halve
    half = _result({"defaults": [50.0, 51.0, 49.0], "maxtp": [75.0, 77.0, 74.0]}, reference=500.0)
    assert compare(half, BASE, 0.10, "ratio").passed
    gate = compare(half, BASE, 0.10, "absolute")
    assert len(gate.regressions) == 4 and gate.regressions[0].key == "steady"
    # the job itself slower on a machine as fast as before: the ratio sees it
    job_slower = _result({"defaults": [50.0, 51.0, 49.0], "maxtp": [150.0] * 3})
    assert not compare(job_slower, BASE, 0.10, "ratio").passed


def test_what_cannot_be_compared_is_an_error_or_a_note() -> None:
    with pytest.raises(ValueError, match="recorded with steps=100, this run has steps=50"):
        compare(_result({"defaults": [100.0]}, steps=50), BASE)
    with pytest.raises(ValueError, match="ran on cpu, this run on cuda"):
        compare(_result({"defaults": [100.0]}, device="cuda:0"), BASE)
    with pytest.raises(ValueError, match="max_regression must be in"):
        compare(BASE, BASE, 1.5)
    with pytest.raises(ValueError, match="gate must be one of ratio, absolute"):
        compare(BASE, BASE, gate="relative")
    gate = compare(_result({"defaults": [100.0], "bf16": [200.0]}), BASE)
    assert gate.passed and gate.notes == ("config 'bf16' has no baseline; record one to gate it",)


def test_a_result_round_trips_through_strict_json() -> None:
    text = json.dumps(BASE.to_dict(), allow_nan=False)
    again = BenchResult.from_dict(json.loads(text))
    assert again.to_dict() == BASE.to_dict()
    assert json.loads(text)["summary"]["maxtp"]["steady"]["median"] == 150.0
    with pytest.raises(ValueError, match="is not a maxtp bench result"):
        BenchResult.from_dict({"schema": "maxtp-ci-bench/1"}, "--baseline old.json")
    with pytest.raises(ValueError, match="incomplete maxtp bench result"):
        BenchResult.from_dict({"schema": SCHEMA, "target": "x:y"})
    with pytest.raises(ValueError, match=r"no runs of config\(s\) \['maxtp'\]"):
        BenchResult.from_dict({**BASE.to_dict(), "runs": [_run("defaults", 1.0)]})


def test_tables_show_every_config_and_the_verdict() -> None:
    slower = _result({"defaults": [70.0, 72.0, 71.0], "maxtp": [150.0, 151.0, 149.0]})
    gate = compare(slower, BASE, 0.10)
    text = format_text(slower, gate)
    assert "defaults" in text and "maxtp" in text and "2.11x" in text  # maxtp vs first
    assert "-29.0% REGRESSION, -29.0% REGRESSION" in text
    assert text.splitlines()[-1].endswith("FAILED against the baseline")
    md = format_markdown(slower, gate)
    assert md.startswith("### maxtp bench `train.py:job` **REGRESSION**")
    assert "| maxtp | 150.0 | 1.3% | " in md and "- **REGRESSION** defaults steady" in md
    assert "commit abc123def4" in md
    assert format_markdown(BASE).startswith("### maxtp bench `train.py:job`\n")


def test_a_baseline_without_this_run_s_configs_or_with_a_zero_reference_is_refused() -> None:
    with pytest.raises(ValueError, match="nothing to compare"):
        compare(_result({"bf16": [100.0]}), BASE)
    broken = BASE.to_dict()
    broken["runs"][0]["reference_samples_per_s"] = 0.0
    with pytest.raises(ValueError, match="reference rate is not > 0"):
        BenchResult.from_dict(broken)
