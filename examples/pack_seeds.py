"""Train several seeds at once with ``lightning_maxtp.pack``: the Python side of ``maxtp pack``.

Builds one job per seed (``examples/pack_train.py``), prints where each would start and what
would wait, runs them all (each with its GPU or CPU share, its own log), and prints the summary
table. The shell equivalent: ``maxtp pack --jobs examples/pack_jobs.json``.

Usage: ``python examples/pack_seeds.py [--seeds 4] [--steps 200] [--log-dir DIR]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lightning_maxtp import JobSpec, plan_pack, run_jobs

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--log-dir", default=None)
    args = parser.parse_args()
    if args.seeds < 1 or args.steps < 1:
        parser.error(f"need --seeds >= 1 and --steps >= 1, got {args.seeds} and {args.steps}")
    jobs = [
        JobSpec(
            (sys.executable, str(HERE / "pack_train.py"), "--seed", str(seed),
             "--steps", str(args.steps)),
            name=f"seed{seed}",
            gpu_memory_gib=2,  # declared, so several seeds share one large GPU
        )
        for seed in range(1, args.seeds + 1)
    ]  # fmt: skip
    plan = plan_pack(jobs)
    print(plan, end="\n\n", flush=True)
    result = run_jobs(plan, log_dir=args.log_dir, progress=sys.stderr)
    print(result)
    for job in result.jobs:
        if job.log_path:
            last = Path(job.log_path).read_text().strip().splitlines()[-1]
            print(f"{job.name}: {last}")
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
