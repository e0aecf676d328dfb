"""``python -m benchmarks.allow_cpu --smoke``: the whole-fit A/B/C runs end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_times_defaults_safe_and_all_on_both_jobs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.allow_cpu", "--smoke"], capture_output=True,
        text=True, timeout=300, check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    ).stdout  # fmt: skip
    data = json.loads(out.strip().splitlines()[-1])
    assert data["benchmark"] == "allow_cpu" and data["smoke"] is True
    assert set(data["wall_ratios"]) == {"long", "short"}
    for job in data["jobs"].values():
        assert set(job["runs"]) == {"defaults", "safe", "all"}
        (every,) = job["runs"]["all"]
        assert every["seconds"] > 0 and every["tail_samples_per_s"] > 0
        assert "stop_reason" in every["callback"] and "kept" in every["callback"]
