"""In-memory inference on the CPU: ``BatchInferencePool`` vs. a plain batched loop, start-up in.

What it measures, in one run, A/B/C per round, the same model, tensors and batch size for all,
each timed from nothing built to every output on the host:

1. ``plain``: build the model, then ``torch.inference_mode()`` over batches of the stacked
   tensors in this process (default torch threads): what a user writes.
2. ``pool``: ``BatchInferencePool(factory, batch_size=...)`` with everything else on
   ``"auto"`` (the measured plan): construct, start, ``map``, close.
3. ``pool-processes``: the same with ``mode="processes"``: the worker processes the pool used
   before it measured (one single-threaded process per core), for comparison.

The target: ``pool`` >= 0.9x ``plain`` for a few thousand items. Run from the repository root::

    python -m benchmarks.inference_cpu                  # ~1-2 min on 2 CPU cores
    python -m benchmarks.inference_cpu --items 320      # a small input
    python -m benchmarks.inference_cpu --smoke          # seconds: checks the plumbing
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.inference_jpeg import timed
from benchmarks.workloads.jpeg_inference import build_classifier

SMOKE = {"items": 64, "size": 32, "batch_size": 16, "rounds": 1, "model": "resnet18"}


def make_items(count: int, size: int) -> list[torch.Tensor]:
    """``count`` uint8 images ``(3, size, size)``, fixed seed."""
    generator = torch.Generator().manual_seed(0)
    return list(torch.randint(0, 256, (count, 3, size, size), dtype=torch.uint8,
                              generator=generator).unbind(0))  # fmt: skip


def plain(factory: Callable[[], torch.nn.Module], items: list[torch.Tensor], batch: int) -> int:
    """The plain loop; returns the number of outputs."""
    model = factory().eval()
    outputs = []
    with torch.inference_mode():
        for start in range(0, len(items), batch):
            outputs.append(model(torch.stack(items[start : start + batch])))
    return sum(o.shape[0] for o in outputs)


def pooled(
    factory: Callable[[], torch.nn.Module], items: list[torch.Tensor], batch: int, mode: str,
    plans: list[Any],
) -> int:  # fmt: skip
    """The pool, start to close; returns the number of outputs."""
    from lightning_maxtp.inference import BatchInferencePool

    with BatchInferencePool(factory, batch_size=batch, mode=mode) as pool:
        count = len(pool.map(items))
        plans.append({"plan": pool.plan.to_dict(), "stats": str(pool.stats)})
    return count


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry point."""
    from benchmarks.runner import Config, report, run_ab

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--table-out", type=Path, default=None)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke:
        given = {a.lstrip("-").split("=")[0].replace("-", "_") for a in (argv or [])}
        for key, value in SMOKE.items():
            if key not in given:
                setattr(args, key, value)
    items = make_items(args.items, args.size)
    factory = functools.partial(build_classifier, args.model, 10)
    plans: dict[str, list[Any]] = {"pool": [], "pool-processes": []}
    configs = [
        Config("plain", functools.partial(timed, functools.partial(plain, factory, items,
                                                                   args.batch_size))),
        Config("pool", functools.partial(timed, functools.partial(
            pooled, factory, items, args.batch_size, "auto", plans["pool"]))),
        Config("pool-processes", functools.partial(timed, functools.partial(
            pooled, factory, items, args.batch_size, "processes", plans["pool-processes"]))),
    ]  # fmt: skip
    params = {"items": args.items, "size": args.size, "batch_size": args.batch_size,
              "model": args.model, "torch_threads": torch.get_num_threads()}  # fmt: skip
    result = run_ab("inference_cpu", configs, rounds=args.rounds, params=params)
    report(result, json_out=args.out, table_out=args.table_out)
    for name, seen in plans.items():
        print(f"{name} (last round): {seen[-1]['stats']}")
        for decision in seen[-1]["plan"]["decisions"]:
            print(f"  decided: {decision}")


if __name__ == "__main__":
    main()
