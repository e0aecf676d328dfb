"""One timed fit in a fresh process: ``python -m lightning_maxtp.bench.child ...``.

The parent (``run_bench``) starts one of these per configuration and round (forked from the
bench's fork server where it can), so no run inherits another's caches, threads or allocator
state. It writes one JSON record to ``--out``: the
reference workload's rate, the steady samples/s after warm-up, the whole fit's wall-clock, and
for ``maxtp`` what the callback changed. A failure is written there too, as its last line.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from lightning_maxtp.bench.target import BenchJob, BenchTargetError, load_job, parse_target

# The bench decides how long the fit runs and keeps it free of side work; these job settings
# are replaced (and listed in the record) rather than rejected, so a job function can return
# the Trainer arguments of the real run unchanged.
_REPLACED = (
    "max_steps",
    "max_epochs",
    "min_steps",
    "min_epochs",
    "max_time",
    "limit_val_batches",
    "val_check_interval",
    "num_sanity_val_steps",
    "logger",
    "enable_checkpointing",
    "enable_progress_bar",
    "enable_model_summary",
)


def _timer(warmup: int, steps: int) -> Any:
    """A callback that reads the clock at the end of step ``warmup`` and of step warmup+steps."""
    import lightning.pytorch as pl
    import torch

    from lightning_maxtp.callbacks.step_clock import count_samples

    class SteadyTimer(pl.Callback):
        def __init__(self) -> None:
            self.batches = self.samples = self.total_samples = 0
            self.start: float | None = None
            self.stop: float | None = None
            self.ends: list[float] = []
            """Each timed step's end on the host clock (no device sync: it would pace the job)."""

        def _now(self, trainer: pl.Trainer) -> float:
            device = trainer.strategy.root_device
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elif device.type == "mps":
                torch.mps.synchronize()
            return time.perf_counter()

        def on_train_batch_end(
            self,
            trainer: pl.Trainer,
            module: pl.LightningModule,
            outputs: Any,
            batch: Any,
            batch_idx: int,
        ) -> None:
            self.batches += 1
            try:
                samples = count_samples(batch)
            except TypeError:
                raise RuntimeError(
                    f"cannot count the samples in a batch of {type(batch).__name__}: maxtp bench "
                    "reads the first dimension of the batch's first tensor"
                ) from None
            self.total_samples += samples
            if self.batches == warmup:
                self.start = self._now(trainer)
            elif warmup < self.batches <= warmup + steps:
                self.samples += samples
                if self.batches == warmup + steps:
                    self.stop = self._now(trainer)
                    self.ends.append(self.stop)
                else:
                    self.ends.append(time.perf_counter())

        def median_step_s(self) -> float:
            """The median of the timed steps' durations: a burst of other load moves it little."""
            assert self.start is not None and self.ends, "only after the timed steps"
            times = [self.start, *self.ends]
            return statistics.median(b - a for a, b in itertools.pairwise(times))

    return SteadyTimer()


def _kept_callbacks(callbacks: list[Any]) -> tuple[list[Any], list[str]]:
    """The job's callbacks minus those the bench's Trainer settings refuse or make pointless.

    Checkpoints, logging and validation are off, so Lightning would reject a ``ModelCheckpoint``
    or a ``LearningRateMonitor``, and an ``EarlyStopping`` could stop the fit before its steps.
    """
    from lightning.pytorch import callbacks as cb

    drop = (
        cb.ModelCheckpoint,
        cb.LearningRateMonitor,
        cb.EarlyStopping,
        cb.ProgressBar,
        cb.ModelSummary,
        cb.DeviceStatsMonitor,
    )
    kept = [c for c in callbacks if not isinstance(c, drop)]
    return kept, [type(c).__name__ for c in callbacks if isinstance(c, drop)]


def _has_maxtp(callbacks: list[Any]) -> bool:
    from lightning_maxtp.callbacks import MaxThroughputCallback

    return any(isinstance(c, MaxThroughputCallback) for c in callbacks)


def _tuning(callbacks: list[Any]) -> dict[str, Any] | None:
    from lightning_maxtp.callbacks import MaxThroughputCallback

    for callback in callbacks:
        if isinstance(callback, MaxThroughputCallback):
            tuning = callback.tuning
            return {
                "kept": [t.knob for t in tuning.trials if t.kept],
                "trials": [str(t) for t in tuning.trials],
                "settings": {k: str(v) for k, v in tuning.settings.items()},
                "stop_reason": tuning.stop_reason,
            }
    return None


def fit_once(
    job: BenchJob,
    config: str,
    *,
    steps: int,
    warmup: int,
    accelerator: str | None,
    root_dir: str,
    reference: bool = True,
) -> dict[str, Any]:
    """Time the reference workload, ``warmup + steps`` training batches of ``job``, the reference.

    Args:
        job: The job.
        config: ``defaults``, ``maxtp`` (adds ``MaxThroughputCallback()`` unless the job has
            one) or the job's own configuration name.
        steps: Timed training batches.
        warmup: Untimed batches first.
        accelerator: Overrides the job's ``accelerator`` unless ``None``.
        root_dir: The Trainer's ``default_root_dir`` (a temporary folder).
        reference: Time the reference workload before and after the fit (a paired bench,
            whose other side is its reference, does not).

    Returns:
        The run's record (JSON-safe).

    Raises:
        BenchTargetError: The job asks for more than one process.
        RuntimeError: The fit ended before ``warmup + steps`` batches, or its batches hold no
            tensor to count samples by.
    """
    import lightning.pytorch as pl

    from lightning_maxtp.bench.reference import reference_rate

    kwargs = dict(job.trainer_kwargs)
    replaced = sorted(k for k in _REPLACED if k in kwargs)
    timer = _timer(warmup, steps)
    own, dropped = _kept_callbacks(list(kwargs.pop("callbacks", None) or []))
    callbacks = [timer, *own]
    if config == "maxtp" and not _has_maxtp(callbacks):
        from lightning_maxtp.callbacks import MaxThroughputCallback

        callbacks.append(MaxThroughputCallback())
    kwargs.setdefault("devices", 1)
    if accelerator is not None:
        kwargs["accelerator"] = accelerator
    # max_steps counts optimizer steps; the timer counts batches.
    accumulate = int(kwargs.get("accumulate_grad_batches", 1) or 1)
    kwargs.update(
        max_steps=-(-(warmup + steps) // accumulate),
        max_epochs=None,
        min_steps=None,
        min_epochs=None,
        max_time=None,
        limit_val_batches=0,
        val_check_interval=None,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root_dir,
        callbacks=callbacks,
    )
    trainer = pl.Trainer(**kwargs)
    if trainer.world_size > 1:
        # Each rank would re-run this process and write the record: one device is what it times.
        raise BenchTargetError(
            f"the job's trainer_kwargs make {trainer.world_size} processes (devices="
            f"{kwargs.get('devices')!r}, num_nodes={kwargs.get('num_nodes', 1)!r}); maxtp bench "
            "times one device: drop 'devices' from trainer_kwargs or set it to 1"
        )
    device = trainer.strategy.root_device
    before = reference_rate(device) if reference else None
    start = time.perf_counter()
    if job.datamodule is not None:
        trainer.fit(job.model, datamodule=job.datamodule)
    else:
        trainer.fit(job.model, train_dataloaders=job.train_dataloaders)
    fit_s = time.perf_counter() - start
    # Timed on both sides of the fit, so the reference brackets the minutes the job ran in.
    after = reference_rate(device) if reference else None
    if timer.start is None or timer.stop is None:
        raise RuntimeError(
            f"the fit ended after {timer.batches} of {warmup + steps} steps (--warmup {warmup} "
            f"+ --steps {steps}); does the job stop itself early?"
        )
    steady_s = timer.stop - timer.start
    median_s = timer.median_step_s()
    return {
        "config": config,
        "device": str(device),
        "reference_samples_per_s": _mean(before, after),
        "reference_before_after": [before, after],
        "steady_samples": timer.samples,
        "steady_seconds": steady_s,
        "steady_samples_per_s": timer.samples / steady_s,
        "median_step_seconds": median_s,
        "step_samples_per_s": timer.samples / steps / median_s,
        "fit_samples": timer.total_samples,
        "fit_seconds": fit_s,
        "fit_samples_per_s": timer.total_samples / fit_s,
        "steps": steps,
        "warmup_steps": warmup,
        "replaced_trainer_kwargs": replaced,
        "dropped_callbacks": dropped,
        "tuning": _tuning(callbacks),
    }


def _mean(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else (before + after) / 2


def _versions() -> dict[str, str]:
    import lightning
    import torch

    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        # The package is imported already (this module is in it); no import of the top level.
        "lightning_maxtp": str(getattr(sys.modules["lightning_maxtp"], "__version__", "?")),
    }


def _last_line(err: BaseException) -> str:
    text = "".join(traceback.format_exception_only(type(err), err)).strip().splitlines()
    return text[-1] if text else type(err).__name__


def main(argv: list[str] | None = None) -> int:
    """Run one timed fit and write its record (or its error) to ``--out``.

    Args:
        argv: The arguments (default ``sys.argv[1:]``).

    Returns:
        0 on success, 2 for a target that cannot be built, 3 for a fit that failed.
    """
    parser = argparse.ArgumentParser(prog="python -m lightning_maxtp.bench.child")
    parser.add_argument("--target", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--accelerator", default=None)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--probe", action="store_true", help="add the machine's description")
    parser.add_argument("--sys-path", action="append", default=[], help="put first on sys.path")
    parser.add_argument("--no-reference", action="store_true", help="time no reference workload")
    args = parser.parse_args(argv)
    record: dict[str, Any]
    code = 0
    try:
        import logging
        import warnings

        import lightning.pytorch as pl

        logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
        warnings.filterwarnings("ignore", module="lightning.*")
        pl.seed_everything(0, verbose=False)
        # The against side's checkout first, so its `import mypkg` finds that copy.
        sys.path[:0] = args.sys_path
        job = load_job(parse_target(args.target), args.config)
        with tempfile.TemporaryDirectory(prefix="maxtp-bench-") as root:
            record = fit_once(
                job,
                args.config,
                steps=args.steps,
                warmup=args.warmup,
                accelerator=args.accelerator,
                root_dir=root,
                reference=not args.no_reference,
            )
        record["versions"] = _versions()
        if args.probe:  # here, not in the parent: a probe without NVML may fall back to torch
            from lightning_maxtp.resources import inspect_resources

            record["machine"] = inspect_resources().to_dict()
    except BenchTargetError as err:
        record, code = {"error": str(err), "stage": "target"}, 2
    except Exception as err:  # the user's job may raise anything: report it
        traceback.print_exc()
        stage = "target" if "job" not in locals() else "fit"
        record, code = {"error": _last_line(err), "stage": stage}, 2 if stage == "target" else 3
    args.out.write_text(json.dumps(record))
    return code


if __name__ == "__main__":
    sys.exit(main())
