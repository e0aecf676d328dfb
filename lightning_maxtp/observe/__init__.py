"""Watch and judge: windows of measured steps, the bottleneck they show, and the report.

``window`` holds a window of steps as plain data; ``diagnose`` names its bottleneck from the
``thresholds`` with concrete ``recommend``-ations; ``sampler`` reads NVML, the allocator and
psutil in the background; ``capture`` reduces a short profiler trace; ``report`` and
``timeline`` write what was found; ``triage`` does the same for any running process. Pure or
standard-library code over ``resources``: importing it imports neither torch nor lightning.
"""

from lightning_maxtp.observe.capture import CAPTURE_MODES, CaptureMode, KernelCapture
from lightning_maxtp.observe.diagnosis import BottleneckKind, Diagnosis, Recommendation, diagnose
from lightning_maxtp.observe.report import KnobChange, ThroughputReport
from lightning_maxtp.observe.triage import TriageResult, triage
from lightning_maxtp.observe.window import CaptureSummary, JobContext, SamplerSeries, Window

__all__ = [
    "CAPTURE_MODES",
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
    "TriageResult",
    "Window",
    "diagnose",
    "triage",
]
