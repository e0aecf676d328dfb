"""The device's measured peak: matmul FLOP/s per dtype, measured once and cached.

Model FLOPs utilization divides by a peak. A datasheet's peak is the wrong divisor on a machine
that runs at another clock or power limit, on a SKU the table does not know, or on a CPU; so
the library measures its own: square matmuls of a few sizes per dtype (fp32 on a CPU, with the
threads torch uses; fp32, tf32, bf16 and fp16 on a CUDA device), timed in short synchronized
groups, the fastest group of the best size kept. It takes ``seconds_per_size`` per size and
dtype (``measure_peak``; ``docs/cli.md`` states the total) and is cached under the user's cache
directory (``XDG_CACHE_HOME``, else ``~/.cache``), keyed by the device, its driver and the torch
version, and refreshed on request; ``cached_peak`` reads
the cache without ever measuring. The matrices come from a generator of their own, so a
measurement in the middle of a fit leaves the training's random numbers as they were. The
datasheet value, where known, is shown beside it as a cross-check and never used instead.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning_maxtp._checks import SECONDS, refuse_bool

if TYPE_CHECKING:
    import torch

__all__ = [
    "DATASHEET",
    "Peak",
    "PeakRate",
    "cache_path",
    "cached_peak",
    "device_key",
    "measure_peak",
]

log = logging.getLogger(__name__)

CPU_SIZES = (256, 512, 1024)
CUDA_SIZES = (2048, 4096, 8192)
"""Square matmul sizes tried per dtype; the best rate is the peak (small sizes leave a big
device idle, large ones take long on a small one)."""

DATASHEET: dict[str, dict[str, float]] = {
    # Dense tensor-core peaks from NVIDIA's datasheets (SXM parts), FLOP/s.
    "A100": {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12},
    "H100": {"fp32": 67e12, "tf32": 494.5e12, "bf16": 989.5e12, "fp16": 989.5e12},
    "H200": {"fp32": 67e12, "tf32": 494.5e12, "bf16": 989.5e12, "fp16": 989.5e12},
}
"""Datasheet peaks by a name the device's name contains: a cross-check beside the measured
peak, never the divisor."""

_CACHE_VERSION = 2  # 2: the fastest group, not a window's mean


@dataclass(frozen=True)
class PeakRate:
    """The best matmul rate of one dtype, and the size that gave it."""

    dtype: str
    flops_per_s: float
    size: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {"dtype": self.dtype, "flops_per_s": self.flops_per_s, "size": self.size}


@dataclass(frozen=True)
class Peak:
    """A device's measured matmul peak per dtype (see the module docstring)."""

    device: str
    """What was measured: the GPU's name, or the CPU's model and the threads torch used."""
    key: str
    """The cache key: device, driver and torch version."""
    rates: tuple[PeakRate, ...]
    datasheet: dict[str, float] = field(default_factory=dict)
    """The datasheet's peak per dtype where the device is known (a cross-check only)."""
    measured_s: float = 0.0
    """How long the measurement took."""
    cached: bool = False
    """Read from the cache rather than measured now."""

    def rate(self, dtype: str) -> float | None:
        """The measured peak of ``dtype`` in FLOP/s (``None``: not measured)."""
        return next((r.flops_per_s for r in self.rates if r.dtype == dtype), None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "device": self.device,
            "key": self.key,
            "rates": [r.to_dict() for r in self.rates],
            "datasheet": dict(self.datasheet),
            "measured_s": self.measured_s,
            "cached": self.cached,
        }

    def __str__(self) -> str:
        how = "cached" if self.cached else f"measured in {self.measured_s:.1f} s"
        lines = [f"peak ({how}): {self.device}"]
        for r in self.rates:
            sheet = self.datasheet.get(r.dtype)
            beside = ""
            if sheet is not None:
                beside = f" (datasheet {sheet / 1e12:,.1f}: {r.flops_per_s / sheet:.0%} of it)"
            tflops = r.flops_per_s / 1e12
            lines.append(f"  {r.dtype:<5} {tflops:,.3f} TFLOP/s at {r.size}x{r.size}{beside}")
        return "\n".join(lines)


def cache_path() -> Path:
    """Where measured peaks are kept: ``$XDG_CACHE_HOME/lightning_maxtp/peaks.json``."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "lightning_maxtp" / "peaks.json"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def device_key(device: str = "cpu") -> tuple[str, str]:
    """``(what is measured, cache key)`` for ``device`` (``"cpu"`` or ``"cuda[:i]"``)."""
    import torch

    if device.startswith("cuda"):
        index = torch.device(device).index or 0
        name = torch.cuda.get_device_name(index)
        return (
            name,
            f"{name}|driver {_driver()}|cuda {torch.version.cuda}|torch {torch.__version__}",
        )
    threads = torch.get_num_threads()
    name = f"{_cpu_model()}, {threads} thread(s)"
    return name, f"cpu|{name}|torch {torch.__version__}"


def _driver() -> str:
    """The NVIDIA driver's version from ``/proc`` ("?" where it cannot be read)."""
    try:
        first = Path("/proc/driver/nvidia/version").read_text().splitlines()[0]
    except (OSError, IndexError):
        return "?"
    words = [w for w in first.split() if w[:1].isdigit() and "." in w]
    return words[0] if words else "?"


def _datasheet(name: str) -> dict[str, float]:
    return next((dict(v) for k, v in DATASHEET.items() if k in name), {})


def _dtypes(device: str) -> dict[str, Any]:
    import torch

    if not device.startswith("cuda"):
        return {"fp32": torch.float32}
    dtypes: dict[str, Any] = {"fp32": torch.float32, "tf32": torch.float32}
    if torch.cuda.is_bf16_supported():
        dtypes["bf16"] = torch.bfloat16
    dtypes["fp16"] = torch.float16
    return dtypes


def matmul_rate(device: str, dtype: torch.dtype, size: int, seconds: float, tf32: bool) -> float:
    """The best FLOP/s of repeated ``size`` x ``size`` matmuls over about ``seconds``.

    The runs are timed in short synchronized groups (one matmul on a CPU, four on a GPU, where a
    synchronize costs more) and the fastest group gives the rate: a peak is what the device can
    do, and a group slowed by another process or a clock dip says nothing about that, while an
    average over the whole window would carry it into every MFU divided by this peak.
    """
    import torch

    cuda = device.startswith("cuda")
    sync: Callable[[], None] = torch.cuda.synchronize if cuda else (lambda: None)
    group = 4 if cuda else 1
    # The precision setting, not the flag: "medium" read back through the flag would return
    # as "high", and the user's setting is put back as it was.
    before = torch.get_float32_matmul_precision()
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        # A generator of its own: the global one is the training's (dropout, shuffling).
        generator = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
        b = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
        a @ b  # warm-up: kernel selection, first-call costs
        sync()
        fastest, start = float("inf"), time.perf_counter()
        while True:
            began = time.perf_counter()
            for _ in range(group):
                a @ b
            sync()
            now = time.perf_counter()
            fastest = min(fastest, now - began)
            if now - start >= seconds:
                break
    finally:
        torch.set_float32_matmul_precision(before)
    return 2 * size**3 * group / fastest


def _read_cache(path: Path, *, warn: bool = True) -> dict[str, Any]:
    """The cache's entries; a corrupt or unreadable file is ignored (with a warning if ``warn``)."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("version") != _CACHE_VERSION:
            raise ValueError(f"not a peaks cache of version {_CACHE_VERSION}")
        entries = data.get("peaks", {})
        if not isinstance(entries, dict):
            raise ValueError("`peaks` is not a mapping")
        return entries
    except (OSError, ValueError) as err:
        if warn:
            log.warning("maxtp: ignoring the peak cache %s (%s); measuring again", path, err)
        return {}


def _from_entry(entry: dict[str, Any]) -> Peak:
    rates = tuple(
        PeakRate(str(r["dtype"]), float(r["flops_per_s"]), int(r["size"])) for r in entry["rates"]
    )
    if not rates or any(r.flops_per_s <= 0 for r in rates):
        raise ValueError("no positive rate")
    return Peak(
        device=str(entry["device"]),
        key=str(entry["key"]),
        rates=rates,
        datasheet={str(k): float(v) for k, v in entry.get("datasheet", {}).items()},
        measured_s=float(entry.get("measured_s", 0.0)),
        cached=True,
    )


def _write_cache(path: Path, entries: dict[str, Any]) -> None:
    """Write the cache; a failure only costs a measurement next time (a warning)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")  # several processes may write at once
        tmp.write_text(json.dumps({"version": _CACHE_VERSION, "peaks": entries}, indent=1))
        tmp.replace(path)
    except OSError as err:
        log.warning("maxtp: could not write the peak cache %s (%s)", path, err)


def _check_device(device: str) -> None:
    import torch

    if device != "cpu" and not (device.startswith("cuda") and torch.cuda.is_available()):
        raise ValueError(f"`device` must be 'cpu' or an available 'cuda[:i]', got {device!r}")


def cached_peak(device: str = "cpu") -> Peak | None:
    """The cached peak of ``device`` (this driver and torch), or ``None``: never measures.

    For a caller that must not wait for a measurement now (a fit about to take its first
    step) and calls ``measure_peak`` later when this gives ``None``. A corrupt cache or entry
    reads as ``None`` without a warning: ``measure_peak`` warns when it measures again.

    Raises:
        ValueError: For a device that is neither ``cpu`` nor an available ``cuda`` device.
    """
    _check_device(device)
    _, key = device_key(device)
    entry = _read_cache(cache_path(), warn=False).get(key)
    if entry is None:
        return None
    try:
        return _from_entry(entry)
    except (KeyError, TypeError, ValueError):
        return None


def measure_peak(
    device: str = "cpu",
    *,
    refresh: bool = False,
    cache: bool = True,
    seconds_per_size: float = 0.1,
) -> Peak:
    """The measured matmul peak of ``device`` per dtype, from the cache unless ``refresh``.

    Args:
        device: ``"cpu"`` or ``"cuda"``/``"cuda:i"``.
        refresh: Measure again even when the cache has this device, driver and torch.
        cache: Read and write the cache (``cache_path()``).
        seconds_per_size: Time per matmul size and dtype (three sizes per dtype).

    Raises:
        ValueError: For a device that is neither ``cpu`` nor an available ``cuda`` device, or
            a ``seconds_per_size`` that is not positive.
    """
    refuse_bool("seconds_per_size", seconds_per_size, SECONDS, 0.1)
    if seconds_per_size <= 0:
        raise ValueError(f"`seconds_per_size` must be > 0, got {seconds_per_size}")
    _check_device(device)
    name, key = device_key(device)
    path = cache_path()
    entries = _read_cache(path) if cache else {}
    if cache and not refresh and key in entries:
        try:
            return _from_entry(entries[key])
        except (KeyError, TypeError, ValueError) as err:
            log.warning("maxtp: ignoring the cached peak of %s (%r); measuring again", name, err)
    sizes = CUDA_SIZES if device.startswith("cuda") else CPU_SIZES
    start = time.perf_counter()
    rates = []
    for label, dtype in _dtypes(device).items():
        best = max(
            (matmul_rate(device, dtype, n, seconds_per_size, label == "tf32"), n) for n in sizes
        )
        rates.append(PeakRate(label, best[0], best[1]))
    peak = Peak(name, key, tuple(rates), _datasheet(name), time.perf_counter() - start)
    if cache:
        entries[key] = peak.to_dict()
        _write_cache(path, entries)
    return peak
