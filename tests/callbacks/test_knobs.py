"""``Knobs``: a trial's settings reach the loader or the main process's pools, and come back."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_info

from lightning_maxtp.callbacks.knobs import THREADS, Knobs
from lightning_maxtp.observe import BottleneckKind, Diagnosis, Recommendation
from lightning_maxtp.tuning.trials import next_change


class FakeLoader:
    def __init__(self) -> None:
        self.requested: list[dict[str, object]] = []
        self._settings = {"num_workers": 1, "prefetch_factor": 2}

    def settings(self) -> dict[str, object]:
        return dict(self._settings)

    def request(self, **settings: object) -> None:
        self.requested.append(settings)
        self._settings.update(settings)


def blas_threads() -> int:
    np.ones((4, 4)) @ np.ones((4, 4))
    return max(p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas")


@pytest.fixture
def two_threads() -> object:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_threads_apply_at_once_and_are_put_back(two_threads: object) -> None:
    loader = FakeLoader()
    knobs = Knobs(lambda: loader)  # type: ignore[arg-type, return-value]
    blas = blas_threads()
    assert knobs.settings() == {"num_workers": 1, "prefetch_factor": 2}  # unchanged: not listed
    assert knobs.current([THREADS, "num_workers"]) == {THREADS: 2, "num_workers": 1}
    knobs.request(**{THREADS: 1, "prefetch_factor": 4})
    assert torch.get_num_threads() == 1 and blas_threads() == 1
    assert loader.requested == [{"prefetch_factor": 4}]  # the loader never sees the threads
    assert knobs.settings() == {"num_workers": 1, "prefetch_factor": 4, THREADS: 1}
    knobs.threads.restore()
    assert torch.get_num_threads() == 2 and blas_threads() == blas
    knobs.threads.restore()  # idempotent
    assert torch.get_num_threads() == 2
    with pytest.raises(ValueError, match="`intra_op_threads` must be >= 1, got 0"):
        knobs.request(**{THREADS: 0})


def test_the_loop_offers_the_threads_knob_of_a_compute_bound_cpu_job() -> None:
    rec = Recommendation(THREADS, 2, 1, "1 worker(s) share 2 CPUs", True)
    found = (Diagnosis(BottleneckKind.COMPUTE, 0.8, "busy", recommendations=(rec,)),)
    settings = {"num_workers": 1, "prefetch_factor": 2, THREADS: 2}
    assert next_change(found, settings, set()) == (THREADS, 1, "1 worker(s) share 2 CPUs")
    assert next_change(found, settings, {(THREADS, "1")}) is None  # reverted once: not again
    assert next_change(found, {**settings, THREADS: 1}, set()) is None  # already in force


def test_a_remeasure_that_would_start_workers_past_the_budget_ends_the_trial_undecided() -> None:
    from types import SimpleNamespace

    from lightning_maxtp.callbacks.tuner import Tuner
    from lightning_maxtp.tuning.cost import TuningCost
    from lightning_maxtp.tuning.decisions import Remeasure
    from lightning_maxtp.tuning.switches import Switches

    # A 4 -> 0 worker trial looked like a gain; measuring the reference again restarts 4 workers.
    notes: list[str] = []
    tuner = Tuner.__new__(Tuner)
    vars(tuner).update(
        loop=SimpleNamespace(pending=({"num_workers": 4}, {"num_workers": 0}),
                             trial_knob="num_workers", trial_expected_gain=None, ref=None,
                             baseline=None, steps=0),
        knobs=SimpleNamespace(context=lambda: {"num_workers": 0}),
        switches=Switches(), note=notes.append, _cost=lambda: TuningCost(budget_s=0.1),
    )  # fmt: skip
    assert not tuner._remeasure_paid(Remeasure("old"))  # 0.3 s of starts, 0.1 s left
    assert notes and "re-measuring num_workers=4 would start workers" in notes[0]
    assert tuner._remeasure_paid(Remeasure("new"))  # to the main process: nothing starts
    vars(tuner)["_cost"] = lambda: TuningCost(budget_s=1.0)
    assert tuner._remeasure_paid(Remeasure("old"))
