"""``MaxThroughputCallback``: the closed loop, run for the user inside ``trainer.fit``.

probe -> (optional batch search) -> warm up -> measure a baseline window -> diagnose -> try ONE
knob (first the settings ``tune_dataloader`` picks against the measured consumption rate, then
the top diagnosis's auto-applicable recommendation, then the math knobs ``allow`` permits) ->
measure as many steps again -> keep it only if it is faster beyond the noise, else revert ->
repeat -> monitor -> report.

The callback owns a ``BottleneckMonitor`` (measurement, diagnosis, logging, the report) and a
``TuningLoop`` (the decisions, pure); it carries out what the loop decides on the train loader.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, ParamSpec

from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_maxtp._log import rank_zero_info
from lightning_maxtp.callbacks.bottleneck_monitor import BottleneckMonitor
from lightning_maxtp.callbacks.console import fit, plan_brief, result_lines, verbosity
from lightning_maxtp.callbacks.loader_trial import plan_line, tried_knobs
from lightning_maxtp.callbacks.monitor_defaults import MONITOR
from lightning_maxtp.callbacks.report_files import write_report_files
from lightning_maxtp.callbacks.tuner import Tuner
from lightning_maxtp.loader.switchable import SwitchableLoader
from lightning_maxtp.observe.capture import CaptureMode
from lightning_maxtp.observe.report import KnobChange, ThroughputReport
from lightning_maxtp.observe.thresholds import MIN_STEPS
from lightning_maxtp.observe.window import Window
from lightning_maxtp.tuning.allow import Allow
from lightning_maxtp.tuning.config import DEFAULTS, TuningConfig, tuning_config
from lightning_maxtp.tuning.trials import KnobTrial, TuningSummary

if TYPE_CHECKING:
    import lightning.pytorch as pl

__all__ = ["MaxThroughputCallback"]

log = logging.getLogger(__name__)


_P = ParamSpec("_P")
PASSED = "keywords_passed"
"""Where ``__init__`` finds the names its caller passed (set by ``_keywords_recorded``)."""


def _keywords_recorded(init: Callable[_P, None]) -> Callable[_P, None]:
    """Record the names a caller passed to ``__init__``.

    A tuning keyword passed at its default value beside ``config=`` is still passed, and an
    error (``tuning_config``). The signature stays the plain one (``functools.wraps``) for
    LightningCLI and the docs.
    """

    @functools.wraps(init)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> None:
        args[0].__dict__[PASSED] = frozenset(kwargs)
        init(*args, **kwargs)

    return wrapper


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

    ``allow`` adds the knobs of ``knobs.registry.KNOBS`` (the knobs page of the docs has their
    table): ``"safe"`` those of the same math, ``"all"`` (or their names) every one, the math
    changes and the batch size (chosen before training) among them. Each is a trial in the
    order the diagnosis points to; those that round differently run under a numerics guard that
    reverts the trial and restores the model's and optimizers' state when a loss or parameter
    goes non-finite or the loss rises out of the reference's band (``callbacks.guard``).
    Process-wide flags and the Trainer's precision are put back when the fit ends. Under DDP
    rank zero decides and every rank applies the same change at the same step.

    Throughput of a window is its samples over its step times, a step longer than 3 mean steps
    and than every other step of the window counted as the longer of the two (a stall from
    another process on a shared machine must not decide a knob; a loader's recurring wait is
    counted as it is).

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
    ``maxtp/mfu``                     logged: FLOP/s of the window over the measured peak, 0..1
    ``maxtp/gc_share``                logged: share of step time in garbage collection, 0..1
    ``maxtp_samples_s``               progress bar (``progress_bar=True``): samples/s of the
                                      last measured window
    ``maxtp_trials``                  progress bar (``progress_bar=True``): knob trials so far
    ``maxtp_tuning``                  progress bar (``progress_bar=True``): 1 while tuning, 0
                                      once only monitoring
    ``maxtp_mfu``                     progress bar (``progress_bar=True``): MFU of the last
                                      measured window, 0..1
    ================================  ==========================================================

    Args:
        config: The closed loop's settings as one ``TuningConfig``. Alternatively pass its
            fields as the keywords below; passing both is an error.
        warmup_steps: ``TuningConfig.warmup_steps`` (same default).
        window_steps: ``TuningConfig.window_steps`` (same default).
        settle_steps: ``TuningConfig.settle_steps`` (same default).
        min_gain: ``TuningConfig.min_gain`` (same default).
        max_trials: ``TuningConfig.max_trials`` (same default).
        time_budget_s: ``TuningConfig.time_budget_s`` (same default).
        tune_loader: ``TuningConfig.tune_loader`` (same default).
        loader_time_budget_s: ``TuningConfig.loader_time_budget_s`` (same default).
        max_workers: ``TuningConfig.max_workers`` (same default).
        allow_batch_size_change: ``TuningConfig.allow_batch_size_change`` (same default).
        allow: ``TuningConfig.allow`` (same default).
        monitor_window_steps: ``TuningConfig.monitor_window_steps`` (same default).
        drift_share: ``TuningConfig.drift_share`` (same default).
        cost_share: ``TuningConfig.cost_share`` (same default).
        capture: Profiler capture mode after tuning (``"auto"``, ``"always"``, ``"never"``).
        report_dir: Where rank zero writes ``report.json``/``report.md``/``timeline.png``.
        verbose: What rank zero prints to the ``lightning_maxtp`` logger: ``True``, a few
            lines of at most 100 characters (the plan and its budget, the baseline and its
            bottleneck, one line per trial with its verdict, the result and its cost, the
            distance to the limit and the next opt-in, where the report is); ``"steps"``, every
            step of the loop and the full summaries as well; ``False``, nothing.
        progress_bar: Show the tuning's rate, trials, state and MFU in the progress bar.
        sampler_interval_s: Background sampling period (None: no sampler).
        mfu: Give every window and the report the distance to the device's limit: MFU against
            the device's measured matmul peak (measured once per machine, a few hundred
            milliseconds, then cached), from the first batch's FLOPs counted once.
        flops_per_batch: The FLOPs of one training batch (forward and backward), when known:
            nothing is counted (for a compiled model, or a count of your own).
    """

    @_keywords_recorded
    def __init__(
        self,
        config: TuningConfig | None = None,
        *,
        warmup_steps: int = DEFAULTS.warmup_steps,
        window_steps: int = DEFAULTS.window_steps,
        settle_steps: int = DEFAULTS.settle_steps,
        min_gain: float = DEFAULTS.min_gain,
        max_trials: int = DEFAULTS.max_trials,
        time_budget_s: float = DEFAULTS.time_budget_s,
        tune_loader: bool = DEFAULTS.tune_loader,
        loader_time_budget_s: float = DEFAULTS.loader_time_budget_s,
        max_workers: int | None = DEFAULTS.max_workers,
        allow_batch_size_change: bool = DEFAULTS.allow_batch_size_change,
        allow: Allow = DEFAULTS.allow,
        monitor_window_steps: int = DEFAULTS.monitor_window_steps,
        drift_share: float = DEFAULTS.drift_share,
        cost_share: float | None = DEFAULTS.cost_share,
        capture: CaptureMode = "auto",
        report_dir: str | Path | None = None,
        verbose: bool | Literal["steps"] = True,
        progress_bar: bool = False,
        sampler_interval_s: float | None = MONITOR.sampler_interval_s,
        mfu: bool = MONITOR.mfu,
        flops_per_batch: float | None = None,
    ) -> None:
        keywords = {
            "warmup_steps": warmup_steps,
            "window_steps": window_steps,
            "settle_steps": settle_steps,
            "min_gain": min_gain,
            "max_trials": max_trials,
            "time_budget_s": time_budget_s,
            "tune_loader": tune_loader,
            "loader_time_budget_s": loader_time_budget_s,
            "max_workers": max_workers,
            "allow_batch_size_change": allow_batch_size_change,
            "allow": allow,
            "monitor_window_steps": monitor_window_steps,
            "drift_share": drift_share,
            "cost_share": cost_share,
        }
        self.config = tuning_config(config, keywords, self.__dict__.pop(PASSED, ()))
        self._monitor = BottleneckMonitor(
            self.config.window_steps,
            sampler_interval_s=sampler_interval_s,
            capture=capture,
            verbose=False,
            mfu=mfu,
            flops_per_batch=flops_per_batch,
        )
        self.report_dir = None if report_dir is None else Path(report_dir)
        self.verbose = verbose
        self.verbosity = verbosity(verbose)
        self.progress_bar = progress_bar
        self.batch_plan: Any = None
        self._tuner = Tuner(self.config, self._monitor, None, verbosity=self.verbosity)
        self._report: ThroughputReport | None = None
        self._carried: dict[str, Any] | None = None

    @property
    def loader(self) -> SwitchableLoader | None:
        """The train loader the loop switches (``None`` until the fit starts, or when it cannot)."""
        return self._tuner.loader

    @property
    def loader_plan(self) -> Any:
        """``tune_dataloader``'s plan, once the loop measured the loader (else ``None``)."""
        return self._tuner.loader_plan

    @property
    def knob_changes(self) -> list[KnobChange]:
        """Every knob change of the last fit, tried, kept or reverted, with its time."""
        return self._tuner.knob_changes

    @property
    def windows(self) -> list[Window]:
        """Every window measured so far (baseline, trials, monitoring), oldest first."""
        return self._monitor.windows

    @property
    def trials(self) -> list[KnobTrial]:
        """Every knob trial so far, in order."""
        return self._tuner.trials

    @property
    def tuning(self) -> TuningSummary:
        """What the loop did (live while the fit runs)."""
        return self._tuner.summary

    @property
    def report(self) -> ThroughputReport:
        """The report of the last fit (built at its end; a live view while it runs)."""
        if self._report is not None:
            return self._report
        return self._tuner.extend(self._monitor.report)

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
        self._tuner = Tuner(
            self.config,
            self._monitor,
            resources,
            verbosity=self.verbosity,
            progress_bar=self.progress_bar,
            carried=self._carried,
            world_size=trainer.world_size,
            local_ranks=trainer.num_devices,
            allowed=allowed,
        )
        self._monitor.window_steps = self.config.window_steps  # a later fit tunes again
        self.batch_plan = None
        previous = hook.dataloader_transform(trainer)

        def transform(loader: object, stage_: str | None, trainer_: pl.Trainer) -> object:
            if previous is not None:
                loader = previous(loader, stage_, trainer_)
            if stage_ == "train":
                return self._tuner.wrap(loader)
            return self._tuner.follow(loader) if stage_ == "val" else loader

        hook.install_dataloader_transform(trainer, transform)
        if self.verbosity == "steps":
            rank_zero_info(
                plan_line(self.config, resources, trainer.world_size, trainer.num_devices)
            )
        elif self.verbosity == "brief":
            knobs = tried_knobs(self.config, resources)
            cpus, gpus = resources.cpu.effective, len(resources.gpus)
            rank_zero_info(plan_brief(self.config, knobs, cpus, gpus, trainer.world_size))

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.batch_plan = self._tuner.math_trials.choose_before_fit(trainer)
        if self.batch_plan is not None and self.verbosity != "quiet":
            text = str(self.batch_plan)
            rank_zero_info(text if self.verbosity == "steps" else fit(text.splitlines()[0]))

    # -- the monitor's hooks ----------------------------------------------------------------

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._monitor.on_train_start(trainer, pl_module)
        self._tuner.fit_started(trainer)
        self._tuner.adopt(trainer)
        if self._tuner.loader is not None:  # settings requested before the first batch
            self._monitor.update_context(
                **self._tuner.loader.settings(), loaders_following=self._tuner.followers
            )

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._monitor.on_train_epoch_start(trainer, pl_module)

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._monitor.on_validation_end(trainer, pl_module)

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._monitor.on_train_batch_start(trainer, pl_module, batch, batch_idx)

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._monitor.on_exception(trainer, pl_module, exception)
        # Lightning does not call ``teardown`` after an exception: process state goes back
        # here, and the workers of the loader this callback switched stop (Lightning shuts
        # down only the iterators it holds; the switched loader's would outlive the fit).
        self._tuner.restore()
        if self._tuner.loader is not None:
            self._tuner.loader.shutdown()

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
        self._tuner.guard.record(outputs)  # before the window this step may close
        self._tuner.on_step(trainer, self._monitor.step_end(trainer))

    # -- report -----------------------------------------------------------------------------

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        loop = self._tuner.loop
        if (loop.finished and not self._tuner.final) or loop.ref is None:
            # No window under the settings in force closed: the steps run since make one.
            window = self._monitor.close_window(trainer, min_steps=MIN_STEPS)
            if window is not None:
                self._tuner.on_window(trainer, window, closing=True)
        self._tuner.end()
        self._carried = self._tuner.state() or self._carried  # for the next fit of this callback
        self._monitor.on_train_end(trainer, pl_module)
        self._report = self._tuner.extend(self._monitor.report)
        written = None
        if trainer.is_global_zero and self.report_dir is not None:
            written = write_report_files(self._report, self.report_dir)
        if self.verbosity == "steps":
            for capture in self._monitor.captures:
                rank_zero_info(str(capture))
            rank_zero_info(self._report.summary())
            rank_zero_info(str(self.tuning))
            if written:
                rank_zero_info(f"report files in {self.report_dir}")
        elif self.verbosity == "brief":
            where = self.report_dir if written else None
            for line in result_lines(self.tuning, self._report, where):
                rank_zero_info(line)

    @override
    def state_dict(self) -> dict[str, Any]:
        """The tuned settings and what they were tuned on (``{}`` while tuning runs)."""
        return self._tuner.state() or dict(self._carried or {})

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Settings from a checkpoint: applied at once when the machine and loader match."""
        # Lightning restores callbacks after ``setup`` (the fit's Tuner exists already) and
        # before it builds the train loader (where the settings are applied).
        self._carried = self._tuner.carried = dict(state_dict) or None

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._monitor.teardown(trainer, pl_module, stage)
        if stage == "fit":
            self._tuner.restore()  # a fit that failed still puts them back
        if stage == "fit" and self._tuner.loader is not None:
            self._tuner.loader.shutdown()
