"""What the diagnosis says to change: ``Recommendation``, and the ``Advisor`` that makes them.

The diagnosis names what limits the steps and measures it; what to change for each finding is
the knobs' to say (``knobs.advice``), so the diagnosis never spells a knob's name: it asks an
``Advisor`` for the recommendations of each finding it names, in the order to try them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lightning_maxtp.observe.window import Window

__all__ = ["Advise", "Advisor", "Recommendation"]


@dataclass(frozen=True)
class Recommendation:
    """One concrete change: ``knob: current -> proposed (reason)``."""

    knob: str
    current: Any
    proposed: Any
    reason: str
    auto_apply: bool
    """True when the library may apply it by itself (same optimization math)."""
    expected_gain: float | None = None
    """The gain the job model (or a measurement of the loader alone) predicts for it (``None``:
    none)."""
    also: tuple[tuple[str, Any], ...] = ()
    """Settings changed with it in the same trial, ``(knob, value)`` each: the workers'
    persistence with their count, when the job model ranks the two together."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "knob": self.knob,
            "current": self.current,
            "proposed": self.proposed,
            "reason": self.reason,
            "auto_apply": self.auto_apply,
            "expected_gain": self.expected_gain,
            "also": dict(self.also),
        }

    def __str__(self) -> str:
        mode = "auto" if self.auto_apply else "opt-in"
        return (
            f"{self.knob}: {_fmt(self.current)} -> {_fmt(self.proposed)} ({self.reason}) [{mode}]"
        )


def _fmt(value: Any) -> str:
    return "?" if value is None else str(value)


Advise = Callable[[Window], Sequence[Recommendation]]
"""The recommendations for one finding, from the window it was named from, in the order to try
them (empty: nothing to change)."""


@dataclass(frozen=True)
class Advisor:
    """The recommendations for each finding of the diagnosis: one function each.

    ``knobs.advisor.ADVICE`` is the knobs' (``knobs.advisor.diagnose`` passes it; so does
    ``lightning_maxtp.diagnose``).
    """

    data_pipeline: Advise
    """The loader cannot keep up: what makes it faster."""
    storage: Advise
    """The loader waits on reads: what puts more in flight or reads less."""
    compute: Advise
    """The device is the limit: what gives the step more of it (none: healthy)."""
    modelled: Advise
    """The job model's change of the loader's workers, first, then what goes with it; empty
    without a model, or when it predicts nothing beats the settings in force."""
    vram: Advise
    """Device memory at the ceiling: what needs less of it."""
    kernel_launch: Advise
    """Many tiny kernels: what makes fewer, larger ones."""
    host_overhead: Advise
    """Gaps between kernels (syncs, copies, collections): what removes them."""
    collections: Advise
    """Python's garbage collector takes a share of the step: what collects less."""
    busy_host: Advise
    """A GPU host's CPUs are busy: what this job can give back."""
    under_occupied: Advise
    """Too little work for the device: what gives it more."""
