"""A window of N training steps as plain data: what ``diagnose`` reads.

``StepClock`` (in ``callbacks``) fills it from a running fit; tests and ``maxtp triage`` build it
by hand. Nothing here imports torch.

Long because it is one idea, a window and what it carries: the context the job ran with, what
the sampler read meanwhile, and the rates every decision reads from it (the steps', the fit's
with each epoch's cost, the device's).
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from lightning_maxtp.observe.data_path import DataFacts
from lightning_maxtp.observe.flops import Utilization, dtype_in_force, utilization
from lightning_maxtp.observe.gc_pauses import GcSummary
from lightning_maxtp.observe.syncs import SyncCount

__all__ = [
    "MIN_SPAN_SHARE",
    "SPIKE_FACTOR",
    "CaptureSummary",
    "JobContext",
    "SamplerSeries",
    "Window",
    "aligned_epochs",
    "combined_rate",
    "robust_rate",
]


MIN_SPAN_SHARE = 0.5
"""Share of a window's steps whose CUDA events must have completed for their mean span to stand
for the window (the last few are still running when it closes; more missing: a stalled read)."""


def _mean(values: tuple[float, ...]) -> float | None:
    return statistics.fmean(values) if values else None


@dataclass(frozen=True)
class JobContext:
    """What the job runs on and with: needed for recommendations with values."""

    device_type: str = "cpu"
    """``"cuda"``, ``"cpu"``, ``"mps"``..."""
    gpu_name: str | None = None
    compute_capability: str | None = None
    """Like ``"9.0"``; bf16 needs >= 8.0."""
    gpu_memory_total_bytes: int | None = None
    precision: str | None = None
    """Lightning's precision string, e.g. ``"32-true"`` or ``"bf16-mixed"``."""
    batch_size: int | None = None
    epoch_batches: int | None = None
    """Training batches per epoch (``Trainer.num_training_batches``; ``None``: unknown)."""
    num_workers: int | None = None
    prefetch_factor: int | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None
    loaders_following: int = 0
    """Validation loaders that take the train loader's settings (their workers restart with
    the same settings at every validation run)."""
    cpu_worker_budget: int | None = None
    """DataLoader workers this process may start (the probe's ``cpu_workers_per_process``)."""
    cpu_worker_ceiling: int | None = None
    """Most workers the loop may try past the budget, one at a time (``worker_ceiling``)."""
    host_cpus: int | None = None
    """Logical CPUs of this machine (what its CPU percentage counts), for who uses a GPU
    host's CPUs."""
    cpus_per_rank: int | None = None
    """Effective CPUs of this node divided by its ranks (what this process's threads share)."""
    intra_op_threads: int | None = None
    """``torch.get_num_threads()`` of the training process."""
    compiled: bool | None = None
    """Whether the model runs under ``torch.compile`` (None: unknown)."""
    world_size: int = 1
    unused_free_gpus: tuple[int, ...] = ()
    """Free GPUs on this machine that the job does not use."""
    dataset: str | None = None
    """Type name of the train dataset (``"TensorDataset"``: already tensors in memory)."""
    iterable_dataset: bool = False
    """Whether the train dataset is an ``IterableDataset`` (its stream depends on workers)."""
    loading_s: tuple[float, float] | None = None
    """``(seconds, CPU seconds)`` one sample's loading took in one process, as measured by an
    earlier window (the job model's fallback when a window with workers has no reading of
    their CPU)."""
    data_facts: DataFacts | None = None
    """What the loader ships per sample and what a sample costs it, as far as measured."""
    gc_tuned: bool | None = None
    """Whether the ``gc`` knob is on (long-lived objects frozen, collections rarer)."""
    tf32: bool | None = None
    """Whether fp32 matmuls may run as TF32 (CUDA; the peak divided by is then TF32's)."""
    tf32_conv: bool | None = None
    """Whether fp32 convolutions may run as TF32 (cuDNN's own switch, on by default)."""
    flops_per_sample: float | None = None
    """FLOPs of one sample's forward and backward (counted on the first batch, or given)."""
    conv_flop_share: float | None = None
    """Share of those FLOPs in convolutions (``None``: not counted, e.g. a given count)."""
    peaks: tuple[tuple[str, float], ...] = ()
    """The device's measured matmul peak per dtype, ``(dtype, FLOP/s)`` (``resources.peak``)."""

    @property
    def peak_dtype(self) -> str:
        """The dtype whose peak the step's FLOP/s are divided by (precision and TF32 in force)."""
        return dtype_in_force(self.precision, tf32=bool(self.tf32) and self.device_type == "cuda")

    def utilization_at(self, samples_per_s: float) -> Utilization | None:
        """FLOP/s at ``samples_per_s`` against the measured peak of the dtype in force (MFU).

        ``None`` without a FLOP count; with a count but no peak of that dtype, a
        ``Utilization`` whose ``error`` says so. In fp32 on CUDA, convolutions and matmuls
        each run at their own switch's peak (cuDNN's TF32 is on by default, the matmuls' off):
        the peak is their mix by the counted FLOPs, the time each share takes at its own peak
        (``conv_share``), and the dtype says so.
        """
        if self.flops_per_sample is None:
            return None
        peaks = dict(self.peaks)
        dtype = self.peak_dtype
        peak = peaks.get(dtype, 0.0)
        share = self.conv_flop_share
        # The tf32 knob turns both switches on: on, the convolutions run TF32 too.
        conv = "tf32" if self.tf32_conv or self.tf32 else "fp32"
        mixed = dtype in ("fp32", "tf32") and self.device_type == "cuda" and conv != dtype
        if mixed and share and peak > 0 and peaks.get(conv, 0.0) > 0:
            peak = 1 / (share / peaks[conv] + (1 - share) / peak)
            dtype = f"{conv} convolutions ({share:.0%} of the FLOPs), {dtype} matmuls"
        return utilization(self.flops_per_sample, samples_per_s, peak, dtype)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        data = asdict(self)
        data["unused_free_gpus"] = list(self.unused_free_gpus)
        data["peaks"] = dict(self.peaks)
        data["data_facts"] = None if self.data_facts is None else self.data_facts.to_dict()
        return data


@dataclass(frozen=True)
class SamplerSeries:
    """What the background sampler read during the window (empty tuples: source unavailable).

    CPU percentages follow psutil: 100 means one core fully busy.
    """

    t_s: tuple[float, ...] = ()
    """Sample times, seconds since the monitor started."""
    gpu_util_percent: tuple[float, ...] = ()
    gpu_memory_used_bytes: tuple[int, ...] = ()
    gpu_memory_total_bytes: int | None = None
    allocator_reserved_bytes: tuple[int, ...] = ()
    alloc_retries: int = 0
    """Growth of ``num_alloc_retries`` over the window."""
    ooms: int = 0
    """Growth of ``num_ooms`` over the window."""
    main_cpu_percent: tuple[float, ...] = ()
    worker_cpu_percent: tuple[float, ...] = ()
    """Summed over DataLoader worker processes."""
    num_worker_processes: int = 0
    system_cpu_percent: tuple[float, ...] = ()
    """Whole machine, 100 = all cores busy."""
    iowait_percent: tuple[float, ...] = ()
    disk_read_bytes_per_s: tuple[float, ...] = ()
    available_ram_bytes: tuple[int, ...] = ()
    power_w: float | None = None
    """Mean device power over the readings, watts, from NVML's energy counter (``None``: the
    device has none, or fewer than two readings)."""

    @property
    def mean_gpu_util(self) -> float | None:
        """Mean NVML utilization, percent."""
        return _mean(self.gpu_util_percent)

    @property
    def mean_main_cpu(self) -> float | None:
        """Mean CPU of the training process, percent of one core."""
        return _mean(self.main_cpu_percent)

    @property
    def mean_worker_cpu(self) -> float | None:
        """Mean CPU of one DataLoader worker, percent of one core (None without workers)."""
        total = _mean(self.worker_cpu_percent)
        if total is None or self.num_worker_processes == 0:
            return None
        return total / self.num_worker_processes

    @property
    def mean_system_cpu(self) -> float | None:
        """Mean machine-wide CPU, percent of all cores."""
        return _mean(self.system_cpu_percent)

    @property
    def mean_iowait(self) -> float | None:
        """Mean system I/O wait, percent."""
        return _mean(self.iowait_percent)

    @property
    def mean_disk_read(self) -> float | None:
        """Mean disk read rate, bytes/s."""
        return _mean(self.disk_read_bytes_per_s)

    @property
    def peak_memory_share(self) -> float | None:
        """Largest of reserved or used device memory over total (0..1)."""
        if not self.gpu_memory_total_bytes:
            return None
        peaks = [*self.allocator_reserved_bytes, *self.gpu_memory_used_bytes]
        return max(peaks) / self.gpu_memory_total_bytes if peaks else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class CaptureSummary:
    """A short ``torch.profiler`` capture reduced to the numbers that separate GPU kinds."""

    steps: int
    kernels_per_step: float
    median_kernel_us: float | None
    gpu_idle_share: float | None
    """Share of the captured device span with no kernel running (0..1)."""
    pageable_h2d_per_step: float
    """Host-to-device copies from pageable (unpinned) memory, per step."""
    syncs_per_step: float
    """Synchronizing calls (``cudaStreamSynchronize``, ``.item()``...), per step."""
    median_launch_us: float | None = None
    """Median host time of one kernel launch call."""
    overhead_s: float = 0.0
    """Wall time the capture added to the job."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return asdict(self)

    def __str__(self) -> str:
        kernel = "?" if self.median_kernel_us is None else f"{self.median_kernel_us:.1f} us"
        idle = "?" if self.gpu_idle_share is None else f"{self.gpu_idle_share:.0%}"
        return (
            f"capture of {self.steps} steps: {self.kernels_per_step:.0f} kernels/step, median "
            f"kernel {kernel}, GPU idle {idle}, {self.pageable_h2d_per_step:.1f} pageable H2D "
            f"copies/step, {self.syncs_per_step:.1f} syncs/step (cost {self.overhead_s:.2f} s)"
        )


@dataclass(frozen=True)
class Window:
    """N consecutive training steps of one rank, with what was sampled meanwhile.

    ``step_time_s[i]`` runs from the end of step i-1 to the end of step i, so it includes
    ``data_wait_s[i]`` (the end of step i-1 to the start of step i: fetching the batch).
    """

    step_time_s: tuple[float, ...]
    data_wait_s: tuple[float, ...]
    samples: tuple[int, ...]
    wait_cpu_s: tuple[float, ...] = ()
    """CPU seconds the main thread used while waiting for data (with 0 workers: loading)."""
    compute_cpu_s: tuple[float, ...] = ()
    """CPU seconds the main thread used in the rest of each step."""
    device_time_s: tuple[float, ...] = ()
    """CUDA: device span of each step whose events had completed when the window closed
    (read without waiting, so it may hold fewer entries than ``steps``)."""
    sampler: SamplerSeries = field(default_factory=SamplerSeries)
    context: JobContext = field(default_factory=JobContext)
    capture: CaptureSummary | None = None
    first_step: int = 0
    rank: int = 0
    gc: GcSummary | None = None
    """Python's garbage collections during the window (``None``: not timed)."""
    syncs: SyncCount | None = None
    """Device syncs the steps asked for, counted on CUDA (``None``: not counted)."""
    gap_s: tuple[float, ...] = ()
    """Per step, the time before it that belongs to no step (the end of an epoch, validation);
    empty: none measured."""
    epoch_start: tuple[bool, ...] = ()
    """Per step, whether it began an epoch or followed validation: its data wait includes
    starting the loader's workers, a cost every epoch pays (never capped as a stall)."""
    carried_epoch_s: tuple[float, float] | None = None
    """For a window that held no epoch boundary: ``epoch_parts_s`` of the last one measured
    under the same loader settings (``None``: none yet), or predicted (``epoch_predicted``)."""
    epoch_predicted: bool = False
    """``carried_epoch_s`` is predicted from the fit's first fetch, not measured: its gap part
    holds the validation loaders' worker starts only, not validation itself
    (``aligned_epochs`` completes it from a window that measured one)."""

    def __post_init__(self) -> None:
        n = len(self.step_time_s)
        if len(self.data_wait_s) != n or len(self.samples) != n:
            raise ValueError(
                f"`step_time_s`, `data_wait_s` and `samples` must have the same length, got "
                f"{n}, {len(self.data_wait_s)}, {len(self.samples)}"
            )
        for name in ("gap_s", "epoch_start"):
            if getattr(self, name) and len(getattr(self, name)) != n:
                raise ValueError(
                    f"`{name}` must be empty or as long as `step_time_s` ({n}), got "
                    f"{len(getattr(self, name))}"
                )

    @property
    def steps(self) -> int:
        """Number of steps."""
        return len(self.step_time_s)

    @property
    def total_s(self) -> float:
        """Wall time of the window."""
        return sum(self.step_time_s)

    @property
    def data_wait_share(self) -> float:
        """Share of the window spent waiting for data (0..1)."""
        total = self.total_s
        return sum(self.data_wait_s) / total if total > 0 else 0.0

    @property
    def samples_per_s(self) -> float:
        """Samples per second the job gets, a stall capped (``robust_rate``).

        The rate of the steps themselves: every report and log line uses it; the loop judges by
        ``fit_samples_per_s``, which adds what the epochs cost between steps.
        """
        workers = self.context.num_workers or 0
        return robust_rate(self.step_time_s, self.samples, self.epoch_start, workers)

    def _boundaries(self) -> list[tuple[float, float]]:
        """Per epoch start in the window: ``(its step beyond a steady one, the gap before it)``."""
        steady = [t for t, b in zip(self.step_time_s, self.epoch_start, strict=True) if not b]
        typical = statistics.median(steady) if steady else 0.0
        gaps = self.gap_s or (0.0,) * self.steps
        return [
            (max(0.0, t - typical), g)
            for t, g, b in zip(self.step_time_s, gaps, self.epoch_start, strict=True)
            if b
        ]

    def steady(self) -> Window:
        """The window without its epochs' first steps (itself when it has none, or only those)."""
        keep = [i for i, b in enumerate(self.epoch_start) if not b]
        if not self.epoch_start or len(keep) == self.steps or not keep:
            return self

        def pick(values: tuple[Any, ...]) -> tuple[Any, ...]:
            return tuple(values[i] for i in keep) if values else ()

        return dataclasses.replace(
            self,
            step_time_s=pick(self.step_time_s),
            data_wait_s=pick(self.data_wait_s),
            samples=pick(self.samples),
            wait_cpu_s=pick(self.wait_cpu_s),
            compute_cpu_s=pick(self.compute_cpu_s),
            device_time_s=(),
            gap_s=(),
            epoch_start=(),
        )

    @property
    def epoch_parts_s(self) -> tuple[float, float] | None:
        """An epoch boundary's first step beyond a steady one, and the gap before it.

        Averaged over the window's boundaries (``None``: none seen). The first holds the train
        loader's workers starting and its first batch; the second the previous epoch's end and
        validation.
        """
        seen = self._boundaries() if self.epoch_start else []
        if not seen:
            return self.carried_epoch_s
        return sum(a for a, _ in seen) / len(seen), sum(b for _, b in seen) / len(seen)

    @property
    def epoch_cost_s(self) -> float | None:
        """What one epoch boundary costs beyond a steady step, seconds (``None``: none seen).

        The first step of an epoch (its workers starting, its first batches loading) beyond
        the median of the other steps, plus the gap before it (the previous epoch's end,
        validation), averaged over the boundaries in the window.
        """
        parts = self.epoch_parts_s
        return None if parts is None else parts[0] + parts[1]

    @property
    def fit_samples_per_s(self) -> float:
        """Samples per second of the fit: the steps, plus what each epoch costs between them.

        With ``JobContext.epoch_batches`` known, the window is charged as many boundaries as
        its steps span (``steps / epoch_batches``), each at ``epoch_cost_s``: a window that
        happened to hold two epoch starts and one that held one compare alike. Without
        boundaries, the steps' rate (a boundary measured earlier under the same settings,
        ``carried_epoch_s``, counts for a window that held none).
        """
        rate, cost = self.samples_per_s, self.epoch_cost_s
        if cost is None or rate <= 0:
            return rate
        n = sum(self.samples)
        in_steps = sum(a for a, _ in self._boundaries()) if self.epoch_start else 0.0
        batches = self.context.epoch_batches
        expected = self.steps / batches if batches else sum(self.epoch_start)
        return n / max(n / rate - in_steps + cost * expected, 1e-12)

    @property
    def device_step_s(self) -> float | None:
        """CUDA: the mean time a step took on the device (its events), ``None`` without them.

        What the host measures of a step on CUDA is launch time: the kernels run later,
        possibly while the host waits for the next batch, so host time minus data wait says
        nothing of the device. The events' span does: from the step's first work on the device
        to its last (a device busy with the previous step delays the start event; launches
        slower than the kernels stretch the span to them). ``None`` when fewer than
        ``MIN_SPAN_SHARE`` of the steps' events had completed when the window closed.
        """
        spans = self.device_time_s
        if not spans or len(spans) < MIN_SPAN_SHARE * self.steps:
            return None
        return statistics.fmean(spans)

    @property
    def device_samples_per_s(self) -> float:
        """Samples per second the device could consume if data never kept it waiting.

        The steps' host time less their data wait, or the device's own time (``device_step_s``)
        when it is longer: the device runs no faster than either.
        """
        busy = self.total_s - sum(self.data_wait_s)
        device = self.device_step_s
        if device is not None:
            busy = max(busy, device * self.steps)
        return sum(self.samples) / busy if busy > 0 else 0.0

    @property
    def median_step_s(self) -> float:
        """Median step time."""
        return statistics.median(self.step_time_s) if self.step_time_s else 0.0

    @property
    def wait_cpu_share(self) -> float | None:
        """Share of one core the main thread used while waiting for data (0..1)."""
        wait = sum(self.data_wait_s)
        return sum(self.wait_cpu_s) / wait if self.wait_cpu_s and wait > 0 else None

    @property
    def memory_share(self) -> float | None:
        """Peak device memory share (0..1): NVML's total, else the context's (no NVML)."""
        share = self.sampler.peak_memory_share
        total = self.context.gpu_memory_total_bytes
        if share is None and total and self.sampler.allocator_reserved_bytes:
            share = max(self.sampler.allocator_reserved_bytes) / total
        return share

    @property
    def compute_cpu_cores(self) -> float | None:
        """Cores the training process used while computing.

        The sampler's process CPU (all threads) when there is one, else the main thread's share
        of the non-waiting part of the steps.
        """
        busy = self.total_s - sum(self.data_wait_s)
        main = sum(self.compute_cpu_s) / busy if self.compute_cpu_s and busy > 0 else None
        process = self.sampler.mean_main_cpu
        if process is None:
            return main
        return max(process / 100, main or 0.0)

    @property
    def other_cpus(self) -> float | None:
        """CPUs other processes kept busy during the window: the machine's use less this job's.

        ``None`` when the sampler read no machine-wide or own CPU, or the CPU count is unknown.
        """
        sampler, cpus = self.sampler, self.context.host_cpus
        system, main = sampler.mean_system_cpu, sampler.mean_main_cpu
        if system is None or main is None or not cpus:
            return None
        workers = _mean(sampler.worker_cpu_percent) or 0.0
        return max(0.0, system / 100 * cpus - (main + workers) / 100)

    @property
    def utilization(self) -> Utilization | None:
        """The window's MFU (``JobContext.utilization_at`` its rate)."""
        return self.context.utilization_at(self.samples_per_s)

    @property
    def joules_per_sample(self) -> float | None:
        """Device energy per sample: mean power times the window's time, over its samples.

        ``None`` without NVML's energy counter.
        """
        power, samples = self.sampler.power_w, sum(self.samples)
        return power * self.total_s / samples if power is not None and samples > 0 else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view, with the derived rates."""
        return {
            "rank": self.rank,
            "first_step": self.first_step,
            "steps": self.steps,
            "step_time_s": list(self.step_time_s),
            "data_wait_s": list(self.data_wait_s),
            "samples": list(self.samples),
            "wait_cpu_s": list(self.wait_cpu_s),
            "compute_cpu_s": list(self.compute_cpu_s),
            "device_time_s": list(self.device_time_s),
            "gap_s": list(self.gap_s),
            "epoch_start": list(self.epoch_start),
            "carried_epoch_s": None if self.carried_epoch_s is None else list(self.carried_epoch_s),
            "epoch_predicted": self.epoch_predicted,
            "data_wait_share": self.data_wait_share,
            "samples_per_s": self.samples_per_s,
            "fit_samples_per_s": self.fit_samples_per_s,
            "epoch_cost_s": self.epoch_cost_s,
            "device_samples_per_s": self.device_samples_per_s,
            "sampler": self.sampler.to_dict(),
            "context": self.context.to_dict(),
            "capture": None if self.capture is None else self.capture.to_dict(),
            "utilization": None if self.utilization is None else self.utilization.to_dict(),
            "gc": None if self.gc is None else self.gc.to_dict(),
            "syncs": None if self.syncs is None else self.syncs.to_dict(),
            "joules_per_sample": self.joules_per_sample,
        }

    def __str__(self) -> str:
        text = (
            f"steps {self.first_step}..{self.first_step + self.steps - 1} (rank {self.rank}): "
            f"{self.samples_per_s:.1f} samples/s, median step {self.median_step_s * 1e3:.1f} ms, "
            f"data wait {self.data_wait_share:.0%}"
        )
        util = self.utilization
        if util is not None:
            text += f", {util.short()}"
        if self.gc is not None and self.gc.count:
            text += f", GC {self.gc.share:.0%} of step time"
        return text


def aligned_epochs(ref: Window, other: Window) -> Window:
    """``ref``, its predicted epoch boundary completed by the one ``other`` measured.

    A predicted boundary (``Window.epoch_predicted``) holds the train and validation loaders'
    worker starts, not what an epoch's end costs under any loader settings (validation itself,
    the epoch's hooks, a checkpoint). A measured one holds both: its gap less its validation
    loaders' worker starts (each taken as long as the train loader's) is that common part,
    added to ``ref``'s gap. When ``other`` measured no boundary, ``ref`` is compared by its
    steps alone, as ``other`` is. Any other ``ref`` is returned as it is.
    """
    if not ref.epoch_predicted or ref.carried_epoch_s is None:
        return ref
    parts = None if other.epoch_predicted else other.epoch_parts_s
    if parts is None:
        return dataclasses.replace(ref, carried_epoch_s=None, epoch_predicted=False)
    start, gap = parts
    common = max(0.0, gap - start * other.context.loaders_following)
    own = ref.carried_epoch_s[0]
    return dataclasses.replace(
        ref, carried_epoch_s=(own, common + own * ref.context.loaders_following)
    )


def combined_rate(windows: list[Window] | tuple[Window, ...]) -> float | None:
    """Samples/s over several windows, each counted at its own (stall-capped) rate."""
    seconds = sum(sum(w.samples) / w.samples_per_s for w in windows if w.samples_per_s > 0)
    return sum(sum(w.samples) for w in windows) / seconds if seconds > 0 else None


SPIKE_FACTOR = 3.0
"""A step longer than this many mean steps counts as this many in ``robust_rate``."""


def robust_rate(
    step_time_s: tuple[float, ...],
    samples: tuple[int, ...],
    keep: tuple[bool, ...] = (),
    workers: int = 0,
) -> float:
    """Samples/s of a window with a step-time stall capped at ``SPIKE_FACTOR`` x the mean step.

    On a shared machine a step can stall for seconds (another process takes the cores); such a
    stall says nothing about the knob under test, yet it moves a 10-step mean by tens of
    percent. The cap is relative to the mean, not the median: with several workers a loader
    delivers in bursts (a few instant steps, then one long wait), and those waits are real. A
    wait that recurs is no stall either: the cap is never below the window's second-longest
    step, so 4 workers that deliver together (one wait of 4 mean steps in every 4 steps) are
    counted as they are, not 25 % faster; and a window shorter than two turns of its
    ``workers`` holds its turn's wait once, so nothing in it is capped (22 workers that wait
    on reads, read over one turn with its one wait capped: 10,170 samples/s, where the fit ran
    at 6,500). Steps marked in ``keep`` (an epoch's first step, whose wait starts its workers:
    a cost every epoch pays) are never capped.
    """
    if not step_time_s:
        return 0.0
    cap = SPIKE_FACTOR * sum(step_time_s) / len(step_time_s)
    if len(step_time_s) > 1:
        cap = max(cap, sorted(step_time_s)[-2])
    if workers > 1 and len(step_time_s) < 2 * workers:
        cap = max(step_time_s)
    kept = keep or (False,) * len(step_time_s)
    total = sum(t if k else min(t, cap) for t, k in zip(step_time_s, kept, strict=True))
    return sum(samples) / total if total > 0 else 0.0
