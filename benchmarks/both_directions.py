"""Both directions: a compute-bound CPU image job started with 4 workers, and with none.

On a machine with few CPUs, a loader written with more workers than the step can spare slows a
compute-bound job: the workers' JPEG decoding takes the cores the step's threads use. The
callback must move such a loader down, as it moves a starved one up. Four configs, whole fits
(tuning included) timed A/B interleaved over ``--rounds`` rounds:

- ``start-4``: the loader as written, 4 workers (persistent), no callback;
- ``start-4+callback``: the same loader with ``MaxThroughputCallback()``;
- ``start-0``: no workers, no callback;
- ``start-0+callback``: no workers with the callback.

The targets: with the callback both starts end within 1.10x of the better hand setting, and
neither is slower than its own start by more than 5 %. The table prints each config's whole-fit
rate and the two ratios for each callback run; the callback's trials are printed after it.

Usage: ``python -m benchmarks.both_directions [--smoke] [--rounds 2] [--out F] [--table F]``
"""

from __future__ import annotations

import argparse
import logging
import time
import warnings
from pathlib import Path
from typing import Any

from benchmarks.runner import Config, Measurement, report, run_ab


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """Arguments."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--crop", type=int, default=96)
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument("--images", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=160, help="steps per fit, tuning included")
    p.add_argument("--workers", type=int, default=4, help="the written loader's workers")
    p.add_argument("--window", type=int, default=10, help="the callback's window_steps")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--smoke", action="store_true", help="tiny sizes: the plumbing only")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--table", type=Path, default=None)
    args = p.parse_args(argv)
    if args.smoke:
        args.model, args.images, args.image_size, args.crop = "mobilenet_v3_small", 64, 64, 32
        args.steps, args.window, args.rounds = 24, 4, 1
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the four configs interleaved; print the table, the ratios and the trials."""
    args = parse(argv)
    import lightning.pytorch as pl

    from benchmarks.workloads.jpeg import (
        ImageClassifier,
        JpegFolderDataset,
        JpegSpec,
        LoaderSettings,
        default_data_dir,
        generate_jpeg_dataset,
        make_loader,
    )
    from lightning_maxtp.callbacks import MaxThroughputCallback

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore")
    pl.seed_everything(0, verbose=False)
    spec = JpegSpec(images=args.images, image_size=args.image_size)
    dataset = JpegFolderDataset(generate_jpeg_dataset(default_data_dir(spec), spec), args.crop)
    callbacks: dict[str, list[Any]] = {"start-4+callback": [], "start-0+callback": []}

    def fit(workers: int, name: str | None) -> Measurement:
        settings = LoaderSettings(batch_size=args.batch_size, num_workers=workers,
                                  prefetch_factor=2 if workers else None,
                                  persistent_workers=workers > 0)  # fmt: skip
        callback = None
        if name is not None:
            callback = MaxThroughputCallback(warmup_steps=3, window_steps=args.window,
                                             verbose=False)  # fmt: skip
            callbacks[name].append(callback)
        trainer = pl.Trainer(
            accelerator="cpu", devices=1, max_steps=args.steps, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            callbacks=[callback] if callback is not None else [],
        )  # fmt: skip
        loader = make_loader(dataset, settings, steps=args.steps + 8)
        start = time.perf_counter()
        trainer.fit(ImageClassifier(args.model, num_classes=spec.classes), loader)
        seconds = time.perf_counter() - start
        return Measurement(args.steps * args.batch_size, seconds, args.steps, 0)

    w = args.workers
    configs = [
        Config(f"start-{w}", lambda: fit(w, None), {"num_workers": w}),
        Config(f"start-{w}+callback", lambda: fit(w, "start-4+callback"), {"num_workers": w}),
        Config("start-0", lambda: fit(0, None), {"num_workers": 0}),
        Config("start-0+callback", lambda: fit(0, "start-0+callback"), {"num_workers": 0}),
    ]
    result = run_ab("both_directions", configs, rounds=args.rounds, params={})
    rates = result.medians()
    best = max(rates[f"start-{w}"], rates["start-0"])
    lines = []
    for start in (f"start-{w}", "start-0"):
        tuned = rates[f"{start}+callback"]
        lines.append(
            f"{start}+callback: {tuned / best:.2f}x the better hand setting (target >= 0.91), "
            f"{tuned / rates[start]:.2f}x its own start (target >= 0.95)"
        )
    runs = []
    for name, cbs in callbacks.items():
        for cb in cbs:
            runs.append({"config": name, **cb.tuning.to_dict()})
            print(f"{name}:\n{cb.tuning}")
    params = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    params |= {"callback_runs": runs, "verdict": lines}
    result = type(result)(**{**result.__dict__, "params": params})
    print("\n".join(lines))
    report(result, json_out=args.out, table_out=args.table)
    return result.to_dict()


if __name__ == "__main__":
    main()
