"""Run the README's demo and record it: the run's numbers, its console output, its report's head.

``python -m benchmarks.demo_record [--runs N]`` runs ``examples/demo.py`` (as ``bash
examples/demo.sh`` does, every tuning setting at its default) N times, one after another, and
for each appends one entry to ``benchmarks/results/demo_runs_cpu-2core.json`` (date, commit,
the baseline and final rates, the tuning steps, cost and budget, the verdicts), read from the
run's ``report.json``, favourable or not. The last run's console output becomes
``benchmarks/results/demo_console_cpu-2core.txt`` (the README's and the docs' console samples,
which ``benchmarks/render_docs.py`` copies from it), and its report gives the docs' assets: the
first screen of ``report.md`` (``docs/assets/demo-report-head.txt``) and ``timeline.png``.
Then run ``python -m benchmarks.render_docs`` to rewrite the pages.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "benchmarks" / "results" / "demo_runs_cpu-2core.json"
CONSOLE = ROOT / "benchmarks" / "results" / "demo_console_cpu-2core.txt"
ASSETS = ROOT / "docs" / "assets"
REPORT = ROOT / ".maxtp" / "demo-report"
"""Where ``examples/demo.py`` writes its report with its default ``--data-dir``."""
HEAD_END = "## Trials"
"""report.md's first screen: the summary block, up to the trials table (included)."""


def _commit() -> str:
    """The checkout's commit, with ``-dirty`` when tracked files differ from it."""
    sha = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "diff", "--quiet", "HEAD", "--", "lightning_maxtp", "examples"],
        cwd=ROOT,
        check=False,
    ).returncode
    return f"{sha}-dirty" if dirty else sha


def _head(markdown: str) -> str:
    """The summary block and the trials table of a report.md."""
    lines = markdown.splitlines()
    if HEAD_END not in lines:
        return markdown
    start = lines.index(HEAD_END)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return "\n".join(lines[:end]).rstrip() + "\n"


def entry(report: dict[str, Any], commit: str, wall_s: float, tree: str) -> dict[str, Any]:
    """One run's line in the runs file, from its ``report.json``."""
    tuning = report["tuning"]
    cost = tuning.get("cost") or {}
    verdicts = "; ".join(
        f"{t['knob']} {t['old']} -> {t['new']} {t['verdict']}" for t in tuning["trials"]
    )
    return {
        "date": dt.date.today().isoformat(),
        "commit": commit,
        "tree": tree,
        "baseline_samples_per_s": round(tuning["baseline_samples_per_s"], 1),
        "final_samples_per_s": round(tuning["tuned_samples_per_s"], 1),
        "tuning_steps": tuning["tuning_steps"],
        "cost_s": round(cost.get("cost_s", 0.0), 1),
        "budget_s": None if cost.get("budget_s") is None else round(cost["budget_s"], 1),
        "fit_s": round(wall_s),
        "decisions": verdicts or "no trial",
        "recorded_in": "benchmarks/demo_record.py (fit_s: the demo's whole wall-clock)",
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="demo runs, one after another")
    parser.add_argument("--tree", default="main", help="what the checkout holds, in words")
    parser.add_argument("--dry-run", action="store_true", help="print, write nothing")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be >= 1, got {args.runs}")
    commit = _commit()
    data = json.loads(RUNS.read_text())
    console = ""
    for i in range(args.runs):
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "examples/demo.py"],
            cwd=ROOT, capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            print(proc.stdout + proc.stderr, file=sys.stderr)
            return proc.returncode
        console = proc.stdout + proc.stderr  # the header on stdout, the callback's lines after
        report = json.loads((REPORT / "report.json").read_text())
        run = entry(report, commit, wall, args.tree)
        print(f"run {i + 1}/{args.runs}: {json.dumps(run)}")
        data["runs"].append(run)
    print(console, end="")
    if args.dry_run:
        return 0
    RUNS.write_text(json.dumps(data, indent=1) + "\n")
    CONSOLE.write_text(console)
    ASSETS.mkdir(exist_ok=True)
    (ASSETS / "demo-report-head.txt").write_text(_head((REPORT / "report.md").read_text()))
    shutil.copyfile(REPORT / "timeline.png", ASSETS / "demo-timeline.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
