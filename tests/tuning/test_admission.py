"""The budget on expected loss: within the budget, or past it on a strong prediction."""

from __future__ import annotations

import math

import pytest

from lightning_maxtp.tuning.admission import PREDICTED_NET_FACTOR, admit


def test_a_trial_whose_worst_case_fits_the_budget_left_starts_on_the_budget() -> None:
    admission = admit(0.3, 0.5)
    assert admission is not None and admission.rule == "budget"
    assert str(admission) == "within the budget (0.30 s at worst, 0.50 s left)"
    assert admit(0.3, math.inf) is not None  # no budget: only the time limit bounds tuning


def test_past_the_budget_only_a_strong_prediction_several_times_the_risk_starts() -> None:
    # The waiting loader: 0.28 s at worst, 0.23 s left, a 40 s rest predicted 8x faster
    admission = admit(0.28, 0.23, expected_gain=7.0, rest_s=40.0, strong=True)
    assert admission is not None and admission.rule == "predicted"
    assert admission.net_s == pytest.approx(40 * 7 / 8 - 0.28)
    assert "past the budget on a strong prediction: 34.7 s predicted net gain" in str(admission)
    assert admission.to_dict()["rule"] == "predicted"
    # The same prediction on weak evidence, or with no prediction, or no known length: not.
    assert admit(0.28, 0.23, expected_gain=7.0, rest_s=40.0, strong=False) is None
    assert admit(0.28, 0.23, expected_gain=None, rest_s=40.0, strong=True) is None
    assert admit(0.28, 0.23, expected_gain=7.0, rest_s=None, strong=True) is None
    # A net gain under the factor times the risk: not (0.28 s at worst, a 2 s rest at +20 %).
    net = 2.0 * 0.2 / 1.2 - 0.28
    assert net < PREDICTED_NET_FACTOR * 0.28
    assert admit(0.28, 0.23, expected_gain=0.2, rest_s=2.0, strong=True) is None
