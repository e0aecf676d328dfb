"""``apply_loader_plan`` on real Trainer fits: the loaders Lightning iterates carry the plan, and
training sees the same samples and ends with the same weights as without it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch import seed_everything
from torch.utils.data import DataLoader, DistributedSampler

from lightning_maxtp.loader import LoaderPlan, apply_loader_plan, tune_dataloader
from lightning_maxtp.loader.worker_limits import WorkerThreadLimit
from tests.helpers.loader_data import SleepDataset

PLAN_KEYS = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory")


class IdModel(pl.LightningModule):
    """A linear model that records the sample ids of every batch it trains and validates on."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(16, 1)
        self.seen: list[list[int]] = []
        self.val_seen: list[list[int]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, ids = batch
        self.seen.append(ids.tolist())
        return self.layer(x / 48).pow(2).mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.val_seen.append(batch[1].tolist())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def settings(loader: DataLoader) -> dict[str, Any]:
    return {
        **{k: getattr(loader, k) for k in PLAN_KEYS},
        "sampler": type(loader.sampler).__name__,
        "batch_size": loader.batch_size,
        "worker_init_fn": type(loader.worker_init_fn).__name__,
    }


class LoaderProbe(pl.Callback):
    """Reads the loaders the fit loop and the validation loop actually iterate."""

    def __init__(self, out: Path | None = None) -> None:
        self.out = out
        self.train: dict[str, Any] = {}
        self.val: list[dict[str, Any]] = []

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.train = settings(trainer.train_dataloader)  # type: ignore[arg-type]

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.val.append(settings(trainer.val_dataloaders))  # type: ignore[arg-type]

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.out is not None:
            record = {"train": self.train, "seen": pl_module.seen}  # type: ignore[attr-defined]
            (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


def loaders() -> tuple[DataLoader, DataLoader]:
    train = DataLoader(SleepDataset(48, sleep_s=0.002), batch_size=8, shuffle=True)
    return train, DataLoader(SleepDataset(16, sleep_s=0.002), batch_size=8)


def trainer(probe: LoaderProbe, **kwargs: Any) -> pl.Trainer:
    return pl.Trainer(
        **{
            "accelerator": "cpu",
            "devices": 1,
            "max_epochs": 2,
            "num_sanity_val_steps": 1,
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "callbacks": [probe],
            **kwargs,
        }
    )


def fit(plan: LoaderPlan | None) -> tuple[IdModel, LoaderProbe]:
    seed_everything(7)
    model, probe = IdModel(), LoaderProbe()
    t = trainer(probe)
    if plan is not None:
        apply_loader_plan(t, plan)
    t.fit(model, *loaders())
    return model, probe


@pytest.fixture(scope="module")
def plan() -> LoaderPlan:
    # Sleeping loads: 2 workers clearly beat 1, so the plan changes the loaders. Workers are not
    # kept between epochs: that would reshuffle the shuffled train loader from epoch 2 on.
    plan = tune_dataloader(loaders()[0], max_workers=2, time_budget_s=2)
    assert plan.num_workers == 2 and not plan.persistent_workers, str(plan)
    assert "would change the shuffling order" in plan.reason
    return plan


def test_fit_iterates_the_planned_loaders_and_trains_the_same(plan: LoaderPlan) -> None:
    before, before_probe = fit(None)
    after, probe = fit(plan)
    expected = {k: getattr(plan, k) for k in PLAN_KEYS}
    assert {k: probe.train[k] for k in PLAN_KEYS} == expected
    assert probe.train["worker_init_fn"] == "WorkerThreadLimit"
    assert probe.train["sampler"] == "RandomSampler" and probe.train["batch_size"] == 8
    assert len(probe.val) == 3  # sanity check + one per epoch, all on the planned loader
    assert all({k: v[k] for k in PLAN_KEYS} == expected for v in probe.val)
    assert before_probe.train["num_workers"] == 0
    # Same samples, in the same order, and the same weights at the end.
    assert after.seen == before.seen and len(after.seen) == 12
    assert after.val_seen == before.val_seen
    for a, b in zip(after.parameters(), before.parameters(), strict=True):
        assert torch.equal(a, b)


def test_stages_select_which_loaders_are_rebuilt(plan: LoaderPlan) -> None:
    probe = LoaderProbe()
    t = trainer(probe, max_epochs=1)
    apply_loader_plan(t, plan, stages=("val",))
    t.fit(IdModel(), *loaders())
    assert probe.train["num_workers"] == 0 and probe.train["worker_init_fn"] == "NoneType"
    assert probe.val[-1]["num_workers"] == plan.num_workers
    with pytest.raises(
        ValueError,
        match=r"`stages` must be a non-empty sequence of \('train', 'val', 'test'\), got 'train'",
    ):
        apply_loader_plan(t, plan, stages="train")


def test_ddp_keeps_the_distributed_sampler(plan: LoaderPlan, tmp_path: Path) -> None:
    probe = LoaderProbe(out=tmp_path)
    # ddp_fork: spawned ranks would re-import everything (~10 s each here) and leave
    # multiprocessing's resource tracker running; the hook's pickling is tested separately.
    t = trainer(probe, devices=2, strategy="ddp_fork", max_epochs=1, num_sanity_val_steps=0)
    apply_loader_plan(t, plan, stages=("train",))
    t.fit(IdModel(), loaders()[0])
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for record in ranks:
        assert record["train"]["sampler"] == "DistributedSampler"
        assert {k: record["train"][k] for k in PLAN_KEYS} == {
            k: getattr(plan, k) for k in PLAN_KEYS
        }
    ids = [{i for batch in r["seen"] for i in batch} for r in ranks]
    assert not ids[0] & ids[1] and ids[0] | ids[1] == set(range(48))  # each rank its half


def test_plan_composes_with_lightning_worker_seeding(plan: LoaderPlan) -> None:
    from lightning.fabric.utilities.seed import pl_worker_init_function

    seed_everything(3, workers=True)
    probe = LoaderProbe()
    t = trainer(probe, max_epochs=1, limit_train_batches=2, limit_val_batches=1)
    apply_loader_plan(t, plan, stages=("train",))
    seen: list[Any] = []

    class Grab(pl.Callback):
        def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            seen.append(trainer.train_dataloader.worker_init_fn)  # type: ignore[union-attr]

    t.callbacks.append(Grab())  # type: ignore[attr-defined]
    t.fit(IdModel(), *loaders())
    wrapper = seen[0]
    assert isinstance(wrapper, WorkerThreadLimit) and wrapper.threads == plan.worker_threads
    assert wrapper.user_fn.func is pl_worker_init_function  # type: ignore[union-attr]
    assert isinstance(DistributedSampler, type)  # keeps the import used by the DDP test
