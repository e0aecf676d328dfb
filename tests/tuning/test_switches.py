from __future__ import annotations

import pytest

from lightning_maxtp.tuning.switches import (
    LOSING_SHARE,
    PER_WORKER_S,
    WORKER_START_S,
    Switches,
    only_persists,
    queued_batches,
    settle_excess_s,
    starts_workers,
    trial_risk_s,
    worker_starts,
)

LOADER = {"num_workers": 4, "prefetch_factor": 2, "pin_memory": False, "persistent_workers": True}
RESTARTING = LOADER | {"persistent_workers": False}
MAIN = {"num_workers": 0, "prefetch_factor": None, "pin_memory": False, "persistent_workers": False}


def test_settle_steps_cost_only_their_excess_over_the_reference() -> None:
    assert settle_excess_s([0.3, 0.1, 0.1], 0.1) == pytest.approx(0.2)
    assert settle_excess_s([0.05, 0.05], 0.1) == 0.0  # faster settings cost nothing
    assert settle_excess_s([], 0.1) == 0.0


@pytest.mark.parametrize(
    ("change", "settings", "to", "starts"),
    [
        ({"num_workers": 1}, MAIN, True, [1]),  # to workers; back to the main process: free
        ({"num_workers": 0}, LOADER, False, [4]),  # stopping workers is free; back starts them
        ({"num_workers": 2}, LOADER, True, [2, 4]),
        ({"prefetch_factor": 8}, LOADER, True, [4, 4]),  # new workers each way
        ({"prefetch_factor": 4}, LOADER | {"prefetch_factor": 4}, False, []),  # no change
        ({"intra_op_threads": 1}, LOADER, False, []),  # not the loader's
        ({"precision": "bf16-mixed"}, MAIN, False, []),
        # Persistent workers start once: going back restarts them, as each epoch already does.
        ({"persistent_workers": True}, RESTARTING, True, [4]),
        ({"persistent_workers": True, "num_workers": 2}, RESTARTING, True, [2, 4]),
    ],
)
def test_worker_starts_are_counted_each_way(
    change: dict[str, object], settings: dict[str, object], to: bool, starts: list[int]
) -> None:
    assert starts_workers(change, settings) is to
    assert worker_starts(change, settings) == starts


def test_a_trial_risks_its_worker_starts_and_its_first_steps() -> None:
    assert trial_risk_s([0.3, 0.3], 4, 0.01) == pytest.approx(0.6 + 4 * 0.01 * LOSING_SHARE)
    assert trial_risk_s([], 4, 0.25) == pytest.approx(4 * 0.25 * LOSING_SHARE)


def test_only_persisting_the_same_workers_slows_no_step() -> None:
    assert only_persists({"persistent_workers": True}, RESTARTING)
    assert only_persists({"persistent_workers": True, "num_workers": 4}, RESTARTING)  # same
    assert not only_persists({"persistent_workers": True, "num_workers": 2}, RESTARTING)
    assert not only_persists({"persistent_workers": True}, MAIN)  # no workers to keep
    assert not only_persists({"persistent_workers": False}, LOADER)  # restarting them
    assert not only_persists({"prefetch_factor": 4}, RESTARTING)


def test_switches_charge_once_per_settle_and_learn_what_a_start_costs() -> None:
    switches = Switches()
    # The prior, before any start was measured: more workers take longer to start.
    assert switches.start_s(4) == pytest.approx(WORKER_START_S + 4 * PER_WORKER_S)
    assert switches.start_s(1) < switches.start_s(4)
    switches.mark(10, starts=0)
    switches.mark(12, starts=4)  # a revert and the next trial before one window: one settle
    assert switches.pending_from == 10 and switches.starts == 4
    assert switches.charge([0.5, 0.1], 0.1) == pytest.approx(0.4)
    assert switches.pending_from is None
    assert switches.measured == [], "two switches run together say nothing of one start"
    switches.mark(20, starts=4, queued=12)
    assert switches.queued == 12
    assert switches.charge([0.5, 0.1], 0.1) == pytest.approx(0.4)
    assert switches.queued == 0
    assert switches.measured == [], "rated once the window after it closes"
    switches.rate_start(0.1)
    assert switches.measured == [(pytest.approx(0.4), 4)]
    switches.rate_start(0.1)  # nothing left to rate
    assert switches.measured == [(pytest.approx(0.4), 4)]
    # Measured: 4 workers took 0.4 s, the prior's ratio for that count scales every count.
    scale = 0.4 / (WORKER_START_S + 4 * PER_WORKER_S)
    assert switches.start_s(4) == pytest.approx(0.4)
    assert switches.start_s(12) == pytest.approx(scale * (WORKER_START_S + 12 * PER_WORKER_S))
    assert switches.per_start == pytest.approx((scale * WORKER_START_S, scale * PER_WORKER_S))
    switches.mark(30, starts=0)  # a thread change: charged, yet no start to learn from
    assert switches.charge([0.2], 0.1) == pytest.approx(0.1)
    switches.rate_start(0.1)
    assert switches.measured == [(pytest.approx(0.4), 4)]
    # Against the step of the settings started, not the reference's: workers that follow a
    # slow reference (0.1 s a step) start in 0.5 s, then serve 0.01 s steps.
    fast = Switches()
    fast.mark(0, starts=8)
    assert fast.charge([0.5] + [0.01] * 9, 0.1) == pytest.approx(0.0)  # no slower than before
    fast.rate_start(0.01)
    assert fast.measured == [(pytest.approx(0.49), 8)]
    # A start measured at nothing still predicts half the prior.
    quick = Switches(measured=[(0.0, 2)])
    assert quick.start_s(2) == pytest.approx(0.5 * (WORKER_START_S + 2 * PER_WORKER_S))


def test_the_batches_queued_after_a_start_are_a_turn_more_than_the_prefetched() -> None:
    assert queued_batches(4, 2) == 12
    assert queued_batches(22, 4) == 110
    assert queued_batches(0, 2) == 0
