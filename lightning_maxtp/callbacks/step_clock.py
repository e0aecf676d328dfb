"""What is measured while a fit runs: ``StepClock``, a Lightning callback producing ``Window``s.

Per step, on the host and without a device synchronize: step time (end of the previous step to
the end of this one), data wait (end of the previous step to the start of this one: Lightning
fetches the next batch and moves it to the device in between), samples, and the CPU time the
training process spent in each part (``time.process_time``, about a microsecond per call). On
CUDA, events recorded at step start and end are read lazily (``Event.query``) when a window
closes, so the device's own step span is known without blocking. A background ``Sampler`` adds
NVML, allocator and psutil readings. Every garbage collection is timed (``GcPauses``) and
summarized per window. On rank zero, the device's measured peak is read when training starts and
the first batch's FLOPs are counted (``FlopMeter``): each window then carries its MFU. Under
DDP every rank measures; at each window rank zero gathers a few summary numbers from all ranks
(one small all_gather) into a ``RankSpread``.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_maxtp._checks import COUNT, SECONDS, refuse_bool
from lightning_maxtp.callbacks.context import job_context, watch_first_batch
from lightning_maxtp.callbacks.monitor_defaults import MONITOR
from lightning_maxtp.callbacks.ranks import RankSpread, gather_spread
from lightning_maxtp.callbacks.utilization import FlopMeter
from lightning_maxtp.observe import sampler as _sampler
from lightning_maxtp.observe.gc_pauses import GcPauses
from lightning_maxtp.observe.window import Window

if TYPE_CHECKING:
    import lightning.pytorch as pl

__all__ = ["RankSpread", "StepClock", "count_samples"]

log = logging.getLogger(__name__)


def count_samples(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor-like leaf, else ``len``.

    Raises:
        TypeError: For a batch with neither (pass ``samples_fn`` to ``StepClock``).
    """
    leaf = batch
    while isinstance(leaf, list | tuple | dict) and len(leaf) > 0:
        leaf = next(iter(leaf.values())) if isinstance(leaf, dict) else leaf[0]
    shape = getattr(leaf, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    if hasattr(batch, "__len__"):
        return len(batch)
    raise TypeError(
        f"cannot count samples in a batch of {type(batch).__name__}; pass "
        "`samples_fn=lambda batch: ...` to the monitor"
    )


def _loader_key(ctx: Any) -> tuple[Any, ...]:
    """The loader settings an epoch boundary's cost depends on (``JobContext`` fields)."""
    return (ctx.num_workers, ctx.persistent_workers, ctx.prefetch_factor, ctx.loaders_following)


class StepClock(Callback):
    """Measures each training step and closes a ``Window`` every ``window_steps`` steps.

    Use it as a callback of its own (each closed window is kept in ``windows``), or own one
    inside another callback and call its hooks from yours (``BottleneckMonitor`` does): the
    step's end (``step_end``) returns the window it closed, and ``close_window`` the one it
    closes now. Nothing is called back: the owner acts on what is returned.

    Args:
        window_steps: Steps per window.
        samples_fn: Samples in a batch, for batch types ``count_samples`` cannot read.
        sampler_interval_s: Background sampling period; ``None`` disables the sampler.
        sources: Extra sampler sources (tests inject failing ones here).
        keep_windows: Windows kept in ``self.windows`` (oldest dropped).
        mfu: Read the device's peak and count the first batch's FLOPs (rank zero), so each
            window carries its MFU.
        flops_per_batch: The FLOPs of one training batch (forward and backward) when known:
            the first batch is not counted.
    """

    def __init__(
        self,
        window_steps: int = MONITOR.window_steps,
        *,
        samples_fn: Callable[[Any], int] | None = None,
        sampler_interval_s: float | None = MONITOR.sampler_interval_s,
        sources: list[_sampler.Source] | None = None,
        keep_windows: int = 1000,
        mfu: bool = MONITOR.mfu,
        flops_per_batch: float | None = None,
    ) -> None:
        refuse_bool("window_steps", window_steps, f"{COUNT} of steps >= 1", MONITOR.window_steps)
        refuse_bool(
            "sampler_interval_s",
            sampler_interval_s,
            f"{SECONDS} or None",
            MONITOR.sampler_interval_s,
        )
        if window_steps < 1:
            raise ValueError(f"`window_steps` must be >= 1, got {window_steps}")
        interval = sampler_interval_s
        if interval is not None and not (isinstance(interval, int | float) and interval > 0):
            raise ValueError(
                f"`sampler_interval_s` must be > 0 or None (no sampler), got {interval!r}"
            )
        self.window_steps = window_steps
        self.samples_fn = samples_fn or count_samples
        self.sampler_interval_s = sampler_interval_s
        self.extra_sources = list(sources or [])
        self.missing_sources: list[str] = []
        """Why each expected sampler source did not start this fit (the report's notes)."""
        self.keep_windows = keep_windows
        self.flops = FlopMeter(enabled=mfu, flops_per_batch=flops_per_batch)
        self.gc = GcPauses()
        self.windows: list[Window] = []
        self.closed = 0
        """Windows closed since the clock was made (``windows`` keeps the last ``keep_windows``)."""
        self.spreads: list[RankSpread] = []
        self.sampler: _sampler.Sampler | None = None
        self.context: Any = None
        self.step_log: list[tuple[float, float, float]] = []
        """(t since start, step time, data wait) of every measured step, for the timeline."""
        self.restart_window()
        self._last_end: float | None = None
        self._last_end_cpu = 0.0
        self._step = 0
        self._t0 = time.perf_counter()
        self._cuda = False
        self._unwatch: Callable[[], None] = lambda: None
        self._since: tuple[float, float] | None = None
        """(clock, thread CPU) of the last epoch start or validation end since the last step."""
        self._from: float | None = None
        """When the step under way is timed from (the last step's end, or an epoch start)."""
        self._epochs: dict[tuple[Any, ...], tuple[float, float]] = {}
        """``Window.epoch_parts_s`` last measured per loader settings (``_carry_epochs``)."""
        self._first_fetch: tuple[tuple[Any, ...], float] | None = None
        """The loader settings at the fit's first fetch, and how long it waited (its workers
        starting and its first batch), for ``_carry_epochs`` before any boundary is seen.
        Timed from ``on_train_epoch_start``: Lightning starts the first epoch's iterator a
        little before the hooks, so the workers' start is read short, never long."""
        self._arrived: float | None = None
        """When the fit's first batch reached ``on_before_batch_transfer`` (the fetch's end)."""
        self.epoch_steps = 0
        """Training steps ended since the epoch started."""

    def _first_arrived(self, at: float) -> None:
        self._arrived = at

    def restart_window(self) -> None:
        """Drop the steps measured so far in the open window: the next window starts here."""
        self._buf: dict[str, list[Any]] = {
            k: []
            for k in (
                "step", "wait", "samples", "wait_cpu", "compute_cpu", "events", "end", "gap",
                "boundary",
            )
        }  # fmt: skip

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.context = job_context(trainer)
        self.update_context(peaks=self.flops.start(trainer))
        self.gc.pauses.clear()
        self.gc.install()
        self._since = None
        # What the first batch shipped and what a sample costs, for every later window.
        # A fit of its own: its first fetch starts its workers again (a callback used twice).
        self._last_end, self._first_fetch, self._arrived = None, None, None
        self._unwatch = watch_first_batch(
            trainer, lambda facts: self.update_context(data_facts=facts), self._first_arrived
        )
        missing = self.missing_sources = []
        sources: list[_sampler.Source | None] = [
            _sampler.try_source(
                lambda: _sampler.ProcessCpuSource(exclude=_launched_ranks(trainer)),
                "process CPU", missing,
            ),
            _sampler.try_source(_sampler.SystemSource, "system CPU", missing),
        ]  # fmt: skip
        device = trainer.strategy.root_device
        if device.type == "cuda":
            sources.append(_sampler.try_source(lambda: _nvml_source(device), "NVML", missing))
            sources.append(
                _sampler.try_source(
                    lambda: _sampler.TorchAllocatorSource(device), "torch allocator", missing
                )
            )
        sources += self.extra_sources
        if self.sampler_interval_s is not None:
            self.sampler = _sampler.Sampler(sources, interval_s=self.sampler_interval_s)
            self.sampler.start()
        self._cuda = device.type == "cuda"
        self._t0 = time.perf_counter()

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # What an epoch start costs belongs to the job: the first fetch of an epoch starts its
        # workers (unless they persist) and loads the first batches while the step waits. That
        # step is timed with the rest, its data wait counted from here; the time since the
        # last step (the epoch's end, validation) is its gap: outside every step, yet paid.
        self._since = (time.perf_counter(), time.thread_time())
        self.epoch_steps = 0
        self.flops.abandon()  # a counted batch whose end never came: validation ran since

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Validation runs between two training steps: a gap, not a data wait.
        self._since = (time.perf_counter(), time.thread_time())

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        now, cpu = time.perf_counter(), time.thread_time()
        self._start, self._start_cpu = now, cpu
        self._wait = None if self._last_end is None else now - self._last_end
        self._wait_cpu = cpu - self._last_end_cpu
        self._from = self._last_end  # when the step's time starts
        # The fit's first step starts its workers once: no epoch boundary that recurs.
        self._gap, self._boundary = 0.0, self._since is not None and self._last_end is not None
        if self._since is not None:
            since, since_cpu = self._since
            if self._last_end is None and self.context is not None:
                # To the fetch's end: not the first batch's sampling and device copy after it.
                fetched = now if self._arrived is None else min(now, self._arrived)
                self._first_fetch = (_loader_key(self.context), fetched - since)
            if self._last_end is None or since > self._last_end:
                self._gap = 0.0 if self._last_end is None else since - self._last_end
                self._from, self._wait, self._wait_cpu = since, now - since, cpu - since_cpu
        self._since = None
        self._samples = self.samples_fn(batch)
        if self.flops.before_batch(trainer, self._samples):
            self._wait = None  # the first: counted under FlopCounterMode, slower than others
        self._events = _record_event() if self._cuda else None

    @override
    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self.step_end(trainer)

    def step_end(self, trainer: pl.Trainer) -> Window | None:
        """A training step ended: time it; the window it closes, if it closes one.

        Call it on every rank (under DDP the ranks gather a summary of each window).
        """
        now, cpu = time.perf_counter(), time.thread_time()
        flops = self.flops.after_batch()
        if flops is not None and self.context.flops_per_sample != flops:
            self.update_context(flops_per_sample=flops, conv_flop_share=self.flops.conv_share)
        if self.flops.after_first_step(trainer):  # a peak the cache lacked: no step's time
            self.update_context(peaks=self.flops.peaks)
            now, cpu = time.perf_counter(), time.thread_time()
        if self._wait is not None and self._from is not None:
            events = None if self._events is None else (self._events, _record_event())
            self._append(now, now - self._from, self._wait, cpu)
            self._buf["events"].append(events)
            self._buf["gap"].append(self._gap)
            self._buf["boundary"].append(self._boundary)
        self._last_end, self._last_end_cpu = now, cpu
        self._step += 1
        self.epoch_steps += 1
        if len(self._buf["step"]) >= self.window_steps:
            return self._close(trainer)
        return None

    def restart_step(self) -> None:
        """The time since the last step ended belongs to no step.

        For training blocked by the library itself between steps (the loader measured alone,
        counted as blocked): the next step is timed from now, not from its predecessor's end.
        """
        if self._last_end is not None:
            self._last_end, self._last_end_cpu = time.perf_counter(), time.thread_time()

    def _append(self, now: float, step_s: float, wait_s: float, cpu: float) -> None:
        b = self._buf
        b["step"].append(step_s)
        b["wait"].append(wait_s)
        b["samples"].append(self._samples)
        b["wait_cpu"].append(self._wait_cpu)
        b["compute_cpu"].append(cpu - self._start_cpu)
        b["end"].append(now)
        self.step_log.append((self.elapsed_s(now), step_s, wait_s))

    def _close(self, trainer: pl.Trainer) -> Window:
        b = self._buf
        n = len(b["step"])
        t_end = self.elapsed_s()
        span = (t_end - sum(b["step"]) - sum(b["gap"]), t_end)
        ends = b["end"]
        start = ends[0] - b["step"][0]
        gc = self.gc.summary(
            start, ends[-1], sum(b["step"]), list(zip(ends, b["step"], strict=True))
        )
        self.gc.clear_before(ends[-1])
        window = Window(
            step_time_s=tuple(b["step"]),
            data_wait_s=tuple(b["wait"]),
            samples=tuple(b["samples"]),
            wait_cpu_s=tuple(b["wait_cpu"]),
            compute_cpu_s=tuple(b["compute_cpu"]),
            sampler=self.sampler.series(*span) if self.sampler is not None else _empty_series(),
            context=self.context,
            first_step=self._step - n,
            rank=trainer.global_rank,
            device_time_s=_ready_spans(b["events"]),
            gc=gc,
            gap_s=tuple(b["gap"]),
            epoch_start=tuple(b["boundary"]),
        )
        window = self._carry_epochs(window)
        self.restart_window()
        self.closed += 1
        self.windows.append(window)
        del self.windows[: -self.keep_windows]
        if trainer.world_size > 1:
            spread = gather_spread(trainer, window)
            if spread is not None:
                self.spreads.append(spread)
        return window

    def _carry_epochs(self, window: Window) -> Window:
        """A window with what an epoch boundary costs under its loader settings.

        Remembered from the windows that held one, handed to those that held none (epochs
        longer than windows: most hold none). Before any window held one, workers that do not
        persist are predicted to cost at each epoch start what they cost at the fit's first
        fetch beyond a steady step's wait (they start again each epoch), and as much again at
        each validation for each validation loader that follows the train loader's settings.
        """
        key = _loader_key(window.context)
        if any(window.epoch_start):
            parts = window.epoch_parts_s
            if parts is not None:
                self._epochs[key] = parts
            return window
        carried = self._epochs.get(key)
        if carried is not None:
            return dataclasses.replace(window, carried_epoch_s=carried)
        predicted = self._first_epoch(window, key)
        if predicted is None:
            return window
        return dataclasses.replace(window, carried_epoch_s=predicted, epoch_predicted=True)

    def _first_epoch(self, window: Window, key: tuple[Any, ...]) -> tuple[float, float] | None:
        """``Window.epoch_parts_s`` predicted from the fit's first fetch (``_carry_epochs``).

        Workers that do not persist start again at each epoch as they did at the first fetch,
        and each validation loader that follows starts as many; a loader without workers, or
        with workers that persist, starts none (0 s), the epoch's end aside. The first window
        that measures a boundary completes the prediction with what an epoch's end costs under
        any settings (``observe.window.aligned_epochs``). Only where every window is as long
        as an epoch (short epochs): the windows the prediction is judged against then hold
        their epoch's boundary. With longer epochs most windows hold none, and a prediction
        for the first settings alone would charge them what the windows of other settings are
        not charged.
        """
        ctx = window.context
        if not ctx.epoch_batches or self.window_steps < ctx.epoch_batches:
            return None
        if self._first_fetch is None or self._first_fetch[0] != key or not window.data_wait_s:
            return None
        start = 0.0
        if ctx.num_workers and not ctx.persistent_workers:
            start = max(0.0, self._first_fetch[1] - statistics.median(window.data_wait_s))
        return start, start * ctx.loaders_following

    @property
    def open_steps(self) -> int:
        """Steps measured in the window that has not closed yet."""
        return len(self._buf["step"])

    def open_window(self) -> tuple[tuple[float, ...], tuple[int, ...]]:
        """Step times and samples of the window that has not closed yet."""
        return tuple(self._buf["step"]), tuple(self._buf["samples"])

    def open_waits(self) -> tuple[float, ...]:
        """Data waits of the window that has not closed yet."""
        return tuple(self._buf["wait"])

    def close_window(self, trainer: pl.Trainer, *, min_steps: int = 1) -> Window | None:
        """Close the open window now (a fit ending mid-window), if it has ``min_steps`` steps.

        Call it on every rank (under DDP the ranks gather a summary of each window).
        """
        if self.open_steps < min_steps:
            return None
        return self._close(trainer)

    def elapsed_s(self, now: float | None = None) -> float:
        """Seconds since the fit's clock started (the sampler's zero, when it runs)."""
        t0 = self.sampler.t0 if self.sampler is not None else self._t0
        return (time.perf_counter() if now is None else now) - t0

    def update_context(self, **changes: Any) -> None:
        """Windows closed from now on carry these settings (a knob changed mid-fit)."""
        self.context = dataclasses.replace(self.context, **changes)

    def stop(self) -> None:
        """Stop the sampler thread and the first-batch observer (idempotent)."""
        if self.sampler is not None:
            self.sampler.stop()
        self._unwatch()
        self.flops.abort()
        self.gc.uninstall()

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.stop()

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self.stop()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.stop()


def _empty_series() -> Any:
    from lightning_maxtp.observe.window import SamplerSeries

    return SamplerSeries()


def _record_event() -> Any:
    import torch

    event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    event.record()
    return event


def _ready_spans(events: list[Any]) -> tuple[float, ...]:
    """Device span of each step whose end event has completed; never waits for the others."""
    spans = []
    for pair in events:
        if pair is not None and pair[1].query():
            spans.append(pair[0].elapsed_time(pair[1]) / 1e3)
    return tuple(spans)


def _nvml_source(device: Any) -> _sampler.Source:
    """NVML source for a torch CUDA device, matched by UUID.

    NVML indices differ from torch's under ``CUDA_VISIBLE_DEVICES``; UUIDs do not.
    """
    import torch

    uuid = str(torch.cuda.get_device_properties(device.index or 0).uuid)
    return _sampler.NvmlSource(uuid="GPU-" + uuid if not uuid.startswith("GPU-") else uuid)


def _launched_ranks(trainer: pl.Trainer) -> Callable[[], set[int]]:
    """Pids of DDP ranks rank zero launched itself: its children, but not DataLoader workers."""
    launcher = getattr(trainer.strategy, "launcher", None)

    def pids() -> set[int]:
        procs = getattr(launcher, "procs", None) or []
        return {p.pid for p in procs if getattr(p, "pid", None) is not None}

    return pids
