"""A small fake of the ``pynvml`` functions the probe calls: the GPU boundary, nothing more."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

GIB = 2**30


class NVMLError(Exception):
    """Stands in for ``pynvml.NVMLError``."""


class NVMLError_NotSupported(NVMLError):
    def __str__(self) -> str:
        return "Not Supported"


@dataclass
class FakeGpu:
    name: str = "NVIDIA H200"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    total_gib: float = 140.0
    used_gib: float = 0.5
    util: int | None = 0
    cc: tuple[int, int] = (9, 0)
    mig: bool | None = False
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    """(pid, used bytes or None)."""
    energy_mj: list[int] | None = None
    """Successive readings of the energy counter (``None``: the device has none)."""


class FakeNvml:
    """Module-like object with the NVML calls ``probe_nvml`` makes."""

    NVMLError = NVMLError

    def __init__(self, gpus: list[FakeGpu], init_error: Exception | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.initialised = False
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.65.06"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 13000

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        return self.gpus[i]

    def nvmlDeviceGetName(self, h: FakeGpu) -> bytes:
        return h.name.encode()  # older pynvml returns bytes; the probe must decode

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return h.uuid

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> Any:
        total, used = int(h.total_gib * GIB), int(h.used_gib * GIB)
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> Any:
        if h.util is None:
            raise NVMLError_NotSupported()
        return SimpleNamespace(gpu=h.util, memory=0)

    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeGpu) -> int:
        if h.energy_mj is None:
            raise NVMLError_NotSupported()
        return h.energy_mj.pop(0)

    def nvmlDeviceGetCudaComputeCapability(self, h: FakeGpu) -> tuple[int, int]:
        return h.cc

    def nvmlDeviceGetMigMode(self, h: FakeGpu) -> tuple[int, int]:
        if h.mig is None:
            raise NVMLError_NotSupported()
        return (int(h.mig), int(h.mig))

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeGpu) -> list[Any]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in h.processes]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: FakeGpu) -> list[Any]:
        return []


FOREIGN_PID = 4_190_000
"""Above any pid this machine hands out: a process NVML lists that names no process here, as
the host's PIDs do seen from a container (``tests.helpers.foreign`` gives a visible one)."""


def fake_machine(
    gpus: int = 0, *, busy: tuple[int, ...] = (), total_gib: float = 80.0, ram_gib: float = 512.0
) -> Any:
    """The real host probe with fake GPUs (80 GiB, 0.5 GiB used) and a chosen amount of RAM.

    A GPU in ``busy`` has 20 GiB used by a foreign process (``foreign.foreign_pid()``).
    """
    import dataclasses

    from lightning_maxtp.resources import inspect_resources
    from tests.helpers.foreign import foreign_pid

    fakes = [
        FakeGpu(
            uuid=f"GPU-{i:08x}-aaaa-bbbb-cccc-dddddddddddd", total_gib=total_gib,
            used_gib=20.5 if i in busy else 0.5,
            processes=[(foreign_pid(), 20 * GIB)] if i in busy else [],
        )
        for i in range(gpus)
    ]  # fmt: skip
    res = inspect_resources(nvml=FakeNvml(fakes))
    memory = dataclasses.replace(
        res.memory, available_bytes=int(ram_gib * GIB), cgroup_limit_bytes=None
    )
    return dataclasses.replace(res, memory=memory)
