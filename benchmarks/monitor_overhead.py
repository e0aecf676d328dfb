"""What watching a job costs: training samples/s with vs without ``BottleneckMonitor``, A/B/A/B.

The monitor adds two clock readings and a CPU-time reading per step (no device synchronize;
CUDA events are read lazily), a diagnosis per window, and a sampler thread at 10 Hz that takes
the GIL briefly for psutil/NVML reads. The target is under 1 % of step time. The worst case is
a step that is nearly all framework overhead (``tiny-mlp``: about a millisecond per step on a
CPU), so that is the default; ``--workload large-mlp`` shows a compute-bound step.

Prints the runner's table (the ``vs first`` column is with/without), an overhead line, then one
JSON line.

Usage: ``python -m benchmarks.monitor_overhead [--workload tiny-mlp] [--steps 300]
[--rounds 5] [--out FILE] [--table-out FILE] [--smoke]``
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from functools import partial
from pathlib import Path

from benchmarks.runner import Config, Measurement, StepTimer, report, run_ab
from benchmarks.workloads.common import LoaderSettings, make_loader
from benchmarks.workloads.tensors import build_tensor_workload
from lightning_maxtp.observe import sampler as _sampler


def once(workload: str, batch_size: int, warmup: int, steps: int, monitor: bool) -> Measurement:
    """One timed fit; both configs run this function and differ only by the monitor.

    ``time_fit`` fixes its callback list, so the fit is built here with the same settings.
    """
    import lightning.pytorch as pl
    import torch

    from lightning_maxtp.callbacks import BottleneckMonitor

    w = build_tensor_workload(workload, samples=4096)
    loader = make_loader(w.dataset, LoaderSettings(batch_size=batch_size), steps=warmup + steps)
    timer = StepTimer(warmup, steps)
    callbacks: list[pl.Callback] = [timer]
    if monitor:
        callbacks.append(BottleneckMonitor(window_steps=50, verbose=False))
    trainer = pl.Trainer(
        accelerator="cuda" if torch.cuda.is_available() else "cpu", devices=1,
        max_steps=warmup + steps, max_epochs=1, limit_val_batches=0, num_sanity_val_steps=0,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=callbacks,
    )  # fmt: skip
    trainer.fit(w.module, train_dataloaders=loader)
    assert timer.start is not None and timer.stop is not None
    return Measurement(timer.samples, timer.stop - timer.start, steps, warmup)


def direct_cost(batch_size: int, steps: int = 5000) -> dict[str, float]:
    """The monitor's own cost per step and per sampler reading, timed in a tight loop.

    Timing the hooks inside a fit on an oversubscribed CPU charges them for preemption at
    their clock syscalls (time the thread would lose anyway), so the hooks are driven here
    directly: a real Trainer (not fitting), a real batch, the same calls Lightning makes.
    """
    import lightning.pytorch as pl
    import torch

    from lightning_maxtp.callbacks import BottleneckMonitor
    from lightning_maxtp.observe import JobContext

    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False)
    module = pl.LightningModule()
    batch = (torch.zeros(batch_size, 32), torch.zeros(batch_size, dtype=torch.long))
    mon = BottleneckMonitor(window_steps=50, verbose=False, sampler_interval_s=None)
    mon.context = JobContext()
    mon.on_train_epoch_start(trainer, module)
    start = time.perf_counter()
    for i in range(steps):
        mon.on_train_batch_start(trainer, module, batch, i)
        mon.on_train_batch_end(trainer, module, None, batch, i)
    hook_s = (time.perf_counter() - start) / steps
    sampler = _sampler.Sampler(
        [_sampler.ProcessCpuSource(), _sampler.SystemSource()], interval_s=0.1
    )
    start = time.perf_counter()
    for _ in range(200):
        sampler.sample_once()
    reading_s = (time.perf_counter() - start) / 200
    return {"hook_us_per_step": hook_s * 1e6, "sampler_ms_per_reading": reading_s * 1e3,
            "sampler_share_of_one_core_at_10hz": reading_s * 10}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="tiny-mlp")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--warmup-steps", type=int, default=20)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--table-out", type=Path)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the plumbing")
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.warmup_steps, args.rounds = 60, 5, 2
    logging.basicConfig(level=logging.WARNING)
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    run = partial(once, args.workload, args.batch_size, args.warmup_steps, args.steps)
    configs = [
        Config("without monitor", partial(run, False), {"monitor": False}),
        Config("with monitor", partial(run, True), {"monitor": True, "window_steps": 50,
                                                    "sampler_hz": 10}),
    ]  # fmt: skip
    params = {"workload": args.workload, "batch_size": args.batch_size,
              "warmup_steps": args.warmup_steps, "steps": args.steps}  # fmt: skip
    result = run_ab("monitor_overhead", configs, rounds=args.rounds, params=params)
    # Pairwise per-round ratios cancel slow drift better than the ratio of medians.
    pairs = [r[1].samples_per_s / r[0].samples_per_s for r in result.rounds]
    overhead = 1 - statistics.median(pairs)
    print(f"monitor overhead: {overhead:+.2%} of throughput (median of per-round ratios "
          f"{[round(p, 3) for p in pairs]}; target < 1 %)")  # fmt: skip
    direct = direct_cost(args.batch_size)
    step_s = args.batch_size / result.medians()["without monitor"]
    direct["median_step_ms"] = step_s * 1e3
    direct["hook_share_of_step"] = direct["hook_us_per_step"] / 1e6 / step_s
    print(f"direct cost: hooks {direct['hook_us_per_step']:.1f} us/step = "
          f"{direct['hook_share_of_step']:.3%} of a {step_s * 1e3:.2f} ms step; sampler "
          f"{direct['sampler_ms_per_reading']:.2f} ms/reading = "
          f"{direct['sampler_share_of_one_core_at_10hz']:.2%} of one core at 10 Hz")  # fmt: skip
    report(result, json_out=args.out, table_out=args.table_out)
    if args.out is not None:
        data = json.loads(args.out.read_text())
        data["overhead"] = {"per_round_ratio": pairs, "median_overhead": overhead,
                            "direct": direct}  # fmt: skip
        args.out.write_text(json.dumps(data) + "\n")


if __name__ == "__main__":
    main()
