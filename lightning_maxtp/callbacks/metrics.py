"""Every metric the callbacks log and show, in one table, and the window's values for them.

=================================  ===========================================================
Key                                Logged value
=================================  ===========================================================
``maxtp/samples_per_s``            Training samples/s of the window on this rank (one rank's
                                   share under DDP; the global rate is this times world size)
``maxtp/step_time_ms``             Median step time of the window, milliseconds
``maxtp/data_wait_share``          Share of step time spent waiting for the next batch (0..1)
``maxtp/gpu_util_percent``         Mean NVML utilization of this rank's GPU (CUDA only)
``maxtp/main_cpu_percent``         Mean CPU of the training process, percent of one core
``maxtp/worker_cpu_percent``       Mean CPU of one DataLoader worker, percent of one core
``maxtp/bottleneck_code``          The top diagnosis as its index in ``BottleneckKind``
                                   (0 data_pipeline, 1 storage, 2 compute, 3 kernel_launch,
                                   4 vram, 5 host_overhead, 6 under_occupied, 7 healthy)
``maxtp/bottleneck_confidence``    Its confidence, 0..1
``maxtp/straggler_rank``           DDP only: the rank that waits longest for its own data
``maxtp/mfu``                      Model FLOPs utilization: FLOP/s of the window over this
                                   device's measured peak for the dtype in force (0..1; left
                                   out when the count exceeds the peak: an error, not 104 %)
``maxtp/gc_share``                 Share of step time in Python's garbage collector (0..1)
=================================  ===========================================================

``MaxThroughputCallback`` also shows, while it tunes, on the progress bar (not logged):

=================================  ===========================================================
Key                                Shown value
=================================  ===========================================================
``maxtp_samples_s``                Samples/s of the last measured window (stalls capped)
``maxtp_trials``                   Knob trials so far
``maxtp_tuning``                   1 while tuning, 0 once the loop only monitors
``maxtp_mfu``                      MFU of the last measured window (0..1), when known
=================================  ===========================================================

A key whose reading is missing in a window (no GPU, no sampler) is left out of that window.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_maxtp.observe.diagnosis import BottleneckKind, Diagnosis

if TYPE_CHECKING:
    from lightning_maxtp.callbacks.ranks import RankSpread
    from lightning_maxtp.observe.window import Window

__all__ = ["LOGGED", "PROGRESS_BAR", "window_metrics"]

LOGGED = (
    "maxtp/samples_per_s",
    "maxtp/step_time_ms",
    "maxtp/data_wait_share",
    "maxtp/gpu_util_percent",
    "maxtp/main_cpu_percent",
    "maxtp/worker_cpu_percent",
    "maxtp/bottleneck_code",
    "maxtp/bottleneck_confidence",
    "maxtp/straggler_rank",
    "maxtp/mfu",
    "maxtp/gc_share",
)
"""Every key the monitors log (the table above)."""
PROGRESS_BAR = ("maxtp_samples_s", "maxtp_trials", "maxtp_tuning", "maxtp_mfu")
"""Every key ``MaxThroughputCallback`` shows on the progress bar."""

_KIND_CODE = {kind: float(i) for i, kind in enumerate(BottleneckKind)}


def window_metrics(
    window: Window, found: tuple[Diagnosis, ...], spread: RankSpread | None
) -> dict[str, float]:
    """The logged metrics of one window (readings that are missing are left out)."""
    metrics = {
        "maxtp/samples_per_s": window.samples_per_s,
        "maxtp/step_time_ms": window.median_step_s * 1e3,
        "maxtp/data_wait_share": window.data_wait_share,
    }
    for key, value in (
        ("gpu_util", window.sampler.mean_gpu_util),
        ("main_cpu", window.sampler.mean_main_cpu),
        ("worker_cpu", window.sampler.mean_worker_cpu),
    ):
        if value is not None:
            metrics[f"maxtp/{key}_percent"] = value
    if found:
        metrics["maxtp/bottleneck_code"] = _KIND_CODE[found[0].kind]
        metrics["maxtp/bottleneck_confidence"] = found[0].confidence
    util = window.utilization
    if util is not None and util.mfu is not None:
        metrics["maxtp/mfu"] = util.mfu
    if window.gc is not None:
        metrics["maxtp/gc_share"] = window.gc.share
    if spread is not None:
        metrics["maxtp/straggler_rank"] = float(spread.straggler_rank)
    assert set(metrics) <= set(LOGGED), sorted(set(metrics) - set(LOGGED))
    return metrics
