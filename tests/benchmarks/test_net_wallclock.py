"""``python -m benchmarks.net_wallclock --smoke``: the whole-fit A/B runs end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_times_every_job_with_and_without_the_callback() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.net_wallclock", "--smoke"], capture_output=True,
        text=True, timeout=240, check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    ).stdout  # fmt: skip
    data = json.loads(out.strip().splitlines()[-1])
    assert data["benchmark"] == "net_wallclock" and data["smoke"] is True
    assert set(data["ratios"]) == {"long_data_bound", "short_data_bound", "already_tuned"}
    for job in data["jobs"].values():
        (callback,) = job["runs"]["callback"]
        assert callback["seconds"] > 0 and "stop_reason" in callback["callback"]
        assert job["runs"]["defaults"][0]["seconds"] > 0
