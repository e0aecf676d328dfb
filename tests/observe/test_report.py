"""ThroughputReport files, logger metrics and the end-of-fit summary from a real monitored fit."""

from __future__ import annotations

import csv
import itertools
import json
import logging
import sys
from pathlib import Path

import pytest
from lightning.pytorch.loggers import CSVLogger

from lightning_maxtp.callbacks import BottleneckMonitor
from lightning_maxtp.observe import JobContext, KnobChange, SamplerSeries, ThroughputReport, Window
from lightning_maxtp.observe.diagnosis import diagnose
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
    # What comes next is the job model's (see test_planted): workers on free cores, none when
    # other tests keep the cores busy; each line a change from a value to a value.
    nexts = [line for line in summary[-1].splitlines() if line.strip().startswith("next: ")]
    assert all(" -> " in line and line.endswith("]") for line in nexts), nexts

    folder = tmp_path / "report"
    data = json.loads((folder / "report.json").read_text())
    assert data["bottleneck"] == "data_pipeline"
    # The report's recommendations are its last window's diagnosis (the job model's workers)
    last = diagnose(monitor.report.windows[-1])[0]
    shown = [r["knob"] for r in data["diagnoses"][0]["recommendations"]]
    assert shown == [r.knob for r in last.recommendations]
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


def test_timeline_markers_never_share_a_row_closer_than_the_gap() -> None:
    from lightning_maxtp.observe.timeline import _levels

    times = [0.0, 0.1, 0.2, 5.0, 5.05, 5.1, 9.0]
    rows = _levels(times, span=10.0)
    assert rows == [0, 1, 2, 0, 1, 2, 0]
    for row in set(rows):
        xs = [t for t, r in zip(times, rows, strict=True) if r == row]
        assert all(b - a >= 0.22 for a, b in itertools.pairwise(xs))


def test_the_listing_under_the_timeline_wraps_long_reasons_and_loses_no_word() -> None:
    from lightning_maxtp.observe.timeline import _MAX_LISTED, _listing

    reason = "undecided: +9.1% not beyond the noise (20%) or under the gain its windows " * 3
    lines = _listing((KnobChange(16.2, "intra_op_threads", 1, 2, reason.strip()),), width=100)
    assert len(lines) > 2 and all(len(line) <= 100 for line in lines)
    assert all(line.startswith(" " * 16) for line in lines[1:])
    assert " ".join(line.strip() for line in lines).endswith(reason.strip() + ")")
    many = tuple(KnobChange(float(i), "gc", i, i + 1, "x") for i in range(_MAX_LISTED + 3))
    assert _listing(many)[-1] == "    ... 3 more in report.md"
    assert _listing(()) == []


def test_timeline_draws_blocked_spans_stalls_and_many_changes(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    steps = [(0.1 * i, 0.02, 0.01) for i in range(1, 60)] + [(8.5, 3.0, 2.9)]  # one 3 s stall
    changes = tuple(
        KnobChange(0.5 + 0.01 * i, "num_workers", i, i + 1, "trying") for i in range(20)
    )
    window = Window(step_time_s=(0.02,) * 5, data_wait_s=(0.01,) * 5, samples=(8,) * 5,
                    sampler=SamplerSeries(), context=JobContext())  # fmt: skip
    report = ThroughputReport(
        windows=(window,), diagnoses=(), step_log=tuple(steps), knob_changes=changes,
        spans=(("tuning", 0.1, 6.0), ("blocked", 5.5, 8.5)),
    )  # fmt: skip
    import matplotlib.figure

    drawn: list[matplotlib.figure.Figure] = []
    save = matplotlib.figure.Figure.savefig

    def keep(fig: matplotlib.figure.Figure, *args: object, **kwargs: object) -> None:
        drawn.append(fig)
        save(fig, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(matplotlib.figure.Figure, "savefig", keep)
        written = report.write(tmp_path)
    assert written["timeline.png"].stat().st_size > 10_000
    assert json.loads((tmp_path / "report.json").read_text())["spans"] == [
        ["tuning", 0.1, 6.0], ["blocked", 5.5, 8.5],
    ]  # fmt: skip
    # Read from the figure itself: both spans shaded on the step plot, where they are.
    (fig,) = drawn
    top = fig.axes[0]
    shaded = sorted(
        (round(p.get_x(), 2), round(p.get_x() + p.get_width(), 2))
        for p in top.patches if hasattr(p, "get_width")
    )  # fmt: skip
    assert shaded == [(0.1, 6.0), (5.5, 8.5)], shaded
    texts = [t.get_text() for t in top.texts]
    assert "loader measured alone\n3.0 s" in texts
    # The 3 s stall: a marker at the top of the axis and a line that counts it.
    stall = [c for c in top.collections if c.get_label() == "step above the axis"]
    assert len(stall) == 1 and len(stall[0].get_offsets()) == 1
    assert stall[0].get_offsets()[0][0] == pytest.approx(8.5)
    assert any(t.startswith("1 step(s) above") and "longest 3.0 s" in t for t in texts), texts
    # 20 changes: 20 dashed lines on each plot.
    assert sum(line.get_linestyle() == "--" for line in top.lines) == 20
