"""``maxtp pack`` with real child processes on the CPU: concurrency, env, failures, Ctrl-C."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from lightning_maxtp.pack import JobSpec, plan_pack, run_jobs
from lightning_maxtp.pack.proc import killed_by, rerun
from lightning_maxtp.resources import CpuInfo
from lightning_maxtp.resources.probe import Resources, derive_advice, inspect_resources

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
SHOW_ENV = (
    "import os, time; e = os.environ; "
    "print('env', e['OMP_NUM_THREADS'], e['MKL_NUM_THREADS'], e['OPENBLAS_NUM_THREADS'], "
    "repr(e['CUDA_VISIBLE_DEVICES']), flush=True); time.sleep({sleep})"
)


def cpu_machine(cpus: int) -> Resources:
    """This machine as probed, but with ``cpus`` CPUs and no GPU (the GPU boundary is faked)."""
    res = inspect_resources()
    cpu = CpuInfo(logical=cpus, physical=cpus, usable=cpus, cgroup_quota=None)
    return dataclasses.replace(res, cpu=cpu, gpus=(), advice=derive_advice(cpu, ()))


def py_job(name: str, code: str, **kw: object) -> JobSpec:
    return JobSpec((PY, "-c", code), name=name, **kw)  # type: ignore[arg-type]


def test_jobs_run_concurrently_with_their_thread_share(tmp_path: Path) -> None:
    jobs = [py_job(f"s{i}", SHOW_ENV.format(sleep=1.5)) for i in range(4)]
    start = time.monotonic()
    result = run_jobs(jobs, resources=cpu_machine(4), log_dir=tmp_path)
    wall = time.monotonic() - start
    assert [j.status for j in result.jobs] == ["ok"] * 4
    assert result.exit_code == 0
    # run one after another they take >= 6 s; packed, about the longest (1.5 s + start-up)
    assert wall < 0.7 * 4 * 1.5, wall
    for n, job in enumerate(result.jobs, start=1):
        assert job.log_path == str(tmp_path / f"0{n}-s{n - 1}.log")
        assert "env 1 1 1 ''" in Path(job.log_path).read_text()  # 4 CPUs / 4 jobs
        assert job.threads == 1 and job.gpu is None and job.wall_s is not None


def test_thread_budget_serialises_and_job_env_wins(tmp_path: Path) -> None:
    jobs = [
        py_job("a", SHOW_ENV.format(sleep=0), cpu_threads=2),
        py_job("b", SHOW_ENV.format(sleep=0), env={"OMP_NUM_THREADS": "7"}, cwd=str(tmp_path)),
        JobSpec("pwd", name="where", cwd=str(tmp_path)),
    ]
    plan = plan_pack(jobs, resources=cpu_machine(2))
    assert [p.demand.name for p in plan.first.starts] == ["a"]  # a takes both CPUs
    result = run_jobs(plan, log_dir=tmp_path / "logs")
    logs = [Path(j.log_path or "").read_text() for j in result.jobs]
    assert "env 2 2 2 ''" in logs[0]
    assert "env 7 1 1 ''" in logs[1]
    assert str(tmp_path) in logs[2].splitlines()[-1]


def test_failures_are_counted_and_do_not_stop_the_others(tmp_path: Path) -> None:
    jobs = [
        JobSpec("exit 3", name="three"),
        JobSpec("echo fine", name="fine"),
        JobSpec("kill -9 $$", name="killed"),
        JobSpec(("/nonexistent/program",), name="missing"),
    ]
    result = run_jobs(jobs, resources=cpu_machine(4), log_dir=tmp_path)
    assert [(j.status, j.exit_code) for j in result.jobs] == [
        ("failed", 3), ("ok", 0), ("failed", -9), ("failed", 127)
    ]  # fmt: skip
    assert result.num_failed == 3 and result.exit_code == 1  # 2 would read as a usage error
    assert "could not start" in Path(result.jobs[3].log_path or "").read_text()
    text = str(result)
    assert text.splitlines()[-1].startswith("1/4 ok, 3 failed")


def test_fail_fast_stops_running_jobs_and_skips_queued(tmp_path: Path) -> None:
    jobs = [JobSpec("sleep 0.3; exit 1", name="bad"), JobSpec("sleep 30", name="slow"),
            JobSpec("echo never", name="queued")]  # fmt: skip
    start = time.monotonic()
    result = run_jobs(jobs, resources=cpu_machine(2), log_dir=tmp_path, fail_fast=True)
    assert time.monotonic() - start < 15
    assert [j.status for j in result.jobs] == ["failed", "stopped", "not_run"]
    assert result.jobs[1].exit_code == -signal.SIGTERM
    assert result.exit_code == 1


OOM_ONCE = (
    "import pathlib, sys; m = pathlib.Path(sys.argv[1]); first = not m.exists(); m.touch(); "
    "print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB') if first "
    "else print('fits now'); sys.exit(1 if first else 0)"
)


@pytest.mark.parametrize("retry", [False, True])
def test_oom_is_recognised_and_retried_alone_when_asked(tmp_path: Path, retry: bool) -> None:
    jobs = [JobSpec((PY, "-c", OOM_ONCE, str(tmp_path / "marker")), name="big"),
            JobSpec("exit 0", name="other")]  # fmt: skip
    result = run_jobs(jobs, resources=cpu_machine(2), log_dir=tmp_path / "logs", retry_oom=retry)
    big = result.jobs[0]
    if retry:
        assert (big.status, big.exit_code, big.attempts) == ("ok", 0, 2)
        assert big.log_path == str(tmp_path / "logs" / "01-big.retry1.log")
        assert "fits now" in Path(big.log_path).read_text()
        assert "out of memory" in (tmp_path / "logs" / "01-big.log").read_text()
    else:
        assert (big.status, big.exit_code, big.attempts) == ("oom", 1, 1)
    assert result.exit_code == (0 if retry else 1)


KILLED_ONCE = (
    "import os, pathlib, signal, sys; m = pathlib.Path(sys.argv[1]); first = not m.exists(); "
    "m.touch(); os.kill(os.getpid(), signal.SIGKILL) if first else print('second attempt')"
)


def test_a_killed_job_is_rerun_up_to_its_retries(tmp_path: Path) -> None:
    jobs = [
        JobSpec((PY, "-c", KILLED_ONCE, str(tmp_path / "m1")), name="once", retries=1),
        py_job("always", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)", retries=2),
        JobSpec("exit 3", name="error", retries=2),  # an error code: it would fail again
    ]
    result = run_jobs(jobs, resources=cpu_machine(2), log_dir=tmp_path / "logs")
    rows = [(j.status, j.exit_code, j.attempts) for j in result.jobs]
    assert rows == [("ok", 0, 2), ("failed", -15, 3), ("failed", 3, 1)]
    once, always, _ = result.jobs
    assert once.log_path == str(tmp_path / "logs" / "01-once.retry1.log")
    assert "second attempt" in Path(once.log_path).read_text().splitlines()[-1]
    assert (tmp_path / "logs" / "01-once.log").exists()  # the killed attempt's log is kept
    assert once.earlier[0].startswith("killed by SIGKILL after ") and len(always.earlier) == 2
    assert {j.node for j in result.jobs} == {socket.gethostname()}
    text = str(result)
    assert "once attempt 1: killed by SIGKILL after" in text
    assert "always attempt 2: killed by SIGTERM after" in text
    assert result.exit_code == 1 and result.to_dict()["backend"] == "local"  # 2 failed


@pytest.mark.parametrize(
    ("code", "shell", "name"),
    [(-9, False, "SIGKILL"), (-15, True, "SIGTERM"), (137, True, "SIGKILL"), (137, False, None),
     (-11, False, None), (1, True, None), (None, True, None)],
)  # fmt: skip
def test_killed_by_names_only_killing_signals(code: int | None, shell: bool, name: str) -> None:
    assert killed_by(code, shell=shell) == name


@pytest.mark.parametrize(
    ("code", "oom", "attempt", "retries", "retry_oom", "again"),
    [
        (-9, False, 1, 1, False, ("killed by SIGKILL", False)),
        (-9, False, 2, 1, False, None),  # no retry left
        (1, False, 1, 3, True, None),  # an error exit would fail again
        (1, True, 1, 0, True, ("out of GPU memory", True)),
        (1, True, 2, 0, True, None),  # an OOM is rerun once
        (1, True, 1, 0, False, None),
        (0, True, 1, 0, True, None),  # a success that printed an OOM is a success
    ],
)  # fmt: skip
def test_rerun_is_one_policy_for_both_backends(
    code: int, oom: bool, attempt: int, retries: int, retry_oom: bool, again: object
) -> None:
    kwargs = {"attempt": attempt, "retries": retries, "retry_oom": retry_oom}
    assert rerun(code, oom=oom, shell=False, **kwargs) == again


def test_backend_arguments_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"`backend` must be one of \('local', 'ray'\), got 'k8s'"):
        run_jobs([JobSpec("true")], backend="k8s")
    with pytest.raises(ValueError, match=r"`address` \('auto'\) names a Ray cluster"):
        run_jobs([JobSpec("true")], address="auto", log_dir=tmp_path)
    plan = plan_pack([JobSpec("true")], resources=cpu_machine(2))
    with pytest.raises(ValueError, match=r"`jobs` is a PackPlan .* pass the JobSpecs"):
        run_jobs(plan, backend="ray")


def test_peak_memory_covers_the_process_tree(tmp_path: Path) -> None:
    alloc = "import time; b = bytearray(300 * 2**20); time.sleep(1.5)"
    job = JobSpec(f"{PY} -c '{alloc}' & wait", name="tree")  # the allocation is a grandchild
    result = run_jobs([job], resources=cpu_machine(2), log_dir=tmp_path)
    assert (result.jobs[0].peak_rss_bytes or 0) > 250 * 2**20


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [PY, "-m", "lightning_maxtp.cli", "pack", *args],
        capture_output=True, text=True, timeout=timeout, env=env, check=False,
    )  # fmt: skip


def test_cli_json_summary_and_exit_code(tmp_path: Path) -> None:
    out = run_cli("--json", "--log-dir", str(tmp_path), "--", "exit 4", "echo ok", "exit 1")
    data = json.loads(out.stdout)
    # Two jobs failed: exit 1, not 2 (argparse's code for bad arguments); the count is in JSON.
    assert out.returncode == 1 == data["exit_code"] and data["num_failed"] == 2
    assert [j["exit_code"] for j in data["jobs"]] == [4, 0, 1]
    assert "[maxtp pack] failed job1: exit 4" in out.stderr


def test_cli_dry_run_and_errors(tmp_path: Path) -> None:
    out = run_cli("--dry-run", "--cpu-threads", "1", "--", "echo a", "echo b")
    assert out.returncode == 0 and out.stdout.startswith("pack plan: 2 jobs on ")
    none = run_cli()
    assert none.returncode == 2 and "no jobs given; pass --jobs FILE" in none.stderr
    empty = tmp_path / "jobs.txt"
    empty.write_text("# nothing\n")
    bad = run_cli("--jobs", str(empty))
    assert bad.returncode == 2 and "no jobs found" in bad.stderr
    both = run_cli("--jobs", str(empty), "--", "echo a")
    assert both.returncode == 2 and "not both" in both.stderr


def test_cli_exit_codes_tell_failed_jobs_from_bad_arguments(tmp_path: Path) -> None:
    usage = run_cli("--max-parallel", "0", "--", "true")  # argparse's own usage error
    assert usage.returncode == 2 and "usage: maxtp pack" in usage.stderr
    assert "--max-parallel: must be >= 1" in usage.stderr
    ok = run_cli("--quiet", "--log-dir", str(tmp_path / "ok"), "--", "true")
    assert ok.returncode == 0
    failed = run_cli("--quiet", "--log-dir", str(tmp_path / "two"), "--", "exit 3", "false")
    assert failed.returncode == 1 and "0/2 ok, 2 failed" in failed.stdout
    helped = run_cli("--help")
    assert helped.returncode == 0
    epilog = " ".join(helped.stdout.split())
    assert "Exit codes: 0 every job ok (or --dry-run), 1 one or more jobs failed, 2 bad " in epilog


def test_cli_imports_neither_torch_nor_lightning(tmp_path: Path) -> None:
    code = (
        "import sys, io, contextlib\n"
        "from lightning_maxtp.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    main(['pack', '--quiet', '--log-dir', {str(tmp_path)!r}, '--', 'true'])\n"
        "print([m for m in ('torch', 'lightning', 'pytorch_lightning') if m in sys.modules])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [PY, "-c", code], check=False, capture_output=True, text=True, env=env, timeout=60
    )
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stderr
    # What a Ray worker imports for each job, and the driver's side before `import ray`.
    ray_side = (
        "import sys, lightning_maxtp.pack.ray_runner, lightning_maxtp.pack.ray_task\n"
        "print([m for m in ('torch', 'lightning', 'ray') if m in sys.modules])\n"
    )
    out = subprocess.run(
        [PY, "-c", ray_side], check=False, capture_output=True, text=True, env=env, timeout=60
    )
    assert out.stdout.strip() == "[]", out.stderr


def _running_commands(tree: list[psutil.Process]) -> tuple[int, int]:
    """How many of ``tree`` have exec'd the Python sleeper, and how many ``sleep 60``."""
    pythons = sleeps = 0
    for proc in tree:
        with contextlib.suppress(psutil.Error):
            cmd = proc.cmdline()
            pythons += int(cmd[:1] == [PY] and "time.sleep(60)" in " ".join(cmd))
            sleeps += int(cmd == ["sleep", "60"])
    return pythons, sleeps


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_every_child_and_grandchild(tmp_path: Path, sig: signal.Signals) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    sleeper = f"{PY} -c 'import time; time.sleep(60)'"
    pack = subprocess.Popen(
        [PY, "-m", "lightning_maxtp.cli", "pack", "--max-parallel", "3", "--cpu-threads", "1",
         "--log-dir", str(tmp_path), "--", f"{sleeper} & {sleeper} & wait", sleeper, "sleep 60",
         "sleep 60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        tree: list[psutil.Process] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # 3 jobs: sh + 2 pythons, python, sleep
            tree = psutil.Process(pack.pid).children(recursive=True)
            if _running_commands(tree) == (3, 1):
                break
            time.sleep(0.1)
        # Counting processes is not enough: a shell that has forked but not yet exec'd its
        # command counts too, and the signal could then come before the third job starts.
        assert _running_commands(tree) == (3, 1), [p.cmdline() for p in tree]
        pack.send_signal(sig)
        out, err = pack.communicate(timeout=30)
    finally:
        if pack.poll() is None:
            pack.kill()
            pack.communicate()
    assert pack.returncode == 128 + sig, err
    assert f"interrupted by {sig.name}" in out
    assert [line.split()[1] for line in out.splitlines()[1:5]] == [
        "stopped", "stopped", "stopped", "not_run"
    ]  # fmt: skip
    time.sleep(0.2)
    alive = [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [p.cmdline() for p in alive]
