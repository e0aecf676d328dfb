"""The resource probe: ``inspect_resources() -> Resources``.

Never assume "1 GPU, 4 cores": read the numbers and size everything from them. ``Resources``
holds what was read (CPUs, memory, GPUs, versions) and derived advice as plain data: which GPUs
are free, how many CPU workers each device process may start, and how many copies of a model fit
on each free GPU. It imports neither torch nor lightning unless NVML is missing and a GPU driver
is present, so ``maxtp inspect`` answers quickly. ``format_resources`` (``str(resources)``) is
the table ``maxtp inspect`` prints.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import platform
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_maxtp._units import GIB, format_bytes
from lightning_maxtp._units import format_bytes as size
from lightning_maxtp.resources.gpus import GpuInfo, GpuProcess, probe_gpus
from lightning_maxtp.resources.host import CpuInfo, MemoryInfo, probe_cpus, probe_memory

__all__ = [
    "CpuInfo",
    "GpuInfo",
    "GpuProcess",
    "MemoryInfo",
    "Resources",
    "format_resources",
    "inspect_resources",
    "worker_ceiling",
    "workers_per_process",
]

FREE_GPU_MAX_USED_FRACTION = 0.05
"""A GPU with more than this share of its memory in use is not "free", even without processes
(other containers' processes are invisible to NVML's process list but their memory is not)."""
DEFAULT_HEADROOM_BYTES = int(2.5 * GIB)
"""Memory kept free on a GPU when counting model copies (the seeds' 2-3 GiB rule)."""


@dataclass(frozen=True)
class BusyGpu:
    """A GPU left out of the free list, and why."""

    index: int
    reason: str


@dataclass(frozen=True)
class Advice:
    """Sizing derived from the probe (plain data; see ``Resources.workers_per_gpu`` for models)."""

    free_gpus: tuple[int, ...]
    """CUDA ordinals of GPUs with no foreign process and little memory in use."""
    busy_gpus: tuple[BusyGpu, ...]
    device_processes: int
    """Processes the job would start on this node: one per free GPU, or one on a CPU-only host."""
    cpu_workers_per_process: int
    """DataLoader workers each device process may start: (CPUs - one main thread per process)
    divided among the processes. 0 means load data in the main process."""


@dataclass(frozen=True)
class Versions:
    """Software versions that decide what the library may do."""

    python: str
    torch: str | None
    torch_cuda: str | None
    """CUDA version torch was built with (``torch.version.cuda``), read without importing torch."""
    lightning: str | None
    driver: str | None
    cuda_driver: str | None
    """Highest CUDA version the driver supports."""


@dataclass(frozen=True)
class Resources:
    """What this machine offers to this process, as read by ``inspect_resources``."""

    hostname: str
    platform: str
    cpu: CpuInfo
    memory: MemoryInfo
    gpus: tuple[GpuInfo, ...]
    gpu_backend: str
    """Where GPU numbers came from: ``"nvml"``, ``"torch"`` or ``"none"``."""
    cuda_visible_devices: str | None
    versions: Versions
    advice: Advice
    notes: tuple[str, ...] = field(default=())
    """Machine-level notes: what could not be read, and why."""

    def workers_per_gpu(
        self,
        model_bytes: int,
        *,
        headroom_bytes: int = DEFAULT_HEADROOM_BYTES,
        max_workers: int | None = None,
    ) -> dict[int, int]:
        """Copies of a model that fit on each free GPU: ``(free - headroom) // model_bytes``.

        Args:
            model_bytes: Device memory one worker needs (weights plus activations), in bytes.
            headroom_bytes: Memory left free on each GPU (default 2.5 GiB).
            max_workers: Optional cap per GPU.

        Returns:
            ``{cuda ordinal: workers}`` for every free GPU (0 when even one copy does not fit).
        """
        return {
            gpu.index: workers_for_memory(
                gpu.memory_free_bytes,
                model_bytes,
                headroom_bytes=headroom_bytes,
                max_workers=max_workers,
            )
            for gpu in self.gpus
            if gpu.index in self.advice.free_gpus
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view (the output of ``maxtp inspect --json``)."""
        return {
            "hostname": self.hostname,
            "platform": self.platform,
            "cpu": self.cpu.to_dict(),
            "memory": self.memory.to_dict(),
            "gpus": [g.to_dict() for g in self.gpus],
            "gpu_backend": self.gpu_backend,
            "cuda_visible_devices": self.cuda_visible_devices,
            "versions": vars(self.versions).copy(),
            "advice": {
                "free_gpus": list(self.advice.free_gpus),
                "busy_gpus": [vars(b).copy() for b in self.advice.busy_gpus],
                "device_processes": self.advice.device_processes,
                "cpu_workers_per_process": self.advice.cpu_workers_per_process,
            },
            "notes": list(self.notes),
        }

    def __str__(self) -> str:
        return format_resources(self)


def workers_for_memory(
    free_bytes: int | None,
    model_bytes: int,
    *,
    headroom_bytes: int = DEFAULT_HEADROOM_BYTES,
    max_workers: int | None = None,
) -> int:
    """The seeds' workers-per-GPU rule: ``(free memory - headroom) // model memory``, at least 0.

    Raises:
        ValueError: If ``model_bytes`` is not positive, ``headroom_bytes`` is negative or
            ``max_workers`` is below 1.
    """
    if model_bytes <= 0:
        raise ValueError(
            f"`model_bytes` must be a positive number of bytes, got {model_bytes!r}; "
            "pass the device memory one model copy needs, e.g. int(1.5 * 2**30)"
        )
    if headroom_bytes < 0:
        raise ValueError(f"`headroom_bytes` must be >= 0, got {headroom_bytes!r}")
    if max_workers is not None and max_workers < 1:
        raise ValueError(f"`max_workers` must be None or >= 1, got {max_workers!r}")
    if free_bytes is None:
        return 0
    workers = max(0, (free_bytes - headroom_bytes) // model_bytes)
    return min(workers, max_workers) if max_workers is not None else workers


def derive_advice(cpu: CpuInfo, gpus: tuple[GpuInfo, ...]) -> Advice:
    """Free GPUs and the CPU worker budget per device process (pure)."""
    free: list[int] = []
    busy: list[BusyGpu] = []
    for gpu in gpus:
        reason = _busy_reason(gpu)
        if reason is None:
            free.append(gpu.index)
        else:
            busy.append(BusyGpu(gpu.index, reason))
    processes = max(1, len(free))
    return Advice(tuple(free), tuple(busy), processes, workers_per_process(cpu, processes))


def workers_per_process(cpu: CpuInfo, processes: int) -> int:
    """DataLoader workers each of ``processes`` device processes (ranks on a node) may start.

    ``(effective CPUs - processes) // processes``: one main thread per process stays free.
    """
    ranks = max(1, processes)
    return max(0, (cpu.effective - ranks) // ranks)


CEILING_FACTOR_CPU_ONLY = 2
"""On a host without GPUs the worker search may go up to this many workers per effective CPU."""


def worker_ceiling(cpu: CpuInfo, processes: int, *, has_gpus: bool) -> int:
    """The most DataLoader workers a measured search may reach per device process.

    ``workers_per_process`` is where the search starts being cautious, not where it must
    stop: the main process of a data-bound job mostly waits, so its core is free for a worker,
    and a worker that waits on reads leaves its core to others. Past the budget each worker
    must still gain >= 5 % (measured). The ceiling is what can be defended without measuring:
    on a GPU host every core (the main processes wait on the GPUs), on a CPU-only host twice
    the cores (training computes there too, so the real-step trial decides), shared by the
    ranks on the node; never below the budget.
    """
    ranks = max(1, processes)
    factor = 1 if has_gpus else CEILING_FACTOR_CPU_ONLY
    return max(workers_per_process(cpu, ranks), factor * cpu.effective // ranks)


def _busy_reason(gpu: GpuInfo) -> str | None:
    foreign = gpu.foreign_processes
    if foreign:
        listed = ", ".join(
            f"pid {p.pid}"
            + (f" ({p.username})" if p.username else "")
            + (f" {format_bytes(p.used_memory_bytes)}" if p.used_memory_bytes is not None else "")
            for p in foreign[:3]
        )
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        return f"{len(foreign)} foreign process(es): {listed}{more}"
    if gpu.memory_total_bytes and gpu.memory_used_bytes is not None:
        # Memory our own job holds (this process, its parents, its children; or, when NVML's
        # PIDs are another namespace's, what this process's torch holds) does not make the GPU
        # busy; what is left belongs to processes NVML cannot list or this process cannot see.
        own = sum(p.used_memory_bytes or 0 for p in gpu.processes or () if p.own)
        own = max(own, gpu.torch_reserved_bytes or 0)
        unlisted = max(0, gpu.memory_used_bytes - own)
        share = unlisted / gpu.memory_total_bytes
        if share > FREE_GPU_MAX_USED_FRACTION:
            unseen = gpu.unseen_processes
            whose = (
                "processes not listed (another container?)"
                if not unseen
                else f"pid(s) {', '.join(str(p.pid) for p in unseen[:3])} that name no process "
                "here (NVML's host PIDs seen from a container); if they are this job's, pass "
                "the GPUs explicitly"
            )
            return (
                f"{format_bytes(unlisted)} of {format_bytes(gpu.memory_total_bytes)} in use "
                f"({share:.0%}) by {whose}"
            )
    if gpu.mig_enabled:
        return "MIG mode is on: use the MIG instances' UUIDs in CUDA_VISIBLE_DEVICES"
    return None


def _torch_cuda_version() -> str | None:
    """``torch.version.cuda`` read from torch/version.py, without the ~3 s torch import."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    try:
        tree = ast.parse((Path(spec.origin).parent / "version.py").read_text())
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
        value = getattr(node, "value", None)
        if any(getattr(t, "id", None) == "cuda" for t in targets) and value is not None:
            try:
                cuda = ast.literal_eval(value)
            except ValueError:
                return None
            return cuda if isinstance(cuda, str) else None
    return None


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def inspect_resources(path: str | os.PathLike[str] = ".", *, nvml: Any = None) -> Resources:
    """Probe this machine as this process sees it.

    Args:
        path: Where the job writes (checkpoints, logs); its free disk space is reported.
        nvml: An NVML module to use instead of ``pynvml`` (tests pass a small fake).

    Returns:
        The probe's ``Resources``; every value it could not read is ``None`` with a note.
    """
    cpu = probe_cpus()
    memory = probe_memory(path)
    gpu = probe_gpus(nvml)
    versions = Versions(
        python=platform.python_version(),
        torch=_dist_version("torch"),
        torch_cuda=_torch_cuda_version(),
        lightning=_dist_version("lightning"),
        driver=gpu.driver_version,
        cuda_driver=gpu.cuda_driver_version,
    )
    return Resources(
        hostname=socket.gethostname(),
        platform=f"{platform.system()} {platform.machine()} ({sys.implementation.name})",
        cpu=cpu,
        memory=memory,
        gpus=gpu.gpus,
        gpu_backend=gpu.backend,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        versions=versions,
        advice=derive_advice(cpu, gpu.gpus),
        notes=gpu.notes,
    )


# -- text: the table ``maxtp inspect`` prints ------------------------------------------------


def _or(value: object, unknown: str = "?") -> str:
    return unknown if value is None else str(value)


def format_resources(res: Resources, workers_per_gpu: dict[int, int] | None = None) -> str:
    """Render the probe as aligned sections: machine, CPU, memory, GPUs, advice, notes.

    Args:
        res: The probe's result.
        workers_per_gpu: Optional ``{gpu: workers}`` for a model size, shown under advice.
    """
    cpu, mem, ver = res.cpu, res.memory, res.versions
    quota = "none" if cpu.cgroup_quota is None else f"{cpu.cgroup_quota:g} CPUs"
    cg_mem = "none" if mem.cgroup_limit_bytes is None else size(mem.cgroup_limit_bytes)
    rows = [
        ("machine", f"{res.hostname} | {res.platform}"),
        (
            "versions",
            f"python {ver.python} | torch {_or(ver.torch, '-')} (CUDA "
            f"{_or(ver.torch_cuda, '-')}) | lightning {_or(ver.lightning, '-')} | "
            f"driver {_or(ver.driver, '-')} (CUDA {_or(ver.cuda_driver, '-')})",
        ),
        (
            "cpu",
            f"{_or(cpu.logical)} logical, {_or(cpu.physical)} physical, {_or(cpu.usable)} "
            f"usable (affinity), cgroup quota {quota} -> {cpu.effective} effective",
        ),
        (
            "memory",
            f"{size(mem.total_bytes)} total, {size(mem.available_bytes)} available, "
            f"cgroup limit {cg_mem} -> {size(mem.effective_available_bytes)} usable",
        ),
        ("/dev/shm", f"{size(mem.shm_free_bytes)} free of {size(mem.shm_total_bytes)}"),
        (
            "disk",
            f"{size(mem.disk_free_bytes)} free of {size(mem.disk_total_bytes)} at {mem.disk_path}",
        ),
        (
            "gpus",
            f"{len(res.gpus)} visible via {res.gpu_backend}"
            + (
                f" (CUDA_VISIBLE_DEVICES={res.cuda_visible_devices!r})"
                if res.cuda_visible_devices is not None
                else ""
            ),
        ),
    ]
    lines = [f"{k:<9} {v}" for k, v in rows]
    if res.gpus:
        lines.append("")
        lines.append(
            f"  {'gpu':>3} {'name':<24} {'mem used/total':>20} {'util':>5} {'cc':>4} procs"
        )
        for g in res.gpus:
            util = "?" if g.utilization_percent is None else f"{g.utilization_percent}%"
            procs = (
                "?"
                if g.processes is None
                else (f"{len(g.processes)} ({len(g.foreign_processes)} foreign)")
            )
            used = f"{size(g.memory_used_bytes)}/{size(g.memory_total_bytes)}"
            lines.append(
                f"  {g.index:>3} {_or(g.name)[:24]:<24} {used:>20} {util:>5} "
                f"{_or(g.compute_capability):>4} {procs}"
            )
    adv = res.advice
    lines.append("")
    lines.append(
        f"advice    free GPUs: {list(adv.free_gpus) or 'none'}; "
        f"{adv.cpu_workers_per_process} DataLoader worker(s) per device process "
        f"({adv.device_processes} process(es) on {cpu.effective} CPUs)"
    )
    lines += [f"          GPU {b.index} busy: {b.reason}" for b in adv.busy_gpus]
    if workers_per_gpu is not None:
        per = ", ".join(f"GPU {i}: {n}" for i, n in workers_per_gpu.items()) or "no free GPU"
        lines.append(f"          model copies per free GPU: {per}")
    notes = [*res.notes, *cpu.notes, *mem.notes]
    notes += [f"GPU {g.index}: {n}" for g in res.gpus for n in g.notes]
    if notes:
        lines.append("")
        lines += [f"note      {n}" for n in notes]
    return "\n".join(lines)
