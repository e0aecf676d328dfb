"""``BottleneckMonitor``: a callback that measures, diagnoses each window, logs, and reports.

It is the open loop only (watch and name); ``MaxThroughputCallback`` (issue [6]) composes it
with the knobs. Metrics go to every attached Lightning logger under ``maxtp/...``; at the end of
fit rank zero prints a short summary and, when asked, writes the report files.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from typing_extensions import override

from lightning_maxtp import _sampler
from lightning_maxtp.capture import KernelCapture
from lightning_maxtp.diagnosis import BottleneckKind, Diagnosis, diagnose, needs_capture
from lightning_maxtp.report import ThroughputReport
from lightning_maxtp.signals import StepClock
from lightning_maxtp.window import CaptureSummary, Window

if TYPE_CHECKING:
    import lightning.pytorch as pl

__all__ = ["BottleneckMonitor"]

log = logging.getLogger(__name__)

_KIND_CODE = {kind: i for i, kind in enumerate(BottleneckKind)}
_CAPTURE_MODES = ("auto", "always", "never")


class BottleneckMonitor(StepClock):
    """Watch a fit and name its bottleneck every ``window_steps`` steps.

    Args:
        window_steps: Steps per diagnosed window.
        samples_fn: Samples in a batch, for batch types the default cannot count.
        sampler_interval_s: Background sampling period (None: no sampler).
        capture: ``"auto"`` profiles ``capture_steps`` steps once when the signals are ambiguous
            (GPU underused without a data wait), ``"always"`` after the first window,
            ``"never"`` not at all.
        capture_steps: Steps per capture (its cost is reported in the capture summary).
        report_dir: Where to write the report files at the end of fit (rank zero).
        verbose: Print the summary at the end of fit (rank zero).
        sources: Extra sampler sources.
    """

    def __init__(
        self,
        window_steps: int = 50,
        *,
        samples_fn: Callable[[Any], int] | None = None,
        sampler_interval_s: float | None = 0.1,
        capture: str = "auto",
        capture_steps: int = 3,
        report_dir: str | Path | None = None,
        verbose: bool = True,
        sources: list[_sampler.Source] | None = None,
    ) -> None:
        super().__init__(
            window_steps, samples_fn=samples_fn, sampler_interval_s=sampler_interval_s,
            sources=sources,
        )  # fmt: skip
        if capture not in _CAPTURE_MODES:
            raise ValueError(f"`capture` must be one of {_CAPTURE_MODES}, got {capture!r}")
        self.capture_mode = capture
        self.capture_steps = capture_steps
        self.report_dir = None if report_dir is None else Path(report_dir)
        self.verbose = verbose
        self.diagnoses: list[tuple[Diagnosis, ...]] = []
        self.captures: list[CaptureSummary] = []
        self._capture: KernelCapture | None = None
        self._capture_armed = False
        self._report: ThroughputReport | None = None

    @property
    def report(self) -> ThroughputReport:
        """The report of the last fit (built at its end; a live view while it runs)."""
        return self._report if self._report is not None else self._build_report()

    @override
    def on_window(self, trainer: pl.Trainer, window: Window) -> None:
        if self.captures and window.capture is None:
            window = dataclasses.replace(window, capture=self.captures[-1])
            self.windows[-1] = window
        found = tuple(diagnose(window))
        self.diagnoses.append(found)
        wants = self.capture_mode == "always" or (
            self.capture_mode == "auto" and needs_capture(window)
        )
        if wants and not self.captures and self._capture is None:
            self._capture_armed = True
        self._log(trainer, window, found)

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._capture_armed:
            self._capture_armed = False
            self._capture = KernelCapture(self.capture_steps, self.windows[-1].median_step_s)
            self._capture.start()
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)

    @override
    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if self._capture is not None:
            self._capture.step()
            if self._capture.done:
                self._finish_capture()

    def _finish_capture(self) -> None:
        assert self._capture is not None
        try:
            summary = self._capture.stop()
        except Exception as err:  # a failed capture must not stop training
            log.warning("maxtp: profiler capture failed: %r", err)
        else:
            self.captures.append(summary)
            rank_zero_info(f"maxtp: {summary}")
            if self.windows:  # re-diagnose the last window with what the capture showed
                window = dataclasses.replace(self.windows[-1], capture=summary)
                self.windows[-1] = window
                self.diagnoses.append(tuple(diagnose(window)))
        self._capture = None

    @rank_zero_only
    def _log(self, trainer: pl.Trainer, window: Window, found: tuple[Diagnosis, ...]) -> None:
        metrics = {
            "maxtp/samples_per_s": window.samples_per_s,
            "maxtp/step_time_ms": window.median_step_s * 1e3,
            "maxtp/data_wait_share": window.data_wait_share,
        }
        for key, value in (("gpu_util", window.sampler.mean_gpu_util),
                           ("main_cpu", window.sampler.mean_main_cpu),
                           ("worker_cpu", window.sampler.mean_worker_cpu)):  # fmt: skip
            if value is not None:
                metrics[f"maxtp/{key}_percent"] = value
        if found:
            metrics["maxtp/bottleneck_code"] = float(_KIND_CODE[found[0].kind])
            metrics["maxtp/bottleneck_confidence"] = found[0].confidence
        if self.spreads:
            metrics["maxtp/straggler_rank"] = float(self.spreads[-1].straggler_rank)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)

    def _build_report(self) -> ThroughputReport:
        sampler = self.sampler
        timeline = _sampler.build_series(list(sampler.readings)) if sampler else None
        notes = [f"sampler source {name!r} failed and was disabled" for name in
                 (sampler.failed if sampler else [])]  # fmt: skip
        return ThroughputReport(
            windows=tuple(self.windows),
            diagnoses=self.diagnoses[-1] if self.diagnoses else (),
            step_log=tuple(self.step_log),
            timeline=timeline if timeline is not None else _sampler.build_series([]),
            captures=tuple(self.captures),
            ranks=tuple(s.to_dict() for s in self.spreads),
            notes=tuple(notes),
        )

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._capture is not None and self._capture.active:
            self._finish_capture()
        super().on_train_end(trainer, pl_module)
        self._report = self._build_report()
        if trainer.is_global_zero:
            if self.verbose:
                rank_zero_info(self._report.summary())
            if self.report_dir is not None:
                self._report.write(self.report_dir)
