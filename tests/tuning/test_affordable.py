"""Whether a fit can pay for a trial, on constructed numbers (no Trainer, no loader)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from lightning_maxtp.observe import JobContext, SamplerSeries, Window
from lightning_maxtp.tuning.affordable import (
    Funds,
    admitted,
    affordable,
    may_try_one_more,
    remeasure_refused,
    sized,
    start_s,
    unpaid,
    worst_case_s,
)
from lightning_maxtp.tuning.decisions import Try
from lightning_maxtp.tuning.switches import LOSING_SHARE, PER_WORKER_S, WORKER_START_S, Switches

MAIN = {"num_workers": 0, "prefetch_factor": None, "pin_memory": False, "persistent_workers": False}
RESTARTING = {
    "num_workers": 4,
    "prefetch_factor": 2,
    "pin_memory": False,
    "persistent_workers": False,
}
START_4 = WORKER_START_S + 4 * PER_WORKER_S
"""The prior for starting 4 workers (0.13 s), before any start was measured."""


def _steps_s(steps: int, step_s: float) -> float:
    return steps * step_s * LOSING_SHARE


def test_a_trial_risks_its_worker_starts_and_a_turn_of_its_first_steps() -> None:
    funds = Funds(ref_step_s=0.01)
    # New workers each way, and 4 steps (a quarter of 16, one turn of 4 workers) at risk.
    risk = worst_case_s({"prefetch_factor": 4}, RESTARTING, funds, window_steps=16)
    assert risk == pytest.approx(2 * START_4 + _steps_s(4, 0.01))
    # 8 new workers deliver in bursts of 8: the early read waits for one whole turn of them.
    risk = worst_case_s({"num_workers": 8}, MAIN, funds, window_steps=16)
    assert risk == pytest.approx(WORKER_START_S + 8 * PER_WORKER_S + _steps_s(8, 0.01))
    # A knob outside the loader starts no worker; its first steps are still at risk.
    assert worst_case_s({"intra_op_threads": 1}, RESTARTING, funds, window_steps=16) == (
        pytest.approx(_steps_s(4, 0.01))
    )
    # Without a reference step there is nothing to lose per step.
    assert worst_case_s({"intra_op_threads": 1}, RESTARTING, Funds(), window_steps=16) == 0.0


def test_a_change_that_only_makes_workers_persistent_has_no_early_step_risk() -> None:
    # The same workers load the same batches: only their one start is at risk.
    funds = Funds(ref_step_s=0.01)
    change = {"persistent_workers": True}
    assert worst_case_s(change, RESTARTING, funds, window_steps=16) == pytest.approx(START_4)
    # Persistence with a new worker count is a new loader: starts each way, its first steps too.
    moved = {"persistent_workers": True, "num_workers": 2}
    both_ways = WORKER_START_S + 2 * PER_WORKER_S + START_4
    assert worst_case_s(moved, RESTARTING, funds, window_steps=16) == (
        pytest.approx(both_ways + _steps_s(4, 0.01))
    )


def test_a_start_is_priced_at_the_dearest_start_measured_so_far() -> None:
    assert start_s(4, ()) == pytest.approx(START_4)
    assert start_s(4, [(0.5, 4)]) == pytest.approx(0.5)  # measured: 4 workers took 0.5 s
    assert start_s(8, [(0.5, 4)]) == pytest.approx(Switches(measured=[(0.5, 4)]).start_s(8))
    funds = Funds(ref_step_s=0.01, measured_starts=((0.5, 4),))
    assert worst_case_s({"persistent_workers": True}, RESTARTING, funds, window_steps=16) == (
        pytest.approx(0.5)
    )


def _strong(**changes: Any) -> Funds:
    """Past the budget, 40 s of fit left at the baseline rate, the steps waiting on data."""
    args = {"left_s": 0.0, "rest_s": 40.0, "baseline_rate": 100.0, "ref_rate": 100.0,
            "ref_step_s": 0.01, "ref_wait_share": 0.5} | changes  # fmt: skip
    return Funds(**args)


def test_within_the_budget_left_a_trial_starts_with_or_without_a_prediction() -> None:
    admission = admitted(0.5, Funds(left_s=1.0), expected_gain=None)
    assert admission is not None and admission.rule == "budget"
    assert admitted(1.5, Funds(left_s=1.0), expected_gain=None) is None


def test_past_the_budget_the_rest_of_the_fit_counts_at_the_rate_in_force() -> None:
    # 40 s at the baseline rate predicted 2x faster: 20 s saved less 3 s at worst, 17 s >= 3 x 3.
    admission = admitted(3.0, _strong(), expected_gain=1.0)
    assert admission is not None and admission.rule == "predicted"
    assert admission.net_s == pytest.approx(17.0)
    # A kept change already doubled the rate: 20 s left, 10 s to save, 7 s net < 9 s: refused.
    faster = _strong(ref_rate=200.0)
    assert faster.rest_now_s == pytest.approx(20.0)
    assert admitted(3.0, faster, expected_gain=1.0) is None
    assert admitted(3.0, _strong(rest_s=None), expected_gain=1.0) is None  # unknown length


def test_past_the_budget_only_strong_evidence_admits_a_prediction() -> None:
    assert admitted(3.0, _strong(ref_wait_share=0.30), expected_gain=1.0) is not None
    assert admitted(3.0, _strong(ref_wait_share=0.29), expected_gain=1.0) is None
    assert admitted(3.0, _strong(ref_wait_share=None), expected_gain=1.0) is None  # no reference
    assert admitted(3.0, _strong(), expected_gain=None) is None


def test_a_risk_past_the_budget_starts_only_on_a_strong_predicted_net_gain() -> None:
    # The waiting loader: 4 workers at worst 0.15 s (their start, 4 steps), 0.10 s left.
    change = Try("num_workers", {"num_workers": 4}, "steps wait on data", expected_gain=7.0)
    risk = START_4 + _steps_s(4, 0.01)
    admission = affordable(change, MAIN, _strong(left_s=0.1, ref_wait_share=0.8), window_steps=16)
    assert admission is not None and admission.rule == "predicted"
    assert admission.risk_s == pytest.approx(risk)
    unpredicted = Try("num_workers", {"num_workers": 4}, "steps wait on data")
    assert affordable(unpredicted, MAIN, _strong(left_s=0.1), window_steps=16) is None
    weak = _strong(left_s=0.1, ref_wait_share=0.1)
    assert affordable(change, MAIN, weak, window_steps=16) is None
    within = affordable(unpredicted, MAIN, _strong(left_s=0.2), window_steps=16)
    assert within is not None and within.rule == "budget"


def test_making_workers_persistent_fits_a_budget_a_new_loader_does_not() -> None:
    funds = Funds(left_s=START_4 + 0.01, ref_step_s=0.01)
    persist = Try("persistent_workers", {"persistent_workers": True}, "restarts each epoch")
    prefetch = Try("prefetch_factor", {"prefetch_factor": 4}, "absorb variation")
    assert affordable(persist, RESTARTING, funds, window_steps=16) is not None
    assert affordable(prefetch, RESTARTING, funds, window_steps=16) is None


def test_a_change_not_paid_for_says_what_it_may_cost_and_what_is_left() -> None:
    change = Try("num_workers", {"num_workers": 4}, "steps wait on data")
    assert unpaid(change, 0.284, -0.5) == (
        "num_workers num_workers=4 may cost 0.28 s before a window can revert it (worker "
        "starts, its first steps), 0.00 s of the budget is left"
    )


def test_re_measuring_is_paid_for_before_it_starts_workers() -> None:
    def refused(target: dict[str, Any], settings: dict[str, Any], funds: Funds) -> str | None:
        return remeasure_refused("num_workers", target, settings, funds, expected_gain=None)

    workers = {"num_workers": 4}
    # Going back to the main process starts nothing: free, whatever the budget.
    assert refused(MAIN, RESTARTING, Funds(left_s=-1.0)) is None
    assert refused(workers, MAIN, Funds(left_s=0.2)) is None
    assert refused(workers, MAIN, Funds(left_s=0.1)) == (
        "num_workers: re-measuring num_workers=4 would start workers (about 0.13 s) past the "
        "budget left (0.10 s): decided on the windows measured"
    )
    # The reference's window at its slower measured rate counts too: 0.13 s of start and
    # 0.2 s of a slower window are 0.33 s, past 0.2 s left.
    assert remeasure_refused(
        "num_workers", workers, MAIN, Funds(left_s=0.2), expected_gain=None, loss_s=0.2
    ) == (
        "num_workers: re-measuring num_workers=4 would start workers and 0.20 s of a slower "
        "window (about 0.33 s) past the budget left (0.20 s): decided on the windows measured"
    )
    # The trial's strong prediction admits its re-measurement past the budget, as its start.
    strong = _strong(left_s=0.1, ref_wait_share=0.8)
    assert remeasure_refused("num_workers", workers, MAIN, strong, expected_gain=7.0) is None


def _waiting(steps: int = 16) -> Window:
    """No workers; the steps wait 40 of their 50 ms on reads that cost little CPU."""
    return Window(
        step_time_s=(0.05,) * steps, data_wait_s=(0.04,) * steps, samples=(32,) * steps,
        wait_cpu_s=(0.002,) * steps, sampler=SamplerSeries(),
        context=JobContext(num_workers=0, cpus_per_rank=4, device_type="cuda"),
    )  # fmt: skip


WORKERS = Try("num_workers", {"num_workers": 4}, "steps wait on data", expected_gain=3.0)
PRIOR = Switches().per_start


def _sized(batches: float | None, start: tuple[float, float] = PRIOR, **kw: Any) -> Try | str:
    args = {"change": WORKERS, "window": _waiting()} | kw
    return sized(**args, batches=batches, steps_done=16, per_start=start, most=None)


def test_a_long_fit_gets_the_workers_the_model_ranks_best() -> None:
    assert _sized(1000.0) is WORKERS


def test_a_shorter_fit_gets_fewer_workers_and_a_very_short_one_none() -> None:
    # 4 batches left (128 samples): 3 workers finish sooner than 4 once their start counts.
    fewer = _sized(20.0)
    assert isinstance(fewer, Try) and fewer.settings == {"num_workers": 3}
    assert fewer.why == "steps wait on data; for the 128 samples left, 3 workers"
    assert fewer.expected_gain == pytest.approx(2.75)
    # 2 batches left: no count saves its start.
    none = _sized(18.0)
    assert isinstance(none, str)
    assert none.startswith(
        "num_workers=4 not tried: for the 64 samples left, starting them costs more than they "
        "would save (the job model predicts"
    )


def test_starts_measured_dearer_size_the_workers_down() -> None:
    dear = Switches(measured=[(2.0, 4)]).per_start
    assert isinstance(_sized(60.0, dear), str)  # at the prior: 4 workers pay (below)
    assert _sized(60.0) is WORKERS
    assert _sized(200.0, dear) is WORKERS  # a longer fit still pays for them


@pytest.mark.parametrize(
    "kw",
    [
        {"change": Try("prefetch_factor", {"prefetch_factor": 4}, "absorb", expected_gain=3.0)},
        {"change": Try("num_workers", {"num_workers": 4}, "no prediction")},
        {"window": None},
        {"batches": float("inf")},  # a fit of unknown length
        {"batches": None},
    ],
)
def test_only_a_predicted_worker_change_on_a_fit_of_known_length_is_sized(
    kw: dict[str, Any],
) -> None:
    batches = kw.pop("batches", 18.0)  # short enough to turn any sized change down
    change = kw.get("change", WORKERS)
    assert _sized(batches, **kw) is change


def test_persistent_workers_are_not_tried_in_the_fits_last_epoch() -> None:
    persist = Try("persistent_workers", {"persistent_workers": True}, "restarts", 0.2)
    window = _waiting()
    window = dataclasses.replace(
        window, context=dataclasses.replace(window.context, num_workers=4, epoch_batches=100)
    )
    # Step 16 of a 100-step epoch: a fit of 100 batches ends in it, one of 101 starts another.
    last = sized(persist, window, batches=100.0, steps_done=16, per_start=PRIOR, most=None)
    assert isinstance(last, str)
    assert last == (
        "persistent_workers=True not tried: the fit ends within this epoch (84 steps left), "
        "with no worker restart left to save"
    )
    for batches in (101.0, 400.0):
        kept = sized(persist, window, batches=batches, steps_done=16, per_start=PRIOR, most=None)
        assert kept is persist
    # From step 316 of a 400-step fit (its fourth epoch), none is left either.
    assert isinstance(
        sized(persist, window, batches=400.0, steps_done=316, per_start=PRIOR, most=None), str
    )
    # Epochs of unknown length, or a fit of unknown length: left as proposed.
    unknown = dataclasses.replace(
        window, context=dataclasses.replace(window.context, epoch_batches=None)
    )
    assert (
        sized(persist, unknown, batches=100.0, steps_done=16, per_start=PRIOR, most=None) is persist
    )
    assert (
        sized(persist, window, batches=math.inf, steps_done=16, per_start=PRIOR, most=None)
        is persist
    )


def test_workers_tried_persistent_are_tried_restarting_in_the_fits_last_epoch() -> None:
    both = Try("num_workers", {"num_workers": 4, "persistent_workers": True}, "wait", 3.0)
    window = _waiting()
    window = dataclasses.replace(
        window, context=dataclasses.replace(window.context, epoch_batches=100)
    )
    last = sized(both, window, batches=100.0, steps_done=16, per_start=PRIOR, most=None)
    assert isinstance(last, Try) and last.settings == {"num_workers": 4}
    more = sized(both, window, batches=1000.0, steps_done=16, per_start=PRIOR, most=None)
    assert more is both


def test_one_more_trial_only_after_tuning_converged_on_a_measured_baseline() -> None:
    ready = {"converged": True, "switchable": True, "settling": False, "baseline_measured": True}
    assert may_try_one_more(**ready)
    assert not may_try_one_more(**ready | {"converged": False})  # stopped by its budget or time
    assert not may_try_one_more(**ready | {"switchable": False})
    assert not may_try_one_more(**ready | {"settling": True})  # the steps after an undo
    assert not may_try_one_more(**ready | {"baseline_measured": False})  # carried settings


def test_funds_read_back_as_plain_data() -> None:
    funds = Funds(left_s=math.inf, measured_starts=((0.4, 4),))
    assert funds.to_dict()["left_s"] is None and funds.to_dict()["measured_starts"] == [[0.4, 4]]
    assert Funds(left_s=0.5).to_dict()["left_s"] == 0.5
