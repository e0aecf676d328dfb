"""The regression gate and the result's JSON and tables (pure: records made up here)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from lightning_maxtp.bench import BenchResult, compare, format_markdown, format_text
from lightning_maxtp.bench.gate import slower_rounds_needed
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


def _paired(rates: list[float], against: list[float]) -> tuple[BenchResult, BenchResult]:
    """(against's side, target's side) of one paired bench, ``defaults`` only."""

    def side(values: list[float], target: str, **extra: Any) -> BenchResult:
        made = _result({"defaults": values})
        params = {**made.params, "reference": None, "paired": True, "rounds": len(values)}
        # A paired run times no reference workload.
        runs = tuple({**r, "reference_samples_per_s": None} for r in made.runs)
        fields = {**made.__dict__, "target": target, "runs": runs}
        return BenchResult(**{**fields, "params": {**params, **extra}})

    base = side(against, "base/train.py:job")
    return base, side(rates, "train.py:job", against="base/train.py:job")


def test_the_paired_gate_judges_each_round_against_its_own_pair() -> None:
    # The machine drifts 30 % between rounds; the job's rate per round keeps pace with its
    # pair's: no regression, though the spreads of the two sides overlap everywhere.
    drift = [101.0, 70.0, 131.0, 87.0, 109.0]
    base, same = _paired([100.0, 72.0, 129.0, 88.0, 110.0], drift)
    assert compare(same, base, 0.05, "paired").passed
    # 10 % slower in every round (give or take 1 %), through the same drift: caught, though
    # each of its rounds lies inside the other side's range (a stored baseline could not see it).
    slower = [f * v for f, v in zip((0.9, 0.91, 0.89, 0.9, 0.9), drift, strict=True)]
    base, slow = _paired(slower, drift)
    gate = compare(slow, base, 0.05, "paired", "--against base/train.py:job")
    # The job's speed fails the gate; the whole fit's rate fell as much, and is only shown.
    assert not gate.passed and {c.metric for c in gate.regressions} == {"steady"}
    assert gate.notes == (
        "defaults whole-fit samples/s: median of the rounds' ratios -10.0%, shown, not gated "
        "(start-up moves it run to run more than the job's own speed does)",
    )
    check = gate.regressions[0]
    assert check.pairs == pytest.approx((0.9, 0.91, 0.89, 0.9, 0.9))
    assert check.change == pytest.approx(-0.1)
    assert "5 of 5 rounds slower, 5 needed; ratio per round 0.900 0.910 0.890" in str(check)
    assert "(paired, limit -5%, most rounds slower): FAILED" in str(gate)
    assert "(a sign test)" in format_markdown(slow, gate)
    assert "paired with 'base/train.py:job'" in format_text(slow, gate)


def test_the_paired_gate_needs_the_median_past_the_limit_and_enough_slower_rounds() -> None:
    # The median 20 % down, but one of five rounds as fast as before: with five rounds, only
    # all five slower is rarer than 1 in 20 by chance.
    base, one_fast = _paired([80.0, 80.0, 101.0, 80.0, 80.0], [100.0] * 5)
    assert compare(one_fast, base, 0.05, "paired").passed
    # With twenty, 15 slower rounds are enough, however wild the other five (30 % off).
    twenty = [90.0] * 15 + [130.0] * 5
    base, mostly = _paired(twenty, [100.0] * 20)
    assert not compare(mostly, base, 0.05, "paired").passed
    base, fourteen = _paired([90.0] * 14 + [130.0] * 6, [100.0] * 20)
    assert compare(fourteen, base, 0.05, "paired").passed
    # Every round slower, but by less than the limit.
    base, slightly = _paired([97.0, 98.0, 96.0, 97.5, 97.0], [100.0] * 5)
    assert compare(slightly, base, 0.05, "paired").passed
    assert not compare(slightly, base, 0.02, "paired").passed


def test_the_slower_rounds_needed_are_those_chance_gives_at_most_1_time_in_20() -> None:
    assert [slower_rounds_needed(n) for n in (3, 4, 5, 6, 10, 20)] == [None, None, 5, 6, 9, 15]


def test_paired_and_stored_results_do_not_mix() -> None:
    base, mine = _paired([100.0] * 5, [100.0] * 5)
    with pytest.raises(ValueError, match="timed no reference workload; gate it with"):
        compare(mine, BASE)
    with pytest.raises(ValueError, match="were not timed together"):
        compare(BASE, BASE, gate="paired")
    other = BenchResult(**{**base.__dict__, "target": "other.py:job"})
    with pytest.raises(ValueError, match=r"paired with 'base/train\.py:job', not with 'other\.py"):
        compare(mine, other, gate="paired")
    # Its JSON reads back although no run timed a reference.
    again = BenchResult.from_dict(json.loads(json.dumps(mine.to_dict())))
    assert "steady_per_reference" not in again.summary("defaults")
