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


def _heavy_imports_of(call: str) -> str:
    """The heavy modules a fresh interpreter holds after ``call`` (a ``main([...])`` line)."""
    code = (
        "import sys, io, contextlib\n"
        "from lightning_maxtp.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    {call}\n"
        "heavy = [m for m in ('torch', 'lightning', 'pytorch_lightning') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout.strip()


def test_inspect_imports_neither_torch_nor_lightning() -> None:
    assert _heavy_imports_of("main(['inspect', '--json'])") == "[]"


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


def test_report_renders_report_md_and_timeline_png_again_from_report_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.helpers.tuned_report import tuned_report

    written = tuned_report().write(tmp_path)
    data = (tmp_path / "report.json").read_bytes()
    md = (tmp_path / "report.md").read_text()
    for name in ("report.md", "timeline.png"):
        (tmp_path / name).unlink(missing_ok=True)
    assert main(["report", str(tmp_path)]) == 0
    # The round trip: report.json holds all the renderer reads, so the file comes back the same.
    assert (tmp_path / "report.md").read_text() == md
    assert (tmp_path / "report.json").read_bytes() == data  # the source is left as it is
    names = ", ".join(sorted(n for n in written if n != "report.json"))
    assert capsys.readouterr().out == f"maxtp: wrote {names} in {tmp_path} (from its report.json)\n"
    if "timeline.png" in written:
        assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_of_a_folder_without_a_report_names_dir_its_value_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fix = "; pass the report_dir a fit wrote (the folder that holds report.json)"
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "not-json").mkdir()
    (tmp_path / "not-json" / "report.json").write_text("{")
    (tmp_path / "other-json").mkdir()
    (tmp_path / "other-json" / "report.json").write_text('{"windows": []}')
    cases = {
        "missing": "no such folder",
        "a-file": "a file, not a folder",
        ".": "no report.json in it",
        "not-json": "report.json is not JSON (",
        "other-json": "report.json is not a maxtp report (no bottleneck, samples_per_s)",
    }
    for name, why in cases.items():
        folder = str(tmp_path / name)
        assert main(["report", folder]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith(f"maxtp: error: DIR {folder!r}: {why}"), err
        assert err.rstrip().endswith(fix), err


def test_report_imports_neither_torch_nor_lightning(tmp_path: Path) -> None:
    from tests.helpers.tuned_report import tuned_report

    tuned_report().write(tmp_path)
    assert _heavy_imports_of(f"assert main(['report', {str(tmp_path)!r}]) == 0") == "[]"


def test_report_draws_the_plot_a_fit_without_matplotlib_could_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    from tests.helpers.tuned_report import tuned_report

    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "matplotlib", None)
        assert sorted(tuned_report().write(tmp_path)) == ["report.json", "report.md"]
    assert "timeline.png not written" in (tmp_path / "report.md").read_text()
    assert main(["report", str(tmp_path)]) == 0
    md = (tmp_path / "report.md").read_text()
    # The fit's note was about its own attempt: the new file links the plot drawn now.
    assert "timeline.png not written" not in md and "![timeline](timeline.png)" in md
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
