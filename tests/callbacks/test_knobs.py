"""``Knobs``: a trial's settings reach the loader or the main process's pools, and come back."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_info
from torch.utils.data import DataLoader

from lightning_maxtp.callbacks.bottleneck_monitor import BottleneckMonitor
from lightning_maxtp.callbacks.knobs import THREADS, Knobs
from lightning_maxtp.callbacks.tuner import Tuner
from lightning_maxtp.loader.switchable import SwitchableLoader
from lightning_maxtp.observe import (
    BottleneckKind,
    Diagnosis,
    JobContext,
    Recommendation,
    SamplerSeries,
    Window,
)
from lightning_maxtp.tuning.config import TuningConfig
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
    knobs = Knobs()
    knobs.loader = loader  # type: ignore[assignment]
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


def _window(step_ms: float, workers: int) -> Window:
    """8 steps of 8 samples at ``step_ms``, none waiting on data."""
    return Window(
        step_time_s=(step_ms / 1e3,) * 8, data_wait_s=(0.0,) * 8, samples=(8,) * 8,
        sampler=SamplerSeries(), context=JobContext(num_workers=workers),
    )  # fmt: skip


def _fewer_workers_trial(
    settle_s: float,
    batches: int = 4000,
    expected: float | None = None,
    cost_share: float | None = 0.05,
) -> tuple[Tuner, SwitchableLoader]:
    """A real ``Tuner`` through a 4 -> 0 worker trial that looks like a gain (+25 %).

    Windows built by hand, the loader never iterated with workers. The fit is 4,000 steps of
    1 ms, so ``cost_share=0.05`` gives a 0.2 s budget: the trial (at worst 0.13 s to start the
    4 workers again on a revert) fits it. Its switch to the main process is charged what its
    settle step took beyond the reference's 1 ms: ``settle_s``. ``batches``, ``expected`` (the
    gain predicted for the trial) and ``cost_share`` change that fit.
    """
    config = TuningConfig(
        warmup_steps=1, window_steps=8, settle_steps=1, tune_loader=False, cost_share=cost_share
    )
    monitor = BottleneckMonitor(window_steps=8, sampler_interval_s=None, verbose=False)
    monitor.context = JobContext(device_type="cpu")
    tuner = Tuner(config, monitor, None, verbosity="quiet")
    loader = tuner.wrap(DataLoader(torch.arange(800), batch_size=8, num_workers=4))
    assert isinstance(loader, SwitchableLoader)
    trainer = SimpleNamespace(
        is_global_zero=True, world_size=1, global_step=0, estimated_stepping_batches=batches,
        accumulate_grad_batches=1, precision="32-true", lightning_module=torch.nn.Linear(2, 2),
        optimizers=[], strategy=SimpleNamespace(root_device=torch.device("cpu")),
    )  # fmt: skip
    tuner.adopt(trainer)  # type: ignore[arg-type]

    def step(seconds: float) -> None:  # a training step ends, as the monitor's clock logs it
        monitor.clock.step_log.append((monitor.clock.elapsed_s(), seconds, 0.0))
        tuner.on_step(trainer, None)  # type: ignore[arg-type]

    step(1e-3)  # the warm-up: the baseline window starts
    rec = Recommendation("num_workers", 4, 0, "4 workers take the step's cores", True, expected)
    found = (Diagnosis(BottleneckKind.COMPUTE, 0.8, "busy", recommendations=(rec,)),)
    tuner.measured(trainer, _window(1.0, workers=4), found)  # type: ignore[arg-type]
    assert tuner.loop.pending == ({"num_workers": 4}, {"num_workers": 0})
    assert cost_share is None or tuner.cost.budget_s == pytest.approx(0.2)
    next(iter(loader))  # the switch happens at the next batch: in the main process, no worker
    step(settle_s)  # its settle step
    assert tuner.cost.switch_s == pytest.approx(settle_s - 1e-3)
    tuner.measured(trainer, _window(0.8, workers=0), found)  # type: ignore[arg-type]
    return tuner, loader


# The loader is built with 4 workers on this 2-CPU machine (it never starts them): torch warns.
_FOUR_WORKERS = pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")


@_FOUR_WORKERS
@pytest.mark.parametrize("expected", [None, 0.3])
def test_a_remeasure_that_would_start_workers_past_the_budget_leaves_the_pair_to_decide(
    expected: float | None,
) -> None:
    # The switch cost 0.1 s of the 0.2 s budget: measuring the reference again would start the
    # 4 workers (about 0.13 s) past what is left. One
    # +25 % pair without a prediction is no evidence: the trial ends undecided, the 4 workers
    # back. Against a predicted +30 % it confirms the prediction (half of it and more): kept,
    # no worker started again.
    tuner, loader = _fewer_workers_trial(settle_s=0.101, expected=expected)
    (trial,) = tuner.trials
    assert (trial.knob, trial.old, trial.new) == ("num_workers", 4, 0)
    assert trial.gain == pytest.approx(0.25)
    kept = expected is not None
    assert (trial.verdict, trial.kept, trial.windows) == (
        "kept" if kept else "undecided", kept, 2,
    )  # fmt: skip
    assert loader.settings() == {
        "num_workers": 0 if kept else 4, "prefetch_factor": None if kept else 2,
        "pin_memory": False, "persistent_workers": False,
    }  # fmt: skip
    # Kept, no switch follows the trial's own; undecided, the 4 workers come back.
    changes = [c.reason.split(":")[0] for c in tuner.knob_changes]
    assert changes == (["trying"] if kept else ["trying", "undecided"])
    assert any(
        n.startswith("num_workers: re-measuring num_workers=4 would start workers")
        and n.endswith("past the budget left (0.10 s): decided on the windows measured")
        for n in tuner.notes
    ), tuner.notes
    loader.shutdown()


@_FOUR_WORKERS
@pytest.mark.parametrize("expected", [0.3, None])
def test_a_trial_near_the_fits_end_is_decided_on_its_first_pair(expected: float | None) -> None:
    # 16 steps: after the warm-up and the settle step, 14 are left, and measuring the reference
    # and the trial again needs 18 (8 + 8, each after a settle step). The +25 % pair is kept:
    # it reaches half of a predicted +30 %, and without a prediction the rest of the fit at
    # its rate still ends sooner than at the reference's. Tuning stops: no other trial fits.
    tuner, loader = _fewer_workers_trial(1e-3, batches=16, expected=expected, cost_share=None)
    (trial,) = tuner.trials
    assert trial.windows == 2 and trial.gain == pytest.approx(0.25)
    assert (trial.verdict, trial.kept) == ("kept", True)
    assert loader.settings()["num_workers"] == 0
    assert tuner.loop.finished and tuner.loop.stop_reason.startswith("the fit ends in 14 steps")
    assert not tuner.loop.converged  # not carried into the next fit: one pair decided it
    loader.shutdown()
    # With the steps for it, the same pair is measured again.
    tuner, loader = _fewer_workers_trial(1e-3, batches=4000, expected=expected, cost_share=None)
    assert tuner.trials == [] and tuner.loop.trial_windows == 2
    loader.shutdown()


@_FOUR_WORKERS
def test_a_remeasure_the_budget_pays_for_measures_the_reference_again() -> None:
    # The same trial with a switch that cost nothing beyond its step: the 4 workers' start is
    # paid, so the reference is measured again instead of a verdict.
    tuner, loader = _fewer_workers_trial(settle_s=1e-3)
    assert tuner.trials == [] and tuner.loop.trial_windows == 2
    assert loader.settings()["num_workers"] == 4  # requested again, for the reference
    assert tuner.knob_changes[-1].reason == "re-measuring the reference"
    assert not any("re-measuring num_workers=4 would start workers" in n for n in tuner.notes)
    loader.shutdown()
