"""``maxtp bench`` with forked children against fresh interpreters: faster, and the same numbers?

Runs the CI gate's job (``examples/ci/bench_job.py:job``, ``defaults`` and ``maxtp``) as the
gate does, ``--pairs`` times each way, alternating which goes first: once with its children
forked from one server that imported Lightning (the default) and once with every child a new
interpreter (``MAXTP_BENCH_FORK=0``). Per way it prints the median wall-clock of a whole
``run_bench`` call and the median steady samples/s per reference sample/s of every run (what
the gate compares). Targets: forked/fresh wall-clock well under 1.0; steady per reference
within the runs' own spread of 1.0 (a forked child must measure what a fresh one measures).

Usage: ``python -m benchmarks.bench_fork_cpu [--smoke] [--pairs N] [--out FILE] [--table FILE]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.runner import emit, git_state
from lightning_maxtp.bench import run_bench

JOB = "examples/ci/bench_job.py:job"
WAYS = {"forked": "1", "fresh": "0"}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Time ``--pairs`` alternating pairs of bench runs; print a table, then one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--smoke", action="store_true", help="one pair of one round, 10 steps")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--table", type=Path)
    args = parser.parse_args(argv)
    pairs, rounds, steps = (1, 1, 10) if args.smoke else (args.pairs, args.rounds, args.steps)
    runs: dict[str, list[dict[str, Any]]] = {way: [] for way in WAYS}
    for i in range(pairs):
        order = list(WAYS) if i % 2 == 0 else list(reversed(WAYS))
        for way in order:
            env = {**os.environ, "MAXTP_BENCH_FORK": WAYS[way]}
            start = time.perf_counter()
            result = run_bench(JOB, steps=steps, warmup=5, rounds=rounds, env=env, quiet=True)
            wall = time.perf_counter() - start
            per_ref = [
                r["steady_samples_per_s"] / r["reference_samples_per_s"] for r in result.runs
            ]
            runs[way].append({"wall_s": wall, "steady_per_reference": per_ref})
            print(
                f"pair {i + 1}/{pairs} {way}: {wall:.1f} s, steady per reference "
                f"{statistics.median(per_ref):.3f}",
                file=sys.stderr,
                flush=True,
            )
    wall = {w: statistics.median(r["wall_s"] for r in v) for w, v in runs.items()}
    rate = {
        w: statistics.median(x for r in v for x in r["steady_per_reference"])
        for w, v in runs.items()
    }
    spread = {
        w: max(x for r in v for x in r["steady_per_reference"])
        / min(x for r in v for x in r["steady_per_reference"])
        - 1
        for w, v in runs.items()
    }
    lines = [
        f"maxtp bench, children forked vs fresh interpreters: {pairs} pair(s), each a "
        f"run_bench of defaults+maxtp, {rounds} round(s) of {steps} steps",
        f"{'way':<7} {'run_bench wall s':>16} {'steady/ref':>10} {'spread':>7}",
        *(f"{w:<7} {wall[w]:>16.1f} {rate[w]:>10.3f} {spread[w]:>7.0%}" for w in WAYS),
        f"forked/fresh: wall-clock {wall['forked'] / wall['fresh']:.2f}x, steady per reference "
        f"{rate['forked'] / rate['fresh']:.2f}x",
    ]
    commit, dirty = git_state()
    record = {
        "benchmark": "bench_fork_cpu",
        "smoke": args.smoke,
        "git_commit": commit,
        "git_dirty": dirty,
        "pairs": pairs,
        "rounds": rounds,
        "steps": steps,
        "runs": runs,
        "median_wall_s": wall,
        "median_steady_per_reference": rate,
        "wall_ratio": wall["forked"] / wall["fresh"],
        "steady_ratio": rate["forked"] / rate["fresh"],
    }
    emit("\n".join(lines), record, json_out=args.out, table_out=args.table)
    return record


if __name__ == "__main__":
    main()
