"""The knobs beyond the loader's, one module each behind one ``Knob`` protocol (``base``).

``registry`` lists them; the ``allow`` names, the guarded set, the order per bottleneck and the
device-limited set are derived from it. Each knob reads, offers, applies and restores its value
on a running fit (``base.FitView``); ``callbacks.math_knobs.MathKnobs`` holds one instance of
each per fit. Importing it imports neither torch nor lightning.
"""

from lightning_maxtp.knobs.base import BaseKnob, FitView, Knob, NotOffered, Offer
from lightning_maxtp.knobs.registry import GUARDED, KNOBS, MATH_KNOBS, MATH_ORDER, knob_class

__all__ = [
    "GUARDED",
    "KNOBS",
    "MATH_KNOBS",
    "MATH_ORDER",
    "BaseKnob",
    "FitView",
    "Knob",
    "NotOffered",
    "Offer",
    "knob_class",
]
