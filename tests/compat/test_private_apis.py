"""Every private Lightning and torch access in ``lightning_maxtp._compat``, on the installed
releases: one test per access, so an upgrade that moves one fails here first and names it.

The features built on them (loader rebuilds, batch-size trials, ``auto_maxtp``, the math knobs,
the training-state snapshot) have their own tests; these check only the access itself.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

import lightning
import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from torch.utils.data import DataLoader, TensorDataset

from lightning_maxtp._compat import lightning_data, lightning_loops, torch_data, torch_modules
from lightning_maxtp._compat import version as compat_version
from lightning_maxtp._compat.lightning_strategy import (
    IS_INTERACTIVE,
    Launcher,
    LauncherOverride,
    SubprocessScriptLauncher,
    ddp_settings,
    finish_strategy,
    install_strategy,
)


def test_checked_versions_cover_the_installed_lightning() -> None:
    assert compat_version.lightning_checked(lightning.__version__)


@pytest.mark.parametrize(
    ("version", "checked"),
    [
        ("2.6.6", True), ("2.6.7", True), ("2.6.12", True), ("2.6.7.dev1", True),
        ("2.6.6.post1", True), ("2.6.5", False), ("2.6.6rc1", True), ("2.7.0", False),
        ("2.7.0rc1", False), ("3.0", False), ("not-a-version", False),
    ],
)  # fmt: skip
def test_checked_is_the_release_range_pyproject_allows(version: str, checked: bool) -> None:
    assert compat_version.lightning_checked(version) is checked


def test_inside_the_range_no_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    import warnings

    monkeypatch.setattr(lightning, "__version__", "2.6.9")
    compat_version._warn_unchecked.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        compat_version.warn_if_lightning_unchecked()


def test_outside_the_range_one_warning_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_maxtp.loader import lightning_hook

    monkeypatch.setattr(lightning, "__version__", "2.7.1")
    compat_version._warn_unchecked.cache_clear()
    with pytest.warns(UserWarning, match=r"checked on Lightning >=2.6.6,<2.7; found 2.7.1") as got:
        for _ in range(2):
            trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False)
            lightning_hook.install_dataloader_transform(trainer, lambda dl, stage, trainer: dl)
        compat_version.warn_if_lightning_unchecked()
    assert len([w for w in got if "private Lightning helpers" in str(w.message)]) == 1
    compat_version._warn_unchecked.cache_clear()


# Lightning: DataLoader rebuilds


def test_dataloader_init_args_and_reinstantiation() -> None:
    data = TensorDataset(torch.arange(8.0))
    loader = DataLoader(data, batch_size=4, drop_last=True)
    args, kwargs, names = lightning_data.dataloader_init_args(loader)
    assert kwargs["batch_size"] == 4 and kwargs["drop_last"] is True
    assert isinstance(names, tuple)
    rebuilt = lightning_data.reinstantiate_dataloader(loader, *args, **(kwargs | {"timeout": 3}))
    assert type(rebuilt) is DataLoader and rebuilt.dataset is data
    assert (rebuilt.batch_size, rebuilt.timeout) == (4, 3)


# Lightning: the fit loop


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.loaders_made = 0

    def train_dataloader(self) -> DataLoader[Any]:
        self.loaders_made += 1
        return DataLoader(TensorDataset(torch.arange(8.0).unsqueeze(1)), batch_size=2)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _trainer(**kwargs: Any) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, **kwargs,
    )  # fmt: skip


class Probe(pl.Callback):
    """Reads the fit loop's private state from inside a fit."""

    def __init__(self) -> None:
        self.seen: dict[str, Any] = {}

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        source = lightning_loops.train_loader_source(trainer)
        self.seen["module source"] = source.is_defined() and source.is_module()
        made = pl_module.loaders_made  # type: ignore[attr-defined]
        lightning_loops.reset_train_loader(trainer)
        self.seen["rebuilt"] = pl_module.loaders_made == made + 1  # type: ignore[attr-defined]

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.seen["stepped"] = lightning_loops.batches_that_stepped(trainer)
        lightning_loops.set_batches_that_stepped(trainer, 1)
        self.seen["stepped after set"] = lightning_loops.batches_that_stepped(trainer)
        self.seen["progress"] = dict(lightning_loops.loop_progress(trainer.fit_loop))


def test_fit_loop_counters_and_train_loader_source() -> None:
    probe = Probe()
    _trainer(max_steps=3, callbacks=[probe]).fit(Tiny())
    assert probe.seen["module source"] and probe.seen["rebuilt"]
    assert (probe.seen["stepped"], probe.seen["stepped after set"]) == (3, 1)
    progress = probe.seen["progress"]
    assert {"epoch_progress", "epoch_loop.batch_progress"} <= set(progress)
    assert progress["epoch_loop.batch_progress"].total.completed == 3
    assert all(hasattr(p, "load_state_dict") for p in progress.values())


# Lightning: strategies and launchers


class Marked(Launcher):
    def __init__(self, strategy: Any) -> None:
        self.strategy = strategy

    @property
    def is_interactive_compatible(self) -> bool:
        return True

    def launch(self, function: Any, *args: Any, trainer: Any = None, **kwargs: Any) -> Any:
        return function(*args, **kwargs)

    def kill(self, signum: Any) -> None:
        pass


class OwnLauncher(LauncherOverride):
    def make_launcher(self) -> Launcher:
        return Marked(self)


def test_launcher_override_is_what_lightning_installs() -> None:
    trainer = _trainer(strategy=OwnLauncher(), devices=2)
    launcher = trainer.strategy.launcher
    assert isinstance(launcher, Marked) and launcher.strategy is trainer.strategy
    assert isinstance(IS_INTERACTIVE, bool)
    default = _trainer(strategy="ddp", devices=2).strategy.launcher
    assert isinstance(default, SubprocessScriptLauncher)


def test_ddp_settings_finish_and_install_a_strategy() -> None:
    strategy = DDPStrategy(find_unused_parameters=True)
    trainer = _trainer(strategy=strategy, devices=2, sync_batchnorm=True)
    template = trainer.strategy
    assert isinstance(template, DDPStrategy)
    settings = ddp_settings(template)
    assert settings["find_unused_parameters"] is True
    assert settings["precision_plugin"] is template.precision_plugin
    assert {"checkpoint_io", "start_method", "timeout", "process_group_backend"} <= set(settings)
    built = DDPStrategy(
        parallel_devices=template.parallel_devices,
        accelerator=template.accelerator,
        cluster_environment=template.cluster_environment,
    )
    finish_strategy(built, template)
    assert built._layer_sync is template._layer_sync is not None
    assert built.launcher is not None and built.world_size == 2
    single = SingleDeviceStrategy(torch.device("cpu"), accelerator=template.accelerator)
    model = Tiny()
    template._lightning_module = model
    install_strategy(trainer, single)
    assert trainer.strategy is single and single.lightning_module is model


# torch: DataLoader internals


def test_kept_iterator_its_workers_and_the_multiprocessing_context() -> None:
    data = TensorDataset(torch.arange(8.0))
    loader = DataLoader(data, batch_size=2, num_workers=1, persistent_workers=True)
    assert torch_data.cached_iterator(loader) is None
    iterator = iter(loader)
    next(iterator)
    assert torch_data.cached_iterator(loader) is iterator
    (worker,) = torch_data.worker_processes(iterator)
    assert worker.is_alive()
    torch_data.shutdown_workers(iterator)
    torch_data.shutdown_workers(iterator)  # idempotent
    torch_data.shutdown_workers(None)  # nothing to stop
    assert not worker.is_alive()
    torch_data.drop_cached_iterator(loader)
    assert torch_data.cached_iterator(loader) is None
    plain = DataLoader(data, batch_size=2)
    context = multiprocessing.get_context("spawn")
    torch_data.set_multiprocessing_context(plain, context)
    assert plain.multiprocessing_context is context


# torch: modules, optimizers, scalers


def test_in_place_compile_is_read_switched_off_and_put_back() -> None:
    outer = torch.nn.Sequential(torch.nn.Linear(2, 2))
    inner = outer[0]
    assert torch_modules.compiled_call(inner) is None and not torch_modules.is_compiled(outer)
    inner.compile()  # compiles lazily, on the first call: none happens here
    kept = torch_modules.compiled_call(inner)
    assert kept is not None and torch_modules.is_compiled(outer)
    torch_modules.set_compiled_call(inner, None)
    assert not torch_modules.is_compiled(outer)
    torch_modules.set_compiled_call(inner, kept)
    assert torch_modules.compiled_call(inner) is kept


def test_a_lightning_module_given_compiled_reads_as_compiled() -> None:
    from lightning.pytorch.utilities.compile import from_compiled

    model = Tiny()
    assert not torch_modules.is_compiled(model)
    assert torch_modules.is_compiled(from_compiled(torch.compile(model)))  # type: ignore[arg-type]


def test_fused_kernels_and_amp_scaling_of_optimizers() -> None:
    devices = torch_modules.fused_kernel_devices()
    assert "cuda" in devices and all(isinstance(d, str) for d in devices)
    params = [torch.nn.Parameter(torch.ones(2))]
    assert not torch_modules.steps_with_amp_scaling(torch.optim.SGD(params, lr=0.1))
    if "cpu" in devices:
        fused = torch.optim.Adam(params, lr=0.1, fused=True)
        assert torch_modules.steps_with_amp_scaling(fused)


def test_scheduler_mark_is_read_and_put_back() -> None:
    params = [torch.nn.Parameter(torch.ones(2))]
    optimizer = torch.optim.SGD(params, lr=0.1)
    torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    before = torch_modules.scheduler_mark(optimizer)
    params[0].grad = torch.ones(2)
    optimizer.step()
    after = torch_modules.scheduler_mark(optimizer)
    assert after is not torch_modules.NOT_MARKED and after != before
    torch_modules.set_scheduler_mark(optimizer, before)
    assert torch_modules.scheduler_mark(optimizer) == before
    torch_modules.set_scheduler_mark(optimizer, torch_modules.NOT_MARKED)
    assert torch_modules.scheduler_mark(optimizer) is torch_modules.NOT_MARKED


def test_grad_scaler_state_tensors() -> None:
    scaler = torch.amp.GradScaler("cpu")
    assert torch_modules.scaler_tensors(scaler) == {"_scale": None, "_growth_tracker": None}
    scaler.scale(torch.ones(1))
    state = torch_modules.scaler_tensors(scaler)
    assert all(isinstance(v, torch.Tensor) for v in state.values()), state
    torch_modules.set_scaler_tensor(scaler, "_scale", None)
    assert torch_modules.scaler_tensors(scaler)["_scale"] is None
    with pytest.raises(ValueError, match="`name` must be one of"):
        torch_modules.set_scaler_tensor(scaler, "_other", None)
    torch_modules.clear_scaler_optimizer_states(scaler)
