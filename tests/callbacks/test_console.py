"""What the callback prints: a few short lines by default, every step on request, or nothing.

The lines are read from a real fit (a data-bound loader, so that a worker trial runs and is
judged) and from the pure functions that build them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from torch.utils.data import DataLoader

from lightning_maxtp.callbacks import MaxThroughputCallback
from lightning_maxtp.callbacks.console import WIDTH, fit, trial_line, verbosity
from lightning_maxtp.tuning.trials import KnobTrial
from tests.helpers.loader_data import SleepDataset
from tests.helpers.models import IdModel


def _fit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, verbose: Any
) -> tuple[MaxThroughputCallback, list[str]]:
    """The callback and the ``maxtp:`` lines of a small data-bound fit at ``verbose``.

    Run from ``tmp_path``: the report's path is printed relative to the working directory.
    """
    pl.seed_everything(3, verbose=False)
    callback = MaxThroughputCallback(
        warmup_steps=2, window_steps=8, max_trials=2, cost_share=None, verbose=verbose,
        sampler_interval_s=None, report_dir=tmp_path / "report",
    )  # fmt: skip
    trainer = pl.Trainer(
        accelerator="cpu", max_steps=48, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
    )  # fmt: skip
    loader = DataLoader(SleepDataset(480, 0.004), batch_size=8)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lightning_maxtp"):
        trainer.fit(IdModel(), loader)
    assert callback.trials, "the planted data wait must make the loop try a knob"
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("lightning_maxtp")]
    return callback, lines


def test_the_default_prints_a_few_short_lines_that_answer_the_fit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    callback, lines = _fit(tmp_path, caplog, True)

    assert all(line.startswith("maxtp: ") and len(line) <= WIDTH for line in lines), lines
    # plan, baseline, one line per trial, result, limit and next, report
    assert len(lines) == 5 + len(callback.trials) <= 8, lines
    assert lines[0].startswith("maxtp: plan: ") and "2 trials" in lines[0]
    assert lines[1].startswith("maxtp: baseline ") and "bottleneck" in lines[1]
    assert lines[2 : 2 + len(callback.trials)] == [
        f"maxtp: {trial_line(t)}" for t in callback.trials
    ]
    result = lines[-3]
    speedup = callback.tuning.speedup
    assert result.startswith("maxtp: result: ") and f"({speedup:.2f}x)" in result, lines
    kind = callback.report.bottleneck
    held = "no bottleneck above threshold" if kind == "healthy" else f"{kind}-bound"
    assert lines[-2].startswith(f"maxtp: now {held}"), lines
    assert lines[-1] == f"maxtp: report: {Path('report', 'report.md')}", lines
    assert (tmp_path / "report" / "report.md").is_file()


def test_steps_prints_every_step_and_false_prints_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    _, steps = _fit(tmp_path, caplog, "steps")
    assert len(steps) > 8 and any(line.startswith("maxtp: trying ") for line in steps), steps

    capfd.readouterr()
    assert _fit(tmp_path, caplog, False)[1] == []
    out, err = capfd.readouterr()
    assert "maxtp" not in out + err, out + err


def test_the_library_logger_silences_the_default_lines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    logger = logging.getLogger("lightning_maxtp")
    before = logger.level
    logger.setLevel(logging.WARNING)
    try:
        pl.seed_everything(3, verbose=False)
        callback = MaxThroughputCallback(warmup_steps=2, window_steps=8, max_trials=1)
        trainer = pl.Trainer(
            accelerator="cpu", max_steps=24, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
        )  # fmt: skip
        with caplog.at_level(logging.INFO):
            trainer.fit(IdModel(), DataLoader(SleepDataset(240, 0.002), batch_size=8))
    finally:
        logger.setLevel(before)
    assert not [r for r in caplog.records if r.getMessage().startswith("maxtp: plan")]


def test_a_trial_line_fits_the_width_and_ends_with_its_verdict() -> None:
    trial = KnobTrial("num_workers", 0, 2, "x" * 300, 116.8, 327.0, True, 4, 8, expected_gain=1.06)
    assert trial_line(trial) == (
        "num_workers 0 -> 2: 327.0 samples/s (+180%, predicted +106%), kept"
    )
    undecided = KnobTrial("prefetch_factor", 2, 4, "", 100.0, 104.0, False, 4, 8, "undecided")
    assert trial_line(undecided).endswith("not beyond the noise, reverted")
    assert len("maxtp: " + fit("y" * 500)) == WIDTH
    # A trial of several settings names the others that moved after its own knob.
    both = KnobTrial(
        "num_workers", "num_workers=0, persistent_workers=False",
        "num_workers=2, persistent_workers=True", "", 700.0, 1133.3, True, 7, 20,
        expected_gain=0.5,
    )  # fmt: skip
    assert trial_line(both) == (
        "num_workers 0 -> 2, persistent_workers=True: 1133.3 samples/s (+62%, predicted +50%), kept"
    )


@pytest.mark.parametrize("bad", [1, 0, "yes", None, "Steps"])
def test_verbose_other_than_true_false_or_steps_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match=r"verbose=.*expected True .* 'steps' .* False"):
        verbosity(bad)
    with pytest.raises(ValueError, match="verbose="):
        MaxThroughputCallback(verbose=bad)  # type: ignore[arg-type]
