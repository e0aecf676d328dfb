"""The report describes the settings the run ended with: never a reverted or unfinished trial."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_maxtp.callbacks import BottleneckMonitor, MaxThroughputCallback
from lightning_maxtp.observe import JobContext, SamplerSeries, ThroughputReport, Window
from tests.helpers.models import IdModel


def _trainer(callback: Any, **kwargs: Any) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[callback], **kwargs,
    )  # fmt: skip


def _strict(text: str) -> Any:
    def refuse(name: str) -> None:
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_in_memory_job_reports_only_windows_under_the_settings_it_ended_with(
    tmp_path: Path,
) -> None:
    # The reproduced case: 100 steps of an in-memory job; a worker does not pay, so the run
    # ends with num_workers=0 and the report must not describe the 1-worker trial.
    data = TensorDataset(torch.randn(800, 16), torch.arange(800))
    callback = MaxThroughputCallback(
        warmup_steps=2, window_steps=10, tune_loader=False, verbose=False,
        sampler_interval_s=0.05, report_dir=tmp_path,
    )  # fmt: skip
    _trainer(callback, max_steps=100).fit(IdModel(), DataLoader(data, batch_size=8))

    settings = callback.tuning.settings
    report = callback.report
    assert report.final_windows, "the final settings were measured"
    assert {w.context.num_workers for w in report.final_windows} == {settings["num_workers"]}
    for trial in callback.trials:
        if not trial.kept:
            assert all(w.first_step != trial.first_step for w in report.final_windows)
    for d in report.diagnoses:
        for r in d.recommendations:
            if r.knob in settings:
                assert r.current == settings[r.knob], (r, settings)
            if not settings["num_workers"]:
                assert r.knob not in ("prefetch_factor", "persistent_workers"), r
    # The headline is the final windows' rate, the same number in the summary and the JSON.
    rate = sum(sum(w.samples) for w in report.final_windows) / sum(
        sum(w.samples) / w.samples_per_s for w in report.final_windows
    )
    assert report.samples_per_s == pytest.approx(rate)
    assert f"{rate:.1f} samples/s" in report.summary()
    assert callback.tuning.tuned_samples_per_s == pytest.approx(rate)
    written = _strict((tmp_path / "report.json").read_text())
    assert written["samples_per_s"] == pytest.approx(rate)
    assert written["tuning"]["stop_reason"] == callback.tuning.stop_reason
    assert [t["verdict"] for t in written["tuning"]["trials"]] == [
        t.verdict for t in callback.trials
    ]
    assert "applied automatically" not in (tmp_path / "report.md").read_text()


def test_report_json_is_strict_json() -> None:
    window = Window(
        step_time_s=(0.1, 0.1, 0.1), data_wait_s=(0.0,) * 3, samples=(8,) * 3,
        sampler=SamplerSeries(), context=JobContext(),
    )  # fmt: skip
    spread = {"per_rank": {"gpu_util_percent": [math.nan, 5.0]}, "stats": {"x": math.inf}}
    report = ThroughputReport(windows=(window,), diagnoses=(), ranks=(spread,))
    data = report.to_dict()
    assert data["ranks"][0]["per_rank"]["gpu_util_percent"] == [None, 5.0]
    assert data["ranks"][0]["stats"]["x"] is None
    _strict(json.dumps(data, allow_nan=False))


def test_a_fit_shorter_than_one_window_still_gets_a_window() -> None:
    data = TensorDataset(torch.randn(80, 16), torch.arange(80))
    monitor = BottleneckMonitor(window_steps=50, sampler_interval_s=None, verbose=False)
    _trainer(monitor, max_epochs=2).fit(IdModel(), DataLoader(data, batch_size=8))

    (window,) = monitor.report.windows  # 20 steps in 2 epochs: one closing window
    assert window.steps >= 17  # each epoch's first fetch (worker start-up) is not a step time
    assert "steps measured" in monitor.report.summary()
    assert monitor.report.samples_per_s > 0 and monitor.report.bottleneck != "unknown"


def test_fast_dev_run_says_why_nothing_was_tuned() -> None:
    data = TensorDataset(torch.randn(80, 16), torch.arange(80))
    callback = MaxThroughputCallback(warmup_steps=2, window_steps=10, verbose=False,
                                     sampler_interval_s=None)  # fmt: skip
    _trainer(callback, fast_dev_run=True).fit(IdModel(), DataLoader(data, batch_size=8))

    tuning = callback.tuning
    assert tuning.tuning_s == 0.0 and not tuning.trials
    assert tuning.stop_reason.startswith("the fit ended before the baseline was measured")
    assert "tuning needs at least 12" in tuning.stop_reason
    assert "-0.0" not in str(tuning)
