"""The Lightning callbacks: the step clock, ``BottleneckMonitor`` and ``MaxThroughputCallback``.

``step_clock`` measures each training step and closes windows; ``bottleneck_monitor`` owns a
clock and diagnoses each window; ``max_throughput`` owns a monitor and a ``tuner``, which
carries out on the running fit what the closed loop decides (``lightning_maxtp.tuning``,
pure): the loader plan's trial (``loader_trial``), the math knobs' trials and their numerics
guard (``math_trial``, ``math_knobs``, ``guard``), the loader, thread and math settings
(``knobs``). ``context`` reads the Trainer's settings. This is the only subpackage that imports
lightning at import time, and only the top level imports it.
"""

from lightning_maxtp.callbacks.bottleneck_monitor import BottleneckMonitor
from lightning_maxtp.callbacks.max_throughput import MaxThroughputCallback
from lightning_maxtp.callbacks.step_clock import StepClock
from lightning_maxtp.tuning.config import TuningConfig
from lightning_maxtp.tuning.trials import KnobTrial, TuningSummary

__all__ = [
    "BottleneckMonitor",
    "KnobTrial",
    "MaxThroughputCallback",
    "StepClock",
    "TuningConfig",
    "TuningSummary",
]
