"""DataLoader tuning on the JPEG workload: Lightning defaults vs. the plan vs. an exhaustive sweep.

What it measures, in one run:

1. The device's consumption rate: training steps on one batch already in memory (no loading).
2. ``tune_dataloader`` on the defaults loader (batch 32, 0 workers) with that consumption rate:
   the plan and the wall time tuning took.
3. An exhaustive sweep of the same loader alone: every ``num_workers`` from 0 to the CPU count
   (beyond the probe's budget, to show what the budget leaves out) x ``prefetch_factor`` 2 and 4,
   rounds interleaved; its best setting by the same criterion (training rate expected at the
   consumption rate), and the wall time the sweep took.
4. Training samples/s of real ``Trainer.fit`` runs, A/B/A/B: defaults, the plan, the sweep's
   best; then the time to train one epoch of the data set *including* the tuning time, and how
   many samples it takes for the plan to pay for its tuning.

The device: ``--device model`` trains the torchvision model on this machine's accelerator (on a
CPU-only host the step is compute-bound and loading barely matters). ``--device sim`` (the
default without a GPU) stands in for a GPU: the step sleeps ``batch / --sim-rate`` seconds, like
a host thread waiting on CUDA, so the CPU is free for loading as it is on a GPU machine. Run from
the repository root::

    python -m benchmarks.loader_jpeg                 # ~1.5 min on 2 CPU cores
    python -m benchmarks.loader_jpeg --smoke         # seconds: checks the plumbing
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import warnings
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader

from benchmarks.runner import Config, format_table, run_ab, time_fit
from benchmarks.workloads.jpeg import (
    ImageClassifier,
    JpegFolderDataset,
    JpegSpec,
    LoaderSettings,
    default_data_dir,
    generate_jpeg_dataset,
    make_loader,
)
from lightning_maxtp.loader import LoaderPlan, tune_dataloader
from lightning_maxtp.loader.candidate import expected_rate
from lightning_maxtp.loader.measure import sweep
from lightning_maxtp.resources import inspect_resources

log = logging.getLogger(__name__)

SMOKE = {
    "images": 64, "image_size": 64, "crop": 32, "classes": 4, "warmup_steps": 1, "steps": 3,
    "rounds": 1, "time_budget": 3.0, "sweep_slice": 0.2, "sweep_rounds": 1,
}  # fmt: skip
"""Sizes ``--smoke`` uses (options given explicitly still win)."""


class SimulatedDevice(pl.LightningModule):
    """A step that takes ``batch / rate`` seconds off the CPU (a host waiting on a GPU)."""

    def __init__(self, rate: float, num_classes: int) -> None:
        super().__init__()
        self.rate = rate
        self.head = torch.nn.Linear(3, num_classes)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        time.sleep(x.shape[0] / self.rate)
        return F.cross_entropy(self.head(x.mean(dim=(2, 3))), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def step_rate(
    module: pl.LightningModule,
    batch: tuple[torch.Tensor, torch.Tensor],
    *,
    device: torch.device,
    steps: int,
    warmup: int = 2,
    bf16: bool = False,
) -> float:
    """Samples/s of training steps on one batch already on ``device``: the consumption rate."""
    module.to(device).train()
    optimizer = module.configure_optimizers()
    assert isinstance(optimizer, torch.optim.Optimizer)
    x, y = (t.to(device) for t in batch)
    if getattr(module, "channels_last", False):
        x = x.contiguous(memory_format=torch.channels_last)
    start = 0.0
    for i in range(warmup + steps):
        if i == warmup:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = module.training_step((x, y), i)
        assert isinstance(loss, torch.Tensor)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return steps * x.shape[0] / (time.perf_counter() - start)


def plan_settings(plan: LoaderPlan, batch_size: int) -> LoaderSettings:
    """The plan as the harness's explicit loader settings."""
    return LoaderSettings(
        batch_size=batch_size,
        num_workers=plan.num_workers,
        prefetch_factor=plan.prefetch_factor,
        pin_memory=plan.pin_memory,
        persistent_workers=plan.persistent_workers,
    )


def exhaustive_sweep(
    loader: DataLoader[Any], max_workers: int, consumption: float, args: argparse.Namespace
) -> tuple[dict[str, Any], list[dict[str, Any]], float]:
    """Every (workers, prefetch) setting, rounds interleaved; the best and the time it took."""
    grid: list[tuple[int, int | None]] = [(0, None)]
    grid += [(w, p) for w in range(1, max_workers + 1) for p in (2, 4)]
    start = time.perf_counter()
    runs = sweep(loader, grid, rounds=args.sweep_rounds, slice_s=args.sweep_slice,
                 pin_memory=torch.cuda.is_available())  # fmt: skip
    seconds = time.perf_counter() - start
    rows = []
    for (workers, prefetch), measured in runs.items():
        fastest = max(measured, key=lambda c: c.samples_per_s)
        rows.append({
            "num_workers": workers, "prefetch_factor": prefetch,
            "samples_per_s": fastest.samples_per_s,
            "expected_rate": expected_rate(fastest, consumption),
            "rounds": [round(c.samples_per_s, 1) for c in measured],
        })  # fmt: skip
    top = max(r["expected_rate"] for r in rows)
    # Ties within 1 % go to the cheaper setting: more workers for nothing is not "best".
    best = min(
        (r for r in rows if r["expected_rate"] >= 0.99 * top),
        key=lambda r: (r["num_workers"], r["prefetch_factor"] or 0),
    )
    return best, rows, seconds


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.loader_jpeg", description=__doc__)
    p.add_argument("--images", type=int, default=1024, help="images to generate (1024)")
    p.add_argument("--image-size", type=int, default=160, help="image side in px (160)")
    p.add_argument("--crop", type=int, default=128, help="RandomResizedCrop side (128)")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--quality", type=int, default=90)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=32, help="batch size for every config (32)")
    p.add_argument(
        "--device",
        choices=["auto", "sim", "model"],
        default="auto",
        help="sim: a step that sleeps (default without a GPU); model: real training",
    )
    p.add_argument("--sim-rate", type=float, default=800.0, help="sim device samples/s (800)")
    p.add_argument("--model", default="resnet18", help="torchvision model for --device model")
    p.add_argument("--time-budget", type=float, default=15.0, help="tune_dataloader budget (15)")
    p.add_argument("--sweep-slice", type=float, default=1.0, help="s per sweep setting (1.0)")
    p.add_argument("--sweep-rounds", type=int, default=2, help="interleaved sweep rounds (2)")
    p.add_argument("--warmup-steps", type=int, default=5, help="untimed steps per fit (5)")
    p.add_argument("--steps", type=int, default=40, help="timed steps per fit (40)")
    p.add_argument("--rounds", type=int, default=3, help="A/B rounds (3)")
    p.add_argument("--data-dir", type=Path, default=None)
    p.add_argument("--note", default="", help="free text stored with the result")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON line here")
    p.add_argument("--table-out", type=Path, default=None, help="also write the text here")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: a run of seconds")
    return p  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args(argv)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings(
        "ignore", message=r".*(does not have many workers|LeafSpec|persistent_workers)"
    )
    resources = inspect_resources()
    gpu = torch.cuda.is_available()
    mode = args.device if args.device != "auto" else ("model" if gpu else "sim")
    spec = JpegSpec(args.images, args.image_size, args.classes, args.quality, args.seed)
    root = generate_jpeg_dataset(args.data_dir or default_data_dir(spec), spec)
    dataset = JpegFolderDataset(root, crop=args.crop)
    device = torch.device("cuda" if gpu and mode == "model" else "cpu")
    precision = "bf16-mixed" if device.type == "cuda" else "32-true"

    def module() -> pl.LightningModule:
        if mode == "sim":
            return SimulatedDevice(args.sim_rate, len(dataset.classes))
        return ImageClassifier(args.model, len(dataset.classes), channels_last=gpu)

    batch = next(iter(make_loader(dataset, LoaderSettings(batch_size=args.batch_size))))
    consumption = step_rate(module(), batch, device=device, steps=max(args.steps // 2, 3),
                            bf16=precision == "bf16-mixed")  # fmt: skip
    defaults = LoaderSettings(batch_size=args.batch_size)
    tune_loader = make_loader(dataset, defaults)
    start = time.perf_counter()
    plan = tune_dataloader(
        tune_loader, consumption_rate=consumption, time_budget_s=args.time_budget
    )
    tune_s = time.perf_counter() - start
    best, rows, sweep_s = exhaustive_sweep(
        tune_loader, max(resources.cpu.effective, plan.budget.max_workers), consumption, args
    )
    best_settings = LoaderSettings(
        batch_size=args.batch_size, num_workers=best["num_workers"],
        prefetch_factor=best["prefetch_factor"], pin_memory=gpu,
        persistent_workers=best["num_workers"] > 0,
    )  # fmt: skip
    settings = {
        "lightning-defaults": defaults,
        "plan": plan_settings(plan, args.batch_size),
        "sweep-best": best_settings,
    }

    def run(s: LoaderSettings) -> Any:
        steps = args.warmup_steps + args.steps + s.queue_depth  # loading to the last step
        loader = make_loader(dataset, s, steps=steps)
        return time_fit(module(), loader, warmup_steps=args.warmup_steps, steps=args.steps,
                        accelerator=device.type, precision=precision)  # fmt: skip

    configs = [Config(n, partial(run, s), s.to_dict()) for n, s in settings.items()]
    params = {
        **spec.to_dict(), "crop": args.crop, "batch_size": args.batch_size, "device": mode,
        "sim_rate": args.sim_rate if mode == "sim" else None,
        "model": args.model if mode == "model" else None, "warmup_steps": args.warmup_steps,
        "steps": args.steps, "time_budget_s": args.time_budget, "torch_threads":
        torch.get_num_threads(), "smoke": args.smoke, "note": args.note,
    }  # fmt: skip
    result = run_ab("loader_jpeg", configs, rounds=args.rounds, params=params,
                    machine=resources.to_dict())  # fmt: skip
    medians = result.medians()
    epoch = {
        "lightning-defaults": len(dataset) / medians["lightning-defaults"],
        "plan": tune_s + len(dataset) / medians["plan"],
        "sweep-best": sweep_s + len(dataset) / medians["sweep-best"],
    }
    saved = 1 / medians["lightning-defaults"] - 1 / medians["plan"]
    break_even = tune_s / saved if saved > 0 else None
    plan_row = next(
        (r for r in rows if (r["num_workers"], r["prefetch_factor"]) ==
         (plan.num_workers, plan.prefetch_factor)), None,
    )  # fmt: skip
    loader_info = {
        "consumption_rate": consumption,
        "tune_s": tune_s,
        "sweep_s": sweep_s,
        "plan": plan.to_dict(),
        "sweep": rows,
        "sweep_best": best,
        "plan_vs_sweep_best_expected": (plan_row["expected_rate"] / best["expected_rate"])
        if plan_row
        else None,
        "epoch_s_including_tuning": epoch,
        "break_even_samples": break_even,
    }
    text = "\n".join([
        f"consumption rate ({mode} device, data in memory): {consumption:,.1f} samples/s",
        f"tuning took {tune_s:.1f} s (budget {args.time_budget:g} s); exhaustive sweep "
        f"({len(rows)} settings x {args.sweep_rounds} rounds) took {sweep_s:.1f} s",
        "", str(plan), "",
        "sweep (loader alone, best of rounds; expected = training rate at the consumption rate)",
        *(f"  workers {r['num_workers']:>2} prefetch {r['prefetch_factor'] or '-'!s:>2}: "
          f"{r['samples_per_s']:>9,.1f} samples/s, expected {r['expected_rate']:>9,.1f}"
          + ("  <- best" if r is best else "") for r in rows),
        f"plan's setting vs the sweep's best, expected training rate: "
        f"{loader_info['plan_vs_sweep_best_expected'] or float('nan'):.3f}",
        "", format_table(result), "",
        "one epoch of the data set including tuning time: "
        + ", ".join(f"{k} {v:.1f} s" for k, v in epoch.items()),
        "the plan pays for its tuning after "
        + (f"{break_even:,.0f} samples" if break_even else "never (not faster than defaults)"),
    ])  # fmt: skip
    line = json.dumps({**result.to_dict(), "loader": loader_info})
    for path, content in ((args.out, line), (args.table_out, text)):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content + "\n")
    print(text)
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
