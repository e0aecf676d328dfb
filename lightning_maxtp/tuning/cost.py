"""What tuning costs the fit, and the net effect on its wall-clock (pure, plain data).

Tuning is worth it only when the run gets back more than tuning spends. Two things cost:
*blocked* time, when training waits (the DataLoader measured alone), and *lost* time, windows
run at settings slower than the better of the two being compared (a reverted trial's windows,
the original settings measured again before a kept change). Both are bounded by a share of the
fit's expected time at the baseline rate (``trainer.estimated_stepping_batches`` times the
baseline window's step time); a run too short to pay back a costly step skips it. At the end
the fit's wall-clock is set against the estimate at the baseline rate: the net effect.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning_maxtp.observe.window import Window

__all__ = ["TuningCost", "capped_s", "lost_s"]


def capped_s(window: Window) -> float:
    """A window's time as the loop counts it (``Window.fit_samples_per_s``).

    A stall capped, each epoch's cost between steps included.
    """
    rate = window.fit_samples_per_s
    return sum(window.samples) / rate if rate > 0 else 0.0


def lost_s(windows: list[Window], better_rate: float) -> float:
    """Seconds ``windows`` took beyond what ``better_rate`` would have needed for their samples."""
    if better_rate <= 0:
        return 0.0
    return sum(max(0.0, capped_s(w) - sum(w.samples) / better_rate) for w in windows)


@dataclass(frozen=True)
class TuningCost:
    """What tuning cost, the budget it had, and the fit's wall-clock against the estimate."""

    blocked_s: float = 0.0
    """Training waited this long (the loader measured alone)."""
    lost_s: float = 0.0
    """Windows at the slower of two compared settings took this much longer."""
    switch_s: float = 0.0
    """The settle steps right after each switch took this much longer than steps at the
    reference rate (workers restarting, ``torch.compile`` compiling); no window counts them."""
    budget_s: float | None = None
    """What tuning may cost (``cost_share`` of the expected fit; ``None``: no share limit)."""
    step_s: float | None = None
    """The baseline window's mean step time, seconds."""
    batches: float | None = None
    """Training batches the fit was expected to run (``inf``: unknown length)."""
    fit_s: float | None = None
    """The measured training steps' time from the baseline window on (when the fit ended): the
    warm-up before runs the same with or without tuning, and validation is not a step."""
    steps_run: int = 0
    """Training steps measured from the baseline window on (when the fit ended)."""
    earned_s: float = 0.0
    """What the changes kept so far have already saved (steps run at the faster rate since):
    tuning may spend that on top of its budget, never savings only expected."""

    @property
    def cost_s(self) -> float:
        """Blocked, lost and switch seconds."""
        return self.blocked_s + self.lost_s + self.switch_s

    @property
    def expected_fit_s(self) -> float | None:
        """The whole fit at the baseline rate (``None`` when its length is unknown)."""
        if self.step_s is None or self.batches is None or not math.isfinite(self.batches):
            return None
        return self.step_s * self.batches

    @property
    def left_s(self) -> float:
        """Budget not yet spent (``inf`` without a budget)."""
        return math.inf if self.budget_s is None else self.budget_s + self.earned_s - self.cost_s

    def remaining_s(self, steps_done: int) -> float | None:
        """The rest of the fit at the baseline rate (``None`` when its length is unknown)."""
        if self.step_s is None or self.batches is None or not math.isfinite(self.batches):
            return None
        return max(0.0, self.batches - steps_done) * self.step_s

    def with_earnings(
        self, steps_since: int, baseline_rate: float, rate_now: float, banked_steps: float = 0.0
    ) -> TuningCost:
        """With what ``steps_since`` steps at ``rate_now`` saved against ``baseline_rate``.

        ``banked_steps``: baseline steps saved earlier, at the settings kept before these.
        """
        if self.step_s is None or baseline_rate <= 0:
            return replace(self, earned_s=0.0)
        share = max(0.0, 1 - baseline_rate / rate_now) if rate_now > 0 else 0.0
        return replace(self, earned_s=(steps_since * share + banked_steps) * self.step_s)

    @property
    def over_s(self) -> float:
        """How far the cost went past the budget and the earnings (0: within them)."""
        if self.budget_s is None:
            return 0.0
        return max(0.0, self.cost_s - self.budget_s - self.earned_s)

    @property
    def net(self) -> float | None:
        """The fit's wall-clock over what its steps take at the baseline rate (< 1: faster)."""
        if self.fit_s is None or self.step_s is None or self.steps_run <= 0:
            return None
        return self.fit_s / (self.step_s * self.steps_run)

    def budgeted(self, baseline: Window, batches: float, share: float | None) -> TuningCost:
        """With the baseline's step time, the fit's expected batches and the budget they give."""
        step = baseline.total_s / baseline.steps if baseline.steps else None
        cost = replace(self, step_s=step, batches=batches)
        expected = cost.expected_fit_s
        return replace(
            cost, budget_s=None if share is None or expected is None else share * expected
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view, with the derived numbers."""
        data = asdict(self)
        data["batches"] = (
            self.batches if self.batches is None or math.isfinite(self.batches) else None
        )
        return {
            **data,
            "cost_s": self.cost_s,
            "expected_fit_s": self.expected_fit_s,
            "net": self.net,
            "over_s": self.over_s,
        }

    def __str__(self) -> str:
        budget = ""
        if self.budget_s is not None and self.expected_fit_s is not None:
            budget = (
                f" of a {self.budget_s:.1f} s budget (expected fit {self.expected_fit_s:.1f} s)"
            )
            if self.earned_s > 0:
                budget += f" + {self.earned_s:.1f} s already saved by the changes kept"
            if self.over_s > 0.05:
                budget += f" (OVER BUDGET by {self.over_s:.1f} s)"
        text = (
            f"cost: {self.cost_s:.1f} s{budget}: training blocked {self.blocked_s:.1f} s, "
            f"{self.lost_s:.1f} s lost in slower windows"
        )
        if self.switch_s > 0:
            text += f", {self.switch_s:.1f} s switching (workers restarting, compiling)"
        if self.net is not None and self.fit_s is not None and self.step_s is not None:
            at_baseline = self.step_s * self.steps_run
            text += (
                f"; net: the fit's {self.steps_run} steps took {self.fit_s:.1f} s, "
                f"{self.net:.2f}x the {at_baseline:.1f} s at the baseline rate"
            )
        return text
