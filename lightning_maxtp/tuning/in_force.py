"""Which measured windows describe the settings a fit ended with (pure).

The report's headline and diagnosis come only from windows measured under the settings in
force: never from a reverted or unfinished trial's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lightning_maxtp.observe.diagnosis import Diagnosis
    from lightning_maxtp.observe.report import ThroughputReport
    from lightning_maxtp.observe.window import Window
    from lightning_maxtp.tuning.tuning_loop import TuningLoop

__all__ = ["in_force"]


def in_force(
    loop: TuningLoop,
    final: list[tuple[Window, tuple[Diagnosis, ...]]],
    report: ThroughputReport | None = None,
) -> tuple[list[Window], tuple[Diagnosis, ...]]:
    """The windows measured under the settings in force, and the diagnoses describing them.

    Args:
        loop: The fit's loop (its reference window and whether tuning ended).
        final: Windows closed under the settings in force after tuning ended, with their
            diagnoses (the reference window they were judged by is added).
        report: The monitor's report: its last diagnoses are the latest (re-read with a
            profiler capture, if one ran), and its windows are all there is when nothing
            was tuned.

    Returns:
        When tuning did not end, the reference window (never a reverted or unfinished
        trial's); with no reference at all, every window of ``report``.
    """
    if final:
        windows, found = [w for w, _ in final], final[-1][1]
        last = report.windows[-1] if report is not None and report.windows else None
        if report is not None and last is not None and last.first_step == windows[-1].first_step:
            found = report.diagnoses
        if loop.ref is not None and loop.finished:
            windows.insert(0, loop.ref)
        return windows, found
    if loop.ref is not None:
        return [loop.ref], loop.ref_found
    if report is None:
        return [], ()
    return list(report.windows), report.diagnoses
