"""``benchmarks/gpu_check_all.py``: every GPU check script's smoke mode in one run, and how a
script that fails, crashes, hangs or does not fit in the time left is reported."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks import gpu_check_all

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def check_names() -> list[str]:
    return sorted(
        p.stem.removeprefix("gpu_check_")
        for p in (ROOT / "benchmarks").glob("gpu_check_*.py")
        if p.stem != "gpu_check_all"
    )


@pytest.mark.slow
def test_smoke_runs_every_check_script_and_keeps_their_output(tmp_path: Path) -> None:
    # ~38 s alone here (75 s before the scripts were forked off one server that imported
    # torch and Lightning once), 82 s in CI's parallel pass then; each script is killed after
    # SMOKE_TIMEOUT_S (three at a time), so only a hang of the runner itself gets this far.
    record, out = tmp_path / "all.json", tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "benchmarks/gpu_check_all.py", "--smoke", "--profile", "full",
         "--results-dir", str(tmp_path), "--out", str(record), "--out-dir", str(out)],
        capture_output=True, text=True, timeout=420, check=False, env=ENV, cwd=ROOT,
    )  # fmt: skip
    short = json.loads(proc.stdout.strip().splitlines()[-1])
    data = json.loads(record.read_text())
    assert short["failed"] == data["failed"] and "result" not in short["scripts"][0]
    assert data["check"] == "gpu_check_all" and data["smoke"] is True
    names = [s["name"] for s in data["scripts"]]
    assert sorted(names) == check_names() and len(names) == len(set(names))
    assert names[0] == "inspect"
    statuses = {s["name"]: (s["status"], s["detail"]) for s in data["scripts"]}
    not_ok = {name: got for name, got in statuses.items() if got[0] != "ok"}
    assert not not_ok, (not_ok, proc.stdout[-3000:])
    assert data["failed"] == [] and proc.returncode == 0, proc.stderr[-2000:]
    assert all(s["exit_code"] == 0 and s["result"] is not None for s in data["scripts"])
    assert data["machine"]["cpus"] >= 1 and data["machine"]["cuda"] is False
    # Every row as it was measured, tagged with its script; the preflight's first.
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert rows[0]["script"] == "preflight" and {r["script"] for r in rows} >= {*names}
    assert sorted(p.name for p in out.iterdir()) == [
        "log.txt",
        "rows.jsonl",
        "summary.json",
        "summary.txt",
    ]
    assert json.loads((out / "summary.json").read_text())["failed"] == []
    kept = sorted(p.name for p in tmp_path.glob("*.txt"))
    assert kept == sorted(f"gpu_check_{name}.txt" for name in names)
    # gpu_check_pack's smoke mode trains two tiny jobs on the CPU and skips the GPU items; with
    # Ray installed it runs them again as Ray tasks.
    pack = next(s["result"] for s in data["scripts"] if s["name"] == "pack")
    on_ray = (
        {"ray: every job trained on cpu": True, "ray: the local backend's result keys": True}
        if importlib.util.find_spec("ray") is not None
        else {"backend ray": None}
    )
    assert {r["check"]: r["ok"] for r in pack["rows"]} == {
        "plan on GPU": None,
        "every job trained on cpu": True,
        "packed vs one after another": None,
        "peak RSS reported": True,
        "real CUDA OOM": None,
        **on_ray,
    }
    assert pack["sequential_s"] is None and pack["packed_s"] > 0  # one packed run without a GPU


SCRIPTS = {
    "gpu_check_a_ok.py": """
        import json
        print("check  result")
        print(json.dumps({"check": "a", "failed": [], "rows": [{"check": "x", "ok": True}]}))
    """,
    "gpu_check_b_fails.py": """
        import json, sys
        print(json.dumps({"check": "b", "failed": ["y"], "rows": [{"check": "y", "ok": False}]}))
        sys.exit(1)
    """,
    "gpu_check_c_no_json.py": """
        print("a table, then no JSON line")
        raise RuntimeError("boom")
    """,
    "gpu_check_d_hangs.py": """
        import time
        from benchmarks.checks import check
        print("started", flush=True)
        check([], "measured before the hang", True, "kept")
        time.sleep(60)
    """,
    "gpu_check_e_late.py": """
        print("{}")
    """,
}


@pytest.mark.parametrize("smoke", [False, True], ids=["interpreter", "forked"])
def test_failed_crashed_timeout_and_out_of_time_are_reported(
    smoke: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Each script in a fresh interpreter (the GPU run), or forked off the smoke mode's fork
    # server: the same statuses, output and rows either way.
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    for name, body in SCRIPTS.items():
        (scripts / name).write_text(textwrap.dedent(body))
    (scripts / "gpu_check_all.py").write_text("raise SystemExit('the runner must skip itself')")
    machine = {"cuda": False, "gpus": [], "cpus": 1}
    monkeypatch.setattr(gpu_check_all, "preflight", lambda require: (machine, []))  # no torch
    monkeypatch.setenv(gpu_check_all.DATA_DIR_ENV, str(tmp_path / "data"))
    monkeypatch.setattr(gpu_check_all, "SHARED_SETS", ())
    # 3 s each; 5 s for the scripts: the hanging one starts, then nothing fits any more.
    code = gpu_check_all.main([
        "--scripts-dir", str(scripts), "--budget-s", "3", "--deadline-s", "5",
        "--results-dir", str(tmp_path / "out"), "--out", str(tmp_path / "all.json"),
        "--out-dir", str(tmp_path / "dir"), "--no-require-gpu",
        *(["--smoke", "--jobs", "1"] if smoke else []),
    ])  # fmt: skip
    line = capsys.readouterr().out.strip().splitlines()[-1]
    data = json.loads((tmp_path / "all.json").read_text())
    assert json.loads(line)["failed"] == data["failed"]
    by_name = {s["name"]: s for s in data["scripts"]}
    assert list(by_name) == ["a_ok", "b_fails", "c_no_json", "d_hangs", "e_late"]
    assert {n: s["status"] for n, s in by_name.items()} == {
        "a_ok": "ok", "b_fails": "failed", "c_no_json": "crashed", "d_hangs": "timeout",
        "e_late": "not run",
    }  # fmt: skip
    assert by_name["a_ok"]["result"]["check"] == "a" and by_name["a_ok"]["failed_checks"] == []
    assert by_name["b_fails"]["exit_code"] == 1 and by_name["b_fails"]["failed_checks"] == ["y"]
    crashed = by_name["c_no_json"]
    assert crashed["result"] is None and "RuntimeError: boom" in crashed["detail"]
    assert by_name["d_hangs"]["exit_code"] != 0 and 3 <= by_name["d_hangs"]["seconds"] < 10
    assert "out of time" in by_name["e_late"]["detail"] and by_name["e_late"]["exit_code"] is None
    assert data["failed"] == ["b_fails", "c_no_json", "d_hangs", "e_late"] and code == 1
    assert data["smoke"] is smoke and data["machine"]["cuda"] is False
    kept = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert kept == [f"{n[:-3]}.txt" for n in sorted(SCRIPTS) if "late" not in n]
    assert "started" in (tmp_path / "out" / "gpu_check_d_hangs.txt").read_text()
    # Killed for its time, the hanging script still left its row: as measured, in the rows
    # file, and in the JSON line it printed on SIGTERM.
    rows = [json.loads(r) for r in (tmp_path / "dir" / "rows.jsonl").read_text().splitlines()]
    assert rows == [
        {"script": "d_hangs", "check": "measured before the hang", "ok": True, "detail": "kept"}
    ]
    hung = by_name["d_hangs"]["result"]
    assert hung["terminated"] is True and hung["rows"][0]["check"] == "measured before the hang"
    summary = json.loads((tmp_path / "dir" / "summary.json").read_text())
    assert [s["name"] for s in summary["scripts"]] == list(by_name)
    assert "d_hangs" in (tmp_path / "dir" / "log.txt").read_text()


def test_failed_check_names_from_each_json_shape() -> None:
    assert gpu_check_all.failed_checks({"failed": ["a"], "rows": []}) == ["a"]
    # gpu_check_diagnosis: rows named by case, no failed list
    rows = [{"case": "vram", "ok": False}, {"case": "cpu", "ok": None}]
    assert gpu_check_all.failed_checks({"rows": rows}) == ["vram"]
    # gpu_check_inference: a checks list, no failed list; its exit code is always 0
    checks = [{"check": "pool >= expert loop", "ok": False}]
    assert gpu_check_all.classify(0, False, {"checks": checks}) == (
        "failed", ["pool >= expert loop"]
    )  # fmt: skip
    assert gpu_check_all.classify(0, False, {"medians": {}}) == ("ok", [])
    assert gpu_check_all.classify(0, False, None) == ("crashed", None)
    assert gpu_check_all.last_json("table\n{not json}\n") is None
    assert gpu_check_all.last_json('{"a": 1}\n\n') == {"a": 1}


def test_the_compact_profile_fits_its_call_and_gpu_md_gives_the_command() -> None:
    compact, full = gpu_check_all.COMPACT, gpu_check_all.FULL
    assert list(compact)[:2] == ["inspect", "callback"]  # the probe, then the product's claim
    assert set(compact) <= set(full)
    # Every script within its budget ends before the deadline; the preflight and the data sets
    # come on top, and the device call's timeout leaves a margin past all three.
    assert sum(b.gpu_s for b in compact.values()) <= gpu_check_all.DEADLINES["compact"]
    call = gpu_check_all.DEADLINES["compact"] + gpu_check_all.PREFLIGHT_S
    assert call <= 6 * 60 + 30
    text = (ROOT / "benchmarks" / "GPU.md").read_text()
    assert "timeout_s=420" in text and call + 20 <= 420
    assert 'gpu_check_all.py --profile compact --out-dir "$OUT/gpu"' in text
    for name, budget in compact.items():
        assert f"| {name} | {budget.gpu_s:.0f} |" in text, name
