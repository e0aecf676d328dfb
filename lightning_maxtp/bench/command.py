"""The ``maxtp bench`` subcommand: parse, run, write the files, gate, pick the exit code.

Exit codes: 0 no regression (or no baseline given), 1 a regression, 2 bad arguments or a job
that fails to build or run (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from lightning_maxtp.bench.format import format_markdown, format_text
from lightning_maxtp.bench.gate import GATES, GateResult, compare
from lightning_maxtp.bench.reference import REFERENCE
from lightning_maxtp.bench.result import BenchResult
from lightning_maxtp.bench.run import BenchRunError, run_bench
from lightning_maxtp.bench.target import BenchTargetError, parse_target

__all__ = ["add_bench_parser", "cmd_bench"]


def _whole(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return value


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a share such as 0.10, got {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), e.g. 0.10 for 10 %, got {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def add_bench_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``bench`` to the ``maxtp`` subcommands."""
    bench = sub.add_parser(
        "bench",
        help="time your training job (defaults vs MaxThroughputCallback) and gate on a baseline",
        description="Time the training job TARGET returns, once per configuration per round, "
        "each run in a fresh process, rounds alternating. Records steady samples/s after "
        "warm-up, the whole fit's wall-clock and their spread, next to a small reference "
        "workload timed in the same process. With --baseline it exits 1 when a metric fell by "
        "more than --max-regression and beyond the measured spread.",
        epilog="TARGET: FILE.py:FUNCTION or package.module:FUNCTION; the function returns a dict "
        "(or lightning_maxtp.bench.BenchJob) with 'model' (a LightningModule), 'datamodule' or "
        "'train_dataloaders', and optionally 'trainer_kwargs'. Exit codes: 0 passed, 1 "
        "regression, 2 bad arguments or a broken job.",
    )
    bench.add_argument("target", metavar="TARGET", help="FILE.py:FUNCTION or module:FUNCTION")
    bench.add_argument("--steps", type=_whole, default=100, help="timed steps per fit (100)")
    bench.add_argument("--warmup", type=_whole, default=10, help="untimed steps first (10)")
    bench.add_argument("--rounds", type=_whole, default=3, help="runs of each config (3)")
    bench.add_argument(
        "--configs",
        default="defaults,maxtp",
        help="comma-separated: defaults (the job as written), maxtp (with "
        "MaxThroughputCallback()), or names your job function takes as `config` "
        "(default: defaults,maxtp)",
    )
    bench.add_argument(
        "--accelerator", default=None, help="Trainer accelerator (default: the job's, or auto)"
    )
    bench.add_argument("--json", type=Path, default=None, help="write the result (a baseline)")
    bench.add_argument("--markdown", type=Path, default=None, help="write a Markdown report")
    bench.add_argument("--baseline", type=Path, default=None, help="a result to gate against")
    bench.add_argument(
        "--max-regression", type=_share, default=0.10, help="tolerated fall (default: 0.10)"
    )
    bench.add_argument(
        "--gate",
        choices=GATES,
        default="ratio",
        help="ratio: per reference workload, travels between machines (default); absolute: "
        "raw samples/s, same machine only",
    )
    bench.add_argument(
        "--timeout", type=_seconds, default=1800.0, help="seconds one fit may take (1800)"
    )
    bench.add_argument("--verbose", action="store_true", help="show the job's own output")
    bench.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    bench.set_defaults(handler=cmd_bench)


def _error(message: str) -> int:
    print(f"maxtp bench: error: {message}", file=sys.stderr)
    return 2


def _read_baseline(path: Path, steps: int, warmup: int) -> BenchResult:
    if not path.is_file():
        raise ValueError(f"--baseline {path}: no such file; record one with --json {path} first")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"--baseline {path}: not readable JSON ({err})") from None
    baseline = BenchResult.from_dict(data, where=f"--baseline {path}")
    if baseline.params.get("reference") != REFERENCE:
        raise ValueError(
            f"--baseline {path} was timed against the reference workload "
            f"{baseline.params.get('reference')!r}, this version uses {REFERENCE!r}; record a "
            "new baseline"
        )
    for name, value in (("steps", steps), ("warmup", warmup)):
        if baseline.params.get(name) != value:
            raise ValueError(
                f"--baseline {path} was recorded with --{name} {baseline.params.get(name)}, "
                f"this run asks for --{name} {value}; use the same or record a new baseline"
            )
    return baseline


def _check_outputs(*paths: Path | None) -> None:
    for flag, path in zip(("--json", "--markdown"), paths, strict=True):
        if path is not None and path.is_dir():
            raise ValueError(f"{flag} {path} is a folder; give a file name, e.g. {path}/bench.json")


def _write(result: BenchResult, gate: GateResult | None, json_out: Path | None,
           markdown_out: Path | None) -> None:  # fmt: skip
    record: dict[str, Any] = result.to_dict()
    if gate is not None:
        record["gate"] = gate.to_dict()
    for path, text in ((json_out, json.dumps(record, indent=1) + "\n"),
                       (markdown_out, format_markdown(result, gate))):  # fmt: skip
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)


def cmd_bench(args: argparse.Namespace) -> int:
    """Handle ``maxtp bench``.

    Args:
        args: The parsed ``maxtp bench`` arguments.

    Returns:
        The exit code: 0 passed (or no baseline), 1 a regression, 2 bad arguments or a broken
        job, 130 interrupted.
    """
    configs = tuple(c.strip() for c in args.configs.split(",") if c.strip())
    try:
        parse_target(args.target)
        _check_outputs(args.json, args.markdown)
        baseline = None
        if args.baseline is not None:
            baseline = _read_baseline(args.baseline, args.steps, args.warmup)
        result = run_bench(
            args.target,
            configs=configs,
            steps=args.steps,
            warmup=args.warmup,
            rounds=args.rounds,
            accelerator=args.accelerator,
            timeout_s=args.timeout,
            quiet=args.quiet,
            verbose=args.verbose,
        )
    except KeyboardInterrupt:
        print("maxtp bench: interrupted; nothing written", file=sys.stderr)
        return 130
    except BenchTargetError as err:
        return _error(str(err))
    except BenchRunError as err:
        return _error(f"{err} (run with --verbose to see the job's output)")
    except ValueError as err:
        return _error(str(err))
    gate, problem = None, None
    if baseline is not None:
        try:
            gate = compare(result, baseline, args.max_regression, args.gate, f"{args.baseline}")
        except ValueError as err:  # measured, but not comparable: keep what was measured
            problem = str(err)
    try:
        _write(result, gate, args.json, args.markdown)
    except OSError as err:
        return _error(f"cannot write the result: {err}")
    print(format_text(result, gate), flush=True)
    if problem is not None:
        return _error(problem)
    return 0 if gate is None else gate.exit_code
