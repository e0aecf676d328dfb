"""``FlopMeter`` on every rank, and a first batch whose end never comes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_maxtp.callbacks import BottleneckMonitor
from lightning_maxtp.callbacks.utilization import FlopMeter
from tests.helpers.models import MatmulModel


def test_every_rank_leaves_the_first_step_out_only_rank_zero_counts() -> None:
    # Under DDP each window ends in collectives: the ranks must close them at the same steps.
    other = SimpleNamespace(is_global_zero=False, world_size=1)
    meter = FlopMeter()
    assert meter.start(other) == ()  # type: ignore[arg-type]
    assert meter.before_batch(other, 32) is True  # type: ignore[arg-type]
    assert meter.after_batch() is None and meter._counter is None
    assert meter.after_first_step(other) is False  # type: ignore[arg-type]  # nothing measured
    assert meter.before_batch(other, 32) is False  # type: ignore[arg-type]
    given = FlopMeter(flops_per_batch=1e9)
    given.start(other)  # type: ignore[arg-type]
    # Nothing counted, but the first step's end is where rank zero may measure the peak.
    assert [given.before_batch(other, 32) for _ in range(2)] == [True, False]  # type: ignore[arg-type]


def test_under_ddp_every_rank_waits_for_the_peak_after_the_first_step_once() -> None:
    waits: list[str | None] = []
    strategy = SimpleNamespace(barrier=waits.append)
    other = SimpleNamespace(is_global_zero=False, world_size=2, strategy=strategy)
    meter = FlopMeter()
    meter.start(other)  # type: ignore[arg-type]
    meter.before_batch(other, 32)  # type: ignore[arg-type]
    meter.after_batch()
    # The wait belongs to no step: the clock times the next one from here.
    assert meter.after_first_step(other) is True  # type: ignore[arg-type]
    assert meter.after_first_step(other) is False  # type: ignore[arg-type]
    assert waits == ["maxtp_peak"]
    off = FlopMeter(enabled=False)
    off.start(other)  # type: ignore[arg-type]
    assert off.after_first_step(other) is False and waits == ["maxtp_peak"]  # type: ignore[arg-type]


class SkipsFirstBatch(MatmulModel):
    """Its hook returns -1 on the fit's first batch: Lightning skips the rest of that epoch."""

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
        return -1 if self.current_epoch == 0 and batch_idx == 0 else None


def test_a_counted_batch_whose_end_never_comes_leaves_no_counter_open(tmp_path: Any) -> None:
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    monitor = BottleneckMonitor(window_steps=4, sampler_interval_s=None, verbose=False)
    trainer = pl.Trainer(
        accelerator="cpu", max_epochs=3, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[monitor],
        default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(SkipsFirstBatch(), DataLoader(TensorDataset(torch.randn(256, 32)), batch_size=32))
    assert _get_current_dispatch_mode() is None
    assert monitor.clock.flops._counter is None
    assert monitor.context.flops_per_sample is None
    assert any("never ended" in n for n in monitor.report.notes), monitor.report.notes
