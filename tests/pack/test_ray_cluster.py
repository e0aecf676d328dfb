"""Connecting to a Ray cluster: a wrong address fails in seconds, naming what to check."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lightning_maxtp.pack.ray_cluster import endpoint

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("address", "where"),
    [(None, None), ("auto", None), ("local", None), ("head:6379", ("head", 6379)),
     ("ray://10.0.0.5:10001", ("10.0.0.5", 10001)), ("[::1]:6379", ("::1", 6379)),
     ("head", None), ("head:port", None), (":6379", None)],
)  # fmt: skip
def test_the_endpoint_an_address_names(address: str | None, where: tuple[str, int] | None) -> None:
    assert endpoint(address) == where


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray")
def test_an_address_where_nothing_listens_fails_in_seconds_naming_it(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on once this closes
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
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
