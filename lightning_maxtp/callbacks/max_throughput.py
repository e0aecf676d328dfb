"""``MaxThroughputCallback``: the closed loop, run for the user inside ``trainer.fit``.

probe -> (optional batch search) -> warm up -> measure a baseline window -> diagnose -> try ONE
safe loader knob (first the settings ``tune_dataloader`` picks against the measured consumption
rate, then the top diagnosis's auto-applicable recommendation) -> measure as many steps again ->
keep it if throughput rose by ``min_gain``, else revert -> repeat -> monitor -> report.

The callback owns a ``BottleneckMonitor`` (measurement, diagnosis, logging, the report) and a
``TuningLoop`` (the decisions, pure); it carries out what the loop decides on the train loader.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_maxtp._log import rank_zero_info
from lightning_maxtp.callbacks.bottleneck_monitor import BottleneckMonitor
from lightning_maxtp.callbacks.config import TuningConfig
from lightning_maxtp.callbacks.loader_trial import measure_loader, plan_change, plan_line
from lightning_maxtp.callbacks.metrics import PROGRESS_BAR
from lightning_maxtp.callbacks.trials import (
    KnobTrial,
    TuningSummary,
    fmt_settings,
    remaining,
    top_line,
)
from lightning_maxtp.callbacks.tuning_loop import Change, TuningLoop, window_rate
from lightning_maxtp.loader.switchable import SwitchableLoader, switchable_reason
from lightning_maxtp.observe.capture import CaptureMode
from lightning_maxtp.observe.report import KnobChange, ThroughputReport
from lightning_maxtp.observe.thresholds import MIN_GAIN
from lightning_maxtp.observe.window import Window

if TYPE_CHECKING:
    import lightning.pytorch as pl

__all__ = ["MaxThroughputCallback"]

log = logging.getLogger(__name__)


class MaxThroughputCallback(Callback):
    """Measure the running fit, change one safe loader knob at a time, keep what pays, report.

    Tuning happens on real training steps: the knobs only change how batches are loaded
    (workers, prefetch, persistence, pinning, worker thread limits), never the batches. The
    train loader is rebuilt once around a shared index feed, so a change mid-epoch lets the old
    workers finish the batches they already started and the new ones continue from the next
    index: every sample is seen exactly once per epoch, in the sampler's order (the same ids as
    without the callback; one caveat: a kept ``persistent_workers=True`` makes torch draw one
    seed fewer from the global RNG per epoch, so a sampler without its own ``generator``
    shuffles later epochs differently, as it would with that setting by hand). Only
    ``allow_batch_size_change=True`` changes the math (batch size, via ``find_batch_size``
    before training, reported). Under DDP rank zero decides and every rank applies the same
    change at the same step. Throughput of a window is its samples over its step times, a step
    longer than 3 mean steps counted as 3 (a stall from another process on a shared machine must
    not decide a knob).

    What it logs and shows (``callbacks.metrics`` has the same table):

    ================================  ==========================================================
    Key                               Value
    ================================  ==========================================================
    ``maxtp/samples_per_s``           logged: samples/s of each window on this rank
    ``maxtp/step_time_ms``            logged: median step time of the window
    ``maxtp/data_wait_share``         logged: share of step time waiting for the next batch
    ``maxtp/gpu_util_percent``        logged: mean NVML utilization (CUDA only)
    ``maxtp/main_cpu_percent``        logged: training process CPU, percent of one core
    ``maxtp/worker_cpu_percent``      logged: CPU of one DataLoader worker, percent of one core
    ``maxtp/bottleneck_code``         logged: top diagnosis, its index in ``BottleneckKind``
    ``maxtp/bottleneck_confidence``   logged: its confidence, 0..1
    ``maxtp/straggler_rank``          logged, DDP only: the rank waiting longest for data
    ``maxtp_samples_s``               progress bar: samples/s of the last measured window
    ``maxtp_trials``                  progress bar: knob trials so far
    ``maxtp_tuning``                  progress bar: 1 while tuning, 0 once only monitoring
    ================================  ==========================================================

    Args:
        warmup_steps: Steps before the baseline window (compile, caches, worker start).
        window_steps: Steps in the baseline window and in each trial's window.
        settle_steps: Steps after a change before its window starts (in-flight batches drain).
        min_gain: A knob is kept when throughput rose by at least this share (0.05: 5 %).
        max_trials: Most knob trials.
        time_budget_s: No trial starts after this many seconds of tuning.
        tune_loader: Run ``tune_dataloader`` against the measured consumption rate when the
            baseline is data-bound, and try its settings first.
        loader_time_budget_s: Time budget of that loader measurement.
        max_workers: Worker cap (default: the probe's CPU budget per device process, which
            ``tune_dataloader`` raises up to 4x when loading mostly waits on reads).
        allow_batch_size_change: Run ``find_batch_size`` before training and apply its batch
            (changes the optimization; off by default).
        monitor_window_steps: Window length after tuning (cheap monitoring).
        drift_share: After tuning, a window this much slower than the tuned rate is reported.
        capture: Profiler capture mode after tuning (``"auto"``, ``"always"``, ``"never"``).
        report_dir: Where rank zero writes ``report.json``/``report.md``/``timeline.png``.
        verbose: Print the plan, the tuning progress and the final summary (rank zero).
        sampler_interval_s: Background sampling period (None: no sampler).
    """

    def __init__(
        self,
        *,
        warmup_steps: int = 5,
        window_steps: int = 20,
        settle_steps: int = 2,
        min_gain: float = MIN_GAIN,
        max_trials: int = 6,
        time_budget_s: float = 300.0,
        tune_loader: bool = True,
        loader_time_budget_s: float = 15.0,
        max_workers: int | None = None,
        allow_batch_size_change: bool = False,
        monitor_window_steps: int = 100,
        drift_share: float = 0.2,
        capture: CaptureMode = "auto",
        report_dir: str | Path | None = None,
        verbose: bool = True,
        sampler_interval_s: float | None = 0.1,
    ) -> None:
        self.config = TuningConfig(
            warmup_steps=warmup_steps, window_steps=window_steps, settle_steps=settle_steps,
            min_gain=min_gain, max_trials=max_trials, time_budget_s=time_budget_s,
            tune_loader=tune_loader, loader_time_budget_s=loader_time_budget_s,
            max_workers=max_workers, allow_batch_size_change=allow_batch_size_change,
            monitor_window_steps=monitor_window_steps, drift_share=drift_share,
        )  # fmt: skip
        self.monitor = BottleneckMonitor(
            window_steps, sampler_interval_s=sampler_interval_s, capture=capture,
            verbose=False, on_window=self._on_window,
        )  # fmt: skip
        self.report_dir = None if report_dir is None else Path(report_dir)
        self.verbose = verbose
        self.knob_changes: list[KnobChange] = []
        self.batch_plan: Any = None
        self.loader_plan: Any = None
        self._report: ThroughputReport | None = None
        self._reset_loop()

    def _reset_loop(self) -> None:
        config = self.config
        self.loader: SwitchableLoader | None = None
        self.source_loader: Any = None
        self.resources: Any = None
        self.loop = TuningLoop(
            warmup_steps=config.warmup_steps, settle_steps=config.settle_steps,
            min_gain=config.min_gain, max_trials=config.max_trials,
            time_budget_s=config.time_budget_s, max_workers=config.max_workers,
        )  # fmt: skip
        self._notes: list[str] = []
        self._drifted = False

    @property
    def windows(self) -> list[Window]:
        """Every window measured so far (baseline, trials, monitoring), oldest first."""
        return self.monitor.windows

    @property
    def trials(self) -> list[KnobTrial]:
        """Every knob trial so far, in order."""
        return self.loop.trials

    @property
    def tuning(self) -> TuningSummary:
        """What the loop did (live while the fit runs)."""
        settings = self.loader.settings() if self.loader is not None else {}
        return self.loop.summary(settings, tuple(self._notes))

    @property
    def report(self) -> ThroughputReport:
        """The report of the last fit (built at its end; a live view while it runs)."""
        return self._report if self._report is not None else self._build_report()

    # -- setup: probe, plan, wrap the train loader ------------------------------------------

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        from lightning_maxtp.loader import lightning_private as private
        from lightning_maxtp.resources.probe import inspect_resources

        self._reset_loop()
        self.knob_changes = []
        self.batch_plan, self.loader_plan = None, None
        self.resources = inspect_resources()
        previous = private.dataloader_transform(trainer)

        def transform(loader: object, stage_: str | None, trainer_: pl.Trainer) -> object:
            if previous is not None:
                loader = previous(loader, stage_, trainer_)
            return self._wrap(loader) if stage_ == "train" else loader

        private.install_dataloader_transform(trainer, transform)
        if self.verbose:
            rank_zero_info(plan_line(self.config, self.resources, trainer.world_size))

    def _wrap(self, loader: object) -> object:
        why = switchable_reason(loader)
        if why is not None:
            self._note(f"loader knobs not changed: {why}")
            return loader
        if isinstance(loader, SwitchableLoader):
            return loader
        from torch.utils.data import DataLoader

        assert isinstance(loader, DataLoader)
        self.source_loader = loader
        cpus = int(self.resources.cpu.effective) if self.resources else 1
        self.loader = SwitchableLoader(loader, cpu_threads=cpus)
        return self.loader

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.config.allow_batch_size_change:
            return
        from lightning_maxtp.batch_size.find import find_batch_size

        self.batch_plan = find_batch_size(pl_module, trainer=trainer)
        self.batch_plan.apply(trainer)
        if self.verbose:
            rank_zero_info(str(self.batch_plan))

    # -- the monitor's hooks ----------------------------------------------------------------

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.monitor.on_train_start(trainer, pl_module)

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.monitor.on_train_epoch_start(trainer, pl_module)

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.monitor.on_validation_end(trainer, pl_module)

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.monitor.on_train_batch_start(trainer, pl_module, batch, batch_idx)

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self.monitor.on_exception(trainer, pl_module, exception)

    # -- the loop ---------------------------------------------------------------------------

    @override
    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self.monitor.on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        # Settle steps count once the old workers drained their in-flight batches
        # (deterministic, so every DDP rank closes its window at the same step).
        if self.loop.on_step(switched=self.loader is not None and self.loader.switched):
            self.monitor.restart_window()  # the measured window starts at this step boundary

    def _on_window(self, trainer: pl.Trainer, window: Window) -> None:
        if self.loop.measuring:  # no profiler inside a measured window
            found = self.monitor.record(trainer, window, may_capture=False)
            self._tuning_step(trainer, window, found)
            self._show_progress(trainer, window)
            return
        self.monitor.record(trainer, window)
        if self.loop.finished:
            self._watch_drift(window)

    def _tuning_step(self, trainer: pl.Trainer, window: Window, found: tuple[Any, ...]) -> None:
        loop = self.loop
        if loop.phase == "baseline":
            loop.record_baseline(window, found)
            self._say(f"baseline {window_rate(window):.1f} samples/s over {window.steps} steps, "
                      f"data wait {window.data_wait_share:.0%}; {top_line(found)}")  # fmt: skip
        else:
            kept = loop.pays(window) if trainer.is_global_zero else None
            if trainer.world_size > 1:
                kept = trainer.strategy.broadcast(kept, src=0)
            self._finish_trial(window, bool(kept), found)
        decision = self._decide() if trainer.is_global_zero else None
        if trainer.world_size > 1:
            decision = trainer.strategy.broadcast(decision, src=0)
        if decision is None or isinstance(decision, str):
            self._stop(decision or "no loader")
        else:
            self._start_trial(trainer, *decision)

    def _show_progress(self, trainer: pl.Trainer, window: Window) -> None:
        """Tuning progress in the progress bar: rate of the window, trials, whether done."""
        module = trainer.lightning_module
        values = (window_rate(window), len(self.trials), float(not self.loop.finished))
        for name, value in zip(PROGRESS_BAR, values, strict=True):
            module.log(name, float(value), prog_bar=True, logger=False, on_step=True)

    def _decide(self) -> Change | str:
        """Rank zero: the next trial, or why the loop stops."""
        if self.loader is None:
            return "the train loader cannot be switched (see notes)"
        settings = self.loader.settings()
        wants_plan = self.config.tune_loader and self.loader_plan is None
        plan = self._plan_change if wants_plan else None
        device = self.monitor.context.device_type
        return self.loop.decide(settings, device_type=device, loader_plan=plan)

    def _plan_change(self) -> Change | None:
        """Step 3: ``tune_dataloader`` against the reference window's consumption rate."""
        assert self.loop.ref is not None and self.loader is not None
        rate = self.loop.ref.device_samples_per_s
        self._say(f"measuring the loader alone against {rate:.1f} samples/s consumption")
        try:
            self.loader_plan = measure_loader(
                self.source_loader, self.loop.ref, self.config, self.resources
            )
        except Exception as err:  # advisory: the diagnosis loop still runs without it
            self._note(f"tune_dataloader failed, skipped: {err!r}")
            self.loader_plan = False
            return None
        return plan_change(self.loader_plan, self.loader.settings())

    def _start_trial(self, trainer: pl.Trainer, knob: str, new: dict[str, Any], why: str) -> None:
        assert self.loader is not None
        old = {k: self.loader.settings()[k] for k in new}
        self.loader.request(**new)
        # Windows measured from now on run with the new settings: diagnose them as such.
        self.monitor.clock.update_context(**self.loader.settings())
        self.loop.start(knob, old, new, why, trainer.global_step)
        self._record_change(knob, old, new, f"trying: {why}")
        self._say(f"trying {fmt_settings(old)} -> {fmt_settings(new)} ({why})")
        if self.loop.measuring:  # settle_steps=0: the trial window starts now
            self.monitor.restart_window()

    def _finish_trial(self, window: Window, kept: bool, found: tuple[Any, ...]) -> None:
        assert self.loader is not None and self.loop.pending is not None
        old, new = self.loop.pending
        trial = self.loop.finish(window, kept, found)
        self._say(str(trial))
        if not kept:
            self.loader.request(**old)
            self._record_change(
                trial.knob, new, old, f"reverted: {trial.gain:+.1%} < {self.config.min_gain:.0%}"
            )
        self.monitor.clock.update_context(**self.loader.settings())

    def _stop(self, reason: str) -> None:
        self.loop.stop(reason)
        steps = self.config.monitor_window_steps
        self.monitor.window_steps = steps
        self._say(f"tuning done after {self.tuning.tuning_s:.1f} s: {reason}; now monitoring "
                  f"every {steps} steps")  # fmt: skip

    def _watch_drift(self, window: Window) -> None:
        tuned = window_rate(self.loop.ref) if self.loop.ref is not None else None
        slow = tuned and window_rate(window) < (1 - self.config.drift_share) * tuned
        if slow and not self._drifted:
            self._drifted = True
            last = self.monitor.diagnoses[-1] if self.monitor.diagnoses else ()
            self._note(f"throughput drifted at step {window.first_step}: "
                       f"{window_rate(window):.1f} vs {tuned:.1f} samples/s tuned; "
                       f"{top_line(last)}")  # fmt: skip

    # -- report -----------------------------------------------------------------------------

    def _record_change(self, knob: str, old: Any, new: Any, reason: str) -> None:
        t_s = self.monitor.elapsed_s()
        self.knob_changes.append(
            KnobChange(t_s, knob, fmt_settings(old), fmt_settings(new), reason)
        )

    def _note(self, text: str) -> None:
        if text not in self._notes:
            self._notes.append(text)
            self._say(text)

    def _say(self, text: str) -> None:
        if self.verbose:
            rank_zero_info(text)
        log.debug(text)

    def _build_report(self) -> ThroughputReport:
        report = self.monitor.report
        tuning = self.tuning
        notes = [*report.notes, *str(tuning).split("\n")[:2], *(str(t) for t in self.trials)]
        left = remaining(report.diagnoses, self.loop.tried, tuning.settings)
        return dataclasses.replace(
            report, diagnoses=left, knob_changes=tuple(self.knob_changes),
            notes=(*notes, *self._notes),
        )  # fmt: skip

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.loop.end()
        self.monitor.on_train_end(trainer, pl_module)
        self._report = self._build_report()
        if trainer.is_global_zero:
            if self.verbose:
                rank_zero_info(self._report.summary())
            if self.report_dir is not None:
                self._report.write(self.report_dir)
        if self.verbose:
            rank_zero_info(str(self.tuning))
            if self.report_dir is not None:
                rank_zero_info(f"report files in {self.report_dir}")

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.monitor.teardown(trainer, pl_module, stage)
        if stage == "fit" and self.loader is not None:
            self.loader.shutdown()
