"""The ``maxtp bench`` subcommand's handler: run, write the files, gate, pick the exit code.

Its parser is in ``lightning_maxtp.cli``, beside the other subcommands'.

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
from lightning_maxtp.bench.gate import PAIRED, PAIRED_ROUNDS, GateResult, compare
from lightning_maxtp.bench.reference import REFERENCE
from lightning_maxtp.bench.result import BenchResult
from lightning_maxtp.bench.run import BenchRunError, run_against, run_bench
from lightning_maxtp.bench.target import BenchTargetError, parse_target

__all__ = ["cmd_bench"]


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


def _write(
    result: BenchResult,
    gate: GateResult | None,
    json_out: Path | None,
    markdown_out: Path | None,
    against: BenchResult | None = None,
) -> None:
    record: dict[str, Any] = result.to_dict()
    if gate is not None:
        record["gate"] = gate.to_dict()
    if against is not None:
        record["against"] = against.to_dict()
    for path, text in (
        (json_out, json.dumps(record, indent=1) + "\n"),
        (markdown_out, format_markdown(result, gate)),
    ):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)


def _check_against(args: argparse.Namespace) -> None:
    if args.baseline is not None:
        raise ValueError(
            f"--against {args.against} and --baseline {args.baseline}: give one; --against "
            "times the code to hold the job to in this run, --baseline reads an earlier run"
        )
    if args.gate != "ratio":
        raise ValueError(
            f"--gate {args.gate} is for --baseline; --against always uses the paired gate"
        )
    parse_target(args.against)


def _measure(
    args: argparse.Namespace, configs: tuple[str, ...]
) -> tuple[BenchResult, BenchResult | None, BenchResult | None]:
    """This run, the --against side it was paired with, and the --baseline read (each or None)."""
    against: BenchResult | None = None
    baseline = None
    if args.against is not None:
        _check_against(args)
        against, result = run_against(
            args.target,
            args.against,
            against_path=args.against_path,
            configs=configs,
            steps=args.steps,
            warmup=args.warmup,
            rounds=args.rounds or PAIRED_ROUNDS,
            accelerator=args.accelerator,
            timeout_s=args.timeout,
            quiet=args.quiet,
            verbose=args.verbose,
        )
    else:
        if args.against_path:
            raise ValueError("--against-path needs --against TARGET (the job it imports for)")
        if args.baseline is not None:
            baseline = _read_baseline(args.baseline, args.steps, args.warmup)
        result = run_bench(
            args.target,
            configs=configs,
            steps=args.steps,
            warmup=args.warmup,
            rounds=args.rounds or 3,
            accelerator=args.accelerator,
            timeout_s=args.timeout,
            quiet=args.quiet,
            verbose=args.verbose,
        )
    return result, against, baseline


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
        result, against, baseline = _measure(args, configs)
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
    if against is not None:
        gate = compare(result, against, args.max_regression, PAIRED, f"--against {args.against}")
    elif baseline is not None:
        try:
            gate = compare(result, baseline, args.max_regression, args.gate, f"{args.baseline}")
        except ValueError as err:  # measured, but not comparable: keep what was measured
            problem = str(err)
    try:
        _write(result, gate, args.json, args.markdown, against)
    except OSError as err:
        return _error(f"cannot write the result: {err}")
    print(format_text(result, gate), flush=True)
    if problem is not None:
        return _error(problem)
    return 0 if gate is None else gate.exit_code
