"""One clock for a report: training steps and seconds since the fit started, each from the other.

Windows and trials are numbered by training step; the step log, the sampler's timeline, knob
changes and spans are timed in seconds on the monitor's clock. ``report.md`` keys everything by
step (with the seconds beside it) and ``timeline.png`` by seconds, so each needs the other unit.
The step log holds one entry per measured step, in order, and a window's step times are the very
floats of its steps' entries there: where a window's run of step times sits in the log places
the whole log on the step axis (the fit's first step is usually not timed, so the log does not
simply start at step 0).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["StepTimes", "step_times"]


@dataclass(frozen=True)
class StepTimes:
    """The step log placed on the step axis (plain data; ``step_times`` builds it)."""

    first_step: int | None
    """The step number of the log's first entry (``None``: no window was found in the log)."""
    ends_s: tuple[float, ...] = ()
    """When each logged step ended, seconds since the monitor started."""
    durations_s: tuple[float, ...] = ()
    """Each logged step's time, seconds."""

    def step_at(self, t_s: float) -> int | None:
        """The first step that ended after ``t_s``: the step a change made at ``t_s`` applies to.

        A knob change is made between two steps, after the previous one's end was logged.
        """
        if self.first_step is None:
            return None
        return self.first_step + bisect.bisect_right(self.ends_s, t_s)

    def end_of(self, step: int) -> float | None:
        """When ``step`` ended (``None``: not in the log)."""
        index = self._index(step)
        return None if index is None else self.ends_s[index]

    def start_of(self, step: int) -> float | None:
        """When ``step``'s time began (its data wait included; ``None``: not in the log)."""
        index = self._index(step)
        return None if index is None else self.ends_s[index] - self.durations_s[index]

    def _index(self, step: int) -> int | None:
        if self.first_step is None:
            return None
        index = step - self.first_step
        return index if 0 <= index < len(self.ends_s) else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "first_step": self.first_step,
            "ends_s": list(self.ends_s),
            "durations_s": list(self.durations_s),
        }


def step_times(
    step_log: Sequence[Sequence[float]], windows: Sequence[Mapping[str, Any]]
) -> StepTimes:
    """Place ``step_log`` (``report.json``'s) on the step axis by finding a window in it.

    Args:
        step_log: ``[t_end_s, step_s, data_wait_s]`` per measured step, in order.
        windows: ``report.json``'s windows (``first_step`` and ``step_time_s`` are read).

    Returns:
        The log with the step number of its first entry, or ``None`` for it when no window's
        step times appear in the log (a report built by hand).
    """
    ends = tuple(float(entry[0]) for entry in step_log)
    durations = tuple(float(entry[1]) for entry in step_log)
    for window in windows:
        times = [float(t) for t in window.get("step_time_s", ())]
        if not times:
            continue
        index = _find_run(durations, times)
        if index is not None:
            return StepTimes(int(window.get("first_step", 0)) - index, ends, durations)
    return StepTimes(None, ends, durations)


def _find_run(durations: tuple[float, ...], times: list[float]) -> int | None:
    """Where ``times`` first occurs as a run in ``durations`` (``None``: nowhere)."""
    n = len(times)
    for index in range(len(durations) - n + 1):
        if durations[index] == times[0] and list(durations[index : index + n]) == times:
            return index
    return None
