"""``MaxThroughputCallback``: the closed loop, run for the user inside ``trainer.fit``.

probe -> (optional batch search) -> warm up -> measure a baseline window -> diagnose -> try ONE
knob (first the settings ``tune_dataloader`` picks against the measured consumption rate, then
the top diagnosis's auto-applicable recommendation, then the math knobs ``allow`` permits) ->
measure as many steps again -> keep it if throughput rose by ``min_gain``, else revert ->
repeat -> monitor -> report.

The callback owns a ``BottleneckMonitor`` (measurement, diagnosis, logging, the report) and a
``TuningLoop`` (the decisions, pure); it carries out what the loop decides on the train loader.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_maxtp._log import rank_zero_info
from lightning_maxtp.callbacks.allow import Allow
from lightning_maxtp.callbacks.bottleneck_monitor import BottleneckMonitor
from lightning_maxtp.callbacks.config import TuningConfig
from lightning_maxtp.callbacks.loader_trial import plan_line
from lightning_maxtp.callbacks.math_trial import grow_batch
from lightning_maxtp.callbacks.metrics import PROGRESS_BAR
from lightning_maxtp.callbacks.trials import KnobTrial, TuningSummary
from lightning_maxtp.callbacks.tuner import Tuner
from lightning_maxtp.callbacks.tuning_loop import window_rate
from lightning_maxtp.loader.switchable import SwitchableLoader
from lightning_maxtp.observe.capture import CaptureMode
from lightning_maxtp.observe.report import KnobChange, ThroughputReport
from lightning_maxtp.observe.thresholds import MIN_GAIN, MIN_STEPS
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
    shuffles later epochs differently, as it would with that setting by hand).

    ``allow="safe"`` adds ``cudnn.benchmark`` on CUDA; ``"all"`` (or names) adds precision,
    channels_last, TF32, torch.compile, fused optimizer steps and the batch size (grown before
    training by ``find_batch_size``, LR scaled and warmed up). Each is a trial in the order the
    diagnosis points to; those that round differently run under a numerics guard that reverts
    the trial and restores the model's and optimizers' state when a loss or parameter goes
    non-finite or the loss rises out of the reference's band (``callbacks.guard``).
    Process-wide flags and the Trainer's precision are put back when the fit ends. Under DDP
    rank zero decides and every rank applies the same change at the same step.

    Throughput of a window is its samples over its step times, a step longer than 3 mean steps
    counted as 3 (a stall from another process on a shared machine must not decide a knob).

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
            (changes the optimization; off by default); the same as ``"batch_size"`` in
            ``allow``.
        allow: The knobs beyond the loader's the loop may try: ``"safe"`` (same math),
            ``"all"``, or a tuple of names from ``("precision", "channels_last", "tf32",
            "cudnn_benchmark", "compile", "fused_optimizer", "batch_size")``. Those not allowed
            stay recommendations in the report.
        monitor_window_steps: Window length after tuning (cheap monitoring).
        drift_share: After tuning, a window this much slower than the tuned rate is reported.
        cost_share: Tuning may cost at most this share of the fit's expected time at the
            baseline rate (training blocked while the loader is measured alone, and windows at
            slower settings): a short run skips the loader measurement and stops trying sooner.
            ``None``: only ``time_budget_s`` bounds tuning. The report gives the net effect.
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
        allow: Allow = "safe",
        monitor_window_steps: int = 100,
        drift_share: float = 0.2,
        cost_share: float | None = 0.05,
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
            cost_share=cost_share, allow=allow,
        )  # fmt: skip
        self.monitor = BottleneckMonitor(
            window_steps, sampler_interval_s=sampler_interval_s, capture=capture,
            verbose=False, on_window=self._on_window,
        )  # fmt: skip
        self.report_dir = None if report_dir is None else Path(report_dir)
        self.verbose = verbose
        self.batch_plan: Any = None
        self.tuner = Tuner(self.config, self.monitor, None, verbose=verbose)
        self._report: ThroughputReport | None = None
        self._closing = False
        self._carried: dict[str, Any] | None = None

    @property
    def loader(self) -> SwitchableLoader | None:
        """The train loader the loop switches (``None`` until the fit starts, or when it cannot)."""
        return self.tuner.loader

    @property
    def loader_plan(self) -> Any:
        """``tune_dataloader``'s plan, once the loop measured the loader (else ``None``)."""
        return self.tuner.loader_plan

    @property
    def knob_changes(self) -> list[KnobChange]:
        """Every knob change of the last fit, tried, kept or reverted, with its time."""
        return self.tuner.knob_changes

    @property
    def windows(self) -> list[Window]:
        """Every window measured so far (baseline, trials, monitoring), oldest first."""
        return self.monitor.windows

    @property
    def trials(self) -> list[KnobTrial]:
        """Every knob trial so far, in order."""
        return self.tuner.trials

    @property
    def tuning(self) -> TuningSummary:
        """What the loop did (live while the fit runs)."""
        return self.tuner.summary

    @property
    def report(self) -> ThroughputReport:
        """The report of the last fit (built at its end; a live view while it runs)."""
        return self._report if self._report is not None else self.tuner.extend(self.monitor.report)

    # -- setup: probe, plan, wrap the train loader ------------------------------------------

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        from lightning_maxtp.loader import lightning_hook as hook
        from lightning_maxtp.resources.probe import inspect_resources

        resources = inspect_resources()
        import torch

        allowed = self.config.allowed(deterministic=torch.are_deterministic_algorithms_enabled())
        self.tuner = Tuner(
            self.config, self.monitor, resources, verbose=self.verbose, carried=self._carried,
            world_size=trainer.world_size, local_ranks=trainer.num_devices, allowed=allowed,
        )  # fmt: skip
        self.monitor.window_steps = self.config.window_steps  # a later fit tunes again
        self.batch_plan = None
        previous = hook.dataloader_transform(trainer)

        def transform(loader: object, stage_: str | None, trainer_: pl.Trainer) -> object:
            if previous is not None:
                loader = previous(loader, stage_, trainer_)
            return self.tuner.wrap(loader) if stage_ == "train" else loader

        hook.install_dataloader_transform(trainer, transform)
        if self.verbose:
            rank_zero_info(
                plan_line(self.config, resources, trainer.world_size, trainer.num_devices)
            )

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.batch_plan = grow_batch(self.tuner, trainer)
        if self.batch_plan is not None and self.verbose:
            rank_zero_info(str(self.batch_plan))

    # -- the monitor's hooks ----------------------------------------------------------------

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.monitor.on_train_start(trainer, pl_module)
        self.tuner.adopt(trainer)
        if self.tuner.loader is not None:  # settings requested before the first batch
            self.monitor.clock.update_context(**self.tuner.loader.settings())

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
        # Lightning does not call ``teardown`` after an exception: process state goes back here.
        self.tuner.knobs.threads.restore()
        self.tuner.math.restore()

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
        self.tuner.guard.record(outputs)  # before the window this step may close
        self.monitor.on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self.tuner.on_step()

    def _on_window(self, trainer: pl.Trainer, window: Window) -> None:
        loop = self.tuner.loop
        self.tuner.window_losses = self.tuner.guard.take()
        if self._closing:  # the fit's last steps, under the settings in force
            self.tuner.monitored(window, self.monitor.record(trainer, window, may_capture=False))
        elif loop.measuring:  # no profiler inside a measured window
            found = self.monitor.record(trainer, window, may_capture=False)
            self.tuner.measured(trainer, window, found)
            self._show_progress(trainer, window)
        elif loop.finished:
            self.tuner.monitored(window, self.monitor.record(trainer, window))
        else:  # warm-up or settle steps: reported, never judged, no profiler before tuning ends
            self.monitor.record(trainer, window, may_capture=False)

    def _show_progress(self, trainer: pl.Trainer, window: Window) -> None:
        """Tuning progress in the progress bar: rate of the window, trials, whether done."""
        module = trainer.lightning_module
        values = (window_rate(window), len(self.trials), float(not self.tuner.loop.finished))
        for name, value in zip(PROGRESS_BAR, values, strict=True):
            module.log(name, float(value), prog_bar=True, logger=False, on_step=True)

    # -- report -----------------------------------------------------------------------------

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        loop = self.tuner.loop
        if (loop.finished and not self.tuner.final) or loop.ref is None:
            # No window under the settings in force closed: the steps run since make one.
            self._closing = True
            self.monitor.clock.close_window(trainer, min_steps=MIN_STEPS)
            self._closing = False
        self.tuner.end()
        self._carried = self.tuner.state() or self._carried  # for the next fit of this callback
        self.monitor.on_train_end(trainer, pl_module)
        self._report = self.tuner.extend(self.monitor.report)
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
    def state_dict(self) -> dict[str, Any]:
        """The tuned settings and what they were tuned on (``{}`` while tuning runs)."""
        return self.tuner.state() or dict(self._carried or {})

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Settings from a checkpoint: applied at once when the machine and loader match."""
        # Lightning restores callbacks after ``setup`` (the fit's Tuner exists already) and
        # before it builds the train loader (where the settings are applied).
        self._carried = self.tuner.carried = dict(state_dict) or None

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.monitor.teardown(trainer, pl_module, stage)
        if stage == "fit":
            self.tuner.knobs.threads.restore()  # a fit that failed still puts them back
            self.tuner.math.restore()
        if stage == "fit" and self.tuner.loader is not None:
            self.tuner.loader.shutdown()
