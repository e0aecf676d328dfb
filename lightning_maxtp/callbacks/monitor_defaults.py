"""The measuring side's defaults, defined once.

``StepClock``, ``BottleneckMonitor`` and the callback's own monitoring keywords read them from
here (the loop's are ``TuningConfig``'s).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["MONITOR", "MonitorDefaults"]


@dataclass(frozen=True)
class MonitorDefaults:
    """Defaults of the step clock and the monitor."""

    window_steps: int = 50
    """Steps per measured window of a standalone monitor (the callback's loop sizes its own
    windows: ``TuningConfig.window_steps`` while tuning, ``monitor_window_steps`` after)."""
    sampler_interval_s: float | None = 0.1
    """Seconds between the background sampler's readings (``None``: no sampler)."""
    mfu: bool = True
    """Give each window its distance to the device's measured peak."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return asdict(self)


MONITOR = MonitorDefaults()
