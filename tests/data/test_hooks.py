"""Steps added to Lightning's batch hooks: order, removal in any order, the right owner."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities.model_helpers import is_overridden

from lightning_maxtp.data.hooks import add_batch_step, has_batch_step, hook_owner, remove_batch_step

HOOK = "on_after_batch_transfer"


class Module(pl.LightningModule):
    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return [*batch, "user"]


class Data(pl.LightningDataModule):
    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return [*batch, "datamodule"]


def test_steps_run_after_the_original_in_order_and_leave_in_any_order() -> None:
    module = Module()
    add_batch_step(module, HOOK, "late", lambda b: [*b, "late"], 100)
    add_batch_step(module, HOOK, "early", lambda b: [*b, "early"], 0)
    assert module.on_after_batch_transfer([], 0) == ["user", "early", "late"]
    assert is_overridden(HOOK, module)  # Lightning still sees the user's hook
    assert remove_batch_step(module, HOOK, "early") and has_batch_step(module, HOOK, "late")
    assert module.on_after_batch_transfer([], 0) == ["user", "late"]
    assert remove_batch_step(module, HOOK, "late") and not remove_batch_step(module, HOOK, "late")
    assert HOOK not in vars(module) and module.on_after_batch_transfer([], 0) == ["user"]


def test_an_instance_attribute_hook_comes_back_and_the_base_hook_is_not_overridden() -> None:
    module = Module()
    module.on_after_batch_transfer = lambda batch, idx: [*batch, "own"]  # type: ignore[method-assign]
    own = module.on_after_batch_transfer
    add_batch_step(module, HOOK, "step", lambda b: [*b, "step"], 0)
    assert module.on_after_batch_transfer([], 0) == ["own", "step"]
    remove_batch_step(module, HOOK, "step")
    assert module.on_after_batch_transfer is own
    plain = pl.LightningModule()
    add_batch_step(plain, HOOK, "step", lambda b: b, 0)
    assert not is_overridden(HOOK, plain)  # a step is not the user's override


class _Trainer:
    def __init__(self, module: Any, datamodule: Any) -> None:
        self.lightning_module, self.datamodule = module, datamodule


def test_the_owner_is_the_datamodule_only_when_it_overrides_the_hook() -> None:
    module = Module()
    assert hook_owner(_Trainer(module, None), HOOK) is module  # type: ignore[arg-type]
    assert hook_owner(_Trainer(module, pl.LightningDataModule()), HOOK) is module  # type: ignore[arg-type]
    data = Data()
    assert hook_owner(_Trainer(module, data), HOOK) is data  # type: ignore[arg-type]
