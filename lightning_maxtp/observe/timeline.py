"""``timeline.png``: step time and data wait, GPU and CPU utilization over time, knob changes."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lightning_maxtp.observe.report import ThroughputReport


def plot_timeline(report: ThroughputReport, path: Path) -> None:
    """Draw the report's timelines into ``path``.

    Raises:
        ImportError: Without matplotlib (the ``plot`` extra).
    """
    import matplotlib

    matplotlib.use("Agg", force=False)  # no display needed; never opens a window
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    if report.step_log:
        t = [s[0] for s in report.step_log]
        top.plot(t, [s[1] * 1e3 for s in report.step_log], label="step time", lw=1)
        top.plot(t, [s[2] * 1e3 for s in report.step_log], label="data wait", lw=1)
    top.set_ylabel("ms")
    top.set_title(f"bottleneck: {report.bottleneck} - {report.samples_per_s:.1f} samples/s")
    tl = report.timeline
    if tl.gpu_util_percent:
        bottom.plot(tl.t_s[-len(tl.gpu_util_percent) :], tl.gpu_util_percent, label="GPU util %")
    if tl.main_cpu_percent:
        bottom.plot(tl.t_s[-len(tl.main_cpu_percent) :], tl.main_cpu_percent, label="main CPU %")
    if tl.worker_cpu_percent:
        bottom.plot(
            tl.t_s[-len(tl.worker_cpu_percent) :], tl.worker_cpu_percent, label="workers CPU %"
        )
    bottom.set_ylabel("percent (100 = one core / full GPU)")
    bottom.set_xlabel("seconds since start")
    for change in report.knob_changes:
        for ax in (top, bottom):
            ax.axvline(change.t_s, color="gray", ls="--", lw=1)
        top.annotate(f"{change.knob}: {change.old}->{change.new}", (change.t_s, 0),
                     xycoords=("data", "axes fraction"), rotation=90, fontsize=7)  # fmt: skip
    for ax in (top, bottom):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
