"""Short epochs: the baseline ends with the first epoch, its epoch starts predicted.

A worker start that takes ``START_S`` (spun, not slept: a sleep overshoots here) makes the
fit's first fetch, and every later epoch start of workers that do not persist, that long.
"""

from __future__ import annotations

import dataclasses
import time

import lightning.pytorch as pl
import pytest
from torch.utils.data import DataLoader

from lightning_maxtp.callbacks import MaxThroughputCallback
from lightning_maxtp.callbacks.step_clock import StepClock
from lightning_maxtp.observe.window import JobContext, Window, aligned_epochs
from tests.helpers.loader_data import SleepDataset
from tests.helpers.models import MatmulModel

START_S = 0.5
# The epoch's start is timed from Lightning's ``on_train_epoch_start``, which may come a little
# after the loader's workers were started (on a loaded machine, a tenth of a second measured):
# the tests ask for half of ``START_S``.


def _slow_start(worker_id: int) -> None:
    end = time.perf_counter() + START_S
    while time.perf_counter() < end:
        pass


def _fit(
    callback: pl.Callback, *, batches: int, persistent: bool, epochs: int, slow: bool = True
) -> None:
    # A step that computes: no baseline closes early as waiting on data beyond doubt.
    pl.seed_everything(7, verbose=False)
    data = SleepDataset(8 * batches, 0.0, dim=32)
    loader = DataLoader(
        data, batch_size=8, num_workers=2, persistent_workers=persistent,
        worker_init_fn=_slow_start if slow else None,
    )  # fmt: skip
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=epochs, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[callback],
    )  # fmt: skip
    trainer.fit(MatmulModel(), loader)


def test_a_window_before_any_epoch_start_carries_the_first_fetchs_worker_start() -> None:
    # Windows one epoch long: the first one holds no epoch start, the ones after it each hold
    # one, measured.
    clock = StepClock(window_steps=12, sampler_interval_s=None, mfu=False)
    _fit(clock, batches=12, persistent=False, epochs=2)
    first, second = clock.windows[:2]
    assert not any(first.epoch_start) and any(second.epoch_start)
    assert first.epoch_predicted and first.carried_epoch_s is not None
    start, validation = first.carried_epoch_s
    assert start >= START_S / 2, first.carried_epoch_s
    assert validation == 0.0  # no validation loader follows a plain clock's settings
    assert first.fit_samples_per_s < first.samples_per_s
    assert not second.epoch_predicted
    # A second fit with the same clock reads its own first fetch (workers that start at once),
    # not the first fit's, and its first step is no epoch boundary. (What the first fit
    # measured of its epoch starts is carried: the same settings, the same loader, as a rule.)
    assert clock._first_fetch is not None
    slow_fetch = clock._first_fetch[1]
    _fit(clock, batches=12, persistent=False, epochs=1, slow=False)
    assert not any(clock.windows[-1].epoch_start)
    assert clock._first_fetch is not None and clock._first_fetch[1] < slow_fetch - START_S / 2


@pytest.mark.parametrize("persistent", [True, False])
def test_no_worker_start_is_predicted_for_workers_that_persist_nor_with_longer_epochs(
    persistent: bool,
) -> None:
    # Persistent workers start once: the epoch's end alone is left to the first boundary
    # measured. With epochs longer than the windows, the windows of other settings hold no
    # epoch start either, and none is charged one.
    clock = StepClock(window_steps=12, sampler_interval_s=None, mfu=False)
    _fit(clock, batches=12, persistent=persistent, epochs=1)
    first = clock.windows[0]
    if persistent:
        assert first.epoch_predicted and first.carried_epoch_s == (0.0, 0.0)
    longer = StepClock(window_steps=6, sampler_interval_s=None, mfu=False)
    _fit(longer, batches=12, persistent=persistent, epochs=1)
    assert longer.windows[0].carried_epoch_s is None and not longer.windows[0].epoch_predicted


def _steps(start: float = 0.0, gap: float = 0.0, *, following: int = 0, n: int = 12) -> Window:
    """``n`` steps of 0.1 s; with ``start`` or ``gap``, the first begins an epoch."""
    boundary = bool(start or gap)
    return Window(
        step_time_s=(0.1 + start,) + (0.1,) * (n - 1), data_wait_s=(0.0,) * n,
        samples=(32,) * n, gap_s=(gap,) + (0.0,) * (n - 1),
        epoch_start=(boundary,) + (False,) * (n - 1),
        context=JobContext(num_workers=4, epoch_batches=12, loaders_following=following),
    )  # fmt: skip


def test_a_predicted_epoch_start_takes_what_a_measured_one_holds_beyond_worker_starts() -> None:
    ref = dataclasses.replace(
        _steps(following=1, n=8), carried_epoch_s=(0.4, 0.4), epoch_predicted=True
    )
    # The trial's boundary: its train workers start in 0.05 s; its gap, 0.35 s, is validation
    # (0.3 s, the same under any settings) and its validation loader's worker start (0.05 s).
    trial = _steps(0.05, 0.35, following=1)
    aligned = aligned_epochs(ref, trial)
    assert aligned.carried_epoch_s == pytest.approx((0.4, 0.3 + 0.4))
    assert aligned.fit_samples_per_s < ref.fit_samples_per_s
    # Against a window that measured no boundary, both are compared by their steps alone.
    plain = aligned_epochs(ref, _steps())
    assert plain.carried_epoch_s is None and plain.fit_samples_per_s == plain.samples_per_s
    # A measured reference is left as it is.
    measured = _steps(0.4, 0.7, following=1)
    assert aligned_epochs(measured, trial) is measured


def _callback() -> MaxThroughputCallback:
    return MaxThroughputCallback(
        tune_loader=False, verbose=False, sampler_interval_s=0.05, cost_share=None
    )


def test_a_baseline_over_short_epochs_ends_with_the_first_one() -> None:
    callback = _callback()
    _fit(callback, batches=12, persistent=False, epochs=3)
    ref = callback._monitor.clock.windows[0]  # the baseline: the first window measured
    assert ref.first_step + ref.steps == 12, "the baseline ends at the first epoch's last step"
    assert ref.steps >= 8 and not any(ref.epoch_start)
    assert ref.carried_epoch_s is not None and ref.carried_epoch_s[0] >= START_S / 2


def test_epochs_too_short_for_a_baseline_before_their_end_keep_it_one_epoch_long() -> None:
    callback = _callback()
    _fit(callback, batches=9, persistent=False, epochs=3)
    ref = callback._monitor.clock.windows[0]
    assert ref.steps == 9 and any(ref.epoch_start)
