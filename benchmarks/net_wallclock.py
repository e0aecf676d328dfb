"""Net wall-clock: a whole fit with ``MaxThroughputCallback()`` against the same fit without it.

What a user pays and gets: the fit's wall-clock from ``trainer.fit`` to its return, tuning
included (measuring, trials, worker restarts), not a steady-state rate. Three jobs, each timed
A/B/A/B (defaults, then defaults + the callback with its default arguments, per round):

* ``long_data_bound``: a tiny MLP whose samples each wait ``--latency-ms`` (remote storage),
  loaded in the main process as Lightning's defaults do; ~40 s at defaults on 2 CPUs. Target:
  the callback's fit takes well under 0.6x the time.
* ``short_data_bound``: the same job for ~3 s. Tuning must not make it much slower: at most
  ~1.2x (the tuning budget is 5 % of the expected fit, so the loader is not measured alone).
* ``already_tuned``: the long job's loader already has the workers it needs. Target ~1.0x.
* ``tiny_steps_50`` and ``tiny_steps_2000``: ~1 ms steps, no read latency, no workers (the
  monitor's and the loop's own cost per step shows here), and ``already_tuned_prefetch_4``:
  the long job with 4 workers and prefetch 4. Targets: at most +0.5 s on a fit under 5 s,
  at most 1.05x otherwise.

The ratio column is the callback's wall-clock over the defaults' (lower is better); the JSON
line has every round and the callback's own account (its cost, budget and net estimate).

Usage: ``python -m benchmarks.net_wallclock [--smoke] [--rounds N] [--out FILE] [--table FILE]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.runner import emit, git_state, tuning_account
from lightning_maxtp.resources import inspect_resources

JOBS = {
    # name: (steps, workers of the user's own loader, their prefetch, latency: None = --latency-ms)
    "long_data_bound": (800, 0, 2, None),
    "short_data_bound": (60, 0, 2, None),
    "already_tuned": (800, 4, 2, None),
    "tiny_steps_50": (50, 0, 2, 0.0),
    "tiny_steps_2000": (2000, 0, 2, 0.0),
    "already_tuned_prefetch_4": (800, 4, 4, None),
}


def fit_once(
    steps: int, workers: int, latency_s: float, callback: bool, prefetch: int = 2
) -> dict[str, Any]:
    """One fresh fit; its wall-clock and, with the callback, what the callback said."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

    from benchmarks.workloads.ci import LatencyDataset, TinyMLP
    from lightning_maxtp import MaxThroughputCallback

    pl.seed_everything(0, verbose=False)
    cb = MaxThroughputCallback(verbose=False) if callback else None
    trainer = pl.Trainer(
        accelerator="cpu", max_steps=steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[cb] if cb else [],
    )  # fmt: skip
    loader = DataLoader(
        LatencyDataset(16 * steps, latency_s), batch_size=16, shuffle=True,
        num_workers=workers, persistent_workers=workers > 0,
        prefetch_factor=prefetch if workers else None,
    )  # fmt: skip
    start = time.perf_counter()
    trainer.fit(TinyMLP(), loader)
    out: dict[str, Any] = {"seconds": time.perf_counter() - start}
    if cb is not None:
        out["callback"] = tuning_account(cb.tuning)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run every job A/B for ``--rounds`` rounds; print a table, then one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: the plumbing only")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--table", type=Path)
    args = parser.parse_args(argv)
    jobs = {name: (max(20, steps // 20), *rest) for name, (steps, *rest) in JOBS.items()} \
        if args.smoke else JOBS  # fmt: skip
    rounds = 1 if args.smoke else args.rounds
    commit, dirty = git_state()
    results: dict[str, Any] = {}
    for name, (steps, workers, prefetch, latency_ms) in jobs.items():
        latency = (args.latency_ms if latency_ms is None else latency_ms) / 1e3
        runs: dict[str, list[dict[str, Any]]] = {"defaults": [], "callback": []}
        for r in range(rounds):
            for config, done in runs.items():
                run = fit_once(steps, workers, latency, config == "callback", prefetch)
                done.append(run)
                print(f"{name} round {r + 1}/{rounds} {config}: {run['seconds']:.1f} s",
                      file=sys.stderr, flush=True)  # fmt: skip
        medians = {c: statistics.median(r["seconds"] for r in v) for c, v in runs.items()}
        results[name] = {"steps": steps, "workers": workers, "prefetch": prefetch,
                         "latency_s": latency, "runs": runs, "median_s": medians,
                         "ratio": medians["callback"] / medians["defaults"]}  # fmt: skip
    lines = [
        f"net wall-clock, {rounds} round(s), latency {args.latency_ms:g} ms per sample "
        "(the tiny_steps jobs: none)",
        f"{'job':<24} {'steps':>5} {'defaults s':>10} {'callback s':>10} {'diff s':>7} "
        f"{'ratio':>6}",
    ]
    for name, res in results.items():
        med = res["median_s"]
        lines.append(f"{name:<24} {res['steps']:>5} {med['defaults']:>10.1f} "
                     f"{med['callback']:>10.1f} {med['callback'] - med['defaults']:>+7.2f} "
                     f"{res['ratio']:>6.2f}")  # fmt: skip
    table = "\n".join(lines)
    record = {
        "benchmark": "net_wallclock", "smoke": args.smoke, "git_commit": commit,
        "git_dirty": dirty, "latency_ms": args.latency_ms, "rounds": rounds,
        "ratios": {n: r["ratio"] for n, r in results.items()}, "jobs": results,
        "machine": inspect_resources().to_dict(),
    }  # fmt: skip
    emit(table, record, json_out=args.out, table_out=args.table)
    return record


if __name__ == "__main__":
    main()
