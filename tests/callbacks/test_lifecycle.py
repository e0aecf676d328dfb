"""Every fit lifecycle: repeated fits, checkpoints, other stages, with one callback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from torch.utils.data import DataLoader

from lightning_maxtp.callbacks import MaxThroughputCallback
from lightning_maxtp.loader.switchable import SwitchableLoader
from lightning_maxtp.tuning.trials import fmt_settings
from tests.helpers.loader_data import SleepDataset
from tests.helpers.models import IdModel


def _callback() -> MaxThroughputCallback:
    return MaxThroughputCallback(
        warmup_steps=2, window_steps=8, tune_loader=False, verbose=False, max_trials=1,
        sampler_interval_s=None, cost_share=None,
    )  # fmt: skip


def _trainer(callback: MaxThroughputCallback, **kwargs: Any) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[callback], **({"enable_checkpointing": False} | kwargs),
    )  # fmt: skip


def _loader(batch_size: int = 8, samples: int = 480) -> DataLoader[Any]:
    return DataLoader(SleepDataset(samples, 0.004), batch_size=batch_size, shuffle=True)


def _tuned_fit(**kwargs: Any) -> tuple[pl.Trainer, dict, MaxThroughputCallback]:
    # Only settings tuning converged to are carried (``state_dict``); under a loaded test run a
    # fit may stop before it converges (seen once in CI: the resumed fit then tuned again).
    # Such a fit is not what these tests are about: it runs once more, with a fresh callback.
    for _attempt in range(3):
        callback = _callback()
        trainer = _trainer(callback, max_epochs=1, **kwargs)
        trainer.fit(IdModel(), _loader())
        if callback.state_dict():
            break
    assert callback.tuning.finished and callback.trials[0].kept, str(callback.tuning)
    assert callback.state_dict(), callback.tuning.stop_reason
    assert callback.loader is not None
    return trainer, callback.loader.settings(), callback


def test_a_second_fit_of_the_same_trainer_keeps_the_tuned_settings() -> None:
    trainer, tuned, callback = _tuned_fit()
    first_loader = callback.loader

    trainer.fit_loop.max_epochs = 2  # continue for another epoch
    trainer.fit(trainer.lightning_module, _loader())

    tuning = callback.tuning
    assert not tuning.trials, "nothing to try again: the machine and the loader are the same"
    assert tuning.stop_reason.startswith("settings tuned earlier on this machine and loader")
    assert isinstance(callback.loader, SwitchableLoader) and callback.loader is not first_loader
    assert callback.loader.settings() == tuned
    assert callback.report.final_windows, "the second fit is measured under those settings"
    assert {w.context.num_workers for w in callback.report.final_windows} == {tuned["num_workers"]}


def test_a_new_trainer_with_the_same_callback_keeps_the_tuned_settings() -> None:
    _, tuned, callback = _tuned_fit()
    _trainer(callback, max_epochs=1).fit(IdModel(), _loader())
    assert not callback.trials and callback.loader is not None
    assert callback.loader.settings() == tuned


def test_a_resumed_checkpoint_applies_the_tuned_settings_and_a_changed_loader_retunes(
    tmp_path: Path,
) -> None:
    trainer, tuned, _ = _tuned_fit()
    ckpt = tmp_path / "last.ckpt"
    trainer.save_checkpoint(ckpt)

    resumed = _callback()
    _trainer(resumed, max_epochs=2).fit(IdModel(), _loader(), ckpt_path=ckpt)
    assert not resumed.trials and resumed.loader is not None
    assert resumed.loader.settings() == tuned
    assert resumed.tuning.stop_reason.startswith("settings tuned earlier")

    changed = _callback()
    _trainer(changed, max_epochs=2).fit(IdModel(), _loader(batch_size=16), ckpt_path=ckpt)
    assert any("the loader differs (batch_size 8 -> 16)" in n for n in changed.tuning.notes)
    assert changed.trials, "a different loader is tuned again"


def test_validate_test_and_predict_with_the_callback_attached() -> None:
    callback = _callback()
    trainer = _trainer(callback, max_epochs=1)
    model = IdModel()
    loader = DataLoader(SleepDataset(32, 0.0), batch_size=8)
    trainer.validate(model, loader)
    trainer.predict(model, loader)
    assert callback.loader is None and not callback.trials and not callback.windows
    assert callback.state_dict() == {}


def test_reloaded_loaders_keep_the_tuned_settings() -> None:
    callback = _callback()
    model = IdModel()
    trainer = _trainer(callback, max_epochs=2, reload_dataloaders_every_n_epochs=1)
    # 120-step epochs: the trial of ~12 workers settles for three of their turns (~36 steps)
    # before its window, which must end before the first epoch does.
    trainer.fit(model, _loader(samples=960))

    (trial,) = callback.trials
    assert trial.kept and callback.loader is not None
    settings = callback.loader.settings()
    workers = settings["num_workers"]
    # Two epochs: the workers may be tried with their persistence, in one trial.
    both = fmt_settings({"num_workers": workers, "persistent_workers": True})
    assert trial.new in (workers, both), "epoch 2's new loader too"
    assert callback.windows[-1].context.num_workers == workers


class _BrokenAt(SleepDataset):
    """A data set whose one sample raises ``KeyError`` (a missing label, a bad record)."""

    def __init__(self, n: int, sleep_s: float, bad: int) -> None:
        super().__init__(n, sleep_s)
        self.bad = bad

    def __getitem__(self, index: int) -> Any:
        if index == self.bad:
            raise KeyError(f"sample {index}")
        return super().__getitem__(index)


class _StepFailsAt(IdModel):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if batch_idx == 37:
            raise KeyError(f"sample {batch_idx * 8}")
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("where", ["dataset", "step"])
def test_a_users_error_during_tuning_leaves_no_worker_and_puts_the_process_back(
    where: str,
) -> None:
    import time

    import psutil
    import torch

    threads = torch.get_num_threads()
    callback = MaxThroughputCallback(
        warmup_steps=2, window_steps=8, verbose=False, max_trials=3, sampler_interval_s=None,
        cost_share=None,
    )  # fmt: skip
    data = _BrokenAt(480, 0.004, bad=300) if where == "dataset" else SleepDataset(480, 0.004)
    model = IdModel() if where == "dataset" else _StepFailsAt()
    loader = DataLoader(data, batch_size=8, num_workers=2)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    trainer = _trainer(callback, max_epochs=1)
    with pytest.raises(KeyError, match=r"sample (296|300)"):  # the user's own error
        trainer.fit(model, loader)
    # Without waiting for the garbage collector: every worker the fit started is gone within
    # a second (DataLoader's own shutdown joins them with a 5 s timeout at most).
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        left = {p.pid for p in psutil.Process().children(recursive=True)} - before
        if not left:
            break
        time.sleep(0.05)
    assert not left, left
    assert torch.get_num_threads() == threads
