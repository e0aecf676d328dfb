"""The probe, the ground floor: CPUs, memory, ``/dev/shm``, GPUs and who uses them, as plain data.

``inspect_resources()`` reads the machine (``host`` for CPUs, memory, cgroups and disk; ``gpus``
for NVML with ``torch.cuda`` as the fallback; ``schedstat`` for per-thread CPU time and run-queue
wait) and derives the sizing advice every later stage starts from. Nothing here imports another
subpackage, and importing it imports neither torch nor lightning.
"""

from lightning_maxtp.resources.gpus import GpuInfo, GpuProcess
from lightning_maxtp.resources.host import CpuInfo, MemoryInfo
from lightning_maxtp.resources.probe import Advice, BusyGpu, Resources, Versions, inspect_resources

__all__ = [
    "Advice",
    "BusyGpu",
    "CpuInfo",
    "GpuInfo",
    "GpuProcess",
    "MemoryInfo",
    "Resources",
    "Versions",
    "inspect_resources",
]
