"""`maxtp pack --backend ray` at a wrong address fails in seconds, naming what to check."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.ray_local import closed_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray")
def test_an_address_where_nothing_listens_fails_in_seconds_naming_it(tmp_path: Path) -> None:
    port = closed_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "lightning_maxtp.cli", "pack", "--backend", "ray",
         "--address", f"127.0.0.1:{port}", "--log-dir", str(tmp_path), "--", "echo a"],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"`address` '127.0.0.1:{port}': nothing accepts a connection at 127.0.0.1:{port}" in (
        done.stderr
    )
    assert time.monotonic() - start < 60, "Ray's own retries took over"
    assert not list(tmp_path.iterdir()), "no job started"
