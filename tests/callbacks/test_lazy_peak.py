"""The device's peak never delays the first step: read from the cache, else measured after it.

``measure_peak`` is replaced by a fake that records when it was called (steps started and
optimizer steps taken by then, and whether torch's FLOP counter was active) and moves the step
clock's time on by ``PAUSE_S``, as a slow measurement would; nothing here times real work.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode
from torch.utils.data import DataLoader, TensorDataset

from lightning_maxtp.callbacks import BottleneckMonitor, MaxThroughputCallback, step_clock
from lightning_maxtp.resources import peak as peak_mod
from lightning_maxtp.resources.peak import Peak, PeakRate, cache_path, device_key
from tests.helpers.models import MatmulModel

FAKE_FP32 = 1e15
"""Far above what two CPU cores reach: every window's MFU is a small share, never an error."""
PAUSE_S = 100.0
"""What the fake measurement adds to the step clock's time: longer than this whole test."""


def _peak() -> Peak:
    name, key = device_key("cpu")
    return Peak(name, key, (PeakRate("fp32", FAKE_FP32, 1024),))


class FakeTime:
    """``step_clock``'s ``time``: the real clock plus ``offset``."""

    def __init__(self) -> None:
        self.offset = 0.0

    def perf_counter(self) -> float:
        return time.perf_counter() + self.offset

    def thread_time(self) -> float:
        return time.thread_time()


class Steps(pl.Callback):
    """Counts the training steps that started, and the trainer's optimizer steps."""

    def __init__(self) -> None:
        self.started = 0
        self.trainer: pl.Trainer | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.trainer = trainer

    def on_train_batch_start(self, *args: Any) -> None:
        self.started += 1

    @property
    def optimizer_steps(self) -> int:
        return 0 if self.trainer is None else self.trainer.global_step


class Elementwise(pl.LightningModule):
    """A step without a matmul: the counter finds no FLOPs, so there is no MFU to divide."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(32))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x: torch.Tensor = batch[0]
        return (x * self.scale).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


Calls = tuple[Steps, list[tuple[str, int, int, bool]]]


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return cache_path()


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    """The fake ``measure_peak`` and what it saw at each call."""
    steps, seen, clock = Steps(), [], FakeTime()
    monkeypatch.setattr(step_clock, "time", clock)

    def fake_measure_peak(device: str = "cpu", **kwargs: Any) -> Peak:
        active = _get_current_dispatch_mode() is not None
        seen.append((device, steps.started, steps.optimizer_steps, active))
        clock.offset += PAUSE_S
        return _peak()

    monkeypatch.setattr(peak_mod, "measure_peak", fake_measure_peak)
    return steps, seen


def _fit(callback: pl.Callback, steps: Steps, model: pl.LightningModule | None = None) -> None:
    trainer = pl.Trainer(
        accelerator="cpu", max_steps=24, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[steps, callback],
    )  # fmt: skip
    data = TensorDataset(torch.randn(24 * 16, 32))
    trainer.fit(model or MatmulModel(32, 64), DataLoader(data, batch_size=16))


def test_an_uncached_peak_is_measured_after_the_first_step_in_no_step_and_every_window_has_it(
    fresh_cache: Path, calls: Calls
) -> None:
    steps, seen = calls
    monitor = BottleneckMonitor(window_steps=6, sampler_interval_s=None, verbose=False)
    _fit(monitor, steps)
    # Once: after the first step's optimizer step, before the second started, outside the
    # counter (never before the first step, as it was).
    assert seen == [("cpu", 1, 1, False)]
    assert monitor.context.flops_per_sample is not None
    # The pause belongs to no step: the step after it is timed from its end.
    assert [w.first_step for w in monitor.windows] == [1, 7, 13]
    assert all(s < PAUSE_S for w in monitor.windows for s in w.step_time_s)
    assert all(s < PAUSE_S and d < PAUSE_S for _, s, d in monitor.clock.step_log)
    for window in monitor.windows:  # every window divides by the peak
        assert dict(window.context.peaks) == {"fp32": FAKE_FP32}
        assert window.utilization is not None and window.utilization.mfu is not None
    report = monitor.report
    assert report.to_dict()["mfu"] is not None
    assert any("measured in" in n and "after the first step" in n for n in report.notes), (
        report.notes
    )


def test_the_callbacks_report_gives_mfu_from_a_peak_measured_during_the_fit(
    fresh_cache: Path, calls: Calls
) -> None:
    steps, seen = calls
    callback = MaxThroughputCallback(
        warmup_steps=2, window_steps=4, monitor_window_steps=4, max_trials=0,
        tune_loader=False, sampler_interval_s=None, verbose=False,
    )  # fmt: skip
    _fit(callback, steps)
    assert seen == [("cpu", 1, 1, False)]
    assert callback.report.to_dict()["mfu"] is not None
    assert all(dict(w.context.peaks) == {"fp32": FAKE_FP32} for w in callback.windows)


def test_a_given_count_needs_no_counted_step_and_the_peak_still_comes_after_the_first(
    fresh_cache: Path, calls: Calls
) -> None:
    steps, seen = calls
    monitor = BottleneckMonitor(
        window_steps=6, sampler_interval_s=None, verbose=False, flops_per_batch=1e9
    )
    _fit(monitor, steps)
    assert seen == [("cpu", 1, 1, False)]
    assert monitor.context.flops_per_sample == 1e9 / 16
    assert all(dict(w.context.peaks) == {"fp32": FAKE_FP32} for w in monitor.windows)


def test_a_cached_peak_is_read_at_start_and_nothing_is_measured(
    fresh_cache: Path, calls: Calls
) -> None:
    steps, seen = calls
    peak_mod._write_cache(fresh_cache, {_peak().key: _peak().to_dict()})
    monitor = BottleneckMonitor(window_steps=6, sampler_interval_s=None, verbose=False)
    _fit(monitor, steps)
    assert seen == []
    assert all(dict(w.context.peaks) == {"fp32": FAKE_FP32} for w in monitor.windows)
    assert not any("peak was measured" in n for n in monitor.report.notes)


def test_a_fit_without_a_flop_count_measures_no_peak(fresh_cache: Path, calls: Calls) -> None:
    steps, seen = calls
    monitor = BottleneckMonitor(window_steps=6, sampler_interval_s=None, verbose=False)
    _fit(monitor, steps, Elementwise())
    assert seen == []  # no FLOPs to divide: the measurement would be time spent for nothing
    assert monitor.context.flops_per_sample is None and not monitor.context.peaks
    assert any("ran no matmul" in n for n in monitor.report.notes), monitor.report.notes
    assert not fresh_cache.exists()


def test_a_peak_that_cannot_be_measured_leaves_the_fit_running_and_says_why(
    fresh_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(device: str = "cpu", **kwargs: Any) -> Peak:
        raise RuntimeError("no room for the matrices")

    monkeypatch.setattr(peak_mod, "measure_peak", failing)
    monitor = BottleneckMonitor(window_steps=6, sampler_interval_s=None, verbose=False)
    _fit(monitor, Steps())
    assert len(monitor.windows) == 3 and monitor.context.flops_per_sample is not None
    for window in monitor.windows:
        assert window.utilization is not None
        assert window.utilization.error == "no measured fp32 peak"
    notes = monitor.report.notes
    assert any("could not be measured" in n and "no room" in n for n in notes), notes
