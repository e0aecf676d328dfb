"""Knobs chosen before the fit (``before_fit``: the batch size), through the ``Knob`` protocol."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
from torch.utils.data import DataLoader

from lightning_maxtp.callbacks import MaxThroughputCallback
from lightning_maxtp.knobs.base import FitView
from lightning_maxtp.knobs.batch_size import BatchSize
from tests.helpers.loader_data import SleepDataset
from tests.helpers.models import IdModel


def _fit(callback: MaxThroughputCallback) -> None:
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=4, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
    )  # fmt: skip
    # A loader passed to fit(): nothing reads a batch size attribute to build it again.
    trainer.fit(IdModel(), DataLoader(SleepDataset(64, 0.0), batch_size=8))


def test_a_loader_that_cannot_be_resized_is_an_error_when_named_and_a_note_under_all() -> None:
    named = MaxThroughputCallback(allow=("batch_size",), verbose=False)
    with pytest.raises(ValueError, match=r"`allow` names 'batch_size', but the train DataLoader"):
        _fit(named)
    flag = MaxThroughputCallback(allow_batch_size_change=True, verbose=False)
    with pytest.raises(ValueError, match=r"`allow_batch_size_change=True`, but"):
        _fit(flag)
    every = MaxThroughputCallback(allow="all", verbose=False)
    _fit(every)
    assert every.batch_plan is None
    notes = every.tuning.notes
    assert any(n.startswith("batch_size not tried: the train DataLoader") for n in notes), notes


def test_the_batch_size_knob_offers_a_search_and_refuses_a_bare_size() -> None:
    knob = BatchSize()
    with pytest.raises(NotImplementedError):
        super(BatchSize, knob).choose(FitView(None))  # the base: tried mid-fit knobs only
    with pytest.raises(ValueError, match="chosen before training"):
        knob.apply(FitView(None), 256)
