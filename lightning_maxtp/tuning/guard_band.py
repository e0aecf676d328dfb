"""The numerics guard's verdict on a window's losses, as plain numbers (pure).

A trial's window fails when a loss is not finite, a parameter is not finite after it, or its
median loss leaves the reference's band: above the median loss of the last window under the
reference settings by more than ``BAND_SPREADS`` times that window's spread (the median absolute
deviation scaled to a standard deviation, 1.4826 x MAD) or ``BAND_SHARE`` of its median,
whichever is larger. ``callbacks.guard.NumericsGuard`` snapshots, collects the losses and
restores; this module only judges them.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["BAND_SHARE", "BAND_SPREADS", "GuardCheck", "loss_band"]

BAND_SPREADS = 4.0
"""A trial's median loss may exceed the reference's by this many of its spreads."""
BAND_SHARE = 0.1
"""... or by this share of the reference's median loss, whichever allows more."""
_MAD_TO_SD = 1.4826


@dataclass(frozen=True)
class GuardCheck:
    """The guard's numbers for one trial window."""

    passed: bool
    reason: str
    steps: int
    """Losses the window gave."""
    non_finite: int = 0
    """Losses that were NaN or infinite (``-1``: a parameter was)."""
    reference_loss: float | None = None
    """Median loss of the last window under the reference settings."""
    trial_loss: float | None = None
    """Median loss of this window."""
    limit: float | None = None
    """The band's upper edge."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return asdict(self)

    def __str__(self) -> str:
        if self.trial_loss is None or self.reference_loss is None or self.limit is None:
            return f"guard {'passed' if self.passed else 'FAILED'}: {self.reason}"
        return (
            f"guard {'passed' if self.passed else 'FAILED'}: median loss {self.trial_loss:.4g} vs "
            f"{self.reference_loss:.4g} (band up to {self.limit:.4g}); {self.reason}"
        )


def loss_band(
    reference: list[float], trial: list[float], *, params_finite: bool = True
) -> GuardCheck:
    """Whether a trial window's losses stay finite and in the reference's band (pure)."""
    bad = sum(not math.isfinite(x) for x in trial)
    if bad:
        return GuardCheck(False, f"{bad} of {len(trial)} losses not finite", len(trial), bad)
    if not params_finite:
        return GuardCheck(False, "a parameter is not finite", len(trial), -1)
    ref = [x for x in reference if math.isfinite(x)]
    if len(ref) < 2 or not trial:
        return GuardCheck(True, "finite (too few losses for the band)", len(trial))
    middle = statistics.median(ref)
    spread = _MAD_TO_SD * statistics.median(abs(x - middle) for x in ref)
    limit = middle + max(BAND_SPREADS * spread, BAND_SHARE * abs(middle), 1e-8)
    now = statistics.median(trial)
    passed = now <= limit
    reason = "finite, in the band" if passed else "the loss rose out of the band"
    return GuardCheck(passed, reason, len(trial), 0, middle, now, limit)
