"""Every metric the callbacks log and show, as data (``METRICS``), and a window's values for them.

``METRICS`` is the one table: the documentation's metrics page is generated from it
(``metrics_table``), and a test checks that the callbacks' docstrings list the same keys. A key
whose reading is missing in a window (no GPU, no sampler, no FLOP count) is left out of that
window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from lightning_maxtp.observe.diagnosis import BottleneckKind, Diagnosis

if TYPE_CHECKING:
    from lightning_maxtp.callbacks.ranks import RankSpread
    from lightning_maxtp.observe.window import Window

__all__ = ["LOGGED", "METRICS", "PROGRESS_BAR", "Metric", "metrics_table", "window_metrics"]


@dataclass(frozen=True)
class Metric:
    """One metric: its key, where it goes and what its value is."""

    key: str
    where: Literal["logger", "progress bar"]
    """``"logger"``: every attached Lightning logger, each window; ``"progress bar"``:
    ``MaxThroughputCallback`` only, while it tunes (not logged)."""
    text: str

    def to_dict(self) -> dict[str, str]:
        """JSON-safe view."""
        return {"key": self.key, "where": self.where, "text": self.text}


_KINDS = ", ".join(f"{i} {kind.value}" for i, kind in enumerate(BottleneckKind))

METRICS: tuple[Metric, ...] = (
    Metric("maxtp/samples_per_s", "logger", "training samples/s of the window on this rank "
           "(under DDP one rank's share: the global rate is this times the world size)"),
    Metric("maxtp/step_time_ms", "logger", "median step time of the window, milliseconds"),
    Metric("maxtp/data_wait_share", "logger",
           "share of step time spent waiting for the next batch (0..1)"),
    Metric("maxtp/gpu_util_percent", "logger",
           "mean NVML utilization of this rank's GPU (CUDA only)"),
    Metric("maxtp/main_cpu_percent", "logger",
           "mean CPU of the training process, percent of one core"),
    Metric("maxtp/worker_cpu_percent", "logger",
           "mean CPU of one DataLoader worker, percent of one core"),
    Metric("maxtp/bottleneck_code", "logger",
           f"the top diagnosis as its index in `BottleneckKind` ({_KINDS})"),
    Metric("maxtp/bottleneck_confidence", "logger", "its confidence, 0..1"),
    Metric("maxtp/straggler_rank", "logger",
           "DDP only: the rank that waits longest for its own data"),
    Metric("maxtp/mfu", "logger", "model FLOPs utilization: FLOP/s of the window over this "
           "device's measured peak for the dtype in force (0..1; left out when the count "
           "exceeds the peak: an error, not 104 %)"),
    Metric("maxtp/gc_share", "logger", "share of step time in Python's garbage collector (0..1)"),
    Metric("maxtp_samples_s", "progress bar",
           "samples/s of the last measured window (stalls capped)"),
    Metric("maxtp_trials", "progress bar", "knob trials so far"),
    Metric("maxtp_tuning", "progress bar", "1 while tuning, 0 once the loop only monitors"),
    Metric("maxtp_mfu", "progress bar", "MFU of the last measured window (0..1), when known"),
)  # fmt: skip
"""Every metric, in the order the tables list them."""

LOGGED = tuple(m.key for m in METRICS if m.where == "logger")
"""Every key the monitors log."""
PROGRESS_BAR = tuple(m.key for m in METRICS if m.where == "progress bar")
"""Every key ``MaxThroughputCallback`` shows on the progress bar, in the order it shows them."""


def metrics_table() -> str:
    """``METRICS`` as a markdown table (the documentation's metrics page)."""
    rows = ["| key | where | value |", "|---|---|---|"]
    rows += [f"| `{m.key}` | {m.where} | {m.text} |" for m in METRICS]
    return "\n".join(rows)


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
