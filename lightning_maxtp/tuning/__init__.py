"""The closed loop's decisions, pure: no torch, no lightning.

``tuning_loop`` is the loop's state machine (warm-up, baseline, one trial at a time, monitor),
``judge`` decides a trial from paired windows, ``cost`` accounts for what tuning costs the fit,
``trials`` holds the trial records and chooses the next loader change, ``config`` is the one
``TuningConfig``, ``allow`` resolves which knobs a fit may try, ``carry`` decides whether
settings tuned before apply again, and ``guard_band`` judges a window's losses for the numerics
guard. ``callbacks`` carries out what they decide on a running fit.
"""

from lightning_maxtp.tuning.config import TuningConfig
from lightning_maxtp.tuning.trials import KnobTrial, TuningSummary

__all__ = ["KnobTrial", "TuningConfig", "TuningSummary"]
