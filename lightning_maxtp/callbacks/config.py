"""``TuningConfig``: what ``MaxThroughputCallback``'s closed loop may do, checked when built.

One frozen object instead of a dozen keyword arguments handed from the callback to the loop
and to the loader step; each message of a bad value names the argument and the fix.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from lightning_maxtp.callbacks.allow import Allow, resolve_allow
from lightning_maxtp.observe.thresholds import MIN_GAIN

__all__ = ["TuningConfig"]

_AT_LEAST = {
    "warmup_steps": 0,
    "window_steps": 2,
    "settle_steps": 0,
    "max_trials": 0,
    "monitor_window_steps": 1,
}


@dataclass(frozen=True, kw_only=True)
class TuningConfig:
    """The closed loop's limits (the callback's arguments of the same names)."""

    warmup_steps: int = 5
    """Steps before the baseline window (compile, caches, worker start)."""
    window_steps: int = 20
    """Steps in the baseline window and in each trial's window."""
    settle_steps: int = 2
    """Steps after a change before its window starts (in-flight batches drain)."""
    min_gain: float = MIN_GAIN
    """A knob is kept when throughput rose by at least this share (0.05: 5 %)."""
    max_trials: int = 6
    """Most knob trials."""
    time_budget_s: float = 300.0
    """No trial starts after this many seconds of tuning."""
    tune_loader: bool = True
    """Run ``tune_dataloader`` when the baseline is data-bound and try its settings first."""
    loader_time_budget_s: float = 15.0
    """Time budget of that loader measurement."""
    max_workers: int | None = None
    """Worker cap (``None``: the probe's CPU budget, raised for loading that waits on reads)."""
    allow_batch_size_change: bool = False
    """Run ``find_batch_size`` before training and apply its batch (``"batch_size"`` in
    ``allow``)."""
    allow: Allow = "safe"
    """Knobs beyond the loader's: ``"safe"`` (same math), ``"all"``, or a tuple of names."""
    monitor_window_steps: int = 100
    """Window length after tuning (cheap monitoring)."""
    drift_share: float = 0.2
    """After tuning, a window this much slower than the tuned rate is reported."""
    cost_share: float | None = 0.05
    """Tuning may cost at most this share of the fit's expected time at the baseline rate
    (training blocked, plus windows at slower settings); ``None``: only ``time_budget_s``."""

    def __post_init__(self) -> None:
        allow: Any = self.allow
        if isinstance(allow, list):  # from a config file: a list is as good as a tuple
            object.__setattr__(self, "allow", tuple(allow))
        resolve_allow(self.allow)  # a bad name fails here, before the fit
        for name, least in _AT_LEAST.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"`{name}` must be an integer >= {least}, got {value!r}")
        gain = self.min_gain
        if not isinstance(gain, int | float) or not 0 <= gain < 1:
            raise ValueError(
                f"`min_gain` must be a share in [0, 1), got {gain!r}; e.g. 0.05 keeps a knob "
                "that makes the run at least 5 % faster"
            )
        for name in ("time_budget_s", "loader_time_budget_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not (value > 0 and math.isfinite(value)):
                raise ValueError(
                    f"`{name}` must be a number of seconds > 0, got {value!r}; e.g. 60"
                )
        drift = self.drift_share
        if not isinstance(drift, int | float) or not 0 < drift < 1:
            raise ValueError(f"`drift_share` must be in (0, 1), got {drift!r}; e.g. 0.2")
        share = self.cost_share
        if share is not None and (
            isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1
        ):
            raise ValueError(
                f"`cost_share` must be in (0, 1] or None (no limit), got {share!r}; e.g. 0.05 lets "
                "tuning cost at most 5 % of the fit's expected time"
            )
        workers = self.max_workers
        if workers is not None and (
            isinstance(workers, bool) or not isinstance(workers, int) or workers < 0
        ):
            raise ValueError(
                "`max_workers` must be an integer >= 0 or None (the probe's budget), got "
                f"{workers!r}"
            )

    def allowed(self, *, deterministic: bool = False) -> tuple[str, ...]:
        """The knob names beyond the loader's this fit may try (``allow.resolve_allow``)."""
        return resolve_allow(self.allow, batch_size=self.allow_batch_size_change,
                             deterministic=deterministic)  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        data = asdict(self)
        if isinstance(self.allow, tuple):
            data["allow"] = list(self.allow)
        return data
