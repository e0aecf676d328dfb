"""ThroughputReport files, logger metrics and the end-of-fit summary from a real monitored fit."""

from __future__ import annotations

import csv
import json
import logging
import sys
from pathlib import Path

import pytest
from lightning.pytorch.loggers import CSVLogger

from lightning_maxtp.callbacks import BottleneckMonitor
from lightning_maxtp.observe import KnobChange, ThroughputReport
from tests.helpers import planted


def test_monitored_fit_logs_metrics_prints_summary_and_writes_report(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monitor = BottleneckMonitor(window_steps=8, sampler_interval_s=0.05,
                                report_dir=tmp_path / "report")  # fmt: skip
    logger = CSVLogger(tmp_path / "logs", name="run")
    with caplog.at_level(logging.INFO):
        planted.fit(*planted.data_pipeline_job(), [monitor], steps=18, logger=logger,
                    log_every_n_steps=1)  # fmt: skip
    report = monitor.report
    assert report.bottleneck == "data_pipeline"
    assert len(report.windows) == 2
    summary = [r.getMessage() for r in caplog.records if r.getMessage().startswith("maxtp: ")]
    assert summary and "bottleneck: data_pipeline" in summary[-1]
    assert "next: num_workers: 0 -> " in summary[-1]

    folder = tmp_path / "report"
    data = json.loads((folder / "report.json").read_text())
    assert data["bottleneck"] == "data_pipeline"
    assert data["diagnoses"][0]["recommendations"][0]["knob"] == "num_workers"
    assert len(data["windows"]) == 2 and len(data["step_log"]) == 17  # 18 steps, first unmeasured
    md = (folder / "report.md").read_text()
    assert md.startswith("# Throughput report\n")
    assert "**Bottleneck: `data_pipeline`**" in md and "| 1-8 |" in md
    assert (folder / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    with open(Path(logger.log_dir) / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    logged = [r for r in rows if r.get("maxtp/samples_per_s")]
    assert len(logged) == 2
    assert float(logged[0]["maxtp/bottleneck_code"]) == 0.0  # data_pipeline
    assert 0 < float(logged[0]["maxtp/data_wait_share"]) <= 1


def test_report_without_matplotlib_writes_json_and_markdown_with_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    report = ThroughputReport(
        windows=(), diagnoses=(), knob_changes=(KnobChange(1.5, "num_workers", 0, 2, "measured"),)
    )
    written = report.write(tmp_path)
    assert sorted(written) == ["report.json", "report.md"]
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["notes"] == ["timeline.png not written: install the `plot` extra (matplotlib)"]
    assert data["knob_changes"][0] == {"t_s": 1.5, "knob": "num_workers", "old": 0, "new": 2,
                                       "reason": "measured"}  # fmt: skip
    md = (tmp_path / "report.md").read_text()
    assert "- t=1.5s num_workers: 0 -> 2 measured" in md
    assert "install the `plot` extra" in md
