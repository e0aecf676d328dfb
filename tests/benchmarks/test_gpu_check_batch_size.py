"""``benchmarks/gpu_check_batch_size.py``: its time-budget check follows the search's rule."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from benchmarks.gpu_check_batch_size import budget_kept
from lightning_maxtp.batch_size.search import TrialResult


def plan(*seconds: float) -> Any:
    trials = tuple(TrialResult(2**i, True, 1.0, None, s) for i, s in enumerate(seconds))
    return SimpleNamespace(trials=trials, seconds=sum(seconds))


def test_a_trial_started_in_time_may_end_past_the_budget_on_a_shared_cpu_only() -> None:
    # CI saw this: two slow trials on a loaded CPU, the second ending past 1.25x the budget.
    slow = plan(6.0, 7.0)
    ok, detail = budget_kept(slow, 10.0, 14.0, gpu=False)
    assert ok and "13.0 s search of 10 s" in detail
    assert budget_kept(slow, 10.0, 14.0, gpu=True)[0] is False
    assert budget_kept(plan(2.0, 3.0, 4.0), 10.0, 9.5, gpu=True)[0] is True


def test_a_trial_started_after_the_budget_was_spent_fails_everywhere() -> None:
    late = plan(6.0, 5.0, 0.5)
    for gpu in (False, True):
        ok, detail = budget_kept(late, 10.0, 12.0, gpu=gpu)
        assert not ok and "started after the budget: [4]" in detail
