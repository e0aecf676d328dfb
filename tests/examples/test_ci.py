"""``examples/ci``: the job function loads, and the workflow's command is one maxtp accepts."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from lightning_maxtp.bench.target import load_job, parse_target
from lightning_maxtp.cli import build_parser

CI = Path(__file__).resolve().parents[2] / "examples" / "ci"


def test_the_example_job_function_returns_a_job() -> None:
    job = load_job(parse_target(f"{CI / 'bench_job.py'}:job"))
    assert type(job.model).__name__ == "SmallCNN" and job.datamodule is None
    x, y = next(iter(job.train_dataloaders))
    assert tuple(x.shape) == (64, 3, 64, 64) and tuple(y.shape) == (64,)


def test_the_workflow_runs_maxtp_bench_with_options_it_has() -> None:
    text = (CI / "throughput.yml").read_text()
    target = re.search(r"TARGET: (\S+)", text)
    assert target is not None and (CI.parents[1] / target.group(1).split(":")[0]).is_file()
    (line,) = [x.strip() for x in text.splitlines() if x.strip().startswith("maxtp bench")]
    # The gate's words, as the pull request's branch of the step sets them.
    (gate,) = re.findall(r"gate=\((--against .*)\)", text)
    words = shlex.split(line.replace('"${gate[@]}"', gate))
    args = build_parser().parse_args(
        [w.replace("$TARGET", target.group(1)).replace('"', "") for w in words[1:]]
    )
    assert args.against == f"../base/{target.group(1)}" and args.against_path == ["../base"]
    assert args.rounds is None and args.configs == "defaults"  # --against's 5 rounds
    assert args.json == Path("bench.json") and args.baseline is None
    assert args.markdown == Path("bench.md") and args.max_regression == 0.05
    assert "git worktree add ../base" in text and "fetch-depth: 0" in text
    assert "GITHUB_STEP_SUMMARY" in text and "upload-artifact" in text
