"""``BottleneckMonitor``: a callback that measures, diagnoses each window, logs, and reports.

It is the open loop only (watch and name). It owns a ``StepClock`` (the measurement) and calls
its hooks from its own; ``MaxThroughputCallback`` owns a monitor the same way and adds the
knobs. Metrics go to every attached Lightning logger under ``maxtp/...`` (the table is in
``callbacks.metrics``); at the end of fit rank zero prints a short summary and, when asked,
writes the report files.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_only
from typing_extensions import override

from lightning_maxtp._log import prefixed, rank_zero_info
from lightning_maxtp.callbacks.metrics import window_metrics
from lightning_maxtp.callbacks.monitor_defaults import MONITOR
from lightning_maxtp.callbacks.ranks import RankSpread
from lightning_maxtp.callbacks.report_files import write_report_files
from lightning_maxtp.callbacks.step_clock import StepClock
from lightning_maxtp.knobs.advisor import diagnose
from lightning_maxtp.knobs.registry import LOADER_SETTINGS
from lightning_maxtp.observe import sampler as _sampler
from lightning_maxtp.observe.capture import CAPTURE_MODES, CaptureMode, KernelCapture
from lightning_maxtp.observe.diagnosis import Diagnosis, needs_capture
from lightning_maxtp.observe.report import ThroughputReport
from lightning_maxtp.observe.status import remove_status, write_status
from lightning_maxtp.observe.syncs import SyncCount, SyncCounter
from lightning_maxtp.observe.thresholds import MIN_STEPS
from lightning_maxtp.observe.window import CaptureSummary, Window

if TYPE_CHECKING:
    import lightning.pytorch as pl

__all__ = ["BottleneckMonitor"]

log = logging.getLogger(__name__)

STATUS_EVERY_S = 1.0
"""Least time between two writes of the live status ``maxtp triage --pid`` reads."""


class BottleneckMonitor(Callback):
    """Watch a fit and name its bottleneck every ``window_steps`` steps.

    Logged to every attached logger at each window (see ``callbacks.metrics`` for the table):
    ``maxtp/samples_per_s``, ``maxtp/step_time_ms``, ``maxtp/data_wait_share``,
    ``maxtp/gpu_util_percent``, ``maxtp/main_cpu_percent``, ``maxtp/worker_cpu_percent``,
    ``maxtp/bottleneck_code``, ``maxtp/bottleneck_confidence``, ``maxtp/mfu``,
    ``maxtp/gc_share`` and, under DDP, ``maxtp/straggler_rank``.

    Args:
        window_steps: Steps per diagnosed window.
        samples_fn: Samples in a batch, for batch types the default cannot count.
        sampler_interval_s: Background sampling period (None: no sampler).
        capture: ``"auto"`` profiles ``capture_steps`` steps once when the signals are ambiguous
            (GPU underused without a data wait), ``"always"`` after the first window,
            ``"never"`` not at all.
        capture_steps: Steps per capture (its cost is reported in the capture summary).
        report_dir: Where to write the report files at the end of fit (rank zero).
        verbose: Print a profiler capture's summary when it ends and the report's summary at
            the end of fit (rank zero).
        sources: Extra sampler sources.
        mfu: Give each window its MFU: the device's measured peak (cached after the first fit
            on a machine) and the first batch's FLOPs, counted once (rank zero).
        flops_per_batch: The FLOPs of one training batch (forward and backward), when known:
            nothing is counted.
    """

    def __init__(
        self,
        window_steps: int = MONITOR.window_steps,
        *,
        samples_fn: Callable[[Any], int] | None = None,
        sampler_interval_s: float | None = MONITOR.sampler_interval_s,
        capture: CaptureMode = "auto",
        capture_steps: int = 3,
        report_dir: str | Path | None = None,
        verbose: bool = True,
        sources: list[_sampler.Source] | None = None,
        mfu: bool = MONITOR.mfu,
        flops_per_batch: float | None = None,
    ) -> None:
        if capture not in CAPTURE_MODES:
            raise ValueError(f"`capture` must be one of {CAPTURE_MODES}, got {capture!r}")
        self.clock = StepClock(
            window_steps,
            samples_fn=samples_fn,
            sampler_interval_s=sampler_interval_s,
            sources=sources,
            mfu=mfu,
            flops_per_batch=flops_per_batch,
        )
        self.capture_mode = capture
        self.capture_steps = capture_steps
        self.report_dir = None if report_dir is None else Path(report_dir)
        self.verbose = verbose
        self.diagnoses: list[tuple[Diagnosis, ...]] = []
        self.captures: list[CaptureSummary] = []
        self._capture: KernelCapture | None = None
        self._published_at: float | None = None
        """When the live status was last written (``time.monotonic()``)."""
        self._syncs = SyncCounter()
        self._capture_armed = False
        self._report: ThroughputReport | None = None
        self._fit_first_window = 0

    # -- what the clock measured ------------------------------------------------------------

    @property
    def window_steps(self) -> int:
        """Steps per window (may change between windows)."""
        return self.clock.window_steps

    @window_steps.setter
    def window_steps(self, steps: int) -> None:
        self.clock.window_steps = steps

    @property
    def windows(self) -> list[Window]:
        """Every window closed so far, oldest first."""
        return self.clock.windows

    @property
    def spreads(self) -> list[RankSpread]:
        """DDP: each window's summary across ranks (rank zero)."""
        return self.clock.spreads

    @property
    def sampler(self) -> _sampler.Sampler | None:
        """The background sampler of this fit (``None`` when disabled)."""
        return self.clock.sampler

    @property
    def context(self) -> Any:
        """The job's ``JobContext`` (read from the Trainer when training starts)."""
        return self.clock.context

    @context.setter
    def context(self, value: Any) -> None:
        self.clock.context = value

    @property
    def step_log(self) -> list[tuple[float, float, float]]:
        """``(end s, step s, data wait s)`` of every step measured this fit, in order."""
        return self.clock.step_log

    @property
    def open_steps(self) -> int:
        """Steps measured in the window that has not closed yet."""
        return self.clock.open_steps

    @property
    def epoch_steps(self) -> int:
        """Training steps ended since the epoch started."""
        return self.clock.epoch_steps

    def open_window(self) -> tuple[tuple[float, ...], tuple[int, ...]]:
        """Step times and samples of the window that has not closed yet."""
        return self.clock.open_window()

    def open_waits(self) -> tuple[float, ...]:
        """Data waits of the window that has not closed yet."""
        return self.clock.open_waits()

    def close_window(self, trainer: pl.Trainer, *, min_steps: int = 1) -> Window | None:
        """Close the open window now, if it has ``min_steps`` steps (every rank calls it)."""
        return self.clock.close_window(trainer, min_steps=min_steps)

    def update_context(self, **changes: Any) -> None:
        """Windows closed from now on carry these settings (a knob changed mid-fit)."""
        self.clock.update_context(**changes)

    def restart_step(self) -> None:
        """The time since the last step ended belongs to no step (training was blocked)."""
        self.clock.restart_step()

    @property
    def report(self) -> ThroughputReport:
        """The report of the last fit (built at its end; a live view while it runs)."""
        return self._report if self._report is not None else self.build_report()

    # -- judging a window -------------------------------------------------------------------

    def record(
        self, trainer: pl.Trainer, window: Window, *, may_capture: bool = True
    ) -> tuple[Diagnosis, ...]:
        """Diagnose a closed window, keep and log the result; return the diagnoses.

        Args:
            trainer: The Trainer (its loggers get the window's metrics, on rank zero).
            window: The window that closed.
            may_capture: Whether a profiler capture may be armed after this window (``False``
                also cancels one armed earlier that has not started): an owner measuring a
                trial wants no profiler in its windows.
        """
        if may_capture and self.captures and window.capture is None:
            window = dataclasses.replace(window, capture=self.captures[-1])
            self.windows[-1] = window
        found = tuple(diagnose(window))
        self.diagnoses.append(found)
        wants = self.capture_mode == "always" or (
            self.capture_mode == "auto" and needs_capture(window)
        )
        if not may_capture:
            self._capture_armed = False
        elif wants and not self.captures and self._capture is None:
            self._capture_armed = True
        self._log(trainer, window, found)
        self._publish(window, found)
        return found

    def _publish(self, window: Window, found: tuple[Diagnosis, ...]) -> None:
        """This process's live status for ``maxtp triage --pid`` (see ``observe.status``).

        At most once every ``STATUS_EVERY_S``: the write (a folder check, a file, a rename)
        costs a few hundred microseconds on the training thread, and with millisecond steps
        windows close many times a second, more often than anyone reads a status.
        """
        now = time.monotonic()
        if self._published_at is not None and now - self._published_at < STATUS_EVERY_S:
            return
        self._published_at = now
        ctx = window.context
        settings = {k: getattr(ctx, k, None) for k in LOADER_SETTINGS} if ctx is not None else {}
        top = found[0] if found else None
        write_status(
            {
                "first_step": window.first_step,
                "steps": window.steps,
                "step_time_s": window.median_step_s,
                "data_wait_share": window.data_wait_share,
                "samples_per_s": window.samples_per_s,
                "settings": settings,
                "bottleneck": top.kind.value if top else None,
                "confidence": top.confidence if top else None,
                "summary": top.summary if top else None,
            }
        )

    def restart_window(self) -> None:
        """Start the open window over at this step boundary (a measured window starts here)."""
        self.clock.restart_window()

    def elapsed_s(self) -> float:
        """Seconds since the fit's clock started (the timeline's zero)."""
        return self.clock.elapsed_s()

    # -- hooks ------------------------------------------------------------------------------

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._fit_first_window = self.clock.closed
        self._published_at = None  # a new fit's first window is published at once
        self.clock.on_train_start(trainer, pl_module)

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.clock.on_train_epoch_start(trainer, pl_module)

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.clock.on_validation_end(trainer, pl_module)

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._capture_armed:
            self._capture_armed = False
            self._capture = KernelCapture(self.capture_steps, self.windows[-1].median_step_s)
            self._capture.start()
            if trainer.strategy.root_device.type == "cuda":
                self._start_syncs()
        self.clock.on_train_batch_start(trainer, pl_module, batch, batch_idx)

    @override
    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        window = self.step_end(trainer)
        if window is not None:
            self.record(trainer, window)

    def step_end(self, trainer: pl.Trainer) -> Window | None:
        """A training step ended: the window it closed, if any, for the owner to act on.

        The hook (``on_train_batch_end``) records it; a callback that owns this monitor calls
        this instead and records the window itself (``record``), when and how it decides.
        """
        window = self.clock.step_end(trainer)
        self._syncs.step()
        if self._capture is not None:
            self._capture.step()
            if self._capture.done:
                self._finish_capture()
        return window

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._capture is not None and self._capture.active:
            self._finish_capture()
        if self.clock.closed == self._fit_first_window:  # a fit shorter than one window
            window = self.clock.close_window(trainer, min_steps=MIN_STEPS)
            if window is not None:
                self.record(trainer, window)
        self.clock.on_train_end(trainer, pl_module)
        remove_status()
        self._report = self.build_report()
        if trainer.is_global_zero:
            if self.verbose:
                rank_zero_info(self._report.summary())
            if self.report_dir is not None:
                write_report_files(self._report, self.report_dir)

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self.clock.on_exception(trainer, pl_module, exception)
        self._stop_syncs()
        remove_status()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.clock.teardown(trainer, pl_module, stage)

    # -- internals --------------------------------------------------------------------------

    def _start_syncs(self) -> None:
        try:
            self._syncs.start()
        except Exception as err:  # counting syncs is a reading; training goes on without it
            log.warning(prefixed("could not count device syncs: %r"), err)

    def _stop_syncs(self) -> SyncCount | None:
        try:
            return self._syncs.stop()
        except Exception as err:
            log.warning(prefixed("could not count device syncs: %r"), err)
            return None

    def _finish_capture(self) -> None:
        assert self._capture is not None
        syncs = self._stop_syncs()
        try:
            summary = self._capture.stop()
        except Exception as err:  # a failed capture must not stop training
            log.warning(prefixed("profiler capture failed: %r"), err)
        else:
            self.captures.append(summary)
            if self.verbose:
                rank_zero_info(str(summary) + ("" if syncs is None else f"; {syncs}"))
            if self.windows:  # re-diagnose the last window with what the capture showed
                window = dataclasses.replace(self.windows[-1], capture=summary, syncs=syncs)
                self.windows[-1] = window
                self.diagnoses.append(tuple(diagnose(window)))
        self._capture = None

    @rank_zero_only
    def _log(self, trainer: pl.Trainer, window: Window, found: tuple[Diagnosis, ...]) -> None:
        spread = self.spreads[-1] if self.spreads else None
        metrics = window_metrics(window, found, spread)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)

    def build_report(self) -> ThroughputReport:
        """The report of what was measured so far (every window, the last diagnoses)."""
        sampler = self.sampler
        timeline = _sampler.build_series(list(sampler.readings)) if sampler else None
        notes = list(sampler.failure_notes) if sampler else []
        notes += self.clock.missing_sources
        facts = self.clock.context.data_facts
        if facts is not None and facts.unmeasured:
            notes.append(facts.unmeasured)
        notes += self.clock.flops.notes
        return ThroughputReport(
            windows=tuple(self.windows),
            diagnoses=self.diagnoses[-1] if self.diagnoses else (),
            step_log=tuple(self.clock.step_log),
            timeline=timeline if timeline is not None else _sampler.build_series([]),
            captures=tuple(self.captures),
            ranks=tuple(s.to_dict() for s in self.spreads),
            notes=tuple(notes),
        )
