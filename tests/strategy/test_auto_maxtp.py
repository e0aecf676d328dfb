from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import psutil
import pytest

from lightning_maxtp.strategy import plan_strategy
from lightning_maxtp.strategy.model_size import FSDP_MIN_UNIT_PARAMS, ModelSize
from tests.helpers.fake_nvml import fake_machine
from tests.helpers.runif import RunIf

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _all_gpus_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("LIGHTNING_MAXTP_PLAN", raising=False)


SMALL = ModelSize.from_count(10_000_000)


# --- the Lightning glue ------------------------------------------------------------------------


def test_lightning_device_list_reads_back_as_the_request() -> None:
    from lightning_maxtp.strategy.build import devices_flag

    assert devices_flag([0, 1, 2, 3], [0, 1, 2, 3]) == "auto"
    assert devices_flag([0, 1], [0, 1, 2, 3]) == 2
    assert devices_flag([2, 3], [0, 1, 2, 3]) == [2, 3]


def _trainer(**kwargs: Any) -> Any:
    import lightning.pytorch as pl

    import lightning_maxtp  # noqa: F401  (registers the name)

    defaults: dict[str, Any] = {
        "max_steps": 3, "logger": False, "enable_checkpointing": False,
        "enable_progress_bar": False, "enable_model_summary": False,
    }  # fmt: skip
    return pl.Trainer(**{**defaults, **kwargs})


def test_build_strategy_keeps_what_lightning_set_up() -> None:
    from lightning.pytorch.plugins.precision import FSDPPrecision
    from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, SingleDeviceStrategy
    from lightning.pytorch.strategies.launchers.subprocess_script import (
        _SubprocessScriptLauncher,
    )

    from lightning_maxtp import AutoMaxTP
    from lightning_maxtp.strategy.build import build_strategy

    trainer = _trainer(
        strategy=AutoMaxTP(find_unused_parameters=True, fsdp_kwargs={"limit_all_gathers": True}),
        accelerator="cpu", devices=2, precision="bf16-mixed", sync_batchnorm=True,
    )  # fmt: skip
    template = trainer.strategy
    assert isinstance(template, AutoMaxTP) and trainer.num_devices == 2
    base = plan_strategy(fake_machine(0), SMALL, devices=2)
    ddp = build_strategy(base, template)
    assert type(ddp) is DDPStrategy and ddp._ddp_kwargs == {"find_unused_parameters": True}
    assert (
        ddp.parallel_devices is not None and [d.type for d in ddp.parallel_devices] == ["cpu"] * 2
    )
    assert ddp.precision_plugin is template.precision_plugin
    assert ddp.cluster_environment is template.cluster_environment
    assert ddp._layer_sync is template._layer_sync is not None
    assert isinstance(ddp.launcher, _SubprocessScriptLauncher) and ddp.launcher.num_processes == 2
    single = build_strategy(dataclasses.replace(base, strategy="single_device"), template)
    assert type(single) is SingleDeviceStrategy and single.root_device.type == "cpu"
    fsdp_plan = dataclasses.replace(
        base, strategy="fsdp", accelerator="cuda", devices=(0, 2), cpu_offload=True
    )
    fsdp = build_strategy(fsdp_plan, template, template._fsdp_kwargs)
    assert type(fsdp) is FSDPStrategy
    assert isinstance(fsdp.precision_plugin, FSDPPrecision)
    assert fsdp.precision_plugin.precision == "bf16-mixed"
    assert [(d.type, d.index) for d in fsdp.parallel_devices or []] == [("cuda", 0), ("cuda", 2)]
    assert fsdp.cpu_offload is not None and fsdp.cpu_offload.offload_params
    assert fsdp.kwargs["auto_wrap_policy"].keywords == {"min_num_params": FSDP_MIN_UNIT_PARAMS}
    assert fsdp.kwargs["limit_all_gathers"] is True
    assert fsdp.sharding_strategy.name == "FULL_SHARD"


def test_fsdp_refuses_a_custom_precision_plugin() -> None:
    from lightning.pytorch.plugins.precision import Precision

    from lightning_maxtp.strategy.build import fsdp_precision

    class MyPrecision(Precision):
        pass

    assert fsdp_precision(None).precision == "32-true"
    with pytest.raises(ValueError, match=r"needs an FSDPPrecision plugin, but the Trainer has "
                       r"MyPrecision; pass `precision=` instead"):  # fmt: skip
        fsdp_precision(MyPrecision())


def test_auto_maxtp_rejects_bad_arguments() -> None:
    from lightning_maxtp import AutoMaxTP

    with pytest.raises(ValueError, match=r"`optimizer` must be one of .*got 'lamb'"):
        AutoMaxTP(optimizer="lamb")
    with pytest.raises(ValueError, match=r"`memory_budget_bytes` must be None or > 0, got 0"):
        AutoMaxTP(memory_budget_bytes=0)
    with pytest.raises(ValueError, match=r"`num_params` must be an int >= 0, got -3"):
        AutoMaxTP(num_params=-3)
    with pytest.raises(ValueError, match=r"`fsdp_kwargs` must not set 'cpu_offload'"):
        AutoMaxTP(fsdp_kwargs={"cpu_offload": True})


def _tiny_module(*, configure_model: bool = False, validation: bool = False) -> Any:
    import lightning.pytorch as pl
    import torch
    from torch import nn

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(8, 2)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return nn.functional.cross_entropy(self.layer(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Deferred(Tiny):
        def configure_model(self) -> None:
            self.extra = nn.Linear(2, 2)

    class Validated(Tiny):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.training_step(batch, batch_idx)

    return Deferred() if configure_model else Validated() if validation else Tiny()


def _loader() -> Any:
    import torch

    gen = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(
        torch.randn(64, 8, generator=gen), torch.randint(0, 2, (64,), generator=gen)
    )
    return torch.utils.data.DataLoader(data, batch_size=16)


def test_registered_name_trains_on_a_single_device(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from lightning.pytorch.strategies import SingleDeviceStrategy

    model = _tiny_module()
    before = model.layer.weight.detach().clone()
    trainer = _trainer(strategy="AUTO_MAXTP", accelerator="cpu")
    # Read from the library's own logger, at INFO, whatever an earlier test in this process
    # left on the logging tree: the line itself is what is tested.
    logger = logging.getLogger("lightning_maxtp")
    heard: list[logging.LogRecord] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = heard.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        with caplog.at_level("INFO", logger="lightning_maxtp"):
            trainer.fit(model, _loader())
    finally:
        logger.removeHandler(handler)
    assert type(trainer.strategy) is SingleDeviceStrategy
    assert trainer.global_step == 3
    assert not model.layer.weight.detach().equal(before)
    lines = [r.getMessage() for r in heard if r.getMessage().startswith("maxtp: strategy:")]
    state = (logger.level, logger.disabled, logger.propagate, logging.root.manager.disable)
    assert len(lines) == 1, (lines, state)
    assert lines[0].startswith("maxtp: strategy: single device on 1 CPU process.")
    assert "18 params (18 trainable), 32-true" in lines[0]
    # Given by name, the strategy reads the optimizer from configure_optimizers: plain SGD
    # keeps no state, so no "adam state" is sized.
    assert "sgd" in lines[0] and "adam" not in lines[0], lines[0]


def test_instance_arguments_reach_the_plan() -> None:
    from lightning_maxtp import AutoMaxTP

    strategy = AutoMaxTP(optimizer="sgd", activation_bytes=1234)
    trainer = _trainer(strategy=strategy, accelerator="cpu", precision="bf16-mixed")
    model = _tiny_module(validation=True)
    trainer.fit(model, _loader(), _loader())
    assert strategy.plan is not None and strategy.plan.memory.optimizer == "sgd"
    assert strategy.plan.memory.activation_bytes == 1234
    assert strategy.plan.memory.precision == "bf16-mixed"
    assert strategy.plan.memory.autocast_bytes == 18 * 2
    assert trainer.strategy is not strategy  # the chosen strategy took its place
    trainer.validate(model, _loader(), verbose=False)  # later entry points use the chosen one


def test_parameters_created_in_configure_model_need_a_count() -> None:
    from lightning_maxtp import AutoMaxTP

    trainer = _trainer(strategy="auto_maxtp", accelerator="cpu", max_steps=1)
    with pytest.warns(UserWarning, match=r"`Deferred.configure_model` creates parameters after "
                      r"the plan is made; planning with the 18 that exist now"):  # fmt: skip
        trainer.fit(_tiny_module(configure_model=True), _loader())
    strategy = AutoMaxTP(num_params=5_000_000)
    _trainer(strategy=strategy, accelerator="cpu", max_steps=1).fit(
        _tiny_module(configure_model=True), _loader()
    )
    assert strategy.plan is not None and strategy.plan.memory.model.num_params == 5_000_000


def test_ddp_children_take_the_parents_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning.pytorch.strategies import DDPStrategy

    from lightning_maxtp import AutoMaxTP
    from lightning_maxtp.strategy.auto_maxtp import PLAN_ENV, _inherited_plan

    strategy = AutoMaxTP()
    trainer = _trainer(strategy=strategy, accelerator="cpu", devices=2)
    trainer.strategy._lightning_module = model = _tiny_module()
    trainer.state.fn = "fit"
    parent = plan_strategy(fake_machine(0), ModelSize.from_module(model), devices=2)
    parent = dataclasses.replace(parent, reason="decided by the parent")
    record = {"pid": os.getppid(), "fingerprint": [18, 18, "32-true", True]}
    monkeypatch.setenv(PLAN_ENV, json.dumps({**record, "plan": parent.to_dict()}))
    chosen = strategy.resolve(trainer)
    assert type(chosen) is DDPStrategy and trainer.strategy is chosen
    assert strategy.plan is not None and strategy.plan.reason == "decided by the parent"
    # Written by a process that is neither us nor our parent: not ours to follow.
    monkeypatch.setenv(PLAN_ENV, json.dumps({**record, "pid": 1, "plan": parent.to_dict()}))
    assert _inherited_plan() is None
    monkeypatch.setenv(PLAN_ENV, "{not json")
    assert _inherited_plan() is None


# --- real processes ----------------------------------------------------------------------------

DDP_SCRIPT = """
import json, os, sys
import lightning_maxtp  # first, as in the children Lightning starts: registers via the hook
import lightning.pytorch as pl
import torch
from torch import nn


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    pl.seed_everything(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    trainer = pl.Trainer(
        strategy="auto_maxtp", accelerator="cpu", devices=2, max_steps=3, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    model = Tiny()
    before = model.layer.weight.detach().clone()
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=8))
    gathered = trainer.strategy.all_gather(model.layer.weight.detach())
    inherited = json.loads(os.environ.get("LIGHTNING_MAXTP_PLAN", "{}"))
    record = {
        "rank": trainer.global_rank, "world_size": trainer.world_size,
        "strategy": type(trainer.strategy).__name__,
        "backend": trainer.strategy.process_group_backend, "steps": trainer.global_step,
        "changed": not model.layer.weight.detach().equal(before),
        "in_sync": bool(torch.equal(gathered[0], gathered[1])),
        "pid": os.getpid(), "ppid": os.getppid(), "plan_pid": inherited.get("pid"),
    }
    with open(f"rank{trainer.global_rank}.json", "w") as f:
        json.dump(record, f)
    for child in getattr(trainer.strategy.launcher, "procs", []):
        child.wait(timeout=60)  # leave no DDP child behind
"""


@pytest.mark.slow
def test_registered_name_runs_real_ddp_on_cpu(tmp_path: Path) -> None:
    script = tmp_path / "ddp_fit.py"
    script.write_text(textwrap.dedent(DDP_SCRIPT))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=240, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["rank"] for r in ranks] == [0, 1]
    for record in ranks:
        assert record["world_size"] == 2 and record["strategy"] == "DDPStrategy"
        assert record["backend"] == "gloo" and record["steps"] == 3
        assert record["changed"] and record["in_sync"]
    # Rank 1 is the child Lightning started, and it followed the plan rank 0 wrote.
    assert ranks[1]["ppid"] == ranks[0]["pid"] == ranks[1]["plan_pid"]
    assert not psutil.pid_exists(ranks[1]["pid"])
    plans = re.findall(r"^maxtp: strategy: .*$", proc.stderr + proc.stdout, flags=re.M)
    assert len(plans) == 1 and plans[0].startswith("maxtp: strategy: DDP on 2 CPU processes.")


def test_example_trains_with_the_registered_name(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "strategy_auto.py"), "--steps", "3"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert re.search(r"^planned: maxtp: strategy: single device on 1 CPU process\.", out, re.M), out
    assert re.search(r"^trained: SingleDeviceStrategy, 3 steps, loss [\d.]+ -> [\d.]+$", out, re.M)


@RunIf(min_cuda_gpus=1)
def test_real_gpu_single_device_fit() -> None:
    from lightning.pytorch.strategies import SingleDeviceStrategy

    from lightning_maxtp import AutoMaxTP

    strategy = AutoMaxTP()
    trainer = _trainer(strategy=strategy, accelerator="cuda", devices=1)
    trainer.fit(_tiny_module(), _loader())
    assert type(trainer.strategy) is SingleDeviceStrategy
    assert trainer.strategy.root_device.type == "cuda" and trainer.global_step == 3
    assert strategy.plan is not None and strategy.plan.accelerator == "cuda"
    assert strategy.plan.budget_bytes is not None and strategy.plan.fits


def test_the_optimizer_is_read_from_configure_optimizers() -> None:
    import torch
    from torch import nn

    from lightning_maxtp.strategy.model_size import optimizer_name

    class Model(nn.Module):
        def __init__(self, make: Any) -> None:
            super().__init__()
            self.layer, self.make = nn.Linear(4, 4), make

        def configure_optimizers(self) -> Any:
            return self.make(self.parameters())

    sgd = Model(lambda p: torch.optim.SGD(p, lr=0.1))
    momentum = Model(lambda p: {"optimizer": torch.optim.SGD(p, lr=0.1, momentum=0.9)})
    adamw = Model(lambda p: ([torch.optim.AdamW(p)], []))
    assert optimizer_name(sgd)[0] == "sgd"
    assert optimizer_name(momentum)[0] == "sgd_momentum"
    assert optimizer_name(adamw)[0] == "adamw"
    name, why = optimizer_name(Model(torch.optim.LBFGS))
    assert name is None and why == "LBFGS is not in the memory table"

    def needs_setup(p: Any) -> Any:
        raise RuntimeError("trainer not attached")

    name, why = optimizer_name(Model(needs_setup))
    assert name is None and "could not be called yet (RuntimeError)" in why
