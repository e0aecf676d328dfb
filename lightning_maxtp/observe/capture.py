"""A short ``torch.profiler`` capture reduced to what separates the GPU kinds.

NVML's utilization only says a kernel ran during a sample, so a launch-bound step (many tiny
kernels), a sync-bound step (``.item()``, pageable copies) and a compute-bound one can look
alike. A capture of a few steps settles it: kernels per step, median kernel time, the device's
idle share between kernels, host-to-device copies from pageable memory and synchronizing calls
per step (the quantities HTA's temporal and kernel breakdowns report). The trace is parsed as
Chrome-trace events, so ``summarize_trace`` is pure and testable from a recorded event list.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Iterable, Mapping
from typing import Any, Literal, get_args

from lightning_maxtp.observe.window import CaptureSummary

__all__ = ["CAPTURE_MODES", "CaptureMode", "KernelCapture", "summarize_trace"]

CaptureMode = Literal["auto", "always", "never"]
"""When the monitors profile a few steps: ``"auto"`` once when the signals are ambiguous,
``"always"`` after the first window, ``"never"`` not at all."""
CAPTURE_MODES: tuple[str, ...] = get_args(CaptureMode)

log = logging.getLogger(__name__)

SYNC_CALLS = frozenset(
    {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"}
)
"""Runtime calls that block the host until the device catches up (``cudaMemcpy`` is the
synchronous copy behind ``.item()`` and ``.cpu()``)."""
LAUNCH_CALLS = frozenset(
    {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx"}
)


def _busy_and_span(intervals: list[tuple[float, float]]) -> tuple[float, float]:
    """Union length of [start, end) intervals and their overall span."""
    intervals.sort()
    busy, cur_start, cur_end = 0.0, intervals[0][0], intervals[0][1]
    for start, end in intervals[1:]:
        if start > cur_end:
            busy += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    busy += cur_end - cur_start
    return busy, max(e for _, e in intervals) - intervals[0][0]


def summarize_trace(
    events: Iterable[Mapping[str, Any]], steps: int, overhead_s: float = 0.0
) -> CaptureSummary:
    """Summarise Chrome-trace events (``ts``/``dur`` in microseconds) of ``steps`` steps.

    Raises:
        ValueError: If ``steps`` < 1.
    """
    if steps < 1:
        raise ValueError(f"`steps` must be >= 1, got {steps}")
    kernels: list[tuple[float, float]] = []
    launches: list[float] = []
    pageable = syncs = 0
    for e in events:
        cat, name = str(e.get("cat", "")), str(e.get("name", ""))
        if cat == "kernel":
            kernels.append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))))
        elif cat == "gpu_memcpy" and "HtoD" in name and "Pageable" in name:
            pageable += 1
        elif cat in ("cuda_runtime", "cuda_driver"):
            if name in SYNC_CALLS:
                syncs += 1
            elif name in LAUNCH_CALLS:
                launches.append(float(e.get("dur", 0.0)))
    median_kernel = statistics.median(e - s for s, e in kernels) if kernels else None
    idle = None
    if kernels:
        busy, span = _busy_and_span(kernels)
        idle = 1.0 - busy / span if span > 0 else 0.0
    return CaptureSummary(
        steps=steps,
        kernels_per_step=len(kernels) / steps,
        median_kernel_us=median_kernel,
        gpu_idle_share=idle,
        pageable_h2d_per_step=pageable / steps,
        syncs_per_step=syncs / steps,
        median_launch_us=statistics.median(launches) if launches else None,
        overhead_s=overhead_s,
    )


class KernelCapture:
    """Profile a few steps: ``start()``, ``step()`` after each, ``stop() -> CaptureSummary``.

    The cost (profiling overhead and parsing) is measured and reported in the summary's
    ``overhead_s``; ``baseline_step_s`` (the median step before the capture) lets the slower
    captured steps count too.

    Args:
        steps: Steps to capture.
        baseline_step_s: Median step time before the capture, when known.
    """

    def __init__(self, steps: int = 3, baseline_step_s: float | None = None) -> None:
        if steps < 1:
            raise ValueError(f"`steps` must be >= 1, got {steps}; a capture needs a whole step")
        self.steps = steps
        self.baseline_step_s = baseline_step_s
        self.steps_done = 0
        self._prof: Any = None
        self._t_start = 0.0

    @property
    def active(self) -> bool:
        """Whether the profiler is running."""
        return self._prof is not None

    @property
    def done(self) -> bool:
        """Whether all requested steps were captured."""
        return self.steps_done >= self.steps

    def start(self) -> None:
        """Start the profiler (CPU, plus CUDA when available)."""
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self._t_start = time.perf_counter()
        self._prof = profile(activities=activities)
        self._prof.__enter__()

    def step(self) -> None:
        """Mark the end of one captured step."""
        self.steps_done += 1

    def stop(self) -> CaptureSummary:
        """Stop, parse the trace and summarise it."""
        if self._prof is None:
            raise RuntimeError("KernelCapture.stop() called before start()")
        t_stop = time.perf_counter()
        self._prof.__exit__(None, None, None)
        fd, path = tempfile.mkstemp(suffix=".json", prefix="maxtp-capture-")
        os.close(fd)
        try:
            self._prof.export_chrome_trace(path)
            with open(path) as f:
                events = json.load(f).get("traceEvents", [])
        finally:
            os.unlink(path)
            self._prof = None
        captured = t_stop - self._t_start
        extra = 0.0
        if self.baseline_step_s is not None:
            extra = max(0.0, captured - self.steps_done * self.baseline_step_s)
        overhead = extra + (time.perf_counter() - t_stop)
        return summarize_trace(events, max(1, self.steps_done), overhead_s=overhead)
