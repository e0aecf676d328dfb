"""Faults during a fit with ``MaxThroughputCallback()`` leave nothing behind and no false word.

Each case is a whole fit in its own process (``runner``: forked per case from one process that
imported torch and Lightning once), the fault planted at the loop's first trial unless the case
says otherwise. Every case must end with the user's own exception (type and message) or
Lightning's graceful stop, no process the fit started still alive, every process-wide setting
as it was before the fit, and a report folder that is valid or absent, never half-written.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

CASES = {
    # case: (exception type or None, a pattern its message matches)
    "dataset_baseline": ("KeyError", r"planted: sample 48 is missing"),
    "dataset_trial": ("KeyError", r"planted: sample \d+ is missing"),
    "dataset_alone": ("KeyError", r"planted: sample \d+ is missing"),
    "step_trial": ("ValueError", r"planted: the step failed at batch \d+"),
    "sigint": ("SystemExit", r"^1$"),  # Lightning's graceful shutdown exits 1
    # torch names the killed worker, however its death is noticed first
    "worker_killed": ("RuntimeError", r"DataLoader worker \(pid.*(exited unexpectedly|killed)"),
    "should_stop": (None, ""),
    "report_unwritable": (None, ""),
    "disk_full": (None, ""),
    # NVML, on one fake GPU: failing at start, and the GPU lost at the first trial
    "nvml_start": (None, ""),
    "nvml_mid_fit": (None, ""),
}

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("faults")]


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every case's record, from one run of the runner."""
    out = tmp_path_factory.mktemp("faults") / "records.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.faults.runner", str(out), *CASES],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    data: dict[str, Any] = json.loads(out.read_text())
    return data


@pytest.mark.parametrize("case", list(CASES))
def test_a_fault_leaves_no_process_no_changed_setting_and_no_half_report(
    records: dict[str, Any], case: str
) -> None:
    record = records[case]
    assert "crashed" not in record and record["exit"] == 0, record
    expected, pattern = CASES[case]
    error = record["error"]
    if expected is None:
        assert error is None, error
    else:  # the user's own error, not one of ours wrapped around it
        assert error is not None and error["type"] == expected, error
        assert re.search(pattern, error["message"]), error["message"]
    assert record["left"] == [], "every process the fit started is gone"
    assert record["state_after"] == record["state_before"], "process-wide settings put back"
    report = record["report"]
    if "report.json" in report["files"]:  # written whole, or not at all
        assert report["json_ok"] and "report.md" in report["files"], report
    else:
        assert not report["files"], f"a half-written report: {report}"


def test_each_fault_struck_where_it_was_planted(records: dict[str, Any]) -> None:
    """The cases test what they say: the fault came during a trial, the baseline or the
    loader measured alone, and the quiet ones ended normally with a report or a warning; NVML
    failing, at start or mid-fit, ended normally with a report whose notes say so."""
    trials = ("dataset_trial", "step_trial", "sigint", "worker_killed", "should_stop")
    for case in trials:
        assert records[case]["planted_at"] is not None, case
    assert records["dataset_baseline"]["planted_at"] is None  # before any trial started
    assert records["dataset_baseline"]["trials"] == []
    assert records["dataset_alone"]["reached_measure_alone"] is True
    assert records["sigint"]["interrupted"] is True
    assert records["should_stop"]["report"]["files"][:2] == ["report.json", "report.md"]
    assert records["should_stop"]["trials"], "the loop's trial was recorded when the fit stopped"
    for case in ("report_unwritable", "disk_full"):
        (warning,) = records[case]["warnings"]
        assert "the report files were not written" in warning and "report_dir=" in warning
    assert not records["report_unwritable"]["report"]["exists"]
    # Our own failure never stops the fit, and the report says what went unmeasured and why.
    start = (
        "sampler source NVML could not start (NVMLError_DriverNotLoaded: Driver Not Loaded): "
        "the diagnosis runs without its readings"
    )
    mid_fit = (
        r"sampler source 'nvml' failed after \d+\.\d s of sampling \(NVMLError_GpuIsLost: "
        r"GPU is lost\) and was disabled: the diagnosis runs without its readings from then on"
    )
    assert records["nvml_mid_fit"]["nvml_reads"] > 0, "NVML read the GPU before it was lost"
    assert records["nvml_mid_fit"]["planted_at"] is not None
    for case, note in (("nvml_start", re.escape(start)), ("nvml_mid_fit", mid_fit)):
        report = records[case]["report"]
        assert report["files"][:2] == ["report.json", "report.md"], case
        assert [n for n in report["notes"] if re.fullmatch(note, n)], report["notes"]
        assert re.search(f"^- {note}$", report["md"], re.MULTILINE), report["md"]
