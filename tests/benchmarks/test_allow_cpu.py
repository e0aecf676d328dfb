"""``benchmarks.allow_cpu --smoke``: the whole-fit A/B/C runs end to end."""

from __future__ import annotations

import pytest

from benchmarks import allow_cpu
from tests.helpers.scripts import smoke_json


@pytest.mark.slow
def test_smoke_times_defaults_safe_and_all_on_both_jobs(capsys: pytest.CaptureFixture[str]) -> None:
    data = smoke_json(allow_cpu.main, capsys)
    assert data["benchmark"] == "allow_cpu" and data["smoke"] is True
    assert set(data["wall_ratios"]) == {"long", "short"}
    for job in data["jobs"].values():
        assert set(job["runs"]) == {"defaults", "safe", "all"}
        (every,) = job["runs"]["all"]
        assert every["seconds"] > 0 and every["tail_samples_per_s"] > 0
        assert "stop_reason" in every["callback"] and "kept" in every["callback"]
