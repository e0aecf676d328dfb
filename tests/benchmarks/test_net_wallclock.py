"""``benchmarks.net_wallclock --smoke``: the whole-fit A/B runs end to end."""

from __future__ import annotations

import pytest

from benchmarks import net_wallclock
from tests.helpers.scripts import smoke_json


@pytest.mark.slow
def test_smoke_times_every_job_with_and_without_the_callback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = smoke_json(net_wallclock.main, capsys)
    assert data["benchmark"] == "net_wallclock" and data["smoke"] is True
    assert set(data["ratios"]) == set(net_wallclock.JOBS)
    assert data["jobs"]["tiny_steps_50"]["latency_s"] == 0.0
    assert data["jobs"]["already_tuned_prefetch_4"]["prefetch"] == 4
    for job in data["jobs"].values():
        (callback,) = job["runs"]["callback"]
        assert callback["seconds"] > 0 and "stop_reason" in callback["callback"]
        assert job["runs"]["defaults"][0]["seconds"] > 0
