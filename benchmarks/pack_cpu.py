"""Issue [8]: ``maxtp pack`` on a CPU host: N small jobs packed vs. run one after another.

Each config runs the same N independent jobs through ``run_jobs``: ``one-after-another`` with
``max_parallel=1`` (each job may use every CPU), ``packed`` with the planner's defaults (jobs
share the CPUs, ``OMP_NUM_THREADS`` set to each one's share). The measured value is jobs per
second of total wall time (the "samples/s" column), so the ratio column is sequential wall time
over packed wall time. Workloads: ``torch`` (``examples/pack_train.py``: import torch, train a
tiny MLP; start-up is a large part, as in real seeds/evals) or ``python`` (a single-threaded
pure-Python loop of fixed work). Rounds alternate the configs (A/B/A/B).

Prints the table, then one JSON line (see ``benchmarks/README.md``).

Usage: ``python -m benchmarks.pack_cpu [--workload torch|python] [--jobs 4] [--rounds 3]
[--smoke] [--out FILE] [--table-out FILE]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.runner import Config, report, run_ab
from benchmarks.timing import Measurement
from lightning_maxtp.pack import JobSpec, run_jobs

ROOT = Path(__file__).resolve().parents[1]
LOOP = "s = 0\nfor i in range({n}): s += i * i\nprint(s)"


def make_jobs(workload: str, num_jobs: int, size: int) -> list[JobSpec]:
    if workload == "torch":
        train = str(ROOT / "examples" / "pack_train.py")
        argv = [sys.executable, train, "--steps", str(size), "--width", "256", "--batch", "64"]
        return [JobSpec((*argv, "--seed", str(i)), name=f"t{i}") for i in range(num_jobs)]
    code = LOOP.format(n=size)
    return [JobSpec((sys.executable, "-c", code), name=f"p{i}") for i in range(num_jobs)]


def timed(jobs: list[JobSpec], max_parallel: int | None) -> Measurement:
    with tempfile.TemporaryDirectory() as logs:
        start = time.perf_counter()
        result = run_jobs(jobs, log_dir=logs, max_parallel=max_parallel, poll_interval_s=0.02)
        seconds = time.perf_counter() - start
    if result.num_failed:
        raise RuntimeError(f"{result.num_failed} benchmark job(s) failed:\n{result}")
    return Measurement(samples=len(jobs), seconds=seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("torch", "python"), default="torch")
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--size", type=int, default=None,
                        help="training steps (torch) or loop iterations (python)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="2 tiny jobs, 1 round")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--table-out", type=Path, default=None)
    args = parser.parse_args()
    size = args.size or {"torch": 300, "python": 15_000_000}[args.workload]
    if args.smoke:
        args.jobs, args.rounds, size = 2, 1, {"torch": 3, "python": 10_000}[args.workload]
    jobs = make_jobs(args.workload, args.jobs, size)
    configs = [
        Config("one-after-another", lambda: timed(jobs, 1), {"max_parallel": 1}),
        Config("packed", lambda: timed(jobs, None), {"max_parallel": None}),
    ]
    params = {"workload": args.workload, "jobs": args.jobs, "size": size}
    result = run_ab("pack_cpu", configs, rounds=args.rounds, params=params)
    report(result, json_out=args.out, table_out=args.table_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
