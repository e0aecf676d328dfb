"""Every key the callbacks log or show is in the one table, and the table is in the docs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers.logger import Logger
from torch.utils.data import DataLoader, TensorDataset

from lightning_maxtp.callbacks import BottleneckMonitor, metrics
from tests.helpers.models import IdModel

ROOT = Path(__file__).resolve().parents[2]


class KeyLogger(Logger):
    """Keeps every metric key logged."""

    def __init__(self) -> None:
        super().__init__()
        self.keys: set[str] = set()

    @property
    def name(self) -> str:
        return "keys"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.keys |= set(metrics)

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass


def test_logged_keys_are_the_documented_ones() -> None:
    data = TensorDataset(torch.randn(96, 16), torch.arange(96))
    logger = KeyLogger()
    monitor = BottleneckMonitor(window_steps=4, sampler_interval_s=0.02, verbose=False)
    trainer = pl.Trainer(
        accelerator="cpu", max_steps=12, logger=logger, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[monitor],
    )  # fmt: skip
    trainer.fit(IdModel(), DataLoader(data, batch_size=8))

    logged = {k for k in logger.keys if k.startswith("maxtp")}
    assert logged <= set(metrics.LOGGED), sorted(logged - set(metrics.LOGGED))
    # The step readings are in every window (the sampler's may miss a window this short).
    assert {"maxtp/samples_per_s", "maxtp/step_time_ms", "maxtp/data_wait_share",
            "maxtp/bottleneck_code", "maxtp/bottleneck_confidence"} <= logged  # fmt: skip


def test_the_one_table_gives_every_key_once_and_its_place() -> None:
    # The docs page is generated from it (tests/test_docs.py checks the page and docstrings).
    keys = [m.key for m in metrics.METRICS]
    assert len(keys) == len(set(keys))
    assert set(metrics.LOGGED) | set(metrics.PROGRESS_BAR) == set(keys)
    assert all(k.startswith("maxtp/") for k in metrics.LOGGED)
    assert all(k.startswith("maxtp_") for k in metrics.PROGRESS_BAR)
    assert metrics.metrics_table().count("\n") == len(keys) + 1
