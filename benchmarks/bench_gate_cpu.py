"""The ``maxtp bench`` gate on a noisy machine: its false alarms, and the slowdowns it catches.

How often it fails an unchanged job (a false alarm) and how often it catches a job made 10 %
slower.

Two ways to gate, each repeated on the compute-bound test job (``tests/helpers/bench_jobs.py``,
~3 ms steps) unchanged and made 10 % slower (``job_10pct_slower``: each step spins a ninth of the
previous step's own time, so its rate is 0.9x whatever the machine's speed):

* ``paired``: ``maxtp bench JOB --against BASE`` (``run_against``, 20 rounds), both jobs timed
  in one bench, round by round, the paired gate at ``--max-regression 0.05`` (and 0.10 for the
  false alarms);
* ``stored``: one baseline recorded at the start (``--json``), then each repeat gated against it
  with the ratio gate at ``--max-regression 0.15`` (what a user tried first) and 0.25.

Targets (paired, at 0.05): fewer than 1 false alarm in 20 on the unchanged job, the 10 % slowdown
caught at least 19 times in 20. The stored gate is measured beside it, not held to them.

Usage: ``python -m benchmarks.bench_gate_cpu [--smoke] [--repeats N] [--stored-repeats N]
[--out FILE] [--table FILE]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.runner import emit, git_state
from lightning_maxtp.bench import compare, run_against, run_bench

JOBS = "tests/helpers/bench_jobs.py"
VARIANTS = {"unchanged": f"{JOBS}:job", "10% slower": f"{JOBS}:job_10pct_slower"}
LIMITS = {"paired": (0.05, 0.10), "stored": (0.15, 0.25)}
TARGET_FALSE_ALARMS = 1 / 20
"""Largest share of unchanged repeats the paired gate may fail at its first limit."""
TARGET_CAUGHT = 19 / 20
"""Smallest share of 10 %-slower repeats the paired gate must fail at its first limit."""


def _outcome(gates: dict[float, Any], seconds: float) -> dict[str, Any]:
    steady = next(c for c in next(iter(gates.values())).checks if c.metric == "steady")
    return {
        "steady_change": steady.change,
        "pairs": list(steady.pairs),
        "passed": {str(limit): g.passed for limit, g in gates.items()},
        "regressions": {str(limit): [str(c) for c in g.regressions] for limit, g in gates.items()},
        "seconds": seconds,
    }


def _paired(target: str, kw: dict[str, Any], rounds: int) -> dict[str, Any]:
    start = time.perf_counter()
    base, result = run_against(target, VARIANTS["unchanged"], rounds=rounds, **kw)
    gates = {limit: compare(result, base, limit, "paired") for limit in LIMITS["paired"]}
    return _outcome(gates, time.perf_counter() - start)


def _stored(target: str, kw: dict[str, Any], baseline: Any, rounds: int) -> dict[str, Any]:
    start = time.perf_counter()
    result = run_bench(target, rounds=rounds, **kw)
    gates = {limit: compare(result, baseline, limit) for limit in LIMITS["stored"]}
    return _outcome(gates, time.perf_counter() - start)


def _rows(mode: str, outcomes: dict[str, list[dict[str, Any]]]) -> list[str]:
    lines = []
    for variant, runs in outcomes.items():
        failed = "  ".join(
            f"{sum(not r['passed'][str(k)] for r in runs):>2} of {len(runs)} at -{k:.0%}"
            for k in LIMITS[mode]
        )
        changes = sorted(r["steady_change"] for r in runs)
        lines.append(
            f"{mode:<7} {variant:<11} {failed}  steady change {changes[len(changes) // 2]:+.1%} "
            f"(range {changes[0]:+.1%} to {changes[-1]:+.1%})"
        )
    return lines


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Repeat both gates on both variants, interleaved; print the table, then JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20, help="paired repeats per variant")
    parser.add_argument("--stored-repeats", type=int, default=5, help="stored, per variant")
    parser.add_argument("--rounds", type=int, default=20, help="pairs per paired bench")
    parser.add_argument("--stored-rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--smoke", action="store_true", help="one repeat each, few steps")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--table", type=Path)
    args = parser.parse_args(argv)
    repeats, stored_repeats = (1, 1) if args.smoke else (args.repeats, args.stored_repeats)
    rounds, stored_rounds = (5, 2) if args.smoke else (args.rounds, args.stored_rounds)
    steps = 10 if args.smoke else args.steps
    kw: dict[str, Any] = {"configs": ("defaults",), "steps": steps, "warmup": 5, "quiet": True}
    started = time.perf_counter()
    baseline = run_bench(VARIANTS["unchanged"], rounds=stored_rounds, **kw)
    outcomes: dict[str, dict[str, list[dict[str, Any]]]] = {
        mode: {v: [] for v in VARIANTS} for mode in LIMITS
    }
    for i in range(max(repeats, stored_repeats)):
        for variant, target in VARIANTS.items():
            runs = [("paired", i < repeats), ("stored", i < stored_repeats)]
            for mode, due in runs if i % 2 == 0 else runs[::-1]:
                if not due:
                    continue
                got = (
                    _paired(target, kw, rounds)
                    if mode == "paired"
                    else _stored(target, kw, baseline, stored_rounds)
                )
                outcomes[mode][variant].append(got)
                verdicts = ", ".join(
                    f"-{k} {'passed' if ok else 'FAILED'}" for k, ok in got["passed"].items()
                )
                print(
                    f"repeat {i + 1} {mode} {variant}: steady {got['steady_change']:+.1%} "
                    f"({verdicts}; {got['seconds']:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
    paired = outcomes["paired"]
    first = str(LIMITS["paired"][0])
    alarms = sum(not r["passed"][first] for r in paired["unchanged"]) / len(paired["unchanged"])
    caught = sum(not r["passed"][first] for r in paired["10% slower"]) / len(paired["10% slower"])
    met = alarms < TARGET_FALSE_ALARMS and caught >= TARGET_CAUGHT
    lines = [
        f"maxtp bench gate: paired ({rounds} rounds of {steps} steps a side, both jobs in one "
        f"bench) and stored (one baseline, {stored_rounds} rounds a run, ratio gate)",
        *_rows("paired", paired),
        *_rows("stored", outcomes["stored"]),
        f"paired at -{LIMITS['paired'][0]:.0%}: false alarms {alarms:.0%} (target < "
        f"{TARGET_FALSE_ALARMS:.0%}), 10% slowdown caught {caught:.0%} (target >= "
        f"{TARGET_CAUGHT:.0%}): {'met' if met else 'NOT met'}; "
        f"{time.perf_counter() - started:.0f} s in all",
    ]
    commit, dirty = git_state()
    record = {
        "benchmark": "bench_gate_cpu",
        "smoke": args.smoke,
        "git_commit": commit,
        "git_dirty": dirty,
        "limits": {mode: list(limits) for mode, limits in LIMITS.items()},
        "rounds": {"paired": rounds, "stored": stored_rounds},
        "steps": steps,
        "repeats": {"paired": repeats, "stored": stored_repeats},
        "outcomes": outcomes,
        "false_alarms": alarms,
        "caught": caught,
        "met": met,
        "seconds": time.perf_counter() - started,
        "baseline": baseline.to_dict(),
    }
    emit("\n".join(lines), record, json_out=args.out, table_out=args.table)
    return record


if __name__ == "__main__":
    main()
