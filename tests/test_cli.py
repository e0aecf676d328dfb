from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_maxtp.cli import main

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "lightning_maxtp.cli", *args],
        capture_output=True, text=True, timeout=60, env=env, check=check,
    )  # fmt: skip


def test_inspect_json_is_parseable_and_complete(tmp_path: Path) -> None:
    out = run_cli("inspect", "--json", "--path", str(tmp_path)).stdout
    data = json.loads(out)
    assert set(data) >= {"cpu", "memory", "gpus", "versions", "advice", "notes", "gpu_backend"}
    assert data["cpu"]["effective"] >= 1
    assert data["cpu"]["usable"] <= data["cpu"]["logical"]
    assert data["memory"]["disk_path"] == str(tmp_path.resolve())
    assert data["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    if not data["gpus"]:
        assert data["advice"]["free_gpus"] == []
        assert data["gpu_backend"] in {"none", "torch"}


def test_inspect_model_size_adds_workers_per_gpu() -> None:
    data = json.loads(run_cli("inspect", "--json", "--model-gib", "1.5").stdout)
    advice = data["advice"]
    assert advice["model_gib"] == 1.5 and advice["headroom_gib"] == 2.5
    assert [w["gpu"] for w in advice["workers_per_gpu"]] == advice["free_gpus"]


def test_inspect_text_table() -> None:
    out = run_cli("inspect").stdout
    lines = out.splitlines()
    assert lines[0].startswith("machine ")
    assert any(line.startswith("cpu ") and "effective" in line for line in lines)
    assert any(line.startswith("advice ") for line in lines)


def test_inspect_imports_neither_torch_nor_lightning() -> None:
    code = (
        "import sys, io, contextlib\n"
        "from lightning_maxtp.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['inspect', '--json'])\n"
        "heavy = [m for m in ('torch', 'lightning', 'pytorch_lightning') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert out.strip() == "[]"


def test_bad_arguments_name_the_value(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["inspect", "--model-gib", "-2"])
    assert exc.value.code == 2
    assert "--model-gib: must be > 0, got '-2'" in capsys.readouterr().err
    assert main(["inspect", "--headroom-gib", "-1"]) == 2
    assert "--headroom-gib must be >= 0, got -1.0" in capsys.readouterr().err


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "maxtp"
    if not script.exists():
        pytest.skip("package not installed in this interpreter's environment (pip install -e .)")
    out = subprocess.run([str(script), "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("maxtp ")
