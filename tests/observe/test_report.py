"""ThroughputReport files, logger metrics and the end-of-fit summary from a real monitored fit."""

from __future__ import annotations

import contextlib
import csv
import itertools
import json
import logging
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightning.pytorch.loggers import CSVLogger

from lightning_maxtp.callbacks import BottleneckMonitor
from lightning_maxtp.knobs.advisor import diagnose
from lightning_maxtp.observe import JobContext, KnobChange, SamplerSeries, ThroughputReport, Window
from tests.helpers import planted


@contextlib.contextmanager
def _figures_saved() -> Iterator[list[Any]]:
    """Every matplotlib figure saved inside the block, read after it (the PNG drawn as is)."""
    import matplotlib.figure

    drawn: list[matplotlib.figure.Figure] = []
    save = matplotlib.figure.Figure.savefig

    def keep(fig: matplotlib.figure.Figure, *args: object, **kwargs: object) -> None:
        drawn.append(fig)
        save(fig, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(matplotlib.figure.Figure, "savefig", keep)
        yield drawn


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
    assert "- t=1.5 s num_workers: 0 -> 2 measured" in md  # no step log: no step to key it by
    assert "![timeline](timeline.png)" not in md  # no link to a plot that was not drawn
    assert "install the `plot` extra" in md


def test_timeline_labels_in_one_row_never_overlap() -> None:
    from lightning_maxtp.observe.timeline import _CHAR_SHARE, _label_rows

    times = [0.0, 0.1, 0.2, 5.0, 5.05, 9.0, 9.5]
    labels = [f"{i} num_workers: kept" for i in range(len(times))]
    places = _label_rows(times, labels, 0.0, 10.0)
    assert [p.row for p in places] == [0, 1, 2, 0, 1, 0, 1]
    # Near the right edge a label runs left of its line, inside the plot.
    assert [p.side for p in places] == ["left"] * 5 + ["right"] * 2
    width = _CHAR_SHARE * (len(labels[0]) + 2) * 10.0
    extents = [
        (t, t + width) if p.side == "left" else (t - width, t)
        for t, p in zip(times, places, strict=True)
    ]
    for row in {p.row for p in places}:
        spans = sorted(e for e, p in zip(extents, places, strict=True) if p.row == row)
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), spans


def test_the_listing_under_the_timeline_wraps_long_reasons_and_loses_no_word() -> None:
    from lightning_maxtp.observe.report_view import report_view
    from lightning_maxtp.observe.timeline import _MAX_LISTED, _listing, markers

    reason = "undecided: +9.1% not beyond the noise (20%) or under the gain its windows " * 3
    change = KnobChange(16.2, "intra_op_threads", 1, 2, reason.strip())
    report = ThroughputReport(windows=(), diagnoses=(), knob_changes=(change,))
    (marker,) = markers(report_view(report.to_dict()))
    lines = _listing([marker.text], width=100)
    assert len(lines) > 2 and all(len(line) <= 100 for line in lines)
    assert all(line.startswith(" " * 16) for line in lines[1:])
    assert " ".join(line.strip() for line in lines).endswith(reason.strip() + ")")
    assert _listing(["x"] * (_MAX_LISTED + 3))[-1] == "    ... 3 more in report.md"
    assert _listing([]) == []


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
    with _figures_saved() as drawn:
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


# The report as a reader meets it: report.md leads with the result, timeline.png shows it.
# Built from a tuned run's report (tests/helpers/tuned_report.py): two trials, one kept.


def _written(tmp_path: Path) -> tuple[dict[str, Any], str]:
    from tests.helpers.tuned_report import tuned_report

    tuned_report().write(tmp_path)
    data = json.loads((tmp_path / "report.json").read_text())
    return data, (tmp_path / "report.md").read_text()


def _section(md: str, title: str) -> list[str]:
    """The lines of the ``## title`` section (up to the next heading)."""
    lines = md.splitlines()
    start = lines.index(f"## {title}") + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


def _table(lines: list[str]) -> list[list[str]]:
    """A markdown table's body rows, cells stripped (``\\|`` inside a cell kept)."""
    rows = [line for line in lines if line.startswith("| ")][1:]  # the header row left out
    return [[c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows]


def test_report_md_leads_with_the_result_settings_cost_and_net_of_report_json(
    tmp_path: Path,
) -> None:
    data, md = _written(tmp_path)
    tuning, cost = data["tuning"], data["tuning"]["cost"]
    head = md.split("\n## ")[0]  # the first screen: everything before the first section
    lines = head.splitlines()
    assert lines[0] == "# Throughput report"
    before, after = tuning["baseline_samples_per_s"], tuning["tuned_samples_per_s"]
    assert lines[2].startswith(
        f"**Throughput: {before:.1f} -> {after:.1f} samples/s ({after / before:.2f}x)** - your "
        f"settings' baseline window (steps 2-5) against the "
        f"{data['steps_under_final_settings']} steps"
    ), lines[2]
    assert after == pytest.approx(data["samples_per_s"])  # the headline rate is the "after"
    bullets = {m[1]: m[2] for m in re.finditer(r"^- \*\*([^:*]+):?\*\*:? ?(.*)$", head, re.M)}
    # What changed against the user's settings: the kept trial, not the reverted one.
    settings = bullets["Settings in force"]
    assert settings.startswith("changed: num_workers 0 -> 2, prefetch_factor None -> 2")
    assert "intra_op_threads" not in settings
    assert bullets["Tuning cost"].startswith(
        f"{cost['cost_s']:.1f} s of a {cost['budget_s']:.1f} s budget (training blocked "
        f"{cost['blocked_s']:.1f} s, slower windows {cost['lost_s']:.1f} s, switching "
        f"{cost['switch_s']:.1f} s); 2 trial(s), 1 kept, in {tuning['tuning_s']:.1f} s over "
        f"{tuning['tuning_steps']} real training steps; stopped: {tuning['stop_reason']}"
    )
    at_baseline = cost["step_s"] * cost["steps_run"]
    assert bullets["Net"] == (
        f"the fit's {cost['steps_run']} steps took {cost['fit_s']:.1f} s against "
        f"{at_baseline:.1f} s at the baseline rate: {at_baseline - cost['fit_s']:.1f} s saved "
        f"({cost['net']:.2f}x)"
    )
    assert bullets["Distance to the limit"] == data["limit"]["text"]
    assert (
        f"- **Bottleneck: `compute`** - {data['samples_per_s']:.1f} samples/s, median step "
        f"{data['median_step_s'] * 1e3:.1f} ms, data wait {data['data_wait_share']:.0%} (under "
        "the final settings)"
    ) in lines
    # What next: the knobs `allow` left out; `compile`, recommended too, is said once, there.
    assert bullets["Next"] == ""
    nexts = [line.strip()[2:] for line in lines if line.startswith("    - ")]
    assert nexts == [tuning["notes"][0]] and "`compile`: False -> True" not in head
    assert "![timeline](timeline.png)" in head
    # Said once: the notes keep none of the lines the summary and the trial table say.
    assert "## Notes" not in md and "maxtp: tuning:" not in md and "## Knob changes" not in md


def test_next_says_a_recommended_knob_that_allow_left_out_once() -> None:
    from lightning_maxtp.observe.report_view import report_view
    from tests.helpers.tuned_report import tuned_report

    data = tuned_report().to_dict()
    compile_rec = data["diagnoses"][0]["recommendations"][0]
    data["diagnoses"][0]["recommendations"].append(
        {**compile_rec, "knob": "batch_size", "current": 32, "proposed": 64}
    )
    nexts = report_view(data).summary.next
    assert nexts[0].startswith("`batch_size`: 32 -> 64 (opt-in; see `compute` below)")
    assert nexts[1:] == ("not allowed: compile (allow='all' tries it behind a numerics guard)",)
    # Nothing left out: the recommendation is shown.
    data["tuning"]["notes"] = []
    assert report_view(data).summary.next[0].startswith("`compile`: False -> True")


def test_report_md_has_one_row_per_trial_with_its_verdict(tmp_path: Path) -> None:
    data, md = _written(tmp_path)
    trials = data["tuning"]["trials"]
    rows = _table(_section(md, "Trials"))
    assert len(rows) == len(trials) == 2
    for row, trial, change in zip(rows, trials, data["knob_changes"], strict=False):
        _, step, t, knob, values, rates, gain, _, verdict, evidence = row
        assert (knob, verdict, step) == (trial["knob"], trial["verdict"], str(trial["first_step"]))
        assert values == f"{trial['old']} -> {trial['new']}"
        assert rates == (
            f"{trial['before_samples_per_s']:.1f} -> {trial['after_samples_per_s']:.1f}"
        )
        assert gain == f"{trial['gain']:+.1%}"
        assert t == f"{change['t_s']:.1f}"  # the switch that started it
        assert evidence.startswith(f"{trial['windows']} windows")
    assert [r[7] for r in rows] == ["+106%", "-"]  # predicted: only the job model's trial
    assert "reverted: -3.9% < 5%" in rows[1][9] and "0.1 s lost" in rows[1][9]


def test_report_md_windows_are_keyed_by_step_with_their_time_and_role(tmp_path: Path) -> None:
    data, md = _written(tmp_path)
    rows = _table(_section(md, "Windows"))
    assert [(r[0], r[2]) for r in rows] == [
        ("2-5", "baseline (your settings)"),
        ("8-11", "trial 1 of num_workers: 0 -> 2 - final settings"),
        ("13-24", "trial 2 of intra_op_threads: 2 -> 1"),
        ("26-37", "final settings (monitoring)"),
        ("38-49", "final settings (monitoring)"),
    ]
    log = data["step_log"]  # step n is entry n - 1 here (step 0 is never timed)
    for row in rows:
        first, last = (int(s) for s in row[0].split("-"))
        start, end = row[1].split("-")
        assert end == f"{log[last - 1][0]:.1f}"
        assert start == f"{log[first - 1][0] - log[first - 1][1]:.1f}"
    # A trial that measured the settings before it again: that window is its reference.
    from lightning_maxtp.observe.report_md import render_markdown

    again = {"t_s": log[11][0] + 1e-3, "knob": "intra_op_threads", "old": "intra_op_threads=1",
             "new": "intra_op_threads=2", "reason": "re-measuring the reference"}  # fmt: skip
    changes = data["knob_changes"]
    md = render_markdown({**data, "knob_changes": [*changes[:2], again, changes[2]]})
    roles = {r[0]: r[2] for r in _table(_section(md, "Windows"))}
    assert roles["13-24"] == "reference for trial 2: intra_op_threads 2"


def test_timeline_title_has_the_speedup_one_marker_per_trial_and_the_tuning_span(
    tmp_path: Path,
) -> None:
    pytest.importorskip("matplotlib")
    from tests.helpers.tuned_report import tuned_report

    with _figures_saved() as drawn:
        tuned_report().write(tmp_path)
    data = json.loads((tmp_path / "report.json").read_text())
    (fig,) = drawn
    before, after = data["tuning"]["baseline_samples_per_s"], data["tuning"]["tuned_samples_per_s"]
    assert fig.get_suptitle() == (
        f"{before:.1f} -> {after:.1f} samples/s ({after / before:.2f}x); bottleneck now: compute"
    )
    top, machine = fig.axes[0], fig.axes[1]
    # One marker per trial (three switches, two trials), labelled with its knob and verdict.
    labels = [t.get_text() for t in top.texts if t.get_gid() == "trial"]
    assert labels == ["1 num_workers: kept", "2 intra_op_threads: reverted"]
    lines = [line for line in top.lines if line.get_gid() == "trial"]
    starts = [c["t_s"] for c in data["knob_changes"] if c["reason"].startswith("trying: ")]
    assert [line.get_xdata()[0] for line in lines] == pytest.approx(starts)
    # The tuning shading spans the tuning period only, which ends well before the fit.
    (shade,) = [p for p in top.patches if p.get_gid() == "tuning"]
    _, start, end = data["spans"][0]
    assert (shade.get_x(), shade.get_x() + shade.get_width()) == pytest.approx((start, end))
    assert end < data["step_log"][-1][0] - 2.0
    # A CPU-only fit: the machine axis speaks of CPU cores, not of a GPU.
    assert machine.get_ylabel() == "CPU %\n(100 = one of 2 cores)"
    assert not any(line.get_label().startswith("GPU") for line in machine.lines)


def test_the_machine_axis_is_labelled_for_the_device() -> None:
    from lightning_maxtp.observe.timeline import machine_label

    assert machine_label("cuda", 8) == "GPU busy %, CPU %\n(CPU: 100 = one of 8 cores)"
    assert machine_label("cpu", None) == "CPU %\n(100 = one core)"
