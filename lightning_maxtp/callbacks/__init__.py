"""The Lightning callbacks: the step clock, ``BottleneckMonitor`` and ``MaxThroughputCallback``.

``step_clock`` measures each training step and closes windows; ``bottleneck_monitor`` owns a
clock and diagnoses each window; ``max_throughput`` owns a monitor and runs the closed loop,
whose decisions live in ``tuning_loop`` and ``trials`` (pure), with ``loader_step`` running
``tune_dataloader`` for it, ``context`` reading the Trainer's settings and ``arguments``
checking what the user passed. This is the only subpackage that imports lightning at import
time, and only the top level imports it.
"""

from lightning_maxtp.callbacks.bottleneck_monitor import BottleneckMonitor
from lightning_maxtp.callbacks.config import TuningConfig
from lightning_maxtp.callbacks.max_throughput import MaxThroughputCallback
from lightning_maxtp.callbacks.step_clock import StepClock
from lightning_maxtp.callbacks.trials import KnobTrial, TuningSummary

__all__ = [
    "BottleneckMonitor",
    "KnobTrial",
    "MaxThroughputCallback",
    "StepClock",
    "TuningConfig",
    "TuningSummary",
]
