"""What a trial may change in a fit: the fit's own settings and the math, each through its knob.

Every name a trial sets is a knob's (``knobs.registry``): the fit's own settings
(``SETTINGS``: the train loader's, switched at its next batch boundary through
``SwitchableLoader``, and the main process's intra-op pools, at once and put back when the fit
ends) and the math knobs (``math_knobs``, at once, when ``allow`` permits them). ``Knobs``
reads and requests them by asking each knob, never by its name.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from lightning_maxtp.knobs.base import FitView
from lightning_maxtp.knobs.registry import KNOBS, MATH_KNOBS, SETTINGS, knob_class
from lightning_maxtp.knobs.setting import SettingKnob
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
        self._settings: dict[str, SettingKnob] = {k.name: k() for k in SETTINGS}

    @property
    def _fit(self) -> FitView:
        trainer = None if self.math is None else self.math.trainer
        return FitView(trainer, loader=self.loader, threads=self.threads)

    def settings(self) -> dict[str, Any]:
        """The settings in force for the report: the loader's, the threads once changed."""
        fit, settings = self._fit, {}
        for knob in self._settings.values():
            settings.update(knob.reported(fit))
        if self.math is not None:
            settings.update(self.math.in_force)
        return settings

    def context(self) -> dict[str, Any]:
        """The current values windows are diagnosed with (``JobContext`` fields)."""
        fit = self._fit
        context = {
            knob.context_field: knob.current(fit)
            for knob in self._settings.values()
            if knob.context_field is not None and knob.held(fit)
        }
        if self.math is not None and self.math.trainer is not None:
            for math_knob in KNOBS:
                # One chosen before the fit does not change mid-fit: the job context has it.
                if math_knob.context_field is not None and not math_knob.before_fit:
                    context[math_knob.context_field] = self.math.current(math_knob.name)
        return context

    def current(self, keys: Iterable[str]) -> dict[str, Any]:
        """The current values of ``keys`` (the fit's settings or math knobs)."""
        now = self.context()
        math = self.math
        return {
            k: math.current(k) if math is not None and k in MATH_KNOBS else now[k] for k in keys
        }

    def request(self, **settings: Any) -> None:
        """Apply ``settings``: threads and math at once, the loader's at its next batch boundary.

        A loader setting without a switchable loader is dropped: the loop proposes none then.
        """
        fit = self._fit
        for name, value in settings.items():
            knob = self._settings.get(name)
            if knob is None:
                knob_class(name)  # a name no knob has: refused, naming the knobs
                assert self.math is not None, f"{name}: no math knob is allowed in this fit"
                self.math.set(name, value)
            elif knob.held(fit):
                knob.apply(fit, value)

    def restore(self) -> None:
        """The fit ended: put back what is process-wide (the main threads; idempotent)."""
        fit = self._fit
        for knob in self._settings.values():
            knob.restore(fit)
