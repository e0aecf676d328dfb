"""Writing the report never fails a fit: an unwritable ``report_dir`` or a failing plot warns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_maxtp.callbacks import BottleneckMonitor, MaxThroughputCallback
from lightning_maxtp.observe import KnobChange, ThroughputReport
from tests.helpers import planted


@pytest.mark.parametrize("callback", ["tuning", "monitor"])
def test_a_file_where_report_dir_should_be_warns_and_the_fit_finishes(
    tmp_path: Path, callback: str
) -> None:
    blocker = tmp_path / "report"
    blocker.write_text("a file, not a folder")
    if callback == "tuning":
        cb = MaxThroughputCallback(
            warmup_steps=2, window_steps=4, tune_loader=False, verbose=False, report_dir=blocker
        )
    else:
        cb = BottleneckMonitor(window_steps=4, verbose=False, report_dir=blocker)
    with pytest.warns(UserWarning, match=r"report_dir=.*report.*not written.*fit itself finished"):
        trainer = planted.fit(*planted.well_fed_job(), [cb], steps=10)
    assert trainer.state.finished and trainer.global_step == 10
    assert blocker.read_text() == "a file, not a folder"
    assert cb.report.windows  # the report is still there, in memory


def test_a_plot_that_fails_leaves_the_json_and_markdown_with_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lightning_maxtp.observe.timeline as timeline

    def full_disk(report: ThroughputReport, path: Path) -> None:
        path.write_bytes(b"\x89PNG half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(timeline, "plot_timeline", full_disk)
    report = ThroughputReport(
        windows=(), diagnoses=(), knob_changes=(KnobChange(1.5, "num_workers", 0, 2, "measured"),)
    )
    written = report.write(tmp_path)
    assert sorted(written) == ["report.json", "report.md"]
    assert not (tmp_path / "timeline.png").exists()
    (note,) = json.loads((tmp_path / "report.json").read_text())["notes"]
    assert note == "timeline.png not written: OSError: [Errno 28] No space left on device"
    assert note in (tmp_path / "report.md").read_text()


def test_each_report_file_is_moved_into_place_whole_and_no_temporary_file_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from lightning_maxtp.observe.report_write import write_atomic
    from tests.helpers.tuned_report import tuned_report

    moved: list[tuple[Path, Path]] = []
    replace = os.replace

    def spy(src: str | Path, dst: str | Path) -> None:
        moved.append((Path(src), Path(dst)))
        replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    written = tuned_report().write(tmp_path)
    # Each file arrives by one rename from a temporary file beside it: a reader sees a whole one.
    assert sorted(d.name for _, d in moved) == sorted(written)
    assert all(s.parent == d.parent and s.name.startswith(f".{d.name}.") for s, d in moved)
    before = (tmp_path / "report.md").read_text()

    def half(tmp: Path) -> None:
        tmp.write_text("# Throughput rep")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        write_atomic(tmp_path / "report.md", half)
    assert (tmp_path / "report.md").read_text() == before  # the earlier file, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(written)  # no temporary left
