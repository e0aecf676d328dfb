"""Fits run in a fresh interpreter: a script's text in, what each rank wrote (or printed) out."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_script(source: str, tmp_path: Path, *, timeout: float, **fields: str) -> str:
    """Write ``source`` (``{root}``, ``{out}`` and ``fields`` filled in) and run it; its stdout.

    ``{root}`` is the repository (for ``sys.path``), ``{out}`` is ``tmp_path`` (for files the
    script writes). Fails the test when the script exits non-zero.
    """
    script = tmp_path / "fit_script.py"
    text = source.format(root=str(ROOT), out=str(tmp_path), **fields)
    script.write_text(textwrap.dedent(text))
    done = subprocess.run([sys.executable, str(script)], check=True, timeout=timeout,
                          cwd=tmp_path, capture_output=True, text=True)  # fmt: skip
    return done.stdout


def rank_outputs(source: str, tmp_path: Path, *, timeout: float, ranks: int = 2) -> list[Any]:
    """Run a DDP script that writes ``{out}/rank{N}.json`` per rank; the parsed files in order."""
    run_script(source, tmp_path, timeout=timeout)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(ranks)]
