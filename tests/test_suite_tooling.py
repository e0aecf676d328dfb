"""How the suite runs: ``--serial`` selects and orders tests (``tests/conftest.py``), and
``.ci/slowest.py`` prints the passes' wall-clock and the slowest tests at the end of ``.ci/run``."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import pytest_collection_modifyitems

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class FakeItem:
    """What the hook reads of a test: its name and its markers."""

    name: str
    markers: tuple[str, ...] = ()

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.markers else None


@dataclass
class FakeConfig:
    """A config whose ``--serial`` is ``mode``; records what the hook deselects."""

    mode: str
    deselected: list[Any] = field(default_factory=list)

    def getoption(self, name: str) -> str:
        assert name == "--serial"
        return self.mode

    @property
    def hook(self) -> FakeConfig:
        return self

    def pytest_deselected(self, items: list[Any]) -> None:
        self.deselected += items


def collected() -> list[FakeItem]:
    return [
        FakeItem("fast"), FakeItem("slow", ("slow",)), FakeItem("serial", ("serial",)),
        FakeItem("fast2"), FakeItem("slow_serial", ("slow", "serial")),
        FakeItem("slow2", ("slow",)),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("mode", "kept", "deselected"),
    [
        ("include", ["slow", "slow_serial", "slow2", "fast", "serial", "fast2"], []),
        ("exclude", ["slow", "slow2", "fast", "fast2"], ["serial", "slow_serial"]),
        ("only", ["slow_serial", "serial"], ["fast", "slow", "fast2", "slow2"]),
    ],
)
def test_serial_option_selects_and_slow_tests_go_first(
    mode: str, kept: list[str], deselected: list[str]
) -> None:
    items, config = collected(), FakeConfig(mode)
    pytest_collection_modifyitems(config, items)  # type: ignore[arg-type]
    # Slow first, otherwise in collection order (every xdist worker must see the same order).
    assert [i.name for i in items] == kept
    assert [i.name for i in config.deselected] == deselected


def slowest_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ci_slowest", ROOT / ".ci" / "slowest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def junit(path: Path, cases: dict[str, float]) -> Path:
    rows = "".join(
        f'<testcase classname="tests.pkg.test_mod" name="{name}" time="{seconds}"/>'
        for name, seconds in cases.items()
    )
    path.write_text(f'<testsuites><testsuite name="pytest">{rows}</testsuite></testsuites>')
    return path


def test_slowest_prints_each_pass_and_the_ten_slowest_tests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parallel = junit(tmp_path / "p.xml", {f"test_{i}": float(i) for i in range(12)})
    serial = junit(tmp_path / "s.xml", {"test_alone": 30.5})
    argv = ["--pass", "parallel", "100.0", "400.4", str(parallel),
            "--pass", "serial", "400.4", "450.0", str(serial)]  # fmt: skip
    assert slowest_module().main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    total = "pytest wall-clock: 350 s = parallel 300 s (12 tests) + serial 50 s (1 tests)"
    assert lines[0] == total
    assert lines[1] == "the 10 slowest tests (setup + call + teardown):"
    assert lines[2] == "     30.5 s  tests/pkg/test_mod.py::test_alone  [serial]"
    assert lines[3] == "     11.0 s  tests/pkg/test_mod.py::test_11  [parallel]"
    assert len(lines) == 12 and lines[-1].endswith("test_3  [parallel]")


def test_slowest_reads_a_pass_without_a_report_as_no_tests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A pass that collected nothing (pytest's exit 5) may leave an empty or no XML file.
    (tmp_path / "empty.xml").write_text("")
    argv = ["--pass", "parallel", "0", "2", str(tmp_path / "empty.xml"),
            "--pass", "serial", "2", "3", str(tmp_path / "missing.xml"),
            "--run", "0", "1"]  # fmt: skip
    assert slowest_module().main(argv) == 0
    out = capsys.readouterr().out
    assert "pytest wall-clock: 3 s = parallel 2 s (0 tests) + serial 1 s (0 tests)" in out
    assert "the 0 slowest tests" in out and "(set-up before them: 1 s)" in out


GROUPED = """
import os, pathlib, pytest
pytestmark = pytest.mark.xdist_group("one")
@pytest.mark.parametrize("i", range(6))
def test_where(i):
    out = pathlib.Path(os.environ["WHERE_OUT"]) / f"{i}.txt"
    out.write_text(os.environ["PYTEST_XDIST_WORKER"])
"""


@pytest.mark.skipif(importlib.util.find_spec("xdist") is None, reason="needs pytest-xdist")
def test_loadgroup_keeps_a_group_on_one_worker(tmp_path: Path) -> None:
    """``.ci/run``'s ``--dist loadgroup`` must honour ``xdist_group``: the Ray tests share one
    Ray instance per worker only if they run on one worker (pytest 9.2 with pytest-xdist 3.8
    silently ran them everywhere, each worker starting Ray)."""
    import os
    import subprocess
    import sys

    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "out").mkdir()
    env = {**os.environ, "WHERE_OUT": str(tmp_path / "out")}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "3",
         "--dist", "loadgroup", "--rootdir", str(tmp_path), str(tmp_path / "test_grouped.py")],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:]
    workers = {p.read_text() for p in (tmp_path / "out").iterdir()}
    assert len(list((tmp_path / "out").iterdir())) == 6 and len(workers) == 1, workers
