"""Argument checks of ``MaxThroughputCallback`` (each message names the argument and the fix)."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["check_arguments"]

_AT_LEAST = {
    "warmup_steps": 0,
    "window_steps": 2,
    "settle_steps": 0,
    "max_trials": 0,
    "monitor_window_steps": 1,
}
_CAPTURE_MODES = ("auto", "always", "never")


def check_arguments(args: dict[str, Any]) -> None:
    """Raise ``ValueError`` for any argument no run can satisfy.

    Args:
        args: The callback's keyword arguments (``locals()`` of its ``__init__``).
    """
    for name, least in _AT_LEAST.items():
        value = args[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"`{name}` must be an integer >= {least}, got {value!r}")
    gain = args["min_gain"]
    if not isinstance(gain, int | float) or not 0 <= gain < 1:
        raise ValueError(
            f"`min_gain` must be a share in [0, 1), got {gain!r}; e.g. 0.05 keeps a knob that "
            "makes the run at least 5 % faster"
        )
    for name in ("time_budget_s", "loader_time_budget_s"):
        value = args[name]
        if not isinstance(value, int | float) or not (value > 0 and math.isfinite(value)):
            raise ValueError(f"`{name}` must be a number of seconds > 0, got {value!r}; e.g. 60")
    drift = args["drift_share"]
    if not isinstance(drift, int | float) or not 0 < drift < 1:
        raise ValueError(f"`drift_share` must be in (0, 1), got {drift!r}; e.g. 0.2")
    workers = args["max_workers"]
    if workers is not None and (not isinstance(workers, int) or workers < 0):
        raise ValueError(
            f"`max_workers` must be an integer >= 0 or None (the probe's budget), got {workers!r}"
        )
    if args["capture"] not in _CAPTURE_MODES:
        raise ValueError(f"`capture` must be one of {_CAPTURE_MODES}, got {args['capture']!r}")
    interval = args["sampler_interval_s"]
    if interval is not None and not (isinstance(interval, int | float) and interval > 0):
        raise ValueError(f"`sampler_interval_s` must be > 0 or None (no sampler), got {interval!r}")
