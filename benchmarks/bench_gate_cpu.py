"""The ``maxtp bench`` gate on a noisy machine: does it pass the unchanged job and catch slowdowns?

One baseline of the compute-bound test job, then ``--repeats`` times: the job unchanged, and the
job with a planted slowdown (``MAXTP_TEST_SLOW_MS`` of sleep added to each ~3 ms step), each
gated against that baseline with the ratio gate at two limits (``-25 %`` and ``-50 %``, the one
the planted-slowdown test uses). The table counts how often each variant failed the gate and
shows the steady metric's change every time. Target: the unchanged job never fails at -50 %;
the 10 ms slowdown (about -80 %) always does.

Usage: ``python -m benchmarks.bench_gate_cpu [--smoke] [--repeats N] [--out FILE] [--table FILE]``
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from benchmarks.runner import emit, git_state
from lightning_maxtp.bench import compare, run_bench

JOB = "tests/helpers/bench_jobs.py:job"
LIMITS = (0.25, 0.5)
VARIANTS = {"unchanged": None, "slow 2 ms": "2", "slow 10 ms": "10"}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Record a baseline, gate every variant ``--repeats`` times; print a table, then JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--smoke", action="store_true", help="one repeat, few steps")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--table", type=Path)
    args = parser.parse_args(argv)
    repeats, steps = (1, 20) if args.smoke else (args.repeats, args.steps)
    kw: dict[str, Any] = {"configs": ("defaults",), "steps": steps, "warmup": 5,
                          "rounds": args.rounds, "quiet": True}  # fmt: skip
    baseline = run_bench(JOB, **kw)
    outcomes: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    for i in range(repeats):
        for name, slow in VARIANTS.items():
            env = dict(os.environ)
            env.pop("MAXTP_TEST_SLOW_MS", None)
            if slow is not None:
                env["MAXTP_TEST_SLOW_MS"] = slow
            result = run_bench(JOB, env=env, **kw)
            gates = {limit: compare(result, baseline, limit) for limit in LIMITS}
            steady = next(c for c in gates[LIMITS[0]].checks if c.metric == "steady")
            outcomes[name].append({
                "steady_change": steady.change,
                "passed": {str(limit): g.passed for limit, g in gates.items()},
                "regressions": {str(limit): [str(c) for c in g.regressions]
                                for limit, g in gates.items()},
            })  # fmt: skip
            verdicts = ", ".join(f"-{k:.0%} {'passed' if g.passed else 'FAILED'}"
                                 for k, g in gates.items())  # fmt: skip
            print(f"repeat {i + 1}/{repeats} {name}: steady {steady.change:+.1%} ({verdicts})",
                  file=sys.stderr, flush=True)  # fmt: skip
    lines = [
        f"maxtp bench gate (ratio): {args.rounds} rounds of {steps} steps per run, {repeats} "
        "repeat(s) against one baseline",
        f"{'variant':<12} {'failed at -25%':>14} {'failed at -50%':>14}  steady change per repeat",
    ]
    for name, runs in outcomes.items():
        failed = [sum(not r["passed"][str(k)] for r in runs) for k in LIMITS]
        changes = " ".join(f"{r['steady_change']:+.1%}" for r in runs)
        lines.append(f"{name:<12} {f'{failed[0]} of {len(runs)}':>14} "
                     f"{f'{failed[1]} of {len(runs)}':>14}  {changes}")  # fmt: skip
    commit, dirty = git_state()
    record = {"benchmark": "bench_gate_cpu", "smoke": args.smoke, "git_commit": commit,
              "git_dirty": dirty, "limits": list(LIMITS), "rounds": args.rounds,
              "steps": steps, "repeats": repeats, "outcomes": outcomes,
              "baseline": baseline.to_dict()}  # fmt: skip
    emit("\n".join(lines), record, json_out=args.out, table_out=args.table)
    return record


if __name__ == "__main__":
    main()
