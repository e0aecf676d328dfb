"""Short epochs: the baseline ends with the first epoch, its epoch starts predicted.

A worker start that takes ``START_S`` (spun, not slept: a sleep overshoots here) makes the
fit's first fetch, and every later epoch start of workers that do not persist, that long.
"""

from __future__ import annotations

import time

import lightning.pytorch as pl
import pytest
from torch.utils.data import DataLoader

from lightning_maxtp.callbacks import MaxThroughputCallback
from lightning_maxtp.callbacks.step_clock import StepClock
from tests.helpers.loader_data import SleepDataset
from tests.helpers.models import MatmulModel

START_S = 0.3


def _slow_start(worker_id: int) -> None:
    end = time.perf_counter() + START_S
    while time.perf_counter() < end:
        pass


def _fit(callback: pl.Callback, *, batches: int, persistent: bool, epochs: int) -> None:
    # A step that computes: no baseline closes early as waiting on data beyond doubt.
    pl.seed_everything(7, verbose=False)
    data = SleepDataset(8 * batches, 0.0, dim=32)
    loader = DataLoader(
        data, batch_size=8, num_workers=2, persistent_workers=persistent,
        worker_init_fn=_slow_start,
    )  # fmt: skip
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=epochs, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[callback],
    )  # fmt: skip
    trainer.fit(MatmulModel(), loader)


@pytest.mark.parametrize("persistent", [False, True])
def test_a_window_before_any_epoch_start_carries_the_first_fetchs_worker_start(
    persistent: bool,
) -> None:
    clock = StepClock(window_steps=6, sampler_interval_s=None, mfu=False)
    _fit(clock, batches=40, persistent=persistent, epochs=1)
    first = clock.windows[0]
    assert not any(first.epoch_start)
    if persistent:  # persistent workers start once: no epoch start pays it again
        assert first.carried_epoch_s is None
        return
    assert first.carried_epoch_s is not None
    start, validation = first.carried_epoch_s
    assert start >= START_S * 0.8, first.carried_epoch_s
    assert validation == 0.0  # no validation loader follows a plain clock's settings
    assert first.fit_samples_per_s < first.samples_per_s


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
    assert ref.carried_epoch_s is not None and ref.carried_epoch_s[0] >= START_S * 0.8


def test_epochs_too_short_for_a_baseline_before_their_end_keep_it_one_epoch_long() -> None:
    callback = _callback()
    _fit(callback, batches=9, persistent=False, epochs=3)
    ref = callback._monitor.clock.windows[0]
    assert ref.steps == 9 and any(ref.epoch_start)
