"""Scripts run for tests: fits in a fresh interpreter (a script's text in, what each rank wrote or
printed out), and the example scripts run in this process."""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

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


@contextlib.contextmanager
def process_state_kept() -> Iterator[None]:
    """Put back what a script run in this process may change for the tests after it.

    Logger levels, handlers and propagation (``examples/find_batch.py`` quiets
    ``lightning.pytorch``, which hid every later test's ``maxtp:`` INFO lines from ``caplog``),
    warning filters and torch's intra-op thread count. Child processes, threads and environment
    variables are the leak fixtures' business (``tests/conftest.py``).
    """
    import logging
    import warnings

    import torch

    loggers = [logging.root, *logging.root.manager.loggerDict.values()]
    saved = [
        (lg, lg.level, lg.propagate, lg.disabled, list(lg.handlers))
        for lg in loggers
        if isinstance(lg, logging.Logger)
    ]
    threads, disabled = torch.get_num_threads(), logging.root.manager.disable
    with warnings.catch_warnings():
        try:
            yield
        finally:
            for lg, level, propagate, was_disabled, handlers in saved:
                lg.setLevel(level)
                lg.propagate, lg.disabled, lg.handlers[:] = propagate, was_disabled, handlers
            logging.disable(disabled)
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)


@dataclass(frozen=True)
class Ran:
    """What a script run in this process left: its exit code and what it printed."""

    code: int
    stdout: str
    stderr: str


def run_example(script: Path, *args: str, cwd: Path, check: bool = True) -> Ran:
    """Run ``python script args`` in this process, from ``cwd``; its exit code and output.

    In-process because a fresh interpreter spends ~8 s of CPU importing torch and Lightning,
    which this test process has already imported; the script still runs as ``__main__``,
    with its own ``sys.argv`` and working directory, both put back afterwards. Use a
    subprocess instead for a script that spawns processes (they re-import ``__main__``) or
    whose point is what a fresh interpreter imports. With ``check``, a non-zero exit fails
    the test with what the script printed. What the script changes process-wide is put back
    (``process_state_kept``).
    """
    stdout, stderr = io.StringIO(), io.StringIO()
    saved_argv, saved_cwd, saved_path = sys.argv, os.getcwd(), list(sys.path)
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(script.parent))  # as `python script` puts the script's folder first
    os.chdir(cwd)
    code = 0
    try:
        with (
            process_state_kept(),
            contextlib.redirect_stdout(stdout),
            contextlib.redirect_stderr(stderr),
        ):
            try:
                runpy.run_path(str(script), run_name="__main__")
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        os.chdir(saved_cwd)
    ran = Ran(code, stdout.getvalue(), stderr.getvalue())
    if check and code != 0:
        raise AssertionError(f"{script.name} exited with {code}:\n{ran.stdout}\n{ran.stderr}")
    return ran


def smoke_json(
    main: Callable[[list[str]], dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> Any:
    """Run a benchmark's ``main(["--smoke"])`` in this process; its printed JSON line, parsed.

    In-process: a fresh interpreter would spend ~8 s importing torch and Lightning again. The
    printed line must be what ``main`` returned.
    """
    with process_state_kept():
        returned = main(["--smoke"])
    data = json.loads(capsys.readouterr().out.strip().splitlines()[-1])  # the one JSON line
    assert data == json.loads(json.dumps(returned))
    return data
