"""``examples/tune_loader.py`` runs in seconds and prints a plan with its evidence."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.helpers.scripts import run_example

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tune_loader.py"


def test_example_tunes_and_prints_the_plan() -> None:
    out = run_example(
        EXAMPLE, "--images", "64", "--time-budget", "3", "--max-workers", "2",
        "--consumption-rate", "1e6", cwd=ROOT,
    ).stdout  # fmt: skip
    assert out.startswith("LoaderPlan: ")  # the change itself depends on this machine
    assert re.search(r"^  why: .+ short of the 1,000,000 samples/s the device consumes", out, re.M)
    assert "  diagnosis: data_pipeline" in out
    assert re.search(r"^\s+0\s+-\s+[\d,.]+\s+[\d,.]+", out, re.M)  # the main-process row
    assert re.search(r"tuned in \d+\.\d s of 3 s", out)


def test_example_json_and_bad_arguments() -> None:
    done = run_example(
        EXAMPLE, "--images", "32", "--time-budget", "1", "--max-workers", "0", "--json", cwd=ROOT
    )
    plan = json.loads(done.stdout)
    assert plan["num_workers"] == 0 and plan["budget"]["cpu_source"] == "max_workers=0"
    bad = run_example(EXAMPLE, "--time-budget", "0", cwd=ROOT, check=False)
    assert bad.code == 2 and "`time_budget_s` must be > 0, got 0.0" in bad.stderr
