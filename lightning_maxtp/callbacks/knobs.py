"""What a trial may change in a fit: the loader's knobs, the main process's threads, the math.

The loader's knobs switch through ``SwitchableLoader`` at a batch boundary; the math knobs
(``math_knobs``) at once, when ``allow`` permits them; the main process's intra-op pools
(``knobs.threads``) at once too, and they are put back when the fit ends.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from lightning_maxtp.knobs.registry import KNOBS, MATH_KNOBS
from lightning_maxtp.knobs.threads import THREADS, MainThreads

if TYPE_CHECKING:
    from lightning_maxtp.callbacks.math_knobs import MathKnobs
    from lightning_maxtp.loader.switchable import SwitchableLoader

__all__ = ["THREADS", "Knobs", "MainThreads"]


class Knobs:
    """Reads and requests the settings a trial changes, whichever part of the job holds them.

    Args:
        math: The fit's math knobs (``None``: none allowed).

    Attributes:
        loader: The fit's switchable train loader (``None``: none to switch). Its owner
            replaces it when Lightning reloads the loader mid-fit.
    """

    def __init__(self, math: MathKnobs | None = None) -> None:
        self.loader: SwitchableLoader | None = None
        self.threads = MainThreads()
        self.math = math

    def _loader_settings(self) -> dict[str, Any]:
        return self.loader.settings() if self.loader is not None else {}

    def settings(self) -> dict[str, Any]:
        """The settings in force for the report: the loader's, and the threads once changed."""
        settings = self._loader_settings()
        if self.threads.changed:
            settings[THREADS] = self.threads.current()
        elif self.threads.restored_from is not None:  # in force until the fit ended
            settings[THREADS] = self.threads.restored_from
        if self.math is not None:
            settings.update(self.math.in_force)
        return settings

    def context(self) -> dict[str, Any]:
        """The current values windows are diagnosed with (``JobContext`` fields)."""
        context = {**self._loader_settings(), THREADS: self.threads.current()}
        if self.math is not None and self.math.trainer is not None:
            for knob in KNOBS:
                if knob.context_field is not None:
                    context[knob.context_field] = self.math.current(knob.name)
        return context

    def current(self, keys: Iterable[str]) -> dict[str, Any]:
        """The current values of ``keys`` (loader, threads or math knobs)."""
        now = self.context()
        math = self.math
        return {
            k: math.current(k) if math is not None and k in MATH_KNOBS else now[k] for k in keys
        }

    def request(self, **settings: Any) -> None:
        """Apply ``settings``: threads and math at once, the loader's at its next batch boundary."""
        if self.math is not None:
            for knob in [k for k in settings if k in MATH_KNOBS]:
                self.math.set(knob, settings.pop(knob))
        threads = settings.pop(THREADS, None)
        if threads is not None:
            self.threads.set(int(threads))
        if settings and self.loader is not None:
            self.loader.request(**settings)
