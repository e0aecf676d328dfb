"""The bench's fork server: one import, a forked child per run, each with its own exit and log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from lightning_maxtp.bench import run
from lightning_maxtp.bench.forkserver import ForkServer, fork_allowed

JOBS = """
    import os, time
    from pathlib import Path

    def who():  # the run's pid and parent, then a failure the child reports as its record
        Path(os.environ["WHO_DIR"], str(os.getpid())).write_text(str(os.getppid()))
        raise RuntimeError("planted after writing the pid")

    def hangs():
        time.sleep(600)
"""


def argv(jobs: Path, function: str, out: Path) -> list[str]:
    return [
        "--target",
        f"{jobs}:{function}",
        "--config",
        "defaults",
        "--steps",
        "1",
        "--warmup",
        "1",
        "--out",
        str(out),
    ]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server is Linux-only")
def test_runs_are_forked_from_one_server_each_with_its_exit_log_and_time_limit(
    tmp_path: Path,
) -> None:
    jobs = tmp_path / "jobs.py"
    jobs.write_text(textwrap.dedent(JOBS))
    who = tmp_path / "who"
    who.mkdir()
    env = {**run._child_env(None, with_sys_path=False), "WHO_DIR": str(who)}
    with ForkServer(env, subprocess.DEVNULL) as server:
        assert server.ready, server.why
        codes = [
            server.run(argv(jobs, "who", tmp_path / f"{i}.json"), tmp_path / f"{i}.log", 60)
            for i in range(2)
        ]
        # A run that outlives its limit is killed; the server goes on with the next one.
        start = time.monotonic()
        assert server.run(argv(jobs, "hangs", tmp_path / "h.json"), None, 3.0) is None
        assert time.monotonic() - start < 30
        assert server.run(argv(jobs, "who", tmp_path / "2.json"), tmp_path / "2.log", 60) == 2
        server_pid = server._proc.pid
    assert server._proc.poll() is not None  # stopped on leaving the block
    assert codes == [2, 2]  # the child's own code for a target that raised
    for i in range(3):
        record = json.loads((tmp_path / f"{i}.json").read_text())
        assert "RuntimeError: planted after writing the pid" in record["error"]
        assert "RuntimeError: planted" in (tmp_path / f"{i}.log").read_text()  # its traceback
    parents = {int(p.name): int(p.read_text()) for p in who.iterdir()}
    assert len(parents) == 3 and set(parents.values()) == {server_pid}
    assert os.getpid() not in parents and not (tmp_path / "h.json").exists()


class NotReady:
    closed = False

    def __init__(self, env: dict[str, str], stderr: Any) -> None:
        self.ready, self.why = False, "CUDA was initialized by the imports"

    def close(self) -> None:
        NotReady.closed = True


def test_each_run_is_a_new_interpreter_where_forking_is_off_or_unsafe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert not fork_allowed({"MAXTP_BENCH_FORK": "0"})
    assert fork_allowed({}) == sys.platform.startswith("linux")
    assert run._server({"MAXTP_BENCH_FORK": "0"}, False, tmp_path) is None
    monkeypatch.setattr(run, "ForkServer", NotReady)
    monkeypatch.setattr(run, "fork_allowed", lambda env: True)
    assert run._server({}, False, tmp_path) is None and NotReady.closed


class DiesMidRun:
    def run(self, argv: list[str], log: Path | None, timeout_s: float) -> int | None:
        raise RuntimeError("the bench's fork server died while a run was going on")


def test_a_server_that_dies_mid_run_is_a_bench_run_error(tmp_path: Path) -> None:
    with pytest.raises(run.BenchRunError, match=r"^job \(config defaults, round 1\): the bench"):
        run._run_child(
            [],
            tmp_path / "r1.json",
            {},
            DiesMidRun(),  # type: ignore[arg-type]
            timeout_s=1,
            verbose=False,
            what="job (config defaults, round 1)",
        )
