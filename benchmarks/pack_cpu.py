"""``maxtp pack`` on a CPU host: N small jobs packed vs. run one after another, locally or on Ray.

Each config runs the same N independent jobs through ``run_jobs``: ``one-after-another`` with
``max_parallel=1`` (each job may use every CPU), ``packed`` with the planner's defaults (jobs
share the CPUs, ``OMP_NUM_THREADS`` set to each one's share). With ``--ray`` two more:
``ray`` runs them as Ray tasks on a local Ray instance started once before the rounds (what a
sweep on a running cluster costs), and ``ray-cli`` runs ``maxtp pack --backend ray`` as a
command that starts its own local Ray and stops it (what one invocation costs without a
cluster). Ray's start and stop are timed on their own and recorded in the params. The measured
value is jobs per second of total wall time (the "samples/s" column), so the ratio column is
sequential wall time over each config's. Workloads: ``torch`` (``examples/pack_train.py``:
import torch, train a tiny MLP; start-up is a large part, as in real seeds/evals) or ``python``
(a single-threaded pure-Python loop of fixed work). Rounds alternate the configs (A/B/A/B).

Prints the table, then one JSON line (see ``benchmarks/README.md``).

Usage: ``python -m benchmarks.pack_cpu [--workload torch|python] [--jobs 4] [--rounds 3]
[--ray] [--smoke] [--out FILE] [--table-out FILE]``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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


def timed(jobs: list[JobSpec], max_parallel: int | None, backend: str = "local") -> Measurement:
    with tempfile.TemporaryDirectory() as logs:
        start = time.perf_counter()
        result = run_jobs(
            jobs, backend=backend, log_dir=logs, max_parallel=max_parallel, poll_interval_s=0.02
        )
        seconds = time.perf_counter() - start
    if result.num_failed:
        raise RuntimeError(f"{result.num_failed} benchmark job(s) failed:\n{result}")
    return Measurement(samples=len(jobs), seconds=seconds)


def timed_cli(jobs: list[JobSpec]) -> Measurement:
    """``maxtp pack --backend ray`` as a command: its own local Ray started and stopped."""
    with tempfile.TemporaryDirectory() as folder:
        jobs_file = Path(folder) / "jobs.json"
        jobs_file.write_text(json.dumps([job.to_dict() for job in jobs]))
        logs = str(Path(folder) / "logs")
        command = [sys.executable, "-m", "lightning_maxtp.cli", "pack", "--backend", "ray",
                   "--quiet", "--jobs", str(jobs_file), "--log-dir", logs]  # fmt: skip
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, env=env, timeout=900)
        seconds = time.perf_counter() - start
    return Measurement(samples=len(jobs), seconds=seconds)


def start_ray() -> tuple[Any, float]:
    """A local Ray instance for the ``ray`` config, and the seconds ``ray.init`` took."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    start = time.perf_counter()
    ray.init(include_dashboard=False, log_to_driver=False)
    return ray, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("torch", "python"), default="torch")
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--size", type=int, default=None,
                        help="training steps (torch) or loop iterations (python)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ray", action="store_true", help="add the Ray backend's two configs")
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
    params: dict[str, Any] = {"workload": args.workload, "jobs": args.jobs, "size": size}
    ray = None
    if args.ray:
        ray, params["ray_start_s"] = start_ray()
        configs += [
            Config("ray", lambda: timed(jobs, None, "ray"), {"backend": "ray", "ray": "running"}),
            Config("ray-cli", lambda: timed_cli(jobs), {"backend": "ray", "ray": "own, local"}),
        ]
    try:
        result = run_ab("pack_cpu", configs, rounds=args.rounds, params=params)
    finally:
        if ray is not None:
            start = time.perf_counter()
            ray.shutdown()
            params["ray_stop_s"] = round(time.perf_counter() - start, 2)
    if ray is not None:
        params["ray_start_s"] = round(params["ray_start_s"], 2)
        result = dataclasses.replace(result, params=params)
    report(result, json_out=args.out, table_out=args.table_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
