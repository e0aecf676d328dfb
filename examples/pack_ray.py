"""Train several seeds as Ray tasks: ``maxtp pack --backend ray`` from Python.

The same jobs as ``examples/pack_seeds.py``, handed to a Ray cluster instead of this machine:
each job becomes a Ray task asking for a GPU (or the share of one its declared memory is) and
its CPUs; Ray places it on any node; its output comes back into its log here; the summary table
names the node each job ran on. Without ``--address`` a local Ray instance is started (and
stopped at the end), which shows the flow on one machine; on a cluster pass its address
(``auto`` on a node of it, or ``ray://head:10001``), with ``lightning_maxtp`` installed on every
node. The shell equivalent: ``maxtp pack --backend ray --jobs examples/pack_jobs.json``.

Needs the ``[ray]`` extra (``pip install '.[ray]'`` in a clone of this repository).

Usage: ``python examples/pack_ray.py [--seeds 4] [--steps 200] [--address auto]
[--log-dir DIR]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lightning_maxtp import JobSpec, run_jobs

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--address", default=None, help="Ray cluster (default: a local one)")
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
            retries=1,  # rerun once if its process is killed or its node is lost
        )
        for seed in range(1, args.seeds + 1)
    ]  # fmt: skip
    try:
        result = run_jobs(
            jobs, backend="ray", address=args.address, log_dir=args.log_dir, progress=sys.stderr
        )
    except ImportError as err:  # no Ray: the message names the extra
        print(err, file=sys.stderr)
        return 2
    print(result)
    for job in result.jobs:
        if job.log_path:
            last = Path(job.log_path).read_text().strip().splitlines()[-1]
            print(f"{job.name} on {job.node}: {last}")
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
