"""What every ``gpu_check_*.py`` script shares: check rows, the GPU-marked tests, the ending.

A check script appends rows (name, ok / failed / not applicable, detail), then ``finish`` prints
them as a table for people and ends with one JSON line for machines, optionally written to a
file, and returns the exit code (1 when any row failed).

A row is never held back for the end: ``check`` (or ``emit`` for a script's own row dicts)
prints it at once, flushed, and appends it as one JSON line to the file ``$MAXTP_CHECK_ROWS``
names (``gpu_check_all`` sets it), tagged with the script (``$MAXTP_CHECK_SCRIPT``). A script
killed for its time leaves every row it measured; on SIGTERM it prints the JSON line of the
rows so far and exits 143.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

Rows = list[dict[str, Any]]


ROWS_ENV = "MAXTP_CHECK_ROWS"
SCRIPT_ENV = "MAXTP_CHECK_SCRIPT"
DATA_DIR_ENV = "MAXTP_DATA_DIR"
"""A folder for every generated JPEG set (one subfolder per spec): ``gpu_check_all`` sets it
so that its scripts share the sets it generated once (``workloads.jpeg.default_data_dir``)."""
_RESULT = {True: "ok", False: "FAIL", None: "skip"}
_emitted: Rows = []


def check(rows: Rows, name: str, ok: bool | None, detail: str) -> None:
    """Record one check (``ok=None``: skipped or informational) and ``emit`` it."""
    add(rows, {"check": name, "ok": ok, "detail": detail})


def add(rows: Rows, row: dict[str, Any]) -> None:
    """Record a script's own row dict (``check``/``ok``/``detail`` and more) and ``emit`` it."""
    rows.append(row)
    emit(row)


def script_name() -> str:
    """The running check's name: ``$MAXTP_CHECK_SCRIPT``, else its file's."""
    return os.environ.get(SCRIPT_ENV) or Path(sys.argv[0]).stem


def emit(row: dict[str, Any]) -> None:
    """Print one row now, flushed, and append it to ``$MAXTP_CHECK_ROWS`` (when set)."""
    if not _emitted and threading.current_thread() is threading.main_thread():
        # A script that emits rows ends on SIGTERM with them (set here, not on import).
        signal.signal(signal.SIGTERM, _terminated)
    _emitted.append(row)
    show_row(row, script_name(), os.environ.get(ROWS_ENV))


def show_row(row: dict[str, Any], script: str, path: str | Path | None) -> None:
    """Print one row, flushed; append it to the rows file ``path`` (when given) as JSON."""
    name = row.get("check") or row.get("case") or "?"
    print(f"[{_RESULT.get(row.get('ok'), '?')}] {name}: {row.get('detail', '')}"[:400], flush=True)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"script": script, **row}, default=str) + "\n")


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM (the runner's deadline): the rows so far as the JSON last line, exit 143."""
    failed = [str(r.get("check") or r.get("case")) for r in _emitted if r.get("ok") is False]
    line = {"check": script_name(), "failed": failed, "rows": _emitted, "terminated": True}
    print(json.dumps(line, default=str), flush=True)
    raise SystemExit(143)  # unwinds: finally blocks, loaders and Lightning shut down


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
        result = {**_RESULT, None: none_label}[row["ok"]]
        print(f"{row['check']:<{name_width}} {result:<7} {row['detail']}")
    failed = [r["check"] for r in rows if r["ok"] is False]
    line = json.dumps({"check": name, "failed": failed, "rows": rows, **extra})
    print(line)
    if out:
        out.write_text(line + "\n")
    return 1 if failed else 0
