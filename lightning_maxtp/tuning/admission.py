"""Whether a trial or a measurement may start: a budget on expected loss, not on time spent.

Two rules, either one admits (pure, plain numbers):

* **budget**: its worst case (what it costs before a window can revert it) fits what is left
  of the tuning budget;
* **predicted**: the job model predicts a net gain over the rest of the fit at least
  ``PREDICTED_NET_FACTOR`` times that worst case, and the evidence for the prediction is
  strong (the step waits for data above ``DATA_WAIT_SHARE_STRONG`` and the loader's cost was
  measured). A short data-bound job whose budget cannot pay for one worker start still gets
  the workers that halve its time, and the report says which rule let the trial start.

Net wall-clock stays the final judge: the report's net line shows what the fit took against
its length at the baseline rate. ``affordable`` applies these rules to one fit's numbers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

__all__ = ["PREDICTED_NET_FACTOR", "Admission", "admit"]

PREDICTED_NET_FACTOR = 3.0
"""A predicted net gain must be this many times the worst case to start past the budget: the
prediction may be off by half and the trial still pays for itself twice over."""


@dataclass(frozen=True)
class Admission:
    """Which rule let a trial (or a measurement) start, with the numbers it compared."""

    rule: Literal["budget", "predicted"]
    risk_s: float
    """Its worst case before a window can revert it, seconds."""
    left_s: float
    """Budget left when it started, seconds (``inf``: no budget)."""
    net_s: float | None = None
    """The net gain predicted over the rest of the fit, seconds (``predicted`` only)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        data = asdict(self)
        data["left_s"] = None if self.left_s == float("inf") else self.left_s
        return data

    def __str__(self) -> str:
        if self.rule == "budget":
            return f"within the budget ({self.risk_s:.2f} s at worst, {self.left_s:.2f} s left)"
        return (
            f"past the budget on a strong prediction: {self.net_s or 0:.1f} s predicted net "
            f"gain against {self.risk_s:.2f} s at worst ({max(0.0, self.left_s):.2f} s of "
            "budget left)"
        )


def admit(
    risk_s: float,
    left_s: float,
    *,
    expected_gain: float | None = None,
    rest_s: float | None = None,
    strong: bool = False,
) -> Admission | None:
    """The rule that lets a trial costing ``risk_s`` at worst start, or ``None``.

    Args:
        risk_s: Its worst case before a window can revert it, seconds.
        left_s: The tuning budget left, seconds (``inf`` without one).
        expected_gain: The job model's predicted gain in samples/s (0.8: 1.8x), if any.
        rest_s: The rest of the fit at the rate now, seconds (``None``: unknown length).
        strong: Whether the evidence behind the prediction is strong (see the module).
    """
    if left_s >= risk_s:
        return Admission("budget", risk_s, left_s)
    if expected_gain is None or expected_gain <= 0 or rest_s is None or not strong:
        return None
    net = rest_s * expected_gain / (1 + expected_gain) - risk_s
    if net >= PREDICTED_NET_FACTOR * risk_s:
        return Admission("predicted", risk_s, left_s, net)
    return None
