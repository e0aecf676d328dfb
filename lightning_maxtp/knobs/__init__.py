"""Every knob, one module each behind one ``Knob`` protocol (``base``).

``registry`` lists them: ``KNOBS``, the ones ``allow`` names (the ``allow`` names, the guarded
set, the order per bottleneck and the device-limited set are derived from it), and
``SETTINGS``, the fit's own settings (the train loader's, the main threads': ``setting``),
tried when the diagnosis recommends a value. Each knob reads, offers, applies and restores its
value on a running fit (``base.FitView``); ``callbacks.math_knobs.MathKnobs`` and
``callbacks.knobs.Knobs`` hold one instance of each per fit. ``advice`` and ``advice_loader``
say what to change for each finding of the diagnosis, naming each knob by its class, and
``advisor`` hands them to it (``advisor.diagnose``). Importing it imports neither torch nor
lightning.
"""

from lightning_maxtp.knobs.base import BaseKnob, FitView, Knob, NotOffered, Offer
from lightning_maxtp.knobs.registry import (
    GUARDED,
    KNOBS,
    MATH_KNOBS,
    MATH_ORDER,
    SETTINGS,
    knob_class,
)
from lightning_maxtp.knobs.setting import SettingKnob

__all__ = [
    "GUARDED",
    "KNOBS",
    "MATH_KNOBS",
    "MATH_ORDER",
    "SETTINGS",
    "BaseKnob",
    "FitView",
    "Knob",
    "NotOffered",
    "Offer",
    "SettingKnob",
    "knob_class",
]
