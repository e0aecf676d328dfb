"""The monitor publishes its live status for ``maxtp triage`` while it runs, and removes it."""

from __future__ import annotations

import json
import os
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_maxtp.callbacks import BottleneckMonitor, bottleneck_monitor
from lightning_maxtp.observe.status import read_status, status_path
from tests.helpers.models import IdModel


class Peek(pl.Callback):
    """Reads this process's status at each step (after the monitor's hooks)."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        status, _ = read_status(os.getpid(), os.getuid())
        if status is not None:
            self.seen.append(status)


def _fit() -> tuple[BottleneckMonitor, Peek]:
    """A 20-step fit with 5-step windows; its monitor, and what was read of the status."""
    monitor = BottleneckMonitor(window_steps=5, sampler_interval_s=None, verbose=False)
    peek = Peek()
    data = TensorDataset(torch.randn(160, 16), torch.arange(160))
    pl.Trainer(
        accelerator="cpu", max_steps=20, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[monitor, peek],
    ).fit(IdModel(), DataLoader(data, batch_size=8))  # fmt: skip
    return monitor, peek


def test_status_is_published_each_window_and_removed_at_the_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bottleneck_monitor, "STATUS_EVERY_S", 0.0)
    monitor, peek = _fit()
    firsts = sorted({s["first_step"] for s in peek.seen})
    assert len(firsts) >= 3, firsts  # one status per window, updated as each closes
    last = peek.seen[-1]
    assert last["pid"] == os.getpid() and last["steps"] == 5
    assert last["bottleneck"] == monitor.diagnoses[-1][0].kind.value
    assert last["settings"]["num_workers"] == 0
    json.dumps(last, allow_nan=False)
    assert not status_path(os.getpid()).exists()


def test_windows_closing_faster_than_the_interval_publish_once_per_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Windows of millisecond steps close many times a second (an hour here, so that a loaded
    # machine's slow steps cannot pass for the interval): the first window's status is
    # written, each later one would cost the training thread a file write.
    monkeypatch.setattr(bottleneck_monitor, "STATUS_EVERY_S", 3600.0)
    monitor, peek = _fit()
    assert len(monitor.windows) >= 3 and peek.seen
    assert {s["first_step"] for s in peek.seen} == {monitor.windows[0].first_step}
    assert not status_path(os.getpid()).exists()
