"""``maxtp pack --backend ray`` on a local two-CPU Ray instance: the same jobs as the local backend.

One Ray instance for the module (~4 s to start), with Ray's process-group cleanup on (what
``maxtp pack`` sets on a Ray instance it starts). Each job's command runs on the "node" (this
machine) as the child of a Ray worker; its output comes back through Ray's driver logging and
the task's records.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from lightning_maxtp.cli import main
from lightning_maxtp.pack import JobSpec, ray_task, run_jobs
from lightning_maxtp.pack.ray_cluster import GROUP_CLEANUP, plan_ray_pack
from lightning_maxtp.pack.ray_runner import run_ray_jobs
from tests.helpers.ray_local import local_ray
from tests.pack.test_runner import SHOW_ENV, cpu_machine, py_job

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv(GROUP_CLEANUP, "true")  # the raylet ends the jobs of a worker that died
        with local_ray(num_cpus=2) as context:
            yield context


def test_four_jobs_run_with_their_cpu_share_and_the_local_json_shape(
    cluster: Any, tmp_path: Path
) -> None:
    jobs = [
        py_job("s0", SHOW_ENV.format(sleep=0.3)),
        py_job("s1", SHOW_ENV.format(sleep=0.3)),
        py_job("wide", SHOW_ENV.format(sleep=0.3), cpu_threads=2),
        py_job("own", SHOW_ENV.format(sleep=0.3), env={"OMP_NUM_THREADS": "7"}),
    ]
    result = run_jobs(jobs, backend="ray", log_dir=tmp_path / "ray")
    assert [j.status for j in result.jobs] == ["ok"] * 4 and result.exit_code == 0
    logs = [Path(j.log_path or "").read_text() for j in result.jobs]
    assert "env 1 1 1 ''" in logs[0] and "env 1 1 1 ''" in logs[1]  # 1 of the 2 CPUs each
    assert "env 2 2 2 ''" in logs[2]  # cpu_threads=2: the whole node
    assert "env 7 1 1 ''" in logs[3]  # the job's own variable wins
    assert "# ray_task: num_cpus=2, num_gpus=0" in logs[2]
    host = socket.gethostname()
    assert {j.node for j in result.jobs} == {host} and result.backend == "ray"
    assert [j.log_path for j in result.jobs] == [
        str(tmp_path / "ray" / f"0{n}-{name}.log")
        for n, name in enumerate(("s0", "s1", "wide", "own"), start=1)
    ]
    assert f"  {host}  " in str(result).splitlines()[1]  # the node column
    local = run_jobs(jobs, resources=cpu_machine(2), log_dir=tmp_path / "local")
    ray_dict, local_dict = result.to_dict(), local.to_dict()
    assert ray_dict.keys() == local_dict.keys() and local_dict["backend"] == "local"
    assert [j.keys() for j in ray_dict["jobs"]] == [j.keys() for j in local_dict["jobs"]]
    assert [j["status"] for j in local_dict["jobs"]] == [j["status"] for j in ray_dict["jobs"]]


STREAMED = (
    "import pathlib, sys, time; go = pathlib.Path(sys.argv[1]); print('first', flush=True)\n"
    "deadline = time.monotonic() + 60\n"
    "while not go.exists() and time.monotonic() < deadline: time.sleep(0.05)\n"
    "print('second: my first line had reached the driver while I ran')"
)


def test_output_reaches_the_driver_while_the_job_runs(cluster: Any, tmp_path: Path) -> None:
    """Through Ray's driver logging: the job waits until the test has read its first line on
    the stderr of ``maxtp pack``, then ends; its log has everything once it has ended."""
    go = tmp_path / "go"
    jobs_file = tmp_path / "jobs.json"
    jobs_file.write_text(json.dumps([{"command": [PY, "-c", STREAMED, str(go)], "name": "s"}]))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    pack = subprocess.Popen(
        [PY, "-m", "lightning_maxtp.cli", "pack", "--backend", "ray", "--address",
         cluster.address_info["address"], "--jobs", str(jobs_file), "--log-dir",
         str(tmp_path / "logs"), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert pack.stderr is not None
        seen = []
        for line in pack.stderr:  # ends when maxtp pack does: the job ended without us
            seen.append(line)
            if "(maxtp-pack:s pid=" in line and line.rstrip().endswith(" first"):  # colored
                go.touch()
                break
        assert go.exists(), "".join(seen)
        out, err = pack.communicate(timeout=120)
    finally:
        if pack.poll() is None:
            pack.kill()
            pack.communicate()
    data = json.loads(out)
    assert data["exit_code"] == 0 and data["jobs"][0]["wall_s"] < 60, err
    log = Path(data["jobs"][0]["log_path"]).read_text()
    assert log.endswith("first\nsecond: my first line had reached the driver while I ran\n")


def output(log: Path) -> list[str]:
    """The job's own lines in its log (not our ``#`` header)."""
    return [line for line in log.read_text().splitlines() if not line.startswith("#")]


KILL_SELF_ONCE = (
    "import os, pathlib, signal, sys, time; m = pathlib.Path(sys.argv[1])\n"
    "if not m.exists():\n"
    "    m.write_text(str(os.getpid())); os.kill(os.getpid(), signal.SIGKILL)\n"
    "print('second attempt')"
)
KILL_WORKER_ONCE = (  # the task's worker dies, as on a lost node; the job itself would go on
    "import os, pathlib, re, signal, sys, time; m = pathlib.Path(sys.argv[1])\n"
    "if not m.exists():\n"
    "    log, deadline = pathlib.Path(sys.argv[2]), time.monotonic() + 60\n"
    "    pid = re.compile(r'Ray worker pid (\\d+)')\n"
    "    while not (log.exists() and (w := pid.search(log.read_text()))):\n"
    "        assert time.monotonic() < deadline; time.sleep(0.05)  # the header comes after us\n"
    "    assert int(w[1]) == os.getppid()  # the job is its worker's child\n"
    "    pathlib.Path(sys.argv[3]).write_text(os.readlink('/proc/self/fd/1'))  # its output\n"
    "    m.write_text(str(os.getpid())); os.kill(int(w[1]), signal.SIGKILL)\n"
    "    time.sleep(60)\n"
    "print('second attempt')"
)


def test_failures_retries_and_a_lost_worker(cluster: Any, tmp_path: Path) -> None:
    killed, lost, output_file = tmp_path / "killed.pid", tmp_path / "lost.pid", tmp_path / "out"
    lost_log = tmp_path / "logs" / "04-lost.log"  # names the Ray worker's pid
    jobs = [
        JobSpec("echo broken; exit 3", name="three", retries=2),  # an error code: never rerun
        JobSpec("echo fine", name="fine"),
        JobSpec((PY, "-c", KILL_SELF_ONCE, str(killed)), name="killed", retries=1),
        JobSpec(
            (PY, "-c", KILL_WORKER_ONCE, str(lost), str(lost_log), str(output_file)),
            name="lost",
            retries=1,
        ),
        JobSpec("kill -9 $$", name="no-retry"),
        py_job("term", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"),  # not blocked
    ]
    result = run_jobs(jobs, backend="ray", log_dir=tmp_path / "logs")
    rows = [(j.status, j.exit_code, j.attempts) for j in result.jobs]
    assert rows == [
        ("failed", 3, 1), ("ok", 0, 1), ("ok", 0, 2), ("ok", 0, 2), ("failed", -9, 1),
        ("failed", -15, 1),
    ]  # fmt: skip
    assert result.exit_code == 1 and result.num_failed == 3
    three, _, kill, gone, *_ = result.jobs
    assert "broken" in Path(three.log_path or "").read_text()
    assert kill.earlier[0].startswith("killed by SIGKILL on ")
    # Ray reran the task of the worker that died (its max_retries): the driver saw a new start
    assert gone.earlier[0].startswith("lost on ") and "Ray worker or node died" in gone.earlier[0]
    for job in (kill, gone):  # the first attempt's log is kept, the result is the second's
        assert job.log_path is not None and job.log_path.endswith(".retry1.log")
        assert "second attempt" in output(Path(job.log_path))
        assert "second attempt" not in output(Path(job.log_path.replace(".retry1", "")))
    first_log = (tmp_path / "logs" / "04-lost.log").read_text()
    orphan = int(lost.read_text())
    assert "the Ray task was lost: its worker or node died" in first_log
    # The lost worker's job died with it (Ray ended the worker's process group).
    deadline = time.monotonic() + 10
    while psutil.pid_exists(orphan) and time.monotonic() < deadline:
        with contextlib.suppress(psutil.Error):
            if psutil.Process(orphan).status() == psutil.STATUS_ZOMBIE:
                break
        time.sleep(0.1)
    with contextlib.suppress(psutil.NoSuchProcess):
        assert psutil.Process(orphan).status() == psutil.STATUS_ZOMBIE
    text = str(result)
    assert "killed attempt 1: killed by SIGKILL" in text and "lost attempt 1: lost on" in text
    # The killed worker left no folder behind: its job's output file had left it already.
    written = output_file.read_text()
    assert written.endswith(" (deleted)") and "maxtp-pack-" in written, written
    assert not Path(written.removesuffix(" (deleted)")).parent.exists(), written


def test_fail_fast_cancels_the_rest_and_max_parallel_holds_them_back(
    cluster: Any, tmp_path: Path
) -> None:
    jobs = [JobSpec("sleep 1; exit 1", name="bad"),
            JobSpec("sleep 30; echo finished", name="slow"),
            JobSpec("echo late", name="late")]  # fmt: skip
    result = run_jobs(jobs, backend="ray", log_dir=tmp_path, fail_fast=True, max_parallel=2)
    bad, slow, late = result.jobs
    # "slow" was running, unless a loaded machine had not started its worker yet
    assert bad.status == "failed" and slow.status in ("stopped", "not_run")
    if slow.log_path is not None:  # cancelled, not waited for
        assert "finished" not in output(Path(slow.log_path))
    assert late.status == "not_run" and late.log_path is None
    assert not (tmp_path / "03-late.log").exists()


def test_a_task_that_ignores_its_cancel_is_killed_after_the_grace(
    cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner never waits on a task: one whose stream has ended while its code is still
    stopping (here: forever) must not hold up the others' end, only the grace period."""

    started = tmp_path / "stay-started"

    def stubborn(job: JobSpec, index: int, events: Any, env: Any) -> int:  # for run_attempt
        # As the real task does: Ray's cancel is then a KeyboardInterrupt here, also where the
        # worker inherited SIGINT ignored (a test run started in a shell's background), whose
        # interrupt otherwise fails inside Ray with a TypeError and ends the task at once.
        ray_task._interruptible()
        if job.command == "fail":
            # Ray may start either task first; "bad" failing before "stay" has said it started
            # leaves "stay" not run, which is not what this test is about.
            deadline = time.monotonic() + 30
            while not started.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        events.put({"kind": "start", "job": index, "host": "node", "node_id": None, "gpus": [],
                    "env": {}, "worker_pid": os.getpid()})  # fmt: skip
        if job.command == "stay":
            started.touch()
        if job.command == "fail":
            events.put({"kind": "end", "job": index, "exit_code": 1, "oom": False, "wall_s": 0.0,
                        "output": b"", "peak_rss_bytes": None})  # fmt: skip
            return 1
        while True:  # a cancel is a KeyboardInterrupt here: ignored
            try:
                time.sleep(0.05)
            except KeyboardInterrupt:
                continue

    monkeypatch.setattr(ray_task, "run_attempt", stubborn)
    monkeypatch.setattr(ray_task, "STOP_GRACE_S", 2.0)
    jobs = [JobSpec("stay", name="stay"), JobSpec("fail", name="bad")]
    began = time.monotonic()
    # one CPU each, two CPUs: both run at once, "bad" once "stay" has started
    result = run_jobs(jobs, backend="ray", log_dir=tmp_path, fail_fast=True, max_parallel=2)
    assert time.monotonic() - began < 60
    stay, bad = result.jobs
    assert bad.status == "failed" and stay.status == "stopped", result
    log = Path(stay.log_path or "").read_text()
    assert "killed with its Ray worker after the grace period" in log


def test_a_job_no_node_holds_is_refused_before_anything_starts(
    cluster: Any, tmp_path: Path
) -> None:
    jobs = [JobSpec("echo a", name="a"), JobSpec("echo b", name="huge", cpu_threads=64)]
    with pytest.raises(ValueError, match=r"job 'huge' asks for 0 GPU\(s\), 64 CPU\(s\)"):
        run_ray_jobs(jobs, log_dir=tmp_path)  # run_jobs(backend="ray") by its own name
    assert not list(tmp_path.iterdir())
    plan = plan_ray_pack(jobs[:1], default_cpu_threads=2)
    assert plan.demands[0].options() == {"num_cpus": 2.0, "num_gpus": 0.0}
    assert str(plan).startswith("pack plan: 1 jobs as Ray tasks on 1 node(s), 2 CPUs, 0 GPUs")


def test_cli_dry_run_and_errors(cluster: Any, tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["pack", "--backend", "ray", "--dry-run", "--json", "--", "echo a"])
    assert code == 0, err.getvalue()
    data = json.loads(out.getvalue())
    assert data["backend"] == "ray" and data["jobs"][0]["num_cpus"] == 1.0
    with contextlib.redirect_stderr(err):
        assert main(["pack", "--address", "auto", "--", "echo a"]) == 2
    assert "--address is for a Ray cluster; add --backend ray" in err.getvalue()


def test_without_ray_the_error_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'lightning-maxtp\[ray\]'"):
        run_jobs([JobSpec("true")], backend="ray", log_dir=tmp_path)
    with pytest.raises(ValueError, match=r"`jobs` is empty"):  # checked before Ray is needed
        run_jobs([], backend="ray", log_dir=tmp_path)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["pack", "--backend", "ray", "--log-dir", str(tmp_path), "--", "true"]) == 2
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("maxtp: error: maxtp pack --backend ray needs")


SLEEPER = "sleep 300 & echo $! > {pids}; echo started; wait"
CLI_WITH_STACKS = (  # `maxtp`, with every thread's stack on SIGUSR1
    "import faulthandler, signal, sys; faulthandler.register(signal.SIGUSR1, all_threads=True)\n"
    "from lightning_maxtp.cli import main; sys.exit(main())"
)


def test_sigint_cancels_every_task_and_leaves_no_process(cluster: Any, tmp_path: Path) -> None:
    pids = [tmp_path / f"{n}.pid" for n in range(3)]
    jobs = [{"command": SLEEPER.format(pids=p), "name": f"j{n}"} for n, p in enumerate(pids)]
    jobs_file = tmp_path / "jobs.json"
    jobs_file.write_text(json.dumps(jobs))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    pack = subprocess.Popen(
        [PY, "-c", CLI_WITH_STACKS, "pack", "--backend", "ray", "--address",
         cluster.address_info["address"], "--jobs", str(jobs_file), "--log-dir",
         str(tmp_path / "logs")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120  # Ray's workers start slowly on a loaded runner
        # two jobs run (one CPU each), the third waits in Ray's queue
        while time.monotonic() < deadline:
            running = [int(text) for p in pids if p.exists() and (text := p.read_text().strip())]
            if len(running) == 2:
                break
            time.sleep(0.1)
        assert len(running) == 2, list((tmp_path / "logs").glob("*"))
        pack.send_signal(signal.SIGINT)
        try:
            out, err = pack.communicate(timeout=120)  # at most the 15 s grace, then forced
        except subprocess.TimeoutExpired:
            pack.send_signal(signal.SIGUSR1)  # where it hangs, into the failure's message
            time.sleep(2)
            pack.kill()
            _, err = pack.communicate()
            pytest.fail(f"maxtp pack did not stop within 120 s of SIGINT:\n{err[-6000:]}")
    finally:
        if pack.poll() is None:
            pack.kill()
            pack.communicate()
    assert pack.returncode == 130, err
    assert "interrupted by SIGINT" in out
    statuses = sorted(line.split()[1] for line in out.splitlines()[1:4])
    assert statuses == ["not_run", "stopped", "stopped"], out
    # Each job's `sleep 300`: ended by its task, or, past the grace, with its worker's process
    # group once Ray has killed the worker (a moment after maxtp pack has returned).
    deadline = time.monotonic() + 15
    while (alive := [p for p in running if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive


def _alive(pid: int) -> bool:
    with contextlib.suppress(psutil.NoSuchProcess):
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    return False
