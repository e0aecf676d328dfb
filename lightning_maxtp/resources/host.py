"""Host side of the resource probe: CPUs, memory, cgroup limits, ``/dev/shm`` and disk.

Everything here reads the operating system directly (``os``, ``psutil``, files under
``/sys/fs/cgroup`` and ``/proc``); nothing imports torch. A value that cannot be read is ``None``
and a note says why, so a container without cgroup files or a macOS laptop is a normal case.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

# cgroup v1 writes "no limit" as a huge page-aligned number rather than "max".
_CGROUP_V1_UNLIMITED_BYTES = 2**60


@dataclass(frozen=True)
class CpuInfo:
    """CPU counts as this process can use them."""

    logical: int | None
    """Logical CPUs on the machine (``os.cpu_count()``)."""
    physical: int | None
    """Physical cores, when psutil can tell."""
    usable: int | None
    """CPUs this process may run on (scheduler affinity)."""
    cgroup_quota: float | None
    """CPU quota of this process's cgroup in CPUs (``cpu.max`` or CFS); ``None`` if unlimited."""
    notes: tuple[str, ...] = ()

    @property
    def effective(self) -> int:
        """Whole CPUs this process can keep busy: affinity capped by the cgroup quota, >= 1."""
        candidates = [n for n in (self.usable, self.logical) if n]
        count = candidates[0] if candidates else 1
        if self.cgroup_quota is not None:
            count = min(count, max(1, math.floor(self.cgroup_quota)))
        return max(1, count)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view, including the derived ``effective`` count."""
        return {**dataclasses.asdict(self), "notes": list(self.notes), "effective": self.effective}


@dataclass(frozen=True)
class MemoryInfo:
    """Host memory, cgroup memory limit, ``/dev/shm`` and free disk where the job writes."""

    total_bytes: int | None
    available_bytes: int | None
    cgroup_limit_bytes: int | None
    """Memory limit of this process's cgroup; ``None`` if unlimited or unknown."""
    cgroup_usage_bytes: int | None
    shm_total_bytes: int | None
    """Size of ``/dev/shm``, where DataLoader workers pass batches to the main process."""
    shm_free_bytes: int | None
    disk_path: str
    disk_total_bytes: int | None
    disk_free_bytes: int | None
    notes: tuple[str, ...] = ()

    @property
    def effective_available_bytes(self) -> int | None:
        """Memory the job can still take: available RAM, capped by what the cgroup limit leaves."""
        values = [v for v in (self.available_bytes,) if v is not None]
        if self.cgroup_limit_bytes is not None:
            used = self.cgroup_usage_bytes or 0
            values.append(max(0, self.cgroup_limit_bytes - used))
        return min(values) if values else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view, including ``effective_available_bytes``."""
        return {
            **dataclasses.asdict(self),
            "notes": list(self.notes),
            "effective_available_bytes": self.effective_available_bytes,
        }


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _cgroup_dirs(cgroup_root: Path, proc_cgroup: str | None, controller: str) -> list[Path]:
    """Directories that may hold this process's cgroup files, most specific first.

    ``/proc/self/cgroup`` lines are ``hierarchy:controllers:path``; v2 has the single line
    ``0::/path``. Inside a container the path is often ``/`` or not mounted, so the root of the
    mount is tried last.
    """
    dirs: list[Path] = []
    for line in (proc_cgroup or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        rel = rel.lstrip("/")
        if controllers == "":  # cgroup v2 unified hierarchy
            dirs.append(cgroup_root / rel)
        elif controller in controllers.split(","):
            dirs.append(cgroup_root / controllers / rel)
            dirs.append(cgroup_root / controller / rel)
    dirs += [cgroup_root, cgroup_root / controller, cgroup_root / f"{controller},cpuacct"]
    unique: list[Path] = []
    for d in dirs:
        if d not in unique:
            unique.append(d)
    return unique


def read_cgroup_cpu_quota(
    cgroup_root: Path = Path("/sys/fs/cgroup"), proc_cgroup: str | None = None
) -> tuple[float | None, str | None]:
    """Return ``(quota in CPUs or None, note)`` from cgroup v2 ``cpu.max`` or v1 CFS files."""
    if proc_cgroup is None:
        proc_cgroup = _read_text(Path("/proc/self/cgroup"))
    for d in _cgroup_dirs(cgroup_root, proc_cgroup, "cpu"):
        text = _read_text(d / "cpu.max")
        if text is not None:
            quota, _, period = text.partition(" ")
            if quota == "max":
                return None, None
            try:
                return int(quota) / int(period or "100000"), None
            except ValueError:
                return None, f"cgroup cpu.max unreadable: {text!r}"
        quota_text = _read_text(d / "cpu.cfs_quota_us")
        if quota_text is not None:
            period_text = _read_text(d / "cpu.cfs_period_us") or "100000"
            try:
                quota_us, period_us = int(quota_text), int(period_text)
            except ValueError:
                return None, f"cgroup CFS quota unreadable: {quota_text!r}/{period_text!r}"
            return (None, None) if quota_us <= 0 else (quota_us / period_us, None)
    return None, "no cgroup CPU controller found (not in a container, or cgroup not mounted)"


def read_cgroup_memory(
    cgroup_root: Path = Path("/sys/fs/cgroup"), proc_cgroup: str | None = None
) -> tuple[int | None, int | None, str | None]:
    """Return ``(limit bytes or None, usage bytes or None, note)`` from cgroup v2 or v1 files."""
    if proc_cgroup is None:
        proc_cgroup = _read_text(Path("/proc/self/cgroup"))
    for d in _cgroup_dirs(cgroup_root, proc_cgroup, "memory"):
        for limit_name, usage_name in (
            ("memory.max", "memory.current"),
            ("memory.limit_in_bytes", "memory.usage_in_bytes"),
        ):
            limit_text = _read_text(d / limit_name)
            if limit_text is None:
                continue
            usage_text = _read_text(d / usage_name)
            usage = int(usage_text) if usage_text and usage_text.isdigit() else None
            if limit_text == "max":
                return None, usage, None
            if not limit_text.isdigit():
                return None, usage, f"cgroup {limit_name} unreadable: {limit_text!r}"
            limit = int(limit_text)
            return (None if limit >= _CGROUP_V1_UNLIMITED_BYTES else limit), usage, None
    return None, None, "no cgroup memory controller found (not in a container, or not mounted)"


def probe_cpus(
    cgroup_root: Path = Path("/sys/fs/cgroup"), proc_cgroup: str | None = None
) -> CpuInfo:
    """Read CPU counts, affinity and the cgroup quota of this process."""
    notes: list[str] = []
    physical: int | None
    try:
        physical = psutil.cpu_count(logical=False)
    except Exception as err:  # psutil raises platform-specific errors here
        physical = None
        notes.append(f"physical cores unreadable: {err}")
    if physical is None and not notes:
        notes.append("physical cores unknown: psutil could not tell on this platform")
    usable: int | None = None
    if hasattr(os, "sched_getaffinity"):
        usable = len(os.sched_getaffinity(0))
    else:
        notes.append("CPU affinity unknown: os.sched_getaffinity is not available here")
    quota, quota_note = read_cgroup_cpu_quota(cgroup_root, proc_cgroup)
    if quota_note:
        notes.append(quota_note)
    return CpuInfo(os.cpu_count(), physical, usable, quota, tuple(notes))


def probe_memory(
    disk_path: str | os.PathLike[str] = ".",
    *,
    shm_path: str = "/dev/shm",
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    proc_cgroup: str | None = None,
) -> MemoryInfo:
    """Read RAM, the cgroup memory limit, ``/dev/shm`` and free disk at ``disk_path``."""
    notes: list[str] = []
    vm = psutil.virtual_memory()
    limit, usage, note = read_cgroup_memory(cgroup_root, proc_cgroup)
    if note:
        notes.append(note)
    shm_total = shm_free = None
    try:
        shm = shutil.disk_usage(shm_path)
        shm_total, shm_free = shm.total, shm.free
    except OSError as err:
        notes.append(f"{shm_path} unreadable ({err.strerror or err}): DataLoader workers need it")
    disk = str(Path(disk_path).resolve())
    disk_total = disk_free = None
    try:
        usage_disk = shutil.disk_usage(disk)
        disk_total, disk_free = usage_disk.total, usage_disk.free
    except OSError as err:
        notes.append(f"disk at {disk} unreadable: {err.strerror or err}")
    return MemoryInfo(
        total_bytes=vm.total,
        available_bytes=vm.available,
        cgroup_limit_bytes=limit,
        cgroup_usage_bytes=usage,
        shm_total_bytes=shm_total,
        shm_free_bytes=shm_free,
        disk_path=disk,
        disk_total_bytes=disk_total,
        disk_free_bytes=disk_free,
        notes=tuple(notes),
    )
