"""MFU on real fits: the first batch's FLOPs counted once, the peak measured once, both reported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_maxtp.callbacks import BottleneckMonitor, MaxThroughputCallback
from tests.callbacks.test_metrics import KeyLogger
from tests.helpers.models import MatmulModel

# MatmulModel(32, 1024): Linear(32, 1024) then three Linear(1024, 1024). Forward 2*m*n per
# layer and sample; backward the weight gradients of every layer and the input gradients of all
# but the first (its input needs none).
FIRST, HIDDEN = 32 * 1024, 3 * 1024 * 1024
MLP_FLOPS = 2 * (FIRST + HIDDEN) + 2 * (FIRST + HIDDEN) + 2 * HIDDEN


def _fit(monitor: Any, steps: int = 24, batch: int = 32) -> KeyLogger:
    logger = KeyLogger()
    trainer = pl.Trainer(
        accelerator="cpu", max_steps=steps, logger=logger, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[monitor],
    )  # fmt: skip
    data = TensorDataset(torch.randn(steps * batch, 32))
    trainer.fit(MatmulModel(), DataLoader(data, batch_size=batch))
    return logger


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "lightning_maxtp" / "peaks.json"


def test_the_first_batch_is_counted_once_and_every_window_logs_its_mfu(fresh_cache: Path) -> None:
    monitor = BottleneckMonitor(window_steps=6, sampler_interval_s=None, verbose=False)
    logger = _fit(monitor)
    assert monitor.context.flops_per_sample == MLP_FLOPS
    assert dict(monitor.context.peaks)["fp32"] > 0 and fresh_cache.exists()
    assert all(w.utilization is not None for w in monitor.windows)
    assert "maxtp/mfu" in logger.keys and "maxtp/gc_share" in logger.keys
    report = monitor.report
    assert any("matmul peak was measured in" in n for n in report.notes), report.notes
    assert "limit: " in report.summary() and report.to_dict()["mfu"] is not None
    # The next fit reads the cache: no measurement, no note.
    again = BottleneckMonitor(window_steps=6, sampler_interval_s=None, verbose=False)
    _fit(again, steps=8)
    assert not any("peak was measured" in n for n in again.report.notes)


def test_a_given_count_is_used_and_one_above_the_peak_is_flagged_not_printed(
    fresh_cache: Path,
) -> None:
    # 10 PFLOP per batch on two CPU cores: more than any peak, so a counting error.
    monitor = BottleneckMonitor(
        window_steps=6, sampler_interval_s=None, verbose=False, flops_per_batch=1e16
    )
    logger = _fit(monitor)
    assert monitor.context.flops_per_sample == 1e16 / 32
    util = monitor.windows[-1].utilization
    assert (
        util is not None
        and util.mfu is None
        and "the FLOP count or the peak is wrong" in (util.error or "")
    )
    assert "maxtp/mfu" not in logger.keys
    summary = monitor.report.summary()
    assert "counted is more than the measured fp32 peak" in summary and "MFU" in summary


def test_mfu_off_counts_nothing_and_bad_counts_name_the_argument(fresh_cache: Path) -> None:
    monitor = BottleneckMonitor(window_steps=6, sampler_interval_s=None, verbose=False, mfu=False)
    _fit(monitor, steps=8)
    assert monitor.context.flops_per_sample is None and not monitor.context.peaks
    assert not fresh_cache.exists()
    assert "flops_per_batch=" in monitor.report.summary()
    for bad in (0, -5, "many"):
        with pytest.raises(ValueError, match=r"`flops_per_batch` must be a positive number"):
            MaxThroughputCallback(flops_per_batch=bad)  # type: ignore[arg-type]


@pytest.mark.serial  # compares a rate measured on real CPU work with the peak
def test_a_matmul_heavy_cpu_job_runs_between_5_and_100_percent_of_the_measured_peak(
    fresh_cache: Path,
) -> None:
    monitor = BottleneckMonitor(window_steps=8, sampler_interval_s=None, verbose=False)
    _fit(monitor, steps=40, batch=64)
    shares = [w.utilization.mfu for w in monitor.windows if w.utilization is not None]
    assert shares and all(s is not None and 0.05 <= s <= 1.0 for s in shares), shares
