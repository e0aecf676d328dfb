"""Watch and judge: windows of measured steps, the bottleneck they show, and the report.

``window`` holds a window of steps as plain data; ``diagnosis`` names its bottleneck from the
``thresholds`` and asks an ``Advisor`` (``recommendation``) what to change, so it names no knob
(the knobs' advisor and the one-argument ``diagnose`` are ``knobs.advisor``); ``sampler`` reads
NVML, the allocator and psutil in the background; ``capture`` reduces a short profiler trace;
``report`` and ``timeline`` write what was found. Pure or standard-library code over
``resources``: importing it imports neither torch nor lightning.
"""

from lightning_maxtp.observe.capture import CAPTURE_MODES, CaptureMode, KernelCapture
from lightning_maxtp.observe.diagnosis import BottleneckKind, Diagnosis
from lightning_maxtp.observe.recommendation import Advisor, Recommendation
from lightning_maxtp.observe.report import KnobChange, ThroughputReport
from lightning_maxtp.observe.window import CaptureSummary, JobContext, SamplerSeries, Window

__all__ = [
    "CAPTURE_MODES",
    "Advisor",
    "BottleneckKind",
    "CaptureMode",
    "CaptureSummary",
    "Diagnosis",
    "JobContext",
    "KernelCapture",
    "KnobChange",
    "Recommendation",
    "SamplerSeries",
    "ThroughputReport",
    "Window",
]
