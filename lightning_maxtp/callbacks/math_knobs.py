"""The knobs that change how the step computes, switched mid-fit and reversibly, for one fit.

``MathKnobs`` holds one instance of every knob in ``knobs.registry`` (each in its own module,
which says what it changes), bound to the fit's Trainer: it offers a knob (``offer``: the
change to try, or why not), sets either value at once (``set``: the next step runs with it),
keeps what is in force for the report, and puts back what is process-wide or the Trainer's
when the fit ends (``restore``); what was kept on the module and its optimizer stays with them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from lightning_maxtp.knobs.base import ALREADY_ON, FitView, Knob, NotOffered, Offer
from lightning_maxtp.knobs.registry import KNOBS, knob_class

if TYPE_CHECKING:
    import lightning.pytorch as pl

__all__ = ["MathKnobs"]

log = logging.getLogger(__name__)


class MathKnobs:
    """Offers, sets and restores the math knobs of one fit (see the module docstring).

    Args:
        allowed: The knob names the user allowed (``allow.resolve_allow``).
    """

    def __init__(self, allowed: tuple[str, ...]) -> None:
        self.allowed = allowed
        self.trainer: pl.Trainer | None = None
        self.in_force: dict[str, Any] = {}
        """Knobs whose value differs from the fit's start (kept, or a trial's), for the report."""
        self._start: dict[str, Any] = {}
        self._knobs: dict[str, Knob] = {k.name: k() for k in KNOBS}

    def bind(self, trainer: pl.Trainer) -> None:
        """The fit's Trainer (its strategy, module and optimizers are set up)."""
        self.trainer = trainer

    @property
    def _fit(self) -> FitView:
        assert self.trainer is not None
        return FitView(self.trainer)

    def knob(self, name: str) -> Knob:
        """This fit's instance of the knob called ``name``.

        Raises:
            ValueError: For a name that is not a knob's.
        """
        if name not in self._knobs:
            knob_class(name)  # raises, naming the knobs
        return self._knobs[name]

    def current(self, name: str) -> Any:
        """The knob's value now."""
        return self.knob(name).current(self._fit)

    def offer(self, name: str) -> Offer | NotOffered:
        """The change to try, or why the knob cannot be tried on this fit."""
        knob, fit = self.knob(name), self._fit
        if knob.devices is not None and fit.device not in knob.devices:
            return NotOffered(f"{'/'.join(sorted(d.upper() for d in knob.devices))} only", True)
        if name in self.in_force:
            return ALREADY_ON
        return knob.offer(fit)

    def original(self, name: str) -> Any:
        """The knob's value when the fit started (before the first change)."""
        return self._start[name] if name in self._start else self.current(name)

    def set(self, name: str, value: Any) -> None:
        """Switch the knob to ``value`` (the next step runs with it)."""
        if name not in self._start:
            self._start[name] = self.current(name)
        self.knob(name).apply(self._fit, value)
        if value == self._start[name]:
            self.in_force.pop(name, None)
        else:
            self.in_force[name] = value
        log.debug("math knob %s = %r", name, value)

    def restore(self) -> None:
        """The fit ended: process-wide flags and the Trainer's own state back (idempotent)."""
        if self.trainer is None:
            return
        fit = self._fit
        for knob in self._knobs.values():
            knob.restore(fit)
