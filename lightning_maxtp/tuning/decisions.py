"""What the closed loop decides, as plain values: a trial, a stop, a question for its caller.

``TuningLoop.decide`` returns a ``Decision``; a trial window's judgement is a ``Step``
(measure again, or a verdict). Frozen dataclasses with ``to_dict``; no torch, no Lightning.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

from lightning_maxtp.tuning.trials import Verdict

__all__ = [
    "ASK",
    "Ask",
    "AskMath",
    "Decision",
    "MeasureLoader",
    "Remeasure",
    "Step",
    "Stop",
    "Try",
]


@dataclass(frozen=True)
class Try:
    """Start a trial: switch to ``settings`` (one knob's, or the loader plan's several)."""

    knob: str
    settings: dict[str, Any]
    why: str
    expected_gain: float | None = None
    """The gain a measurement of its own predicts (the loader measured alone), or ``None``."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "knob": self.knob,
            "settings": dict(self.settings),
            "why": self.why,
            "expected_gain": self.expected_gain,
        }


@dataclass(frozen=True)
class Stop:
    """Tuning is over, for ``reason``."""

    reason: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {"reason": self.reason}


@dataclass(frozen=True)
class MeasureLoader:
    """The reference is data-bound: measure the loader alone, then decide again.

    The answer is ``decide(plan=...)`` with the trial the measurement proposes, or ``None``.
    """

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {}


@dataclass(frozen=True)
class AskMath:
    """No loader or thread knob is left: find the next allowed math knob, then decide again.

    For the ``kind`` bottleneck; the answer is ``decide(math=...)`` with its trial, or ``None``.
    """

    kind: str
    named: tuple[str, ...] = ()
    """The knobs the top diagnosis recommends by name (a ``named_only`` knob needs to be)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {"kind": self.kind, "named": list(self.named)}


@dataclass(frozen=True)
class Remeasure:
    """A trial window looked like a gain: measure again, with the ``old`` or ``new`` settings."""

    settings: Literal["old", "new"]


Step = Remeasure | Verdict
"""What a trial window decides: measure again, or how the trial ended."""

Decision = Try | Stop | MeasureLoader | AskMath
"""What ``decide`` returns: a trial, the end of tuning, or a question for the caller."""


class Ask(Enum):
    """The one value ``ASK``: a question ``decide`` may put to its caller."""

    ASK = "ask"


ASK = Ask.ASK
"""``decide(plan=ASK)`` / ``decide(math=ASK)``: ask for it when it is needed."""
