"""``python -m benchmarks.loader_cpu --smoke``: the plan and the sweep measured end to end."""

from __future__ import annotations

import json

import pytest

from benchmarks import loader_cpu


@pytest.mark.parametrize("dataset", ["numpy", "memory"])
def test_smoke_measures_the_sweep_and_compares_the_plan(
    dataset: str, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = loader_cpu.main(["--smoke", "--dataset", dataset])
    lines = capsys.readouterr().out.strip().splitlines()
    assert json.loads(lines[-1]) == summary
    result = json.loads(lines[-3])  # the run's JSON line, before the summary lines
    assert result["benchmark"] == f"loader_cpu_{dataset}"
    names = [c["name"] for c in result["configs"]]
    assert names[:2] == ["w0-pNone", "w1-p2"]
    assert summary["plan_config"] in names and summary["sweep_best"] in names
    assert set(summary["ratios"]) == {"plan / sweep-best", "plan / 0 workers"}
    assert result["params"]["plan_reason"]
