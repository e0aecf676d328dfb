"""The background sampler: a daemon thread reading NVML, the torch allocator and psutil at ~10 Hz.

Each source is a small object with ``read() -> dict``. A source that cannot start is simply not
added (the null case); one that raises while the job runs is logged once and dropped, so the
monitor never stops training. Nothing here imports torch unless ``TorchAllocatorSource`` is built.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import psutil

from lightning_maxtp.observe.window import SamplerSeries
from lightning_maxtp.resources.schedstat import SchedClock, schedstats_enabled

log = logging.getLogger(__name__)

Reading = Mapping[str, float]


_MP_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def _is_mp_helper(proc: psutil.Process) -> bool:
    """Python's resource tracker / forkserver: children of any spawn user, never data workers."""
    try:
        cmdline = " ".join(proc.cmdline())
    except psutil.Error:
        return False
    return any(helper in cmdline for helper in _MP_HELPERS)


class Source(Protocol):
    """Something the sampler reads; ``name`` appears in the one-time failure message."""

    name: str

    def read(self) -> Reading:
        """Current values (keys are ``SamplerSeries`` fields or counters)."""
        ...


class ProcessCpuSource:
    """CPU of one process and, separately, of its child processes (DataLoader workers).

    Args:
        pid: The main process.
        recursive: Count all descendants as workers (``maxtp triage``) instead of direct
            children only.
        exclude: Returns pids that are not workers (e.g. DDP ranks launched by rank zero).
        demand: Also read running + runnable time from ``/proc`` (``*_demand_percent``).
        refresh_s: The longest gap between listings of the children (listing scans every
            process). Listings come sooner at first (after 0.25 s, 0.5 s, 1 s ...) and again
            after a known child ends, since new workers usually follow (the next epoch's).
    """

    name = "process cpu"

    def __init__(
        self,
        pid: int | None = None,
        *,
        recursive: bool = False,
        exclude: Callable[[], set[int]] | None = None,
        demand: bool = False,
        refresh_s: float = 2.0,
    ) -> None:
        self._main = psutil.Process(pid)
        self._main.cpu_percent()
        # Demand needs schedstats: without them no ``*_demand_percent`` key at all, rather
        # than a 0 for "no workers" beside no value for busy ones.
        self._demand = demand and schedstats_enabled()
        self._clocks: dict[psutil.Process, tuple[float, SchedClock]] = {}
        self._recursive = recursive
        self._exclude = exclude or set
        self._children: dict[int, psutil.Process] = {}
        self._listed_at = -float("inf")
        self._refresh_s = refresh_s
        # The gap before the next listing, doubled at each (the first read lists at once, the
        # next after 0.25 s), back to the start when a known child ends.
        self._interval = min(0.125, refresh_s)

    def _refresh(self) -> None:
        # Listing children scans every process on the machine (milliseconds); workers live
        # long, so the list is refreshed at most every ``refresh_s`` and the known ones read each
        # time.
        skip = self._exclude()
        current = {c.pid: c for c in self._main.children(recursive=self._recursive)}
        self._children = {
            pid: self._children.get(pid, proc)
            for pid, proc in current.items()
            if pid not in skip and (pid in self._children or not _is_mp_helper(proc))
        }
        self._listed_at = time.monotonic()
        self._interval = min(2 * self._interval, self._refresh_s)

    def read(self) -> Reading:
        """Main CPU %, summed worker CPU % and the worker count (100 % = one core)."""
        main = self._main.cpu_percent()
        if time.monotonic() - self._listed_at > self._interval:
            self._refresh()
        alive: dict[int, psutil.Process] = {}
        total = 0.0
        for pid, proc in self._children.items():
            try:
                # The first reading of a new process is 0 by definition (psutil).
                value = proc.cpu_percent()
            except psutil.Error:
                continue
            alive[pid] = proc
            total += value
        if len(alive) < len(self._children):
            self._interval = min(0.125, self._refresh_s)  # workers end: new ones may follow
        self._children = alive
        out = {"main_cpu_percent": main, "worker_cpu_percent": total, "workers": len(alive)}
        if self._demand:
            out |= self._demand_percent(alive)
        return out

    def _demand_percent(self, workers: Mapping[int, psutil.Process]) -> dict[str, float]:
        """Running plus runnable-but-waiting time (``/proc/<pid>/task/*/schedstat``), percent.

        CPU percent falls when other processes take the cores; demand does not: a busy loop
        stays near 100 % on a saturated machine, a sleeping process near 0. A key is left out
        while none of its processes has an earlier reading (a rate needs two), so the first
        reading does not pull an average towards 0.
        """
        now = time.monotonic()
        out: dict[str, float] = {}
        seen: dict[psutil.Process, tuple[float, SchedClock]] = {}
        for key, procs in (
            ("main_demand_percent", [self._main]),
            ("worker_demand_percent", list(workers.values())),
        ):
            total, rated = 0.0, not procs
            for proc in procs:  # keyed by process (pid and start time): a reused pid is new
                last_at, clock = self._clocks.get(proc) or (now, SchedClock(proc.pid))
                seen[proc] = (now, clock)
                delta = clock.advance() if now > last_at else None
                if delta is not None:
                    total += sum(delta) / 1e9 / (now - last_at) * 100
                    rated = True
            if rated:
                out[key] = total
        self._clocks = seen
        return out


class MainThreadSource:
    """Whether a process's main thread is running (or runnable) rather than blocked.

    ``/proc/<pid>/stat`` gives the state of the thread group leader: ``R`` running or
    runnable; ``S``/``D`` blocked (a training loop waiting on its workers' queue sleeps there,
    while its thread pools may still spin). ``main_thread_running`` is 1 or 0 per reading;
    its mean is the share of readings the main thread worked.
    """

    name = "main thread"

    def __init__(self, pid: int) -> None:
        self._path = f"/proc/{pid}/stat"
        self.read()  # fails now (no /proc, no such process) rather than while sampling

    def read(self) -> Reading:
        """``main_thread_running``: 1.0 when the main thread is running or runnable."""
        with open(self._path, encoding="ascii", errors="replace") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return {"main_thread_running": 1.0 if state == "R" else 0.0}


class SystemSource:
    """Machine-wide CPU, I/O wait, disk read rate and available RAM."""

    name = "system"

    def __init__(self) -> None:
        psutil.cpu_times_percent()
        self._disk = psutil.disk_io_counters()
        self._t = time.monotonic()

    def read(self) -> Reading:
        """System CPU %, iowait %, disk read bytes/s, available RAM bytes."""
        cpu = psutil.cpu_times_percent()
        out: dict[str, float] = {
            "system_cpu_percent": max(0.0, 100.0 - cpu.idle - getattr(cpu, "iowait", 0.0)),
            "iowait_percent": getattr(cpu, "iowait", 0.0),
            "available_ram_bytes": float(psutil.virtual_memory().available),
        }
        now, disk = time.monotonic(), psutil.disk_io_counters()
        if disk is not None and self._disk is not None and now > self._t:
            out["disk_read_bytes_per_s"] = (disk.read_bytes - self._disk.read_bytes) / (
                now - self._t
            )
        self._disk, self._t = disk, now
        return out


class NvmlSource:
    """NVML utilization and memory of one GPU (``nvml`` is ``pynvml`` or a test fake)."""

    name = "nvml"

    def __init__(self, index: int = 0, *, uuid: str | None = None, nvml: Any = None) -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        nvml.nvmlInit()
        self._nvml = nvml
        if uuid is not None:
            self._handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
        else:
            self._handle = nvml.nvmlDeviceGetHandleByIndex(index)
        self._energy = True
        """Whether the device has an energy counter (Volta and later; off at its first error)."""

    def read(self) -> Reading:
        """GPU util %, memory used and total bytes, and the energy counter where there is one."""
        util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
        mem = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        reading = {
            "gpu_util_percent": float(util.gpu),
            "gpu_memory_used_bytes": float(mem.used),
            "gpu_memory_total_bytes": float(mem.total),
        }
        if self._energy:
            try:  # millijoules since the driver loaded
                reading["energy_mj"] = float(
                    self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
                )
            except Exception:  # not supported on this device: never asked again
                self._energy = False
        return reading


class TorchAllocatorSource:
    """``torch.cuda.memory_stats``: reserved bytes, allocation retries, OOM count."""

    name = "torch allocator"

    def __init__(
        self, device: Any, stats: Callable[[Any], Mapping[str, Any]] | None = None
    ) -> None:
        if stats is None:
            import torch

            stats = torch.cuda.memory_stats
        self._stats, self._device = stats, device

    def read(self) -> Reading:
        """Reserved bytes and the two cumulative counters."""
        s = self._stats(self._device)
        return {
            "allocator_reserved_bytes": float(s.get("reserved_bytes.all.current", 0)),
            "alloc_retries": float(s.get("num_alloc_retries", 0)),
            "ooms": float(s.get("num_ooms", 0)),
        }


def try_source(
    factory: Callable[[], Source], name: str | None = None, missing: list[str] | None = None
) -> Source | None:
    """Build a source, or None when it is unavailable here (no NVML, no CUDA...).

    With ``missing``, a source that was expected here and did not start says so: a line
    naming ``name`` and the error is appended (the report's notes) and logged as a warning;
    without, a debug line (a probe of what happens to be available).
    """
    try:
        return factory()
    except Exception as err:  # whatever a source's start raises, the others still run
        if missing is None:
            log.debug("sampler source unavailable: %s", err)
            return None
        text = (
            f"sampler source {name or 'unnamed'} could not start ({type(err).__name__}: {err}): "
            "the diagnosis runs without its readings"
        )
        missing.append(text)
        log.warning(text)
        return None


class Sampler:
    """Reads every source each ``interval_s`` on a daemon thread and keeps timestamped readings.

    Args:
        sources: What to read; ``None`` entries (unavailable sources) are ignored.
        interval_s: Time between readings.
        max_readings: Oldest readings are dropped beyond this many.
    """

    def __init__(
        self, sources: Iterable[Source | None], interval_s: float = 0.1, max_readings: int = 100_000
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"`interval_s` must be > 0, got {interval_s}; pass e.g. 0.1 (10 Hz)")
        self.sources = [s for s in sources if s is not None]
        self.interval_s = interval_s
        self.readings: collections.deque[tuple[float, dict[str, float]]] = collections.deque(
            maxlen=max_readings
        )
        self.failed: list[str] = []
        """The name of each source that raised while sampling and was dropped."""
        self.failure_notes: list[str] = []
        """Each of those: when it failed, why, and that its readings stop (the report's notes)."""
        self.t0 = time.perf_counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the thread (idempotent)."""
        if self._thread is None and self.sources:
            self._thread = threading.Thread(target=self._loop, name="maxtp-sampler", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop and join the thread (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def sample_once(self) -> None:
        """Read every source now; a source that raises is logged once and dropped."""
        reading: dict[str, float] = {}
        for source in list(self.sources):
            try:
                reading.update(source.read())
            except Exception as err:  # a monitor must never stop the job it watches
                log.warning(
                    "maxtp: sampler: source %r failed and is disabled: %r", source.name, err
                )
                self.sources.remove(source)
                self.failed.append(source.name)
                self.failure_notes.append(
                    f"sampler source {source.name!r} failed after "
                    f"{time.perf_counter() - self.t0:.1f} s of sampling "
                    f"({type(err).__name__}: {err}) and was disabled: the diagnosis runs "
                    "without its readings from then on"
                )
        with self._lock:
            self.readings.append((time.perf_counter() - self.t0, reading))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample_once()

    def between(self, t_start: float, t_end: float) -> list[tuple[float, dict[str, float]]]:
        """Readings with ``t_start <= t <= t_end`` (seconds since the sampler was built)."""
        with self._lock:
            return [(t, r) for t, r in self.readings if t_start <= t <= t_end]

    def series(self, t_start: float, t_end: float) -> SamplerSeries:
        """The readings of a time span as a ``SamplerSeries``."""
        return build_series(self.between(t_start, t_end))


def _col(readings: Sequence[tuple[float, Mapping[str, float]]], key: str) -> tuple[float, ...]:
    return tuple(r[key] for _, r in readings if key in r)


def _delta(values: tuple[float, ...]) -> int:
    return int(values[-1] - values[0]) if len(values) > 1 else 0


def build_series(readings: Sequence[tuple[float, Mapping[str, float]]]) -> SamplerSeries:
    """Turn timestamped readings into the plain ``SamplerSeries`` a ``Window`` carries."""
    totals = _col(readings, "gpu_memory_total_bytes")
    workers = _col(readings, "workers")
    return SamplerSeries(
        t_s=tuple(t for t, _ in readings),
        gpu_util_percent=_col(readings, "gpu_util_percent"),
        gpu_memory_used_bytes=tuple(int(v) for v in _col(readings, "gpu_memory_used_bytes")),
        gpu_memory_total_bytes=int(totals[-1]) if totals else None,
        allocator_reserved_bytes=tuple(int(v) for v in _col(readings, "allocator_reserved_bytes")),
        alloc_retries=_delta(_col(readings, "alloc_retries")),
        ooms=_delta(_col(readings, "ooms")),
        main_cpu_percent=_col(readings, "main_cpu_percent"),
        worker_cpu_percent=_col(readings, "worker_cpu_percent"),
        num_worker_processes=round(max(workers)) if workers else 0,
        system_cpu_percent=_col(readings, "system_cpu_percent"),
        iowait_percent=_col(readings, "iowait_percent"),
        disk_read_bytes_per_s=_col(readings, "disk_read_bytes_per_s"),
        available_ram_bytes=tuple(int(v) for v in _col(readings, "available_ram_bytes")),
        power_w=_power(readings),
    )


def _power(readings: Sequence[tuple[float, Mapping[str, float]]]) -> float | None:
    """Mean watts between the first and last energy readings (``None``: fewer than two)."""
    energy = [(t, r["energy_mj"]) for t, r in readings if "energy_mj" in r]
    if len(energy) < 2 or energy[-1][0] <= energy[0][0]:
        return None
    return (energy[-1][1] - energy[0][1]) / 1e3 / (energy[-1][0] - energy[0][0])
