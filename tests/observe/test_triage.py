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
from lightning_maxtp.observe.triage import classify, triage

ROOT = Path(__file__).resolve().parents[2]


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
