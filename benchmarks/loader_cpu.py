"""Issue [3]: ``tune_dataloader``'s plan against a hand sweep of 0-4 workers, the loader alone.

Two data sets a CPU-only host meets:

- ``numpy``: each sample runs numpy linear algebra (a BLAS-heavy ``__getitem__``). Forked
  workers inherit a BLAS pool as big as the machine, so unlimited workers oversubscribe the
  cores; the plan limits the pools to one thread per worker and may go past the probe's CPU
  budget while each worker still gains >= 5 %. Target: plan >= 0.95x the sweep's best.
- ``memory``: a cheap in-memory ``TensorDataset``: handing batches between processes costs
  more than loading them. Target: plan >= 0.95x the 0-worker rate.

What it does, in one run: ``tune_dataloader(loader)`` (no consumption rate, the default time
budget), then A/B rounds of the loader alone (``loader.measure.measure_candidate``, BLAS limited
to one thread per worker, as an expert's hand sweep would) for every sweep setting, and for the
plan's when it is none of them, rounds interleaved so every setting sees the same drift. From
the repository root::

    python -m benchmarks.loader_cpu --dataset numpy
    python -m benchmarks.loader_cpu --dataset memory
    python -m benchmarks.loader_cpu --smoke          # seconds: the plumbing only
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from benchmarks.runner import Config, Measurement, report, run_ab
from lightning_maxtp.loader import tune_dataloader
from lightning_maxtp.loader.measure import measure_candidate
from lightning_maxtp.loader.order import preserved_rng


class LinalgDataset(Dataset[torch.Tensor]):
    """Each sample: solve a random ``size`` x ``size`` system (numpy, BLAS/LAPACK)."""

    def __init__(self, count: int, size: int) -> None:
        self.count, self.size = count, size

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> torch.Tensor:
        rng = np.random.default_rng(index)
        a = rng.standard_normal((self.size, self.size))
        x = np.linalg.solve(a @ a.T + self.size * np.eye(self.size), a[:, :8])
        return torch.from_numpy(x[:16].astype(np.float32))


def make_loader(name: str, smoke: bool) -> DataLoader[Any]:
    """The user's loader as Lightning's defaults leave it (0 workers)."""
    if name == "numpy":
        data: Dataset[Any] = LinalgDataset(256 if smoke else 4096, 64 if smoke else 160)
        return DataLoader(data, batch_size=16)
    count = 4096 if smoke else 65536
    return DataLoader(TensorDataset(torch.randn(count, 64), torch.arange(count)), batch_size=64)


def timed(
    loader: DataLoader[Any], workers: int, prefetch: int | None, slice_s: float
) -> Measurement:
    """The loader alone with one setting, BLAS limited to one thread per worker."""
    with preserved_rng(loader):
        c = measure_candidate(
            loader, num_workers=workers, prefetch_factor=prefetch, pin_memory=False,
            threads=1, slice_s=slice_s, deadline=time.perf_counter() + 10 * slice_s + 30.0,
        )  # fmt: skip
    samples = c.timed_batches * (loader.batch_size or 1)
    return Measurement(samples, samples / max(c.samples_per_s, 1e-9), c.timed_batches, 0)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Tune, then the A/B rounds; print the table and one JSON line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", choices=("numpy", "memory"), default="numpy")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--slice-s", type=float, default=1.0)
    p.add_argument("--max-sweep-workers", type=int, default=4)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--table", type=Path, default=None)
    p.add_argument("--note", default="")
    args = p.parse_args(argv)
    if args.smoke:
        args.rounds, args.slice_s, args.max_sweep_workers = 1, 0.2, 1
    loader = make_loader(args.dataset, args.smoke)
    started = time.perf_counter()
    plan = tune_dataloader(loader, time_budget_s=4.0 if args.smoke else 15.0)
    tuning_s = time.perf_counter() - started
    print(plan, flush=True)
    settings = [(0, None)] + [(w, 2) for w in range(1, args.max_sweep_workers + 1)]
    planned = (plan.num_workers, plan.prefetch_factor)
    configs = [
        Config(f"w{w}-p{pf}", lambda w=w, pf=pf: timed(loader, w, pf, args.slice_s),
               {"num_workers": w, "prefetch_factor": pf})
        for w, pf in settings
    ]  # fmt: skip
    # The plan's setting measured with the same function and arguments as a sweep setting is
    # that setting: timing it twice would only compare two draws of the machine's noise.
    plan_name = next((c.name for c, st in zip(configs, settings, strict=True) if st == planned),
                     "plan")  # fmt: skip
    if plan_name == "plan":
        configs.append(
            Config("plan", lambda: timed(loader, *planned, args.slice_s),
                   {"num_workers": planned[0], "prefetch_factor": planned[1]})
        )  # fmt: skip
    params = {
        "dataset": args.dataset, "rounds": args.rounds, "slice_s": args.slice_s,
        "plan": plan.settings(), "plan_reason": plan.reason,
        "tuning_s": round(tuning_s, 2), "note": args.note,
    }  # fmt: skip
    result = run_ab(f"loader_cpu_{args.dataset}", configs, rounds=args.rounds, params=params)
    report(result, json_out=args.out, table_out=args.table)
    medians = result.medians()
    best = max((k for k in medians if k != "plan"), key=lambda k: medians[k])
    ratios = {"plan / sweep-best": medians[plan_name] / medians[best],
              "plan / 0 workers": medians[plan_name] / medians["w0-pNone"]}  # fmt: skip
    print(f"sweep-best {best}: {medians[best]:.0f}/s; plan {planned} (= {plan_name}): "
          f"{medians[plan_name]:.0f}/s; " + "; ".join(f"{k} {v:.2f}" for k, v in ratios.items()),
          flush=True)  # fmt: skip
    summary = {"ratios": ratios, "sweep_best": best, "plan_config": plan_name}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
