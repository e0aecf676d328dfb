"""``benchmarks.scoreboard --smoke``: every case of the loop runs end to end, no targets judged.

One test per case, so that the parallel pass spreads them over its workers.
"""

from __future__ import annotations

import pytest

from benchmarks import scoreboard
from tests.helpers.scripts import process_state_kept

CHECKS = {
    "jpeg_defaults": {"whole fit vs best hand", "steady rate vs sweep's best"},
    "waiting_loader": {"whole fit vs best hand", "tuning cost vs budget"},
    "short_epochs": {"from 0 workers vs best hand", "from 4 workers vs best hand"},
    "both_directions": {"from 0 vs better hand", "from 4 vs better hand"},
    "never_slower": {
        "tiny_steps_50", "short_data_bound", "compute_bound_conv",
        "fixed cost before the first step",
    },
    "allow_all": {"short fit (10 steps)", "long fit (30 steps)"},
    "batch_knee": {"knee's rate vs Lightning's pick"},
    "monitor_cost": {"hooks per step"},
    "demo": {"fit vs defaults"},
}  # fmt: skip


def test_every_case_has_its_checks_listed_here() -> None:
    assert set(CHECKS) == set(scoreboard.CASES)


@pytest.mark.slow
@pytest.mark.parametrize("case", scoreboard.CASES)
def test_smoke_runs_the_case_and_reports_its_rows(
    case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with process_state_kept():
        data = scoreboard.main(["--smoke", "--only", case])
    assert data["benchmark"] == "scoreboard" and data["profile"] == "smoke"
    rows = data["rows"]
    assert {r["check"] for r in rows} == CHECKS[case], rows  # no "ran" row: nothing raised
    assert all(r["case"] == case and r["met"] is None for r in rows)
    assert data["judged"] == 0 and capsys.readouterr().out.strip().endswith("}")


def test_a_row_meets_its_ratio_or_the_slack_of_a_short_fit() -> None:
    row = scoreboard.ratio_row(
        "c", "x", [1.2, 1.3], [1.0, 1.0], most=1.05, smoke=False, slack_s=0.5
    )
    assert row.met is True and row.measured == pytest.approx(1.25)  # +0.25 s under 5 s
    long = scoreboard.ratio_row(
        "c", "x", [12.0, 13.0], [10.0, 10.0], most=1.05, smoke=False, slack_s=0.5
    )
    assert long.met is False and long.target == "<= 1.05x (or +0.5 s under 5 s)"
    assert scoreboard.ratio_row("c", "x", [2.0], [1.0], most=1.1, smoke=True).met is None
    table = scoreboard.format_table([row, long], scoreboard.PROFILES["quick"], 12.0)
    assert "met 1 of 2 rows" in table and "missed: c / x" in table


def test_cases_run_their_own_rounds_and_the_header_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    full, quick, smoke = (scoreboard.PROFILES[n] for n in ("full", "quick", "smoke"))
    assert full.rounds_of("jpeg_defaults") == full.rounds == 2
    assert full.rounds_of("short_epochs") == full.rounds_of("never_slower") == 3
    assert full.rounds_of("demo") == 1
    assert quick.rounds_of("short_epochs") == 1 and quick.rounds_of("never_slower") == 3
    assert smoke.rounds_of("never_slower") == 1
    # --rounds N runs N rounds of every case.
    ran: list[scoreboard.Profile] = []
    monkeypatch.setattr(scoreboard, "run", lambda profile, emit, only: ran.append(profile) or [])
    with process_state_kept():
        out = scoreboard.main(["--rounds", "1"])
    assert (out["profile"], out["rounds"], out["case_rounds"]) == ("full", 1, {})
    assert {ran[0].rounds_of(case) for case in scoreboard.CASES} == {1}
    rows = [scoreboard.Row(c, "x", "t", 1.0, "1.00x", True) for c in ("demo", "short_epochs")]
    header = scoreboard.format_table(rows, full, 1.0).splitlines()[0]
    assert header == "scoreboard (full, 2 round(s), demo 1, short_epochs 3, 1 s)"


def test_a_round_runs_its_fits_in_reverse_order_every_other_round() -> None:
    from benchmarks.scoreboard_cases import _in_turn

    ran: list[str] = []
    for r in range(3):
        _in_turn(r, [lambda: ran.append("hand"), lambda: ran.append("callback")])
    assert ran == ["hand", "callback", "callback", "hand", "hand", "callback"]
