"""What every ``gpu_check_*.py`` script shares: check rows, the GPU-marked tests, the ending.

A check script appends rows (name, ok / failed / not applicable, detail), then ``finish`` prints
them as a table for people and ends with one JSON line for machines, optionally written to a
file, and returns the exit code (1 when any row failed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

Rows = list[dict[str, Any]]


def check(rows: Rows, name: str, ok: bool | None, detail: str) -> None:
    """Record one check; ``ok=None`` means skipped or informational."""
    rows.append({"check": name, "ok": ok, "detail": detail})


def run_gpu_tests(rows: Rows, test_file: str, keyword: str) -> None:
    """Run the GPU-marked tests of ``test_file`` (``-k keyword``) and record their summary."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", test_file, "-k", keyword],
        check=False, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
    )  # fmt: skip
    summary = tests.stdout.strip().splitlines()[-1] if tests.stdout.strip() else "no output"
    check(rows, "pytest GPU tests", tests.returncode == 0, summary)


def finish(
    name: str,
    rows: Rows,
    out: Path | None,
    *,
    name_width: int = 36,
    none_label: str = "skip",
    **extra: Any,
) -> int:
    """Print the table and the JSON line (``check``, ``failed``, ``rows``, then ``extra``).

    Returns:
        The script's exit code: 1 when a row failed, else 0.
    """
    print(f"{'check':<{name_width}} {'result':<7} detail")
    for row in rows:
        result = {True: "ok", False: "FAIL", None: none_label}[row["ok"]]
        print(f"{row['check']:<{name_width}} {result:<7} {row['detail']}")
    failed = [r["check"] for r in rows if r["ok"] is False]
    line = json.dumps({"check": name, "failed": failed, "rows": rows, **extra})
    print(line)
    if out:
        out.write_text(line + "\n")
    return 1 if failed else 0
