"""GPU side of the resource probe: NVML first, ``torch.cuda`` as the fallback.

NVML is reached through a module-like object (``pynvml`` in production, a small fake in tests),
so every call that can fail is wrapped: an unsupported field (MIG, vGPU, older drivers) becomes a
note on that GPU, never a traceback. ``CUDA_VISIBLE_DEVICES`` is applied the way the CUDA runtime
applies it, so indices here are the ordinals ``torch.cuda`` will use in this process.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psutil

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuProcess:
    """A process holding a context on a GPU."""

    pid: int
    used_memory_bytes: int | None
    username: str | None
    """Owner, when the pid is visible from here (not in another PID namespace)."""
    name: str | None
    own: bool
    """True for this process, its parents and its children: our own job, not someone else's."""
    visible: bool = True
    """Whether the pid names a process here. NVML reports PIDs as the host numbers them: in a
    container (another PID namespace) none of them is a process here, its own included, so
    such a process is neither ours nor someone else's by its pid; its memory decides."""


@dataclass(frozen=True)
class GpuInfo:
    """One GPU visible to this process."""

    index: int
    """CUDA ordinal in this process (after ``CUDA_VISIBLE_DEVICES``)."""
    physical_index: int | None
    """NVML index on the machine (``nvidia-smi`` numbering); ``None`` from the torch fallback."""
    name: str | None
    uuid: str | None
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    memory_free_bytes: int | None
    utilization_percent: int | None
    compute_capability: str | None
    mig_enabled: bool | None
    processes: tuple[GpuProcess, ...] | None
    """``None`` when the process list could not be read (the notes say why)."""
    notes: tuple[str, ...] = ()
    torch_reserved_bytes: int | None = None
    """What this process's torch holds on it (its caching allocator), read when CUDA was
    already initialised here: this job's own memory when NVML's PIDs cannot be matched."""

    @property
    def foreign_processes(self) -> tuple[GpuProcess, ...]:
        """Processes on this GPU that are visible here and not part of this job."""
        return tuple(p for p in self.processes or () if p.visible and not p.own)

    @property
    def unseen_processes(self) -> tuple[GpuProcess, ...]:
        """Processes NVML lists whose PIDs name no process here (another PID namespace)."""
        return tuple(p for p in self.processes or () if not p.visible)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        data = dataclasses.asdict(self)
        data["notes"] = list(self.notes)
        data["foreign_process_count"] = len(self.foreign_processes)
        return data


@dataclass(frozen=True)
class GpuProbe:
    """What the GPU probe found: the visible GPUs, where the numbers came from, and notes."""

    gpus: tuple[GpuInfo, ...]
    backend: str
    """``"nvml"``, ``"torch"`` or ``"none"``."""
    driver_version: str | None
    cuda_driver_version: str | None
    notes: tuple[str, ...]


def parse_visible_devices(
    value: str | None, physical: Sequence[tuple[int, str | None]]
) -> tuple[list[int], list[str]]:
    """Apply ``CUDA_VISIBLE_DEVICES`` to the machine's GPUs, as the CUDA runtime does.

    Entries are indices or (prefixes of) ``GPU-`` UUIDs. CUDA stops at the first entry it cannot
    use, so later entries are hidden too; this returns the same list plus a note naming the entry.

    Args:
        value: The variable's value; ``None`` when unset (all GPUs visible).
        physical: ``(nvml index, uuid)`` of every GPU on the machine.

    Returns:
        The visible GPUs' NVML indices in CUDA ordinal order, and notes for the user.
    """
    all_indices = [idx for idx, _ in physical]
    if value is None:
        return all_indices, []
    if value.strip() == "":
        return [], ["CUDA_VISIBLE_DEVICES is set but empty: no GPU is visible to this process"]
    visible: list[int] = []
    notes: list[str] = []
    for entry in (e.strip() for e in value.split(",")):
        idx, problem = _resolve_visible_entry(entry, physical)
        if problem is None and idx in visible:
            problem = "lists the same GPU twice"
        if problem is not None or idx is None:
            notes.append(
                f"CUDA_VISIBLE_DEVICES={value!r}: entry {entry!r} {problem}; CUDA ignores it and "
                f"every entry after it, so the visible GPUs are {visible}. Fix: list GPU indices "
                "such as '0,1' or UUIDs from `nvidia-smi -L`"
            )
            break
        visible.append(idx)
    return visible, notes


def child_visible_id(ordinal: int, value: str | None) -> str:
    """What a child process's ``CUDA_VISIBLE_DEVICES`` must say to see this process's GPU.

    ``ordinal`` is a CUDA ordinal here, after this process's own ``CUDA_VISIBLE_DEVICES``
    (``value``; ``None`` when unset): with ``"3,5"`` ordinal 1 is entry ``"5"``, with UUIDs the
    UUID. Entries before a visible ordinal are valid ones (CUDA stops at the first it cannot
    use), so the entry at the ordinal is the GPU.
    """
    entries = [e.strip() for e in value.split(",")] if value and value.strip() else []
    return entries[ordinal] if 0 <= ordinal < len(entries) else str(ordinal)


def _resolve_visible_entry(
    entry: str, physical: Sequence[tuple[int, str | None]]
) -> tuple[int | None, str | None]:
    """One ``CUDA_VISIBLE_DEVICES`` entry -> ``(nvml index, None)`` or ``(None, problem)``."""
    if entry.lstrip("-").isdigit():
        idx = int(entry)
        if idx < 0:
            return None, "is negative (CUDA treats it as the end of the list)"
        indices = [i for i, _ in physical]
        if idx not in indices:
            return None, f"is not a GPU index on this machine (GPUs: {indices})"
        return idx, None
    if entry.upper().startswith("GPU-"):
        matches = [i for i, uuid in physical if uuid and uuid.lower().startswith(entry.lower())]
        if len(matches) == 1:
            return matches[0], None
        return None, "matches no GPU UUID" if not matches else "matches several GPU UUIDs"
    if entry.upper().startswith("MIG-"):
        return None, "is a MIG instance, which this probe does not resolve to its parent GPU"
    return None, "is neither a GPU index nor a GPU UUID"


def _own_pids() -> set[int]:
    me = psutil.Process()
    pids = {me.pid}
    try:
        pids |= {p.pid for p in me.parents()}
        pids |= {p.pid for p in me.children(recursive=True)}
    except psutil.Error:
        pass
    return pids


def _describe_process(pid: int, used: int | None, own_pids: set[int]) -> GpuProcess:
    username = name = None
    visible = True
    try:
        proc = psutil.Process(pid)
        username, name = proc.username(), proc.name()
    except psutil.NoSuchProcess:
        visible = False  # another PID namespace (a container), or gone already
    except psutil.Error:
        pass  # another user's: visible, its owner unreadable
    return GpuProcess(pid, used, username, name, pid in own_pids, visible)


def _torch_reserved(ordinal: int) -> int | None:
    """This process's torch allocator on CUDA ``ordinal``, when CUDA is initialised already.

    Never imports torch or initialises CUDA for it: a probe must not create a context.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_initialized():
            return None
        return int(torch.cuda.memory_reserved(ordinal))
    except (RuntimeError, AssertionError, ValueError) as error:
        log.debug("torch's reserved memory on cuda:%d unreadable: %s", ordinal, error)
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def probe_nvml(nvml: Any, visible_env: str | None) -> GpuProbe:
    """Probe GPUs through an NVML module (``pynvml`` or a test fake with the same functions).

    Raises:
        Exception: Whatever ``nvml.nvmlInit()`` raises when NVML cannot start; the caller turns
            an NVML error into a note and falls back to torch.
    """
    nvml.nvmlInit()
    shutdown: list[str] = []
    try:
        notes: list[str] = []
        driver = _read(notes, "driver version", nvml.nvmlSystemGetDriverVersion)
        cuda = _read(notes, "CUDA driver version", nvml.nvmlSystemGetCudaDriverVersion)
        cuda_text = f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        uuids = [_read([], "uuid", nvml.nvmlDeviceGetUUID, h) for h in handles]
        uuids = [None if u is None else _text(u) for u in uuids]
        visible, visible_notes = parse_visible_devices(visible_env, list(enumerate(uuids)))
        notes += visible_notes
        own = _own_pids()
        gpus = [
            _nvml_gpu(nvml, handles[phys], ordinal=ordinal, phys=phys, uuid=uuids[phys], own=own)
            for ordinal, phys in enumerate(visible)
        ]
    finally:  # a failed shutdown does not hide the result: it is one more note
        _read(shutdown, "NVML shutdown", nvml.nvmlShutdown)
    return GpuProbe(
        tuple(gpus),
        "nvml",
        None if driver is None else _text(driver),
        cuda_text,
        (*notes, *shutdown),
    )


def _nvml_errors(nvml: Any) -> tuple[type[Exception], ...]:
    """What an NVML module raises when NVML cannot start or answer.

    Its ``NVMLError``, and ``OSError`` for a library that cannot be loaded (for a module-like
    object without ``NVMLError``: any ``Exception``). Anything else is a bug, and is raised.
    """
    return (getattr(nvml, "NVMLError", Exception), OSError)


def _read(sink: list[str], label: str, fn: Callable[..., T], *args: Any) -> T | None:
    """Call one NVML function; an error (NotSupported, NoPermission, MIG...) becomes a note."""
    try:
        return fn(*args)
    except Exception as err:
        sink.append(f"{label}: {type(err).__name__}: {err}")
        return None


def _nvml_gpu(
    nvml: Any, h: Any, *, ordinal: int, phys: int, uuid: str | None, own: set[int]
) -> GpuInfo:
    notes: list[str] = []
    mem = _read(notes, "memory", nvml.nvmlDeviceGetMemoryInfo, h)
    util = _read(notes, "utilization", nvml.nvmlDeviceGetUtilizationRates, h)
    cc = _read(notes, "compute capability", nvml.nvmlDeviceGetCudaComputeCapability, h)
    mig = _read(notes, "MIG mode", nvml.nvmlDeviceGetMigMode, h)
    name = _read(notes, "name", nvml.nvmlDeviceGetName, h)
    return GpuInfo(
        index=ordinal,
        physical_index=phys,
        name=None if name is None else _text(name),
        uuid=uuid,
        memory_total_bytes=int(mem.total) if mem else None,
        memory_used_bytes=int(mem.used) if mem else None,
        memory_free_bytes=int(mem.free) if mem else None,
        utilization_percent=int(util.gpu) if util else None,
        compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
        mig_enabled=bool(mig[0]) if mig else None,
        processes=_read(notes, "processes", _nvml_processes, nvml, h, own),
        notes=tuple(notes),
        torch_reserved_bytes=_torch_reserved(ordinal),
    )


def _nvml_processes(nvml: Any, handle: Any, own: set[int]) -> tuple[GpuProcess, ...]:
    seen: dict[int, GpuProcess] = {}
    getters = [nvml.nvmlDeviceGetComputeRunningProcesses]
    if hasattr(nvml, "nvmlDeviceGetGraphicsRunningProcesses"):
        getters.append(nvml.nvmlDeviceGetGraphicsRunningProcesses)
    for getter in getters:
        for proc in getter(handle):
            used = getattr(proc, "usedGpuMemory", None)
            used = int(used) if isinstance(used, int) and used >= 0 else None
            if proc.pid not in seen:
                seen[proc.pid] = _describe_process(int(proc.pid), used, own)
    return tuple(seen.values())


def has_gpu_driver() -> bool:
    """Whether any GPU driver device node exists, so importing torch to look is worth it."""
    return Path("/proc/driver/nvidia").exists() or Path("/dev/kfd").exists()


def probe_torch(reason: str) -> GpuProbe:
    """Fallback when NVML is unavailable: ``torch.cuda`` (no utilization, no process list).

    Args:
        reason: Why NVML could not be used; kept as the first note.
    """
    notes = [f"NVML not available: {reason}"]
    if not has_gpu_driver():
        notes.append("no GPU driver found (/proc/driver/nvidia, /dev/kfd): torch fallback skipped")
        return GpuProbe((), "none", None, None, tuple(notes))
    try:
        import torch
    except ImportError as err:
        notes.append(f"torch fallback unavailable: {err}")
        return GpuProbe((), "none", None, None, tuple(notes))
    if not torch.cuda.is_available():
        notes.append("torch.cuda.is_available() is False")
        return GpuProbe((), "none", None, None, tuple(notes))
    gpus = []
    missing = ("utilization and GPU processes need NVML",)
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        # mem_get_info creates a CUDA context on the device (a few hundred MiB while we run).
        free, total = torch.cuda.mem_get_info(i)
        uuid = getattr(props, "uuid", None)
        gpus.append(
            GpuInfo(
                i,
                None,
                props.name,
                f"GPU-{uuid}" if uuid else None,
                total,
                total - free,
                free,
                None,
                f"{props.major}.{props.minor}",
                None,
                None,
                missing,
            )
        )
    return GpuProbe(tuple(gpus), "torch", None, torch.version.cuda, tuple(notes))


def probe_gpus(nvml: Any = None) -> GpuProbe:
    """Probe the GPUs this process can see: NVML, else ``torch.cuda``, else none (with notes).

    Args:
        nvml: An NVML module; ``None`` imports ``pynvml`` (from ``nvidia-ml-py``).
    """
    visible_env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if nvml is None:
        try:
            import pynvml

            nvml = pynvml
        except ImportError as err:
            return probe_torch(f"pynvml is not installed ({err}); pip install nvidia-ml-py")
    try:
        return probe_nvml(nvml, visible_env)
    except _nvml_errors(nvml) as err:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return probe_torch(f"{type(err).__name__}: {err}")
