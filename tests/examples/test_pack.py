"""The pack examples: ``pack_seeds.py``, ``pack_ray.py`` and the sample ``pack_jobs.json``."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def test_pack_seeds_trains_every_seed(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "pack_seeds.py"), "--seeds", "2", "--steps",
         "3", "--log-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=True, env=ENV, cwd=tmp_path,
    ).stdout  # fmt: skip
    assert out.startswith("pack plan: 2 jobs on ")
    assert re.search(r"^2/2 ok, 0 failed, [\d.]+ s$", out, re.M)
    assert re.search(r"^seed1: seed 1 device \w+ threads \d+ steps 3 loss [\d.]+", out, re.M)
    assert re.search(r"^seed2: seed 2 device \w+ threads \d+ steps 3 loss [\d.]+", out, re.M)
    assert sorted(p.name for p in tmp_path.glob("*.log")) == ["01-seed1.log", "02-seed2.log"]


def test_sample_jobs_file_parses_and_plans() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "lightning_maxtp.cli", "pack", "--dry-run", "--json", "--jobs",
         str(ROOT / "examples" / "pack_jobs.json")],
        capture_output=True, text=True, timeout=60, check=True, env=ENV,
    ).stdout  # fmt: skip
    plan = json.loads(out)
    assert [j["name"] for j in plan["jobs"]] == ["seed1", "seed2", "seed3", "wide"]
    assert plan["jobs"][3]["threads"] == 2 and plan["jobs"][3]["ram_bytes"] == 2**30
    started = {s["job"] for s in plan["starts"]} | {w["job"] for w in plan["waits"]}
    assert started == {"seed1", "seed2", "seed3", "wide"}


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs the [ray] extra")
def test_pack_ray_trains_every_seed_on_a_local_ray(tmp_path: Path) -> None:
    env = {**ENV, "RAY_USAGE_STATS_ENABLED": "0"}
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "pack_ray.py"), "--seeds", "2", "--steps", "3",
         "--log-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=180, check=True, env=env, cwd=tmp_path,
    ).stdout  # fmt: skip
    assert re.search(r"^2/2 ok, 0 failed, [\d.]+ s on ray$", out, re.M), out
    host = re.escape(socket.gethostname())
    assert re.search(rf"^seed1 on {host}: seed 1 device \w+ threads \d+ steps 3 loss", out, re.M)
    assert re.search(rf"^seed2 on {host}: seed 2 device \w+ threads \d+ steps 3 loss", out, re.M)
    assert sorted(p.name for p in tmp_path.glob("*.log")) == ["01-seed1.log", "02-seed2.log"]
