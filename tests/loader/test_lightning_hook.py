"""The loader hook behind ``apply_loader_plan``, on the installed Lightning: rebuilds that keep
everything but the overrides, a transform per stage, pickling for spawned ranks, worker seeding.

The private Lightning helpers it rebuilds with are checked in ``tests/compat``.
"""

from __future__ import annotations

import pickle
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler

from lightning_maxtp.loader import lightning_hook as hook
from tests.helpers.loader_data import SleepDataset


def collate(batch: list[Any]) -> list[Any]:
    return batch


def init_fn(worker_id: int) -> None:
    pass


def test_rebuild_keeps_everything_but_the_overrides() -> None:
    dataset = SleepDataset(16, sleep_s=0.0)
    generator = torch.Generator().manual_seed(1)
    sampler = RandomSampler(dataset, generator=generator)
    loader = DataLoader(
        dataset, batch_size=4, sampler=sampler, collate_fn=collate, drop_last=True,
        worker_init_fn=init_fn, generator=generator, timeout=7,
    )  # fmt: skip
    rebuilt = hook.rebuild_dataloader(loader, num_workers=2, prefetch_factor=3, pin_memory=True)
    assert (rebuilt.num_workers, rebuilt.prefetch_factor, rebuilt.pin_memory) == (2, 3, True)
    assert rebuilt.dataset is dataset and rebuilt.sampler is sampler
    assert rebuilt.collate_fn is collate and rebuilt.worker_init_fn is init_fn
    assert (rebuilt.batch_size, rebuilt.drop_last, rebuilt.timeout) == (4, True, 7)
    assert rebuilt.generator is generator


class TaggedLoader(DataLoader):
    """A subclass with an argument of its own (Lightning records it when made in a hook)."""

    def __init__(self, dataset: Any, batch_size: int, tag: str, **kwargs: Any) -> None:
        super().__init__(dataset, batch_size, **kwargs)
        self.tag_value = tag.upper()


class NoKwargsLoader(DataLoader):
    def __init__(self, dataset: Any) -> None:
        super().__init__(dataset, batch_size=2)


def test_rebuild_without_the_arguments_says_how_to_fix_it() -> None:
    with pytest.raises(
        ValueError,
        match=r"cannot rebuild the `NoKwargsLoader`.*inside the `\*_dataloader\(\)` hook",
    ):
        hook.rebuild_dataloader(NoKwargsLoader(list(range(8))), num_workers=2)


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(16, 1)

    def train_dataloader(self) -> DataLoader:
        return TaggedLoader(SleepDataset(16, sleep_s=0.0), 4, "made in a hook")

    def val_dataloader(self) -> DataLoader:
        return DataLoader(SleepDataset(8, sleep_s=0.0), batch_size=4)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).sum()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Record:
    """A transform that rebuilds with one worker and records what it saw (picklable)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str | None, str]] = []

    def __call__(self, dataloader: object, stage: str | None, trainer: pl.Trainer) -> object:
        assert isinstance(dataloader, DataLoader)
        self.calls.append((stage, type(dataloader).__name__))
        return hook.rebuild_dataloader(dataloader, num_workers=1, prefetch_factor=2)


class Check(pl.Callback):
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        loader = trainer.train_dataloader
        assert isinstance(loader, TaggedLoader)
        assert (loader.tag_value, loader.batch_size, loader.num_workers) == ("MADE IN A HOOK", 4, 1)
        assert trainer.val_dataloaders.num_workers == 1  # type: ignore[union-attr]


def make_trainer(**kwargs: Any) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu", max_epochs=1, limit_train_batches=2, limit_val_batches=1,
        num_sanity_val_steps=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, **kwargs,
    )  # fmt: skip


def test_transform_rebuilds_hook_made_subclasses_per_stage() -> None:
    trainer = make_trainer(callbacks=[Check()])
    first, record = Record(), Record()
    hook.install_dataloader_transform(trainer, first)
    hook.install_dataloader_transform(trainer, record)  # replaces, never stacks
    assert hook.dataloader_transform(trainer) is record
    trainer.fit(Model())
    assert record.calls == [("val", "DataLoader"), ("train", "TaggedLoader")]
    assert first.calls == []


def test_hook_survives_pickling_for_spawned_ranks() -> None:
    trainer = make_trainer(devices=2, strategy="ddp_spawn")
    record = Record()
    hook.install_dataloader_transform(trainer, record)
    strategy = pickle.loads(pickle.dumps(trainer.strategy))
    installed = vars(strategy)["process_dataloader"]
    assert installed.strategy is strategy and isinstance(installed.transform, Record)


def test_lightning_worker_seeding_follows_seed_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = make_trainer()
    monkeypatch.delenv("PL_SEED_WORKERS", raising=False)
    assert hook.lightning_worker_seeding(trainer) is None
    monkeypatch.setenv("PL_SEED_WORKERS", "1")
    seeding = hook.lightning_worker_seeding(trainer)
    assert seeding is not None and seeding.keywords == {"rank": 0}  # type: ignore[attr-defined]
    assert hook.stage_name(trainer) is None  # not running
