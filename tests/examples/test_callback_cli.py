"""The LightningCLI config the callback page shows is the one LightningCLI parses and runs.

``docs/callback.md`` includes ``examples/callback_cli.yaml`` whole (a snippet), so the YAML a
reader copies is the file these tests parse and fit with.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
YAML = ROOT / "examples" / "callback_cli.yaml"
PAGE = ROOT / "docs" / "callback.md"


def test_the_page_shows_the_yaml_file_itself() -> None:
    page = PAGE.read_text()
    assert '```yaml\n--8<-- "examples/callback_cli.yaml"\n```' in page
    command = YAML.read_text().splitlines()[0].removeprefix("# ")
    assert command == "python examples/callback_cli.py fit --config examples/callback_cli.yaml"
    assert command in page


def test_lightning_cli_parses_the_yaml_into_the_callback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning.pytorch.cli import LightningCLI

    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from callback_cli import SlowData
        from callback_train import TinyClassifier
    finally:
        sys.path.remove(str(ROOT / "examples"))
    from lightning_maxtp import MaxThroughputCallback

    monkeypatch.chdir(tmp_path)  # LightningCLI may write its config.yaml beside the run
    monkeypatch.setattr(sys, "argv", ["callback_cli.py"])  # pytest's own arguments are not ours
    cli = LightningCLI(
        TinyClassifier, SlowData, run=False, args=["--config", str(YAML)], seed_everything_default=0
    )
    (callback,) = [c for c in cli.trainer.callbacks if isinstance(c, MaxThroughputCallback)]
    assert callback.config.allow == "safe" and callback.config.time_budget_s == 60
    assert callback.report_dir == Path("maxtp-report")
    assert cli.trainer.max_steps == 200 and cli.datamodule.batch_size == 16


def test_lightning_cli_refuses_a_bool_for_seconds_before_the_fit(tmp_path: Path) -> None:
    from lightning.pytorch.cli import LightningArgumentParser

    from lightning_maxtp import MaxThroughputCallback

    parser = LightningArgumentParser(exit_on_error=False)
    parser.add_class_arguments(MaxThroughputCallback, "cb")
    with pytest.raises(Exception, match="time_budget_s"):
        parser.instantiate_classes(parser.parse_args(["--cb.time_budget_s", "true"]))


@pytest.mark.slow
def test_the_command_on_the_page_runs_a_fit_with_the_callback(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "callback_cli.py"), "fit", "--config",
         str(YAML), "--trainer.max_steps", "40", "--trainer.enable_progress_bar", "false"],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"^maxtp: baseline [\d.]+ samples/s", out.stdout + out.stderr, re.M)
    assert (tmp_path / "maxtp-report" / "report.json").is_file()
