"""Issue [6]: defaults vs. defaults + ``MaxThroughputCallback`` vs. a sweep's best, JPEG workload.

A/B/C alternating rounds on one machine.

1. Sweep (one round, loader settings on the training run): num_workers 0..CPUs, 2x and 4x CPUs
   (more workers than CPUs pay when reads wait) x prefetch 2/4; the fastest is "sweep-best".
   Every fit's loader has ``--tail`` batches more than the fit trains on, so the timed steps
   always have loading beside them (steady state, not a drained queue at the end).
2. A/B/C rounds: ``lightning-defaults`` (batch 32, 0 workers), ``callback`` (the same loader plus
   the callback; timed after ``--warmup-callback`` steps, which must cover the tuning, and the
   table says whether it did), ``sweep-best``. ``--also-allow all`` adds ``callback-all``: the
   callback with ``allow="all"`` on a module whose ``train_dataloader()`` reads its
   ``batch_size`` (so the batch may grow), timed after ``--warmup-all`` steps.
The callback's trials, stop reason, tuning time and whole-fit wall-clock are printed and kept
in the params.

``--read-latency-ms`` (default 5, as the demo) makes every file read wait first, like network
storage; with 0 the files are read from the local disk as they are, and on a small CPU-only
machine the model's arithmetic then sets the pace whatever the loader does.

Usage: ``python -m benchmarks.callback_jpeg [--smoke] [--out FILE] [--table FILE]``
"""

from __future__ import annotations

import argparse
import logging
import warnings
from pathlib import Path
from typing import Any

from benchmarks.runner import Config, Measurement, report, run_ab
from lightning_maxtp.resources.host import probe_cpus


def timed_fit(
    args: argparse.Namespace, dataset: Any, settings: Any, *, callback: Any = None,
    classes: int = 10, resizable: bool = False, precision: str | None = None,
    channels_last: bool = False,
) -> tuple[Measurement, Any]:  # fmt: skip
    """One fit: ``warmup`` untimed steps then ``steps`` timed ones; returns (measurement, cb).

    ``resizable``: the module builds its loader from its ``batch_size`` (``allow="all"`` may
    grow it), and the callback's ``fit_s`` is set to the whole fit's wall-clock.
    ``precision`` and ``channels_last``: a hand configuration's own (``--expert``).
    """
    import dataclasses
    import time

    import lightning.pytorch as pl

    from benchmarks.timing import StepTimer
    from benchmarks.workloads.jpeg import ImageClassifier, make_loader

    warmup = args.warmup_callback if callback is not None else args.warmup
    warmup = args.warmup_all if resizable else warmup
    timer = StepTimer(warmup, args.steps)
    trainer = pl.Trainer(
        accelerator=args.device, devices=1, precision=precision or args.precision,
        max_steps=warmup + args.steps,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[c for c in (callback, timer) if c is not None],
    )  # fmt: skip
    # The loader runs on past the last timed step: a loader that ends with the fit lets a deep
    # queue (workers x prefetch batches) finish loading early, and the last steps then train
    # without any loading beside them, which flatters deep queues in a short run.
    batches = warmup + args.steps + args.tail

    class Resizable(ImageClassifier):
        batch_size = settings.batch_size

        def train_dataloader(self) -> Any:
            return make_loader(dataset, dataclasses.replace(settings, batch_size=self.batch_size),
                               steps=batches)  # fmt: skip

    start = time.perf_counter()
    if resizable:
        trainer.fit(Resizable(args.model, num_classes=classes))
    else:
        loader = make_loader(dataset, settings, steps=batches)
        module = ImageClassifier(args.model, num_classes=classes, channels_last=channels_last)
        trainer.fit(module, train_dataloaders=loader)
    if callback is not None:
        callback.fit_s = time.perf_counter() - start
    assert timer.start is not None and timer.stop is not None
    return Measurement(timer.samples, timer.stop - timer.start, args.steps, warmup), callback


def make_callback(args: argparse.Namespace, allow: str = "safe") -> Any:
    """The callback as a user adds it, with windows sized for a short benchmark.

    With ``allow="all"`` it may try every knob (``--max-trials-all``), and the tuning budget is
    ``--cost-share-all`` (``0``: none, as for a long job whose steady rate is measured).
    """
    from lightning_maxtp.callbacks import MaxThroughputCallback

    every = allow == "all"
    share = args.cost_share_all if every else 0.05
    return MaxThroughputCallback(
        warmup_steps=3, window_steps=args.window, loader_time_budget_s=args.loader_budget,
        max_trials=args.max_trials_all if every else args.max_trials, verbose=False,
        allow=allow, cost_share=share or None,  # type: ignore[arg-type]
    )  # fmt: skip


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """Arguments (shared with ``gpu_check_callback``)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mobilenet_v3_small")
    p.add_argument("--crop", type=int, default=64)
    p.add_argument("--image-size", type=int, default=256)
    p.add_argument("--read-latency-ms", type=float, default=5.0)
    p.add_argument("--images", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="32-true")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=140, help="untimed steps (as the callback's)")
    p.add_argument(
        "--warmup-callback",
        type=int,
        default=140,
        help="untimed steps of the callback run: the paired trials need about 50 steps each",
    )
    p.add_argument(
        "--also-allow",
        choices=("all",),
        default=None,
        help="add a callback-all config: allow='all' on a resizable module",
    )
    p.add_argument(
        "--warmup-all",
        type=int,
        default=400,
        help="untimed steps of the callback-all run (it tries more knobs)",
    )
    p.add_argument("--max-trials-all", type=int, default=10)
    p.add_argument(
        "--cost-share-all",
        type=float,
        default=0.0,
        help="cost_share of the callback-all run (0: no share limit)",
    )
    p.add_argument("--tail", type=int, default=64, help="batches the loader has past the end")
    p.add_argument("--window", type=int, default=10)
    p.add_argument("--max-trials", type=int, default=3)
    p.add_argument("--loader-budget", type=float, default=8.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument(
        "--sweep-workers", default=None, help="e.g. 0,4,8 (default: 0..CPUs; 'none': no sweep)"
    )
    p.add_argument(
        "--expert", action="store_true",
        help="add the expert's hand configuration: batch 256, CPUs - 1 workers, prefetch 4, "
        "pinned, persistent, bf16-mixed (on CUDA), channels_last",
    )  # fmt: skip
    p.add_argument(
        "--threads", type=int, default=None,
        help="torch.set_num_threads for every fit, as a user's script may set it",
    )  # fmt: skip
    p.add_argument("--smoke", action="store_true", help="tiny sizes: the plumbing only")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--table", type=Path, default=None)
    p.add_argument("--note", default="")
    args = p.parse_args(argv)
    if args.smoke:
        args.images, args.image_size, args.crop, args.steps, args.rounds = 64, 64, 32, 3, 1
        args.warmup, args.tail = 3, 8
        args.warmup_callback, args.window, args.max_trials, args.loader_budget = 14, 3, 1, 2.0
        args.warmup_all, args.max_trials_all = 24, 2
        # The plumbing needs a sweep, not the whole grid (up to 4x the CPUs in workers).
        args.sweep_workers = args.sweep_workers or "0,1"
    return args


def main(argv: list[str] | None = None, name: str = "callback_jpeg") -> dict[str, Any]:
    """Run the sweep and the A/B/C rounds; print the table and one JSON line."""
    args = parse(argv)
    import lightning.pytorch as pl

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore")
    from benchmarks.workloads.jpeg import (
        JpegFolderDataset,
        JpegSpec,
        LoaderSettings,
        default_data_dir,
        generate_jpeg_dataset,
    )

    pl.seed_everything(0, verbose=False)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    spec = JpegSpec(images=args.images, image_size=args.image_size)
    root = generate_jpeg_dataset(default_data_dir(spec), spec)
    dataset = JpegFolderDataset(root, args.crop, read_latency_s=args.read_latency_ms / 1000)
    cpus = probe_cpus().effective  # affinity and the cgroup quota
    pin = args.device == "cuda"
    sweep: dict[str, tuple[LoaderSettings, float]] = {}
    grid = sorted({*range(cpus + 1), 2 * cpus, 4 * cpus})
    if args.sweep_workers == "none":
        grid = []
    elif args.sweep_workers:
        grid = [int(w) for w in args.sweep_workers.split(",")]  # type: ignore[assignment]
    for workers in grid:
        for prefetch in (None,) if workers == 0 else (2, 4):
            settings = LoaderSettings(batch_size=args.batch_size, num_workers=workers,
                                      prefetch_factor=prefetch, pin_memory=pin,
                                      persistent_workers=workers > 0)  # fmt: skip
            rate = timed_fit(args, dataset, settings)[0].samples_per_s
            sweep[f"w{workers}-p{prefetch}"] = (settings, rate)
            print(f"sweep workers={workers} prefetch={prefetch}: {rate:.1f} samples/s", flush=True)
    best_name = max(sweep, key=lambda k: sweep[k][1], default=None)
    best = sweep[best_name][0] if best_name is not None else None
    defaults = LoaderSettings(batch_size=args.batch_size)
    callbacks: list[Any] = []

    def with_callback(allow: str = "safe") -> Measurement:
        callback = make_callback(args, allow)
        measurement, cb = timed_fit(args, dataset, defaults, callback=callback,
                                    resizable=allow == "all")  # fmt: skip
        callbacks.append(cb)
        return measurement

    configs = [
        Config("lightning-defaults", lambda: timed_fit(args, dataset, defaults)[0], vars(defaults)),
        Config("callback", with_callback, {"loader": "defaults + MaxThroughputCallback()"}),
    ]
    if best is not None:
        configs.append(Config("sweep-best", lambda: timed_fit(args, dataset, best)[0], vars(best)))
    if args.expert:
        expert = LoaderSettings(
            batch_size=256 if not args.smoke else args.batch_size,
            num_workers=max(1, cpus - 1) if not args.smoke else 1,
            prefetch_factor=4, pin_memory=pin, persistent_workers=True,
        )  # fmt: skip
        precision = "bf16-mixed" if args.device == "cuda" else args.precision

        def run_expert() -> Measurement:
            return timed_fit(args, dataset, expert, precision=precision, channels_last=True)[0]

        configs.append(Config("expert", run_expert, {**vars(expert), "precision": precision,
                                                     "channels_last": True}))  # fmt: skip
    if args.also_allow == "all":
        every = {"loader": "defaults + MaxThroughputCallback(allow='all')"}
        configs.append(Config("callback-all", lambda: with_callback("all"), every))
    tuning = []
    result = run_ab(name, configs, rounds=args.rounds, params={})
    for cb in callbacks:
        summary = cb.tuning
        # Tuning ends before the timed steps when it finished before the fit did.
        tuning.append({**summary.to_dict(), "finished_before_timing": summary.finished,
                       "allow": cb.config.to_dict()["allow"], "fit_s": cb.fit_s,
                       "kept": [(t.knob, t.new, t.gain) for t in summary.trials if t.kept],
                       "batch_size": getattr(cb.batch_plan, "batch_size", None)})  # fmt: skip
        print(summary)
    params = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    params |= {"sweep": {k: r for k, (_, r) in sweep.items()}, "sweep_best": best_name,
               "callback_runs": tuning}  # fmt: skip
    result = type(result)(**{**result.__dict__, "params": params})
    report(result, json_out=args.out, table_out=args.table)
    ratios = result.ratios()
    for run in [n for n in ("callback", "callback-all") if n in ratios]:
        against = [f"/ defaults: {ratios[run]:.2f}x"] + [
            f"/ {other}: {ratios[run] / ratios[other]:.3f}"
            for other in ("sweep-best", "expert") if other in ratios
        ]  # fmt: skip
        print(f"{run} " + "; ".join(against))
    return result.to_dict()


if __name__ == "__main__":
    main()
