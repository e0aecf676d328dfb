"""``allow="all"`` on the CPU: a whole fit never slower than Lightning's defaults.

A small conv net on in-memory 3x32x32 images (the step sets the pace, so only the math knobs
can pay), timed A/B/C per round from ``trainer.fit`` to its return: Lightning's defaults, the
same with ``MaxThroughputCallback()`` (``allow="safe"``), and with ``allow="all"``. On this
kind of 2-core machine bf16 autocast runs ~1.2x faster than fp32, channels_last ~0.8x and
``torch.compile`` no faster after ~25 s of compiling, so the loop has a knob to keep, one to
revert and one it must not let cost the fit. Two jobs:

* ``long``: ~60 s at defaults. Target: ``all`` at most 1.0x the defaults' wall-clock (bf16
  kept, channels_last reverted; compile only if the tuning budget can pay for it).
* ``short``: ~6 s. Target: at most ~1.1x (the budget, 5 % of the expected fit, stops trials).

The table's ratios are wall-clock over the defaults' (lower is better) and the steady rate of
the fit's last quarter over the defaults' (higher is better); the JSON line has every round
and what the loop kept and reverted.

Usage: ``python -m benchmarks.allow_cpu [--smoke] [--rounds N] [--out FILE] [--table FILE]``
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

JOBS = {"long": 800, "short": 80}
"""Job name: training steps (batch 64)."""
CONFIGS = ("defaults", "safe", "all")


def _module() -> Any:
    """A small conv net (three 3x3 convolutions, Adam), as a LightningModule."""
    import lightning.pytorch as pl
    import torch
    from torch import nn

    class SmallConvNet(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(
                nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1),
                nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
                nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
            )  # fmt: skip

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    return SmallConvNet()


def _loader(samples: int, side: int) -> Any:
    """Random 3 x side x side images with 10 classes, in memory, batches of 64."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    generator = torch.Generator().manual_seed(0)
    images = torch.randn(min(samples, 8192), 3, side, side, generator=generator)
    labels = torch.randint(0, 10, (len(images),), generator=generator)
    return DataLoader(TensorDataset(images, labels), batch_size=64, shuffle=True)


def fit_once(steps: int, config: str, side: int = 32) -> dict[str, Any]:
    """One fresh fit: its wall-clock, its last quarter's rate and what the callback did."""
    import lightning.pytorch as pl

    from benchmarks.timing import StepTimer
    from lightning_maxtp import MaxThroughputCallback

    pl.seed_everything(0, verbose=False)
    tail = max(4, steps // 4)
    timer = StepTimer(steps - tail, tail)
    cb = None if config == "defaults" else MaxThroughputCallback(allow=config, verbose=False)
    trainer = pl.Trainer(
        accelerator="cpu", max_steps=steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[c for c in (cb, timer) if c is not None],
    )  # fmt: skip
    loader = _loader(steps * 64, side)
    start = time.perf_counter()
    trainer.fit(_module(), loader)
    out: dict[str, Any] = {"seconds": time.perf_counter() - start}
    assert timer.start is not None and timer.stop is not None
    out["tail_samples_per_s"] = timer.samples / (timer.stop - timer.start)
    if cb is not None:
        out["callback"] = tuning_account(cb.tuning)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run every job A/B/C for ``--rounds`` rounds; print a table, then one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--smoke", action="store_true", help="24 steps of 8x8 images per fit: the plumbing only"
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--table", type=Path)
    args = parser.parse_args(argv)
    jobs = {name: max(24, steps // 40) for name, steps in JOBS.items()} if args.smoke else JOBS
    rounds, side = (1, 8) if args.smoke else (args.rounds, 32)
    commit, dirty = git_state()
    results: dict[str, Any] = {}
    for name, steps in jobs.items():
        runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONFIGS}
        for r in range(rounds):
            for config, done in runs.items():
                run = fit_once(steps, config, side)
                done.append(run)
                rate = run["tail_samples_per_s"]
                print(f"{name} round {r + 1}/{rounds} {config}: {run['seconds']:.1f} s, tail "
                      f"{rate:.0f} samples/s", file=sys.stderr, flush=True)  # fmt: skip
        wall = {c: statistics.median(r["seconds"] for r in v) for c, v in runs.items()}
        rate = {c: statistics.median(r["tail_samples_per_s"] for r in v) for c, v in runs.items()}
        results[name] = {
            "steps": steps, "runs": runs, "median_s": wall, "tail_samples_per_s": rate,
            "wall_ratio": {c: wall[c] / wall["defaults"] for c in CONFIGS[1:]},
            "rate_ratio": {c: rate[c] / rate["defaults"] for c in CONFIGS[1:]},
        }  # fmt: skip
    cpus = inspect_resources().cpu.effective
    lines = [
        f"allow on the CPU ({cpus} usable CPUs, no GPU), {rounds} round(s): whole-fit wall-clock "
        "and last-quarter rate",
        f"{'job':<6} {'steps':>5} {'defaults s':>10} {'safe s':>7} {'all s':>7} "
        f"{'all/def wall':>12} {'all/def rate':>12}  kept by all",
    ]
    for name, res in results.items():
        med, kept = res["median_s"], res["runs"]["all"][-1]["callback"]["kept"]
        lines.append(f"{name:<6} {res['steps']:>5} {med['defaults']:>10.1f} {med['safe']:>7.1f} "
                     f"{med['all']:>7.1f} {res['wall_ratio']['all']:>12.2f} "
                     f"{res['rate_ratio']['all']:>12.2f}  {', '.join(kept) or '-'}")  # fmt: skip
    table = "\n".join(lines)
    record = {
        "benchmark": "allow_cpu", "smoke": args.smoke, "git_commit": commit, "git_dirty": dirty,
        "rounds": rounds, "wall_ratios": {n: r["wall_ratio"] for n, r in results.items()},
        "rate_ratios": {n: r["rate_ratio"] for n, r in results.items()}, "jobs": results,
        "machine": inspect_resources().to_dict(),
    }  # fmt: skip
    emit(table, record, json_out=args.out, table_out=args.table)
    return record


if __name__ == "__main__":
    main()
