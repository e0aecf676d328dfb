"""What tuning may spend: its budget plus only what kept changes have already saved."""

from __future__ import annotations

import pytest

from lightning_maxtp.observe import JobContext, SamplerSeries, Window
from lightning_maxtp.tuning.cost import TuningCost


def _baseline() -> Window:
    return Window(
        step_time_s=(0.1,) * 10,
        data_wait_s=(0.0,) * 10,
        samples=(32,) * 10,
        sampler=SamplerSeries(),
        context=JobContext(),
    )


def test_only_savings_already_made_raise_the_budget() -> None:
    cost = TuningCost(blocked_s=1.0).budgeted(_baseline(), batches=1000, share=0.05)
    assert cost.budget_s == pytest.approx(5.0) and cost.left_s == pytest.approx(4.0)
    # Kept 2x faster 0 steps ago: nothing saved yet, however long the rest of the fit.
    assert cost.with_earnings(0, 320.0, 640.0).left_s == pytest.approx(4.0)
    # 40 steps at half the baseline's step time saved 40 x 0.05 s.
    earned = cost.with_earnings(40, 320.0, 640.0)
    assert earned.earned_s == pytest.approx(2.0) and earned.left_s == pytest.approx(6.0)
    assert cost.with_earnings(40, 320.0, 300.0).earned_s == 0.0  # slower: nothing earned


def test_an_overrun_is_said_in_the_report_and_none_otherwise() -> None:
    cost = TuningCost(blocked_s=6.8).budgeted(_baseline(), batches=460, share=0.05)
    assert cost.over_s == pytest.approx(6.8 - 2.3)
    assert "OVER BUDGET by 4.5 s" in str(cost) and cost.to_dict()["over_s"] == cost.over_s
    within = TuningCost(blocked_s=1.0).budgeted(_baseline(), batches=460, share=0.05)
    assert within.over_s == 0.0 and "OVER" not in str(within)


def test_savings_made_before_the_last_keep_stay_earned() -> None:
    cost = TuningCost().budgeted(_baseline(), batches=1000, share=0.05)
    # 10 baseline steps saved at earlier settings, then 40 steps at twice the rate.
    assert cost.with_earnings(40, 320.0, 640.0, banked_steps=10.0).earned_s == pytest.approx(
        (40 * 0.5 + 10) * 0.1
    )
