"""JPEG inference: ``BatchInferencePool`` vs. a naive loop vs. a hand-written DataLoader loop.

What it measures, in one run, A/B/C per round, the same model, images and batch size for all:

1. ``naive``: one process, decode the batch's JPEGs one after another, stack, forward (fp32,
   pageable memory): what a first script does.
2. ``dataloader``: the expert's hand-written loop: a ``DataLoader`` with ``--workers`` processes
   (default CPUs - 1), persistent workers, prefetch 4, pinned memory and non-blocking copies,
   channels-last and bf16 autocast on a GPU.
3. ``pool``: ``BatchInferencePool`` with every knob on ``"auto"``: the model factory, ``load``
   (decode) and the batch size are all it is given. On a CPU it measures its plan: the first
   pass long enough to pay for a trial of worker processes tries them (inside that round's
   time), later passes use what it kept; ``pool.plan.decisions`` is printed at the end.

Each config is set up once (models built; the pool's start-up time is in the JSON line's
params) and warmed up on a few batches; every timed round is one full pass over the images
(``--repeat`` times the generated set, read from the page cache), outputs back on the host.
Decoding goes to uint8 and the model normalises on the device
(``benchmarks/workloads/jpeg_inference.py``), as an expert does. Run from the repository root::

    python -m benchmarks.inference_jpeg                 # ~1 min on 2 CPU cores
    python -m benchmarks.inference_jpeg --repeat 3 --rounds 2   # long enough for a trial
    python -m benchmarks.inference_jpeg --smoke         # seconds: checks the plumbing
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks.workloads.jpeg_inference import build_classifier, decode, image_paths
from lightning_maxtp.resources.host import probe_cpus

SMOKE = {"images": 48, "image_size": 64, "crop": 32, "batch_size": 16, "rounds": 1}
"""Sizes ``--smoke`` uses (options given explicitly still win)."""


class DecodeDataset(Dataset[torch.Tensor]):
    """The JPEGs at ``paths``, decoded to uint8 (the expert loop's Dataset)."""

    def __init__(self, paths: Sequence[str], size: int) -> None:
        self.paths, self.size = list(paths), size

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> torch.Tensor:
        return decode(self.paths[index], self.size)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def naive_pass(model: torch.nn.Module, paths: Sequence[str], batch: int, crop: int) -> int:
    """One pass of the naive loop; returns the number of outputs."""
    device = next(model.parameters()).device
    count = 0
    with torch.inference_mode():
        for start in range(0, len(paths), batch):
            x = torch.stack([decode(p, crop) for p in paths[start : start + batch]])
            count += model(x.to(device)).cpu().shape[0]
    return count


def loader_pass(model: torch.nn.Module, loader: DataLoader[torch.Tensor], bf16: bool) -> int:
    """One pass of the expert loop; returns the number of outputs."""
    device = next(model.parameters()).device
    count = 0
    with torch.inference_mode(), torch.autocast(device.type, torch.bfloat16, enabled=bf16):
        for x in loader:
            out = model(x.to(device, non_blocking=True))
            count += out.float().cpu().shape[0]
    return count


def timed(run: Callable[[], int]) -> Any:
    """``run`` once, as a ``Measurement``; outputs must be on the host when it returns."""
    from benchmarks.timing import Measurement

    start = time.perf_counter()
    samples = run()
    return Measurement(samples=samples, seconds=time.perf_counter() - start)


def compare(
    paths: Sequence[str],
    *,
    model_name: str,
    crop: int,
    batch_size: int,
    workers: int,
    rounds: int,
    configs: Sequence[str] = ("naive", "dataloader", "pool"),
    params: dict[str, Any] | None = None,
) -> Any:
    """Set up, warm up and time the configs A/B/C; returns the runner's ``BenchmarkResult``."""
    from benchmarks.runner import Config, run_ab
    from lightning_maxtp.inference import BatchInferencePool

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    factory = functools.partial(build_classifier, model_name, 10, cuda)
    load = functools.partial(decode, size=crop)
    params = {**(params or {}), "model": model_name, "crop": crop, "batch_size": batch_size}
    params.update(images=len(paths), loader_workers=workers, device=str(device))
    chosen: list[Any] = []
    pools: list[Any] = []
    with ExitStack() as stack:
        if "naive" in configs:
            naive_model = build_classifier(model_name, 10).to(device)
            naive_pass(naive_model, paths[:batch_size], batch_size, crop)
            run = functools.partial(naive_pass, naive_model, paths, batch_size, crop)
            chosen.append(Config("naive", functools.partial(timed, run), {"fp32": True}))
        if "dataloader" in configs:
            expert = factory().to(device)
            loader = DataLoader(
                DecodeDataset(paths, crop), batch_size=batch_size, num_workers=workers,
                pin_memory=cuda, persistent_workers=workers > 0,
                prefetch_factor=4 if workers > 0 else None,
            )  # fmt: skip
            loader_pass(expert, loader, cuda)
            stack.callback(_shutdown_loader, loader)
            run = functools.partial(loader_pass, expert, loader, cuda)
            settings = {"num_workers": workers, "pin_memory": cuda, "bf16": cuda}
            chosen.append(Config("dataloader", functools.partial(timed, run), settings))
        if "pool" in configs:
            started = time.perf_counter()
            pool = stack.enter_context(
                BatchInferencePool(factory, load=load, batch_size=batch_size)
            )
            pool.map(paths[: batch_size * len(pool.plan.workers) * 2])
            params["pool_startup_s"] = round(time.perf_counter() - started, 2)
            pools.append(pool)
            chosen.append(
                Config("pool", functools.partial(timed, lambda: len(pool.map(paths))),
                       {"plan": str(pool.plan)})
            )  # fmt: skip
        result = run_ab("inference_jpeg", chosen, rounds=rounds, params=params)
        for pool in pools:  # what it measured and decided across the rounds
            result.params["pool_plan"] = pool.plan.to_dict()  # type: ignore[index]
            result.params["pool_stats_last_round"] = str(pool.stats)  # type: ignore[index]
        return result


def _shutdown_loader(loader: DataLoader[torch.Tensor]) -> None:
    # Persistent workers live in the iterator; dropping it shuts them down now, not at exit.
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
    loader._iterator = None


def prepare_images(images: int, image_size: int, data_dir: Path | None) -> list[str]:
    """Generate (or reuse) the JPEG data set; its paths, sorted."""
    from benchmarks.workloads.jpeg import JpegSpec, default_data_dir, generate_jpeg_dataset

    spec = JpegSpec(images=images, image_size=image_size)
    root = generate_jpeg_dataset(data_dir or default_data_dir(spec), spec)
    return image_paths(root)


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry point."""
    from benchmarks.runner import report

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--image-size", type=int, default=160)
    parser.add_argument("--crop", type=int, default=112)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=max(1, probe_cpus().effective - 1))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=1, help="passes over the generated set")
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--table-out", type=Path, default=None)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke:
        given = {a.lstrip("-").split("=")[0].replace("-", "_") for a in (argv or [])}
        for key, value in SMOKE.items():
            if key not in given:
                setattr(args, key, value)
    paths = prepare_images(args.images, args.image_size, args.data_dir) * args.repeat
    result = compare(
        paths, model_name=args.model, crop=args.crop, batch_size=args.batch_size,
        workers=args.workers, rounds=args.rounds, params={"image_size": args.image_size},
    )  # fmt: skip
    report(result, json_out=args.out, table_out=args.table_out)


if __name__ == "__main__":
    main()
