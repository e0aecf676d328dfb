"""What tuning tells the user: the report's notes, its knob changes, and the log's lines.

One object that the Tuner and the math trials both write to, so that neither reports through
the other: the parts below the Tuner never hold it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from lightning_maxtp._log import rank_zero_info
from lightning_maxtp.callbacks.console import Verbosity
from lightning_maxtp.observe.report import KnobChange
from lightning_maxtp.tuning.trials import fmt_settings

__all__ = ["Journal"]

log = logging.getLogger(__name__)


class Journal:
    """The report's notes and knob changes for one fit, and the loop's lines as they happen.

    Args:
        verbosity: Which line of a step is printed (``"steps"``: each in full, ``"brief"``:
            the short one where there is one, ``"quiet"``: none; every one is logged at debug).
        now: Seconds on the fit's timeline (the monitor's clock), for each knob change.
    """

    def __init__(self, verbosity: Verbosity, now: Callable[[], float]) -> None:
        self.verbosity = verbosity
        self._now = now
        self.notes: list[str] = []
        """Caveats for the report, each said once, in order."""
        self.knob_changes: list[KnobChange] = []
        """Every knob change, tried, kept or reverted, with its time."""

    def note(self, text: str) -> None:
        """A caveat for the report (said once)."""
        if text not in self.notes:
            self.notes.append(text)
            self.say(text)

    def drop_notes(self, prefix: str) -> None:
        """Forget the notes starting with ``prefix`` (no longer true)."""
        self.notes[:] = [n for n in self.notes if not n.startswith(prefix)]

    def say(self, text: str, *, brief: str | None = None) -> None:
        """One step of the loop: ``text`` at ``"steps"``, its ``brief`` line (if any) by default."""
        line = {"steps": text, "brief": brief}.get(self.verbosity)
        if line is not None:
            rank_zero_info(line)
        log.debug(text)

    def record_change(self, knob: str, old: Any, new: Any, reason: str) -> None:
        """A knob change for the report, at the fit's time now."""
        self.knob_changes.append(
            KnobChange(self._now(), knob, fmt_settings(old), fmt_settings(new), reason)
        )
