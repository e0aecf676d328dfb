"""``maxtp triage``: sample any running process tree (or the machine) and name its bottleneck.

When the job runs a monitor, it publishes a live status (``observe.status``): step time, data
wait, loader settings and its own diagnosis, which triage reads first (trusted only when it is
the target user's file naming the target pid). Otherwise there is no step clock, so the data
wait is unknown: the class is read from what can be seen from outside (the seeds' quick
triage): GPU utilization and memory (NVML), CPU of the process and of its children separately,
I/O wait, and whether the main thread works or waits (``/proc``: a loop waiting on its workers'
queue sleeps, even while its thread pools spin). No torch or lightning import. Beside the CLI,
above ``observe`` and ``knobs``: what it recommends names the knobs by their classes.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import psutil

from lightning_maxtp._checks import SECONDS, refuse_bool
from lightning_maxtp.knobs.batch_size import BatchSize
from lightning_maxtp.knobs.compile import Compile
from lightning_maxtp.knobs.loader_settings import NumWorkers
from lightning_maxtp.knobs.precision import Precision
from lightning_maxtp.observe import sampler as _sampler
from lightning_maxtp.observe import thresholds as th
from lightning_maxtp.observe.diagnosis import BottleneckKind, Diagnosis, Recommendation
from lightning_maxtp.observe.status import read_status

__all__ = ["TriageResult", "classify", "triage"]


class _AllGpus:
    """Mean utilization and the largest memory share over every GPU NVML sees."""

    name = "nvml"

    def __init__(self, nvml: Any = None) -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        nvml.nvmlInit()
        self._nvml = nvml
        count = nvml.nvmlDeviceGetCount()
        if count == 0:
            raise RuntimeError("no GPU")
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]

    def read(self) -> dict[str, float]:
        utils = [self._nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in self._handles]
        mems = [self._nvml.nvmlDeviceGetMemoryInfo(h) for h in self._handles]
        return {
            "gpu_util_percent": float(statistics.fmean(utils)),
            "gpu_memory_share": max(m.used / m.total for m in mems),
        }


@dataclass(frozen=True)
class TriageResult:
    """What ``maxtp triage`` measured and concluded."""

    pid: int | None
    """The sampled process tree's root, or None for the whole machine."""
    duration_s: float
    evidence: dict[str, Any]
    diagnoses: tuple[Diagnosis, ...]
    source: str = "sampled"
    """``"job status"`` when the job's own monitor named the bottleneck, else ``"sampled"``."""
    status_note: str = ""
    """Whether a live status was found and trusted, and why."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "pid": self.pid,
            "duration_s": self.duration_s,
            "evidence": dict(self.evidence),
            "bottleneck": self.diagnoses[0].kind.value,
            "confidence": self.diagnoses[0].confidence,
            "source": self.source,
            "status_note": self.status_note,
            "diagnoses": [d.to_dict() for d in self.diagnoses],
        }

    def __str__(self) -> str:
        target = "the whole machine" if self.pid is None else f"process tree of pid {self.pid}"
        lines = [f"sampled {target} for {self.duration_s:.1f} s"]
        lines += [f"  {k}: {v}" for k, v in self.evidence.items() if v is not None]
        if self.status_note:
            lines.append(f"  status: {self.status_note}")
        lines += ["", f"bottleneck: {self.diagnoses[0]}", f"  named from: {self.source}"]
        lines += [f"also possible: {d.kind.value} ({d.confidence:.2f})" for d in self.diagnoses[1:]]
        return "\n".join(lines)


def _mean(readings: list[dict[str, float]], key: str) -> float | None:
    values = [r[key] for r in readings if key in r]
    return round(statistics.fmean(values), 1) if values else None


def _d(
    kind: BottleneckKind, conf: float, summary: str, ev: dict[str, Any], *recs: Recommendation
) -> Diagnosis:
    return Diagnosis(kind, conf, summary, ev, tuple(recs))


def _busy(ev: dict[str, Any], who: str) -> float | None:
    """How busy ``who`` (main or worker) wants to be, in percent of one core.

    ``<who>_demand_percent`` (running + runnable: immune to other processes' load) when
    measured, else ``<who>_cpu_percent``.
    """
    demand = ev.get(f"{who}_demand_percent")
    return demand if demand is not None else ev.get(f"{who}_cpu_percent")


def classify(evidence: dict[str, Any], cpu_budget: int = 1) -> list[Diagnosis]:
    """Name the bottleneck from mean utilizations (pure; keys as ``triage`` fills them).

    Args:
        evidence: ``gpu_util_percent``, ``gpu_memory_share``, ``main_cpu_percent``,
            ``worker_cpu_percent`` (or the ``*_demand_percent`` forms, preferred), ``workers``,
            ``system_cpu_percent``, ``iowait_percent`` (missing or None: not measured).
        cpu_budget: DataLoader workers a job may start here (for the worker recommendation).
    """
    ev = evidence
    waiting = _waiting(ev)
    if waiting is not None:
        return [waiting]
    util, mem = ev.get("gpu_util_percent"), ev.get("gpu_memory_share")
    main, wsum, workers = _busy(ev, "main"), _busy(ev, "worker"), ev.get("workers")
    iowait = ev.get("iowait_percent") or 0.0
    per_worker = wsum / workers / 100 if wsum is not None and workers else None
    more_workers = Recommendation(
        NumWorkers.name, int(workers or 0), max(cpu_budget, 1), "loader workers are CPU-busy", True
    )
    found: list[Diagnosis] = []
    if mem is not None and mem >= th.MEMORY_PEAK_SHARE:
        found.append(
            _d(
                BottleneckKind.VRAM,
                0.7,
                f"GPU memory {mem:.0%} used",
                ev,
                Recommendation(
                    "activation checkpointing", False, True, "memory near the ceiling", False
                ),
            )
        )
    if util is not None and util >= th.GPU_UTIL_BUSY:
        found.append(
            _d(
                BottleneckKind.COMPUTE,
                0.8,
                f"GPU busy {util:.0f} %",
                ev,
                Recommendation(
                    Precision.name, "32-true", "bf16-mixed", "if not already; tensor cores", False
                ),
            )
        )
    elif util is not None:
        if per_worker is not None and per_worker >= th.WORKER_BUSY:
            found.append(
                _d(
                    BottleneckKind.DATA_PIPELINE,
                    0.65,
                    f"GPU busy {util:.0f} % while "
                    f"{workers:.0f} workers use {per_worker:.0%} of a core each",
                    ev,
                    more_workers,
                )
            )
        elif iowait >= th.IOWAIT_HIGH:
            found.append(
                _d(
                    BottleneckKind.STORAGE,
                    0.6,
                    f"GPU busy {util:.0f} %, I/O wait {iowait:.0f} %",
                    ev,
                )
            )
        elif main is not None and main / 100 >= th.MAIN_THREAD_BUSY:
            found.append(
                _d(
                    BottleneckKind.KERNEL_LAUNCH,
                    0.5,
                    f"GPU busy {util:.0f} %, main "
                    f"process at {main:.0f} % of a core: launches or syncs (run the "
                    "monitor's capture to tell which)",
                    ev,
                    Recommendation(BatchSize.name, "current", "4x", "fewer launches", False),
                )
            )
        else:
            found.append(
                _d(
                    BottleneckKind.UNDER_OCCUPIED,
                    0.6,
                    f"GPU busy {util:.0f} % and the host idle: too little work for this GPU",
                    ev,
                    Recommendation("jobs per GPU", 1, 2, "the GPU is mostly idle", False),
                )
            )
    else:
        found += _classify_cpu(ev, per_worker, more_workers)
    return sorted(found, key=lambda d: -d.confidence) or [
        _d(BottleneckKind.HEALTHY, 0.5, "nothing above threshold", ev)
    ]


def _waiting(ev: dict[str, Any]) -> Diagnosis | None:
    """A main thread that mostly waits on its workers: busy (data pipeline) or idle (reads).

    Without workers a sleeping main thread may wait on anything, so nothing is concluded.
    """
    running, util = ev.get("main_thread_running_share"), ev.get("gpu_util_percent")
    if running is None or running >= th.MAIN_THREAD_WAITING:
        return None
    if util is not None and util >= th.GPU_UTIL_BUSY:
        return None  # a busy GPU: the host may block in a device sync, not on data
    workers, wsum = ev.get("workers") or 0, _busy(ev, "worker")
    if not workers:  # no loader workers: a sleeping main thread may wait on anything
        return None
    per_worker = wsum / workers / 100 if wsum is not None else None
    confidence = round(min(0.9, 0.5 + (th.MAIN_THREAD_WAITING - running)), 2)
    waits = f"the main thread waits {1 - running:.0%} of the time"
    if per_worker is not None and per_worker >= th.WORKER_BUSY:
        return _d(
            BottleneckKind.DATA_PIPELINE,
            confidence,
            f"{waits} for {workers:.0f} workers busy at {per_worker:.0%} of a core each",
            ev,
            Recommendation(
                NumWorkers.name, int(workers), int(workers) * 2, "the workers cannot keep up", True
            ),
        )
    return _d(
        BottleneckKind.STORAGE,
        confidence,
        f"{waits}, on {workers:.0f} mostly idle workers: loading waits on reads",
        ev,
        Recommendation(
            NumWorkers.name,
            int(workers),
            2 * int(workers),
            "more reads in flight hide latency",
            True,
        ),
    )


def _classify_cpu(
    ev: dict[str, Any], per_worker: float | None, more_workers: Recommendation
) -> list[Diagnosis]:
    main, system = _busy(ev, "main"), ev.get("system_cpu_percent")
    iowait = ev.get("iowait_percent") or 0.0
    if per_worker is not None and per_worker >= th.WORKER_BUSY and (main or 0) < 100 * per_worker:
        return [
            _d(
                BottleneckKind.DATA_PIPELINE,
                0.6,
                f"workers busy ({per_worker:.0%} of a core each), more than the main process",
                ev,
                more_workers,
            )
        ]
    if main is None:  # the whole machine
        if iowait >= th.IOWAIT_HIGH:
            return [_d(BottleneckKind.STORAGE, 0.6, f"I/O wait {iowait:.0f} %", ev)]
        if system is not None and system >= th.SYSTEM_CPU_SATURATED:
            return [
                _d(BottleneckKind.COMPUTE, 0.7, f"the machine's CPUs are {system:.0f} % busy", ev)
            ]
        idle = Recommendation("jobs per machine", 1, 2, "the CPUs are idle", False)
        return [
            _d(
                BottleneckKind.UNDER_OCCUPIED,
                0.6,
                f"the machine's CPUs are {system or 0:.0f} % busy and nothing waits on I/O",
                ev,
                idle,
            )
        ]
    cores = (main + (_busy(ev, "worker") or 0.0)) / 100
    if iowait >= th.IOWAIT_HIGH and cores < 0.5:
        return [_d(BottleneckKind.STORAGE, 0.6, f"I/O wait {iowait:.0f} % with little CPU", ev)]
    if cores >= th.MAIN_THREAD_BUSY:
        return [
            _d(
                BottleneckKind.COMPUTE,
                0.7,
                f"the process tree keeps {cores:.1f} cores busy",
                ev,
                Recommendation(
                    Compile.name, False, True, "torch.compile, if it is a torch job", False
                ),
            )
        ]
    return [
        _d(
            BottleneckKind.UNDER_OCCUPIED,
            0.6,
            f"the process tree uses {cores:.0%} of a "
            "core and no I/O "
            "wait: it waits on something outside (sleep, network, locks)",
            ev,
            Recommendation("jobs per machine", 1, 2, "this job leaves its CPU share unused", False),
        )
    ]


def triage(
    duration_s: float = 10.0, pid: int | None = None, *, interval_s: float = 0.2, nvml: Any = None
) -> TriageResult:
    """Sample for ``duration_s`` seconds and classify.

    Raises:
        ValueError: If ``duration_s`` or ``interval_s`` is not > 0.
        psutil.NoSuchProcess: If ``pid`` does not exist (or exits before the first reading).
        psutil.AccessDenied: If ``pid`` cannot be read.
    """
    refuse_bool("duration_s", duration_s, SECONDS, 10)
    refuse_bool("interval_s", interval_s, SECONDS, 0.2)
    if duration_s <= 0:
        raise ValueError(f"`duration_s` must be > 0, got {duration_s}; pass e.g. 10")
    if interval_s <= 0:
        raise ValueError(f"`interval_s` must be > 0, got {interval_s}")
    sources: list[_sampler.Source | None] = [_sampler.try_source(_sampler.SystemSource)]
    if pid is not None:
        # errors reach the caller
        sources.append(_sampler.ProcessCpuSource(pid, recursive=True, demand=True, refresh_s=0.5))
        sources.append(_sampler.try_source(lambda: _sampler.MainThreadSource(pid)))
    sources.append(_sampler.try_source(lambda: _AllGpus(nvml)))
    sampler = _sampler.Sampler(sources, interval_s=interval_s)
    deadline = time.perf_counter() + duration_s
    while time.perf_counter() < deadline:
        time.sleep(min(interval_s, max(0.0, deadline - time.perf_counter())))
        sampler.sample_once()
    readings = [r for _, r in sampler.readings]
    keys = (
        "gpu_util_percent",
        "gpu_memory_share",
        "main_cpu_percent",
        "worker_cpu_percent",
        "main_demand_percent",
        "worker_demand_percent",
        "workers",
        "system_cpu_percent",
        "iowait_percent",
        "disk_read_bytes_per_s",
    )
    evidence: dict[str, Any] = {k: _mean(readings, k) for k in keys}
    running = _mean(readings, "main_thread_running")
    evidence["main_thread_running_share"] = None if running is None else round(running, 2)
    if pid is not None and "process cpu" in sampler.failed:
        raise psutil.NoSuchProcess(pid, msg="the process exited while it was sampled")
    from lightning_maxtp.resources.probe import inspect_resources

    budget = inspect_resources().advice.cpu_workers_per_process
    found = classify(evidence, budget)
    if pid is None:
        return TriageResult(pid, duration_s, evidence, tuple(found))
    status, note = read_status(pid, psutil.Process(pid).uids().real)
    if status is None or not status.get("bottleneck"):
        return TriageResult(pid, duration_s, evidence, tuple(found), status_note=note)
    published = {
        f"job_{k}": status.get(k)
        for k in ("step_time_s", "data_wait_share", "samples_per_s", "settings", "first_step")
    }
    evidence = {**published, **evidence}
    own = _d(
        BottleneckKind(status["bottleneck"]),
        float(status.get("confidence") or 0.5),
        f"the job's own monitor (window from step {status.get('first_step')}): "
        f"{status.get('summary')}",
        evidence,
    )
    rest = tuple(d for d in found if d.kind is not own.kind)
    return TriageResult(pid, duration_s, evidence, (own, *rest), "job status", note)
