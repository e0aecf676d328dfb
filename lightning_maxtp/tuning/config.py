"""``TuningConfig``: what ``MaxThroughputCallback``'s closed loop may do, checked when built.

The one place the loop's settings, their defaults and their documentation live: the callback
takes a ``TuningConfig`` or its fields as keywords (with these defaults), and hands the object
to the loop and the loader step. Each message of a bad value names the field and the fix.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import asdict, dataclass
from typing import Any

from lightning_maxtp._checks import COUNT, SECONDS, SHARE, refuse_bool
from lightning_maxtp.observe.thresholds import MIN_GAIN
from lightning_maxtp.tuning.allow import Allow, resolve_allow

__all__ = ["DEFAULTS", "TuningConfig", "tuning_config"]

_AT_LEAST = {
    "warmup_steps": 0,
    "window_steps": 2,
    "settle_steps": 0,
    "max_trials": 0,
    "monitor_window_steps": 1,
}

# Every numeric field: what it takes and a valid value, for the message that refuses a bool
# (True would pass the range checks below as 1, False as 0).
_NUMBERS: dict[str, tuple[str, object]] = {
    "warmup_steps": (f"{COUNT} of steps >= 0", 5),
    "window_steps": (f"{COUNT} of steps >= 2", 20),
    "settle_steps": (f"{COUNT} of steps >= 0", 2),
    "max_trials": (f"{COUNT} >= 0", 6),
    "monitor_window_steps": (f"{COUNT} of steps >= 1", 100),
    "min_gain": (SHARE, 0.05),
    "time_budget_s": (SECONDS, 30),
    "loader_time_budget_s": (SECONDS, 15),
    "max_workers": (f"{COUNT} >= 0 or None", 4),
    "drift_share": (SHARE, 0.2),
    "cost_share": (f"{SHARE} or None", 0.05),
}


@dataclass(frozen=True, kw_only=True)
class TuningConfig:
    """The closed loop's settings.

    ``MaxThroughputCallback(config=TuningConfig(...))``, or the same fields as the callback's
    keywords.
    """

    warmup_steps: int = 5
    """Steps before the baseline window (compile, caches, worker start)."""
    window_steps: int = 20
    """Steps in the baseline window and in each trial's window."""
    settle_steps: int = 2
    """Steps after a change before its window starts (in-flight batches drain)."""
    min_gain: float = MIN_GAIN
    """The least gain that counts (0.05: 5 %): a trial is kept when two pairs of windows gain
    3x this beyond the noise, three pairs 2x it, or one confirms a predicted gain (``judge``,
    ``sequential``); below it, a trial is reverted at once."""
    max_trials: int = 6
    """Most knob trials."""
    time_budget_s: float = 300.0
    """No trial starts after this many seconds of tuning."""
    tune_loader: bool = True
    """Run ``tune_dataloader`` against the measured consumption rate when the baseline is
    data-bound, and try its settings first."""
    loader_time_budget_s: float = 15.0
    """Time budget of that loader measurement."""
    max_workers: int | None = None
    """Worker cap (``None``: the probe's CPU budget per device process, which
    ``tune_dataloader`` raises up to 4x when loading mostly waits on reads)."""
    allow_batch_size_change: bool = False
    """Run ``find_batch_size`` before training and apply its batch (changes the optimization;
    off by default); the same as ``"batch_size"`` in ``allow``."""
    allow: Allow = "safe"
    """The knobs beyond the loader's the loop may try: ``"safe"`` (same math), ``"all"``, or a
    tuple of knob names (``knobs.registry.MATH_KNOBS``; the knobs page of the docs has their
    table). Those not allowed stay recommendations in the report."""
    monitor_window_steps: int = 100
    """Window length after tuning (cheap monitoring)."""
    drift_share: float = 0.2
    """After tuning, a window this much slower than the tuned rate is reported."""
    cost_share: float | None = 0.05
    """Tuning may cost at most this share of the fit's expected time at the baseline rate
    (training blocked while the loader is measured alone, windows at slower settings, and the
    steps right after each switch), paid for before it is spent: a short run skips the loader
    measurement and the trials it cannot pay for. ``None``: only
    ``time_budget_s`` bounds tuning. The report gives the net effect."""

    def __post_init__(self) -> None:
        allow: Any = self.allow
        if isinstance(allow, list):  # from a config file: a list is as good as a tuple
            object.__setattr__(self, "allow", tuple(allow))
        resolve_allow(self.allow)  # a bad name fails here, before the fit
        for name, (expected, example) in _NUMBERS.items():
            refuse_bool(name, getattr(self, name), expected, example)
        for name, least in _AT_LEAST.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"`{name}` must be an integer >= {least}, got {value!r}")
        gain = self.min_gain
        if not isinstance(gain, int | float) or not 0 <= gain < 1:
            raise ValueError(
                f"`min_gain` must be a share in [0, 1), got {gain!r}; e.g. 0.05 (a gain under "
                "5 % counts as none)"
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
        return resolve_allow(
            self.allow, batch_size=self.allow_batch_size_change, deterministic=deterministic
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        data = asdict(self)
        if isinstance(self.allow, tuple):
            data["allow"] = list(self.allow)
        return data


DEFAULTS = TuningConfig()
"""Every field at its default: the callback's keyword defaults are read from here."""


def tuning_config(
    config: TuningConfig | None, keywords: dict[str, Any], passed: Collection[str] = ()
) -> TuningConfig:
    """The callback's ``TuningConfig``: ``config`` as given, or one built from ``keywords``.

    Args:
        config: The config object the caller passed, or ``None``.
        keywords: The callback's tuning keywords, each as passed or at its default.
        passed: The names the caller passed explicitly (even at their default values).

    Raises:
        ValueError: When ``config`` is not a ``TuningConfig``, when it comes with tuning
            keywords (which one wins would be a guess, even for a keyword passed at its
            default), or for a bad value.
    """
    if config is None:
        return TuningConfig(**keywords)
    if not isinstance(config, TuningConfig):
        raise ValueError(
            f"`config` must be a TuningConfig or None, got {type(config).__name__}; e.g. "
            "MaxThroughputCallback(config=TuningConfig(max_trials=3))"
        )
    changed = [
        f"{k}={v!r}" for k, v in keywords.items() if k in passed or v != getattr(DEFAULTS, k)
    ]
    if changed:
        raise ValueError(
            f"pass the tuning settings either as `config=` or as keywords, not both: got "
            f"`config=` and {', '.join(changed)}; put them in the config instead, e.g. "
            f"dataclasses.replace(config, {', '.join(changed)})"
        )
    return config
