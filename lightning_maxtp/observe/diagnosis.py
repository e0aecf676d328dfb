"""Name the bottleneck of a window of steps: ``diagnose(window, advisor) -> list[Diagnosis]``.

Pure: plain data in (``Window``), plain data out; no torch. Each rule reads shares of the step
or of the sampling period (thresholds and their sources in ``thresholds``) and returns the
measured numbers that triggered it plus concrete recommendations, asked of an ``Advisor``
(``recommendation``; the knobs' is ``knobs.advisor.ADVICE``): the diagnosis names no knob. On a CPU
device only the kinds that exist there are considered: data_pipeline, storage, compute, and
host_overhead made of garbage collections.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from lightning_maxtp.observe import thresholds as th
from lightning_maxtp.observe.recommendation import Advisor, Recommendation
from lightning_maxtp.observe.shares import host_cpu, loader_rates
from lightning_maxtp.observe.window import Window

__all__ = [
    "Advisor",
    "BottleneckKind",
    "Diagnosis",
    "Recommendation",
    "diagnose",
    "needs_capture",
]


class BottleneckKind(str, Enum):
    """What limits the job (each kind, its evidence and its knobs: ``docs/bottlenecks.md``)."""

    DATA_PIPELINE = "data_pipeline"
    STORAGE = "storage"
    COMPUTE = "compute"
    KERNEL_LAUNCH = "kernel_launch"
    VRAM = "vram"
    HOST_OVERHEAD = "host_overhead"
    UNDER_OCCUPIED = "under_occupied"
    HEALTHY = "healthy"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Diagnosis:
    """One named bottleneck with the numbers behind it and what to change, in order."""

    kind: BottleneckKind
    confidence: float
    """0..1; findings are listed by it, highest first."""
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)
    recommendations: tuple[Recommendation, ...] = ()
    needs_capture: bool = False
    """True when a short profiler capture would confirm or separate this kind."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "kind": self.kind.value,
            "confidence": round(self.confidence, 3),
            "summary": self.summary,
            "evidence": dict(self.evidence),
            "recommendations": [r.to_dict() for r in self.recommendations],
            "needs_capture": self.needs_capture,
        }

    def __str__(self) -> str:
        lines = [f"{self.kind.value} (confidence {self.confidence:.2f}): {self.summary}"]
        lines += [f"  {i}. {r}" for i, r in enumerate(self.recommendations, 1)]
        if self.needs_capture:
            lines.append("  (a short profiler capture would confirm this)")
        return "\n".join(lines)


def _clamp(x: float) -> float:
    return max(0.0, min(1.0, x))


def _r(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def _loader_busy(w: Window) -> float | None:
    """Cores one loader uses: mean worker CPU, or the main process while waiting (0 workers)."""
    workers = w.context.num_workers
    if workers is None:
        workers = w.sampler.num_worker_processes
    busy = w.wait_cpu_share
    if workers > 0:
        mean = w.sampler.mean_worker_cpu
        busy = None if mean is None else mean / 100
    if busy is None or w.context.device_type != "cpu":
        return busy
    # On a CPU device the main thread computes flat out, so its CPU share while computing is
    # the share of a core this machine grants a busy thread right now; a starved loader looks
    # idle by the same factor, so compare the loader with it (shares, not absolute numbers).
    compute = w.total_s - sum(w.data_wait_s)
    granted = sum(w.compute_cpu_s) / compute if w.compute_cpu_s and compute > 0 else 1.0
    return busy / min(1.0, max(0.2, granted))


def _data_side(w: Window, advisor: Advisor) -> list[Diagnosis]:
    share = w.data_wait_share
    if share <= th.DATA_WAIT_SHARE:
        return []
    strength = _clamp(
        (share - th.DATA_WAIT_SHARE) / (th.DATA_WAIT_SHARE_STRONG - th.DATA_WAIT_SHARE)
    )
    base = 0.35 + 0.6 * strength
    s = w.sampler
    busy, system, iowait = _loader_busy(w), s.mean_system_cpu, s.mean_iowait
    starved = system is not None and system >= th.SYSTEM_CPU_SATURATED
    io_high = iowait is not None and iowait >= th.IOWAIT_HIGH
    # A starved worker (runnable, but the cores are taken) also looks idle: on a saturated
    # machine an idle-looking loader is less surely waiting on storage.
    if busy is None:
        dp, st = 0.7, (0.6 if io_high else 0.4)
    elif busy >= th.WORKER_BUSY:
        dp, st = 1.0, (0.5 if io_high else 0.2)
    elif busy < th.WORKER_IDLE:
        dp, st = (0.6, 0.8) if starved and not io_high else (0.4, 1.0 if io_high else 0.9)
    elif starved:
        dp, st = 0.9, (0.6 if io_high else 0.4)
    else:
        dp, st = (0.6, 0.9) if io_high else (0.85, 0.6)
    device_rate, loader_rate = loader_rates(w)
    speedup = device_rate / loader_rate if loader_rate > 0 else None
    evidence = {
        "data_wait_share": _r(share),
        "samples_per_s": _r(w.samples_per_s, 1),
        "device_samples_per_s": _r(device_rate, 1),
        "loader_samples_per_s": _r(loader_rate, 1),
        "loader_speedup_needed": _r(speedup, 2),
        "loader_busy_cores": _r(busy),
        "system_cpu_percent": _r(system, 1),
        "iowait_percent": _r(iowait, 1),
        "disk_read_bytes_per_s": _r(s.mean_disk_read, 0),
    }
    if speedup is None:
        need = ""
    elif speedup > 1:
        need = f"; loader must be {speedup:.1f}x faster"
    else:  # fast enough alone, but loading in the main process runs in series with the step
        need = "; loading runs in series with the step"
    rates = f" (device could take {device_rate:.0f} samples/s, loader gives {loader_rate:.0f})"
    busy_txt = "?" if busy is None else f"{busy:.0%}"
    return [
        Diagnosis(
            BottleneckKind.DATA_PIPELINE,
            base * dp,
            f"data wait {share:.0%} of step, loader CPU-busy ({busy_txt} of a core){need}{rates}",
            evidence,
            tuple(advisor.data_pipeline(w)),
        ),
        Diagnosis(
            BottleneckKind.STORAGE,
            base * st,
            f"data wait {share:.0%} of step while the loader is idle ({busy_txt} of a "
            f"core), I/O wait {_pct(iowait)}{need}",
            evidence,
            tuple(advisor.storage(w)),
        ),
    ]


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x:.0f} %"


def _compute(w: Window, advisor: Advisor) -> list[Diagnosis]:
    if w.data_wait_share > th.DATA_WAIT_SHARE:
        return []
    ctx, util = w.context, w.sampler.mean_gpu_util
    if ctx.device_type == "cuda":
        if util is None or util < th.GPU_UTIL_BUSY:
            return []
        conf = 0.6 + 0.35 * _clamp((util - th.GPU_UTIL_BUSY) / (100 - th.GPU_UTIL_BUSY))
        what = f"GPU busy {util:.0f} %"
        evidence: dict[str, Any] = {"gpu_util_percent": _r(util, 1)}
    else:
        cores, threads = w.compute_cpu_cores, ctx.intra_op_threads or ctx.cpu_worker_budget or 1
        system = w.sampler.mean_system_cpu
        # On a saturated machine the job gets fewer cores than it has threads, and is still
        # limited by CPU compute: the cores it could use are taken.
        saturated = system is not None and system >= th.SYSTEM_CPU_SATURATED
        ratio = 0.0 if cores is None else cores / threads
        if ratio < th.CPU_COMPUTE_BUSY and not saturated:
            return []
        conf = 0.55 + 0.4 * _clamp((max(ratio, 0.9 if saturated else 0.0) - 0.6) / 0.3)
        what = f"CPU compute uses {cores or 0:.1f} of {threads} threads"
        if saturated:
            what += f" (machine CPUs {system:.0f} % busy)"
        evidence = {
            "compute_cpu_cores": _r(cores, 2),
            "intra_op_threads": threads,
            "system_cpu_percent": _r(system, 1),
        }
    evidence |= {
        "data_wait_share": _r(w.data_wait_share),
        "samples_per_s": _r(w.samples_per_s, 1),
        "memory_peak_share": _r(w.memory_share),
    }
    recs = advisor.compute(w)
    if not recs:
        return []  # at the device's limit with every compute knob already in use: healthy
    summary = f"{what}, data wait {w.data_wait_share:.0%}: the device is the limit"
    return [Diagnosis(BottleneckKind.COMPUTE, conf, summary, evidence, tuple(recs))]


def _loader_model(w: Window, advisor: Advisor) -> list[Diagnosis]:
    """The job model predicts a worker count much faster than the one in force, either way.

    More workers: the loader limits the job (``data_pipeline``), even with little data wait
    (an epoch's worker start-up, loading that waits in series). Fewer: the workers take CPU the
    step needs (``compute``). Named when the predicted gain reaches ``MODEL_GAIN`` and the
    data wait is under ``DATA_WAIT_SHARE_STRONG`` (above it the data side names the finding,
    with the same recommendation).
    """
    if w.data_wait_share >= th.DATA_WAIT_SHARE_STRONG:
        return []  # the data side names it, with the same modelled recommendation
    recs = tuple(advisor.modelled(w))
    if not recs or (recs[0].expected_gain or 0) < th.MODEL_GAIN:
        return []
    found = recs[0]
    gain = found.expected_gain or 0.0
    more = int(found.proposed) > int(found.current)
    kind = BottleneckKind.DATA_PIPELINE if more else BottleneckKind.COMPUTE
    conf = 0.5 + 0.45 * _clamp(gain / 0.5)
    change = f"{found.knob} {found.current} -> {found.proposed}"
    summary = f"the job model predicts {gain:+.0%} from {change}"
    evidence = {"predicted_gain": _r(gain), "samples_per_s": _r(w.samples_per_s, 1)}
    return [Diagnosis(kind, conf, summary, evidence, recs)]


def _vram(w: Window, advisor: Advisor) -> list[Diagnosis]:
    s = w.sampler
    peak = w.memory_share
    # Memory at the ceiling outranks the other findings: it blocks their knobs (a larger
    # batch, more jobs per GPU) and the next spike is an OOM.
    conf = 0.0
    if peak is not None and peak >= th.MEMORY_PEAK_SHARE:
        conf = 0.96
    if s.alloc_retries > 0:
        conf = max(conf, 0.7) + 0.01
    if s.ooms > 0:
        conf = 0.99
    if conf == 0.0:
        return []
    evidence = {"memory_peak_share": _r(peak), "alloc_retries": s.alloc_retries, "ooms": s.ooms}
    summary = (
        f"device memory at {_pct(None if peak is None else peak * 100)} of total, "
        f"{s.alloc_retries} allocator retries, {s.ooms} OOMs in the window"
    )
    return [Diagnosis(BottleneckKind.VRAM, conf, summary, evidence, tuple(advisor.vram(w)))]


def needs_capture(window: Window) -> bool:
    """Whether a profiler capture is needed to tell kernel_launch from host_overhead.

    True on a CUDA job whose GPU is underused with little data wait and no capture yet: NVML
    utilization cannot separate launch-bound from sync-bound steps.
    """
    util = window.sampler.mean_gpu_util
    return (
        window.context.device_type == "cuda"
        and window.capture is None
        and util is not None
        and util < th.GPU_UTIL_LOW
        and window.data_wait_share <= th.DATA_WAIT_SHARE_STRONG
    )


def _gpu_idle(w: Window, advisor: Advisor) -> list[Diagnosis]:
    util, cap = w.sampler.mean_gpu_util, w.capture
    if w.context.device_type != "cuda" or util is None or util >= th.GPU_UTIL_LOW:
        return []
    if w.data_wait_share > th.DATA_WAIT_SHARE_STRONG:
        return []  # the data side explains the idle GPU
    main = w.sampler.mean_main_cpu
    main_busy = main is not None and main / 100 >= th.MAIN_THREAD_BUSY
    evidence: dict[str, Any] = {
        "gpu_util_percent": _r(util, 1),
        "main_cpu_percent": _r(main, 1),
        "data_wait_share": _r(w.data_wait_share),
    }
    evidence |= _host_cpu_evidence(w)
    if w.syncs is not None:
        evidence |= {"syncs_per_step": _r(w.syncs.per_step, 2), "sync_sources": w.syncs.sources[:3]}
    if cap is not None:
        evidence |= {"capture_" + k: v for k, v in cap.to_dict().items()}
        short = cap.median_kernel_us is not None and cap.median_kernel_us < th.KERNEL_SHORT_US
        idle = cap.gpu_idle_share is not None and cap.gpu_idle_share > th.GPU_IDLE_SHARE
        syncy = cap.syncs_per_step > th.SYNCS_PER_STEP or cap.pageable_h2d_per_step > 0
        syncs = cap.syncs_per_step > th.SYNCS_PER_STEP
        launch_conf = 0.85 if short else (0.5 if idle and not syncy else 0.2)
        # Syncs make the gaps (and are the cheaper fix); pageable copies alone are weaker.
        host_conf = (0.9 if idle else 0.65) if syncs else (0.5 if syncy else 0.2)
    else:
        launch_conf, host_conf = (0.55, 0.45) if main_busy else (0.3, 0.3)
    out = [
        Diagnosis(
            BottleneckKind.KERNEL_LAUNCH,
            launch_conf,
            f"GPU busy only {util:.0f} %, main thread at {_pct(main)} of a core: many tiny kernels",
            evidence,
            tuple(advisor.kernel_launch(w)),
            needs_capture(w),
        ),
        Diagnosis(
            BottleneckKind.HOST_OVERHEAD,
            host_conf,
            f"GPU busy only {util:.0f} %: gaps between kernels from syncs or pageable copies",
            evidence,
            tuple(advisor.host_overhead(w)),
            needs_capture(w),
        ),
    ]
    if not main_busy and cap is None:
        out.append(
            Diagnosis(
                BottleneckKind.UNDER_OCCUPIED,
                0.6,
                f"GPU busy only {util:.0f} % and the host is not busy either "
                f"({_pct(main)} of a core): too little work for this GPU",
                evidence,
                tuple(advisor.under_occupied(w)),
            )
        )
    return out


def _collections(w: Window, advisor: Advisor) -> list[Diagnosis]:
    """Python's garbage collector takes a measurable share of the step (any device)."""
    gc = w.gc
    if gc is None or gc.share <= th.GC_SHARE:
        return []
    strength = _clamp((gc.share - th.GC_SHARE) / (th.GC_SHARE_STRONG - th.GC_SHARE))
    evidence = {
        "gc_share": _r(gc.share),
        "gc_collections": gc.count,
        "gc_full_collections": gc.gen2,
        "gc_total_s": _r(gc.total_s, 4),
        "gc_longest_s": _r(gc.longest_s, 4),
        "gc_slow_steps": gc.slow_steps,
        "samples_per_s": _r(w.samples_per_s, 1),
    }
    slow = f"; {gc.slow_steps} slow step(s) ran during a full one" if gc.slow_steps else ""
    summary = (
        f"garbage collection takes {gc.share:.0%} of step time ({gc.count} collections, "
        f"{gc.gen2} full, longest {gc.longest_s * 1e3:.1f} ms){slow}"
    )
    # On a GPU host the host_overhead recommendations (collections first); on a CPU only those.
    cuda = w.context.device_type == "cuda"
    recs = tuple(advisor.host_overhead(w) if cuda else advisor.collections(w))
    return [Diagnosis(BottleneckKind.HOST_OVERHEAD, 0.5 + 0.47 * strength, summary, evidence, recs)]


def _host_cpu_evidence(w: Window) -> dict[str, Any]:
    """How busy a GPU host's CPUs are and who uses them (``{}`` off CUDA or unmeasured)."""
    busy = host_cpu(w)
    if busy is None:
        return {}
    system, own, others = busy
    return {
        "host_cpu_percent": _r(system, 1),
        "host_cores_this_process": _r(own, 2),
        "host_cores_other_processes": _r(others, 2),
    }


def _busy_host(w: Window, advisor: Advisor) -> list[Diagnosis]:
    """A GPU host's CPUs over ``HOST_CPU_BUSY``: kernel launches may wait for a core.

    Listed below the healthy threshold unless the GPU idles too (``_gpu_idle`` names that):
    busy CPUs alone slow a step only when its launches are late.
    """
    busy = host_cpu(w)
    if busy is None or busy[0] < th.HOST_CPU_BUSY:
        return []
    system, own, others = busy
    who = "other processes" if others > own else "this process and its workers"
    summary = (
        f"host CPUs {system:.0f} % busy on a GPU host (this process and its workers "
        f"{own:.1f} cores, other processes {others:.1f}): mostly {who}; kernel launches may "
        "wait for a core"
    )
    recs = advisor.busy_host(w)
    return [
        Diagnosis(BottleneckKind.HOST_OVERHEAD, 0.4, summary, _host_cpu_evidence(w), tuple(recs))
    ]


def _unused_gpus(w: Window, advisor: Advisor) -> list[Diagnosis]:
    free = w.context.unused_free_gpus
    if not free:
        return []
    summary = (
        f"{len(free)} free GPU(s) {list(free)} unused while the job runs on {w.context.world_size}"
    )
    evidence = {"unused_free_gpus": list(free), "world_size": w.context.world_size}
    return [
        Diagnosis(
            BottleneckKind.UNDER_OCCUPIED, 0.9, summary, evidence, tuple(advisor.under_occupied(w))
        )
    ]


def diagnose(window: Window, advisor: Advisor) -> list[Diagnosis]:
    """Name what limits the steps in ``window``, most confident first.

    Args:
        window: The steps to judge.
        advisor: What to change for each finding (the knobs' is ``knobs.advisor.ADVICE``;
            ``knobs.advisor.diagnose`` and ``lightning_maxtp.diagnose`` pass it).

    Returns:
        Findings ordered by confidence; ``healthy`` is included when no finding reaches
        ``_thresholds.HEALTHY_BELOW``. Empty when the window has fewer than
        ``_thresholds.MIN_STEPS`` steps (not enough data to say anything).
    """
    if window.steps < th.MIN_STEPS:
        return []
    found = [
        *_data_side(window, advisor),
        *_compute(window, advisor),
        *_collections(window, advisor),
        *_loader_model(window, advisor),
    ]
    if window.context.device_type == "cuda":
        found += [
            *_vram(window, advisor),
            *_gpu_idle(window, advisor),
            *_busy_host(window, advisor),
            *_unused_gpus(window, advisor),
        ]
    found = _merge(found)
    top = max((d.confidence for d in found), default=0.0)
    if top < th.HEALTHY_BELOW:
        evidence = {
            "data_wait_share": _r(window.data_wait_share),
            "samples_per_s": _r(window.samples_per_s, 1),
            "gpu_util_percent": _r(window.sampler.mean_gpu_util, 1),
            "compute_cpu_cores": _r(window.compute_cpu_cores, 2),
        }
        summary = f"no bottleneck above threshold (data wait {window.data_wait_share:.0%})"
        found.append(Diagnosis(BottleneckKind.HEALTHY, 1.0 - top, summary, evidence))
    return sorted(found, key=lambda d: -d.confidence)


def _merge(found: list[Diagnosis]) -> list[Diagnosis]:
    """Keep the most confident finding of each kind; drop zero-confidence ones."""
    best: dict[BottleneckKind, Diagnosis] = {}
    for d in found:
        if d.confidence > 0 and (d.kind not in best or d.confidence > best[d.kind].confidence):
            best[d.kind] = d
    return list(best.values())
