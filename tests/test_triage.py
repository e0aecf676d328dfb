"""``maxtp triage`` on real child processes, and its pure classifier."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from lightning_maxtp.cli import main
from lightning_maxtp.observe import BottleneckKind
from lightning_maxtp.triage import classify, triage

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def child(code: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        yield proc
    finally:
        # kill the grandchildren first: a SIGKILLed child cannot clean up its own
        with contextlib.suppress(psutil.Error):
            for grandchild in psutil.Process(proc.pid).children(recursive=True):
                grandchild.kill()
        proc.kill()
        proc.wait(timeout=10)


def test_busy_child_is_compute_bound(capsys: pytest.CaptureFixture[str]) -> None:
    with child("while True: pass") as proc:
        assert main(["triage", "--duration", "1.5", "--pid", str(proc.pid), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["pid"] == proc.pid and data["bottleneck"] == "compute"
    # demand counts runnable time too, so a busy loop is ~100 % even on a saturated machine
    assert data["evidence"]["main_demand_percent"] > 70
    assert data["diagnoses"][0]["recommendations"]


def test_sleeping_child_is_not_compute_and_shows_idle_cpu(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with child("import time; time.sleep(60)") as proc:
        assert main(["triage", "--duration", "1", "--pid", str(proc.pid)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"sampled process tree of pid {proc.pid} for 1.0 s")
    assert "bottleneck: under_occupied" in out
    values = dict(line.strip().split(": ") for line in out.splitlines()[1:4])
    assert float(values["main_demand_percent"]) < 20  # python's start-up, then sleep


def test_children_count_as_workers() -> None:
    code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
        "try:\n    time.sleep(60)\nfinally:\n    p.kill()\n"
    )
    with child(code) as proc:
        deadline = time.monotonic() + 30
        while not psutil.Process(proc.pid).children() and time.monotonic() < deadline:
            time.sleep(0.05)
        result = triage(1.5, proc.pid, interval_s=0.1)
    assert result.evidence["workers"] == 1.0
    assert result.evidence["worker_demand_percent"] > 70
    assert result.diagnoses[0].kind is BottleneckKind.DATA_PIPELINE


def test_missing_pid_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert main(["triage", "--duration", "0.2", "--pid", str(proc.pid)]) == 2
    assert capsys.readouterr().err == f"maxtp: error: --pid {proc.pid}: no such process\n"
    with pytest.raises(SystemExit) as exc:
        main(["triage", "--duration", "0"])
    assert exc.value.code == 2
    assert "--duration: must be > 0, got '0'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="`duration_s` must be > 0, got -1"):
        triage(-1)


def test_whole_machine_without_pid() -> None:
    result = triage(0.5, interval_s=0.1)
    assert result.pid is None and result.evidence["system_cpu_percent"] is not None
    assert "sampled the whole machine for 0.5 s" in str(result)


def test_classify_gpu_cases() -> None:
    def kind(**ev: float) -> str:
        return classify(dict(ev), cpu_budget=6)[0].kind.value

    assert kind(gpu_util_percent=97, gpu_memory_share=0.3) == "compute"
    assert kind(gpu_util_percent=95, gpu_memory_share=0.97) == "compute"
    assert classify({"gpu_util_percent": 95, "gpu_memory_share": 0.97})[1].kind.value == "vram"
    busy_workers = {"worker_cpu_percent": 380.0, "workers": 4.0, "main_cpu_percent": 30.0}
    assert kind(gpu_util_percent=20, **busy_workers) == "data_pipeline"
    top = classify({"gpu_util_percent": 20, **busy_workers}, cpu_budget=6)[0]
    assert str(top.recommendations[0]) == (
        "num_workers: 4 -> 6 (loader workers are CPU-busy) [auto]"
    )
    assert kind(gpu_util_percent=20, iowait_percent=30, main_cpu_percent=5) == "storage"
    assert kind(gpu_util_percent=30, main_cpu_percent=100) == "kernel_launch"
    assert kind(gpu_util_percent=5, main_cpu_percent=10) == "under_occupied"


def test_triage_imports_neither_torch_nor_lightning() -> None:
    code = (
        "import sys, io, contextlib\n"
        "from lightning_maxtp.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['triage', '--duration', '0.3', '--json'])\n"
        "print([m for m in ('torch', 'lightning', 'pytorch_lightning') if m in sys.modules])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True).stdout  # fmt: skip
    assert out.strip() == "[]"


_WAITS_ON_WORKERS = """
import multiprocessing as mp, threading, time

def worker(q):
    while True:
        time.sleep(0.008)  # one batch of 8 reads, 1 ms each: the worker waits, it does not work
        q.put(b"x" * 1024)

def spin():  # a thread pool spinning while it waits (what made the old triage say compute)
    while True:
        pass

if __name__ == "__main__":
    q = mp.get_context("fork").Queue()
    for _ in range(2):
        mp.get_context("fork").Process(target=worker, args=(q,), daemon=True).start()
    threading.Thread(target=spin, daemon=True).start()
    while True:
        q.get()  # the training loop: blocked on the workers' queue
"""


def test_a_loop_waiting_on_its_workers_is_not_compute(capsys: pytest.CaptureFixture[str]) -> None:
    with child(_WAITS_ON_WORKERS) as proc:
        time.sleep(1.0)  # the workers have started
        assert main(["triage", "--duration", "2", "--pid", str(proc.pid), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    ev = data["evidence"]
    assert ev["workers"] == 2 and ev["main_thread_running_share"] < 0.4, ev
    assert data["bottleneck"] == "storage", data["diagnoses"][0]["summary"]
    assert data["source"] == "sampled" and "no live status" in data["status_note"]
    assert "the main thread waits" in data["diagnoses"][0]["summary"]


_PUBLISHES = """
import sys, time
sys.path.insert(0, {root!r})
from lightning_maxtp.observe.status import write_status
path = write_status({{"bottleneck": "data_pipeline", "confidence": 0.9, "first_step": 40,
                     "summary": "data wait 87% of step", "data_wait_share": 0.87}})
print(path, flush=True)
time.sleep(60)
"""


def test_triage_reads_a_trusted_live_status_and_refuses_forged_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from lightning_maxtp.observe.status import read_status, status_path

    code = _PUBLISHES.format(root=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        path = Path(proc.stdout.readline().strip())  # type: ignore[union-attr]
        assert path == status_path(proc.pid)
        assert os.stat(path).st_mode & 0o777 == 0o600
        assert os.stat(path.parent).st_mode & 0o777 == 0o700
        assert main(["triage", "--duration", "0.5", "--pid", str(proc.pid), "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert (data["source"], data["bottleneck"]) == ("job status", "data_pipeline")
        assert data["evidence"]["job_data_wait_share"] == 0.87
        assert data["diagnoses"][0]["summary"].startswith("the job's own monitor (window from")

        uid = os.getuid()
        body = json.loads(path.read_text())
        path.write_text(json.dumps({**body, "pid": proc.pid + 1}))  # names another process
        assert read_status(proc.pid, uid)[0] is None
        assert "names another process" in read_status(proc.pid, uid)[1]
        real = path.with_name("elsewhere.json")
        real.write_text(json.dumps(body))
        path.unlink()
        path.symlink_to(real)  # a planted link is never followed
        status, why = read_status(proc.pid, uid)
        assert status is None and "not a regular file" in why
        assert read_status(proc.pid, uid + 1)[0] is None  # the file is not that user's
    finally:
        proc.kill()
        proc.wait(timeout=10)
        for leftover in (status_path(proc.pid), status_path(proc.pid).with_name("elsewhere.json")):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
