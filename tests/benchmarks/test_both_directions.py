"""``benchmarks.both_directions --smoke``: the four whole-fit configs run end to end."""

from __future__ import annotations

import pytest

from benchmarks import both_directions
from tests.helpers.scripts import smoke_json


@pytest.mark.slow
def test_smoke_runs_both_starts_with_and_without_the_callback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = smoke_json(both_directions.main, capsys)
    assert data["benchmark"] == "both_directions"
    names = [c["name"] for c in data["configs"]]
    assert names == ["start-4", "start-4+callback", "start-0", "start-0+callback"]
    runs = data["params"]["callback_runs"]
    assert {r["config"] for r in runs} == {"start-4+callback", "start-0+callback"}
    assert all("stop_reason" in r for r in runs)
    assert len(data["params"]["verdict"]) == 2
