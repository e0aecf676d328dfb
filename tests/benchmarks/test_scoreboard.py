"""``benchmarks.scoreboard --smoke``: every case of the loop runs end to end, no targets judged."""

from __future__ import annotations

import pytest

from benchmarks import scoreboard
from tests.helpers.scripts import smoke_json


@pytest.mark.slow
def test_smoke_runs_every_case_and_reports_each_row(capsys: pytest.CaptureFixture[str]) -> None:
    data = smoke_json(scoreboard.main, capsys)
    assert data["benchmark"] == "scoreboard" and data["profile"] == "smoke"
    rows = data["rows"]
    assert {r["case"] for r in rows} == set(scoreboard.CASES)
    assert all(r["met"] is None for r in rows), "smoke sizes judge no target"
    assert not [r for r in rows if r["check"] == "ran"], "a case raised"
    checks = {(r["case"], r["check"]) for r in rows}
    assert ("short_epochs", "from 4 workers vs best hand") in checks
    assert ("never_slower", "fixed cost before the first step") in checks
    assert data["judged"] == 0


def test_a_row_meets_its_ratio_or_the_slack_of_a_short_fit() -> None:
    row = scoreboard.ratio_row("c", "x", [1.2, 1.3], [1.0, 1.0], most=1.05, smoke=False,
                               slack_s=0.5)  # fmt: skip
    assert row.met is True and row.measured == pytest.approx(1.25)  # +0.25 s under 5 s
    long = scoreboard.ratio_row("c", "x", [12.0, 13.0], [10.0, 10.0], most=1.05, smoke=False,
                                slack_s=0.5)  # fmt: skip
    assert long.met is False and long.target == "<= 1.05x (or +0.5 s under 5 s)"
    assert scoreboard.ratio_row("c", "x", [2.0], [1.0], most=1.1, smoke=True).met is None
    table = scoreboard.format_table([row, long], scoreboard.PROFILES["quick"], 12.0)
    assert "met 1 of 2 rows" in table and "missed: c / x" in table
