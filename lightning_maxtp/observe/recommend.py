"""Concrete recommendations (values, not adjectives) for each bottleneck kind.

``auto_apply`` follows DESIGN's "Knobs": loader knobs and which GPUs are used are the same math;
batch size, accumulation, precision and compile change the optimization and need an opt-in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from lightning_maxtp.observe import thresholds as th
from lightning_maxtp.observe.window import JobContext, Window


@dataclass(frozen=True)
class Recommendation:
    """One concrete change: ``knob: current -> proposed (reason)``."""

    knob: str
    current: Any
    proposed: Any
    reason: str
    auto_apply: bool
    """True when the library may apply it by itself (same optimization math)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "knob": self.knob,
            "current": self.current,
            "proposed": self.proposed,
            "reason": self.reason,
            "auto_apply": self.auto_apply,
        }

    def __str__(self) -> str:
        mode = "auto" if self.auto_apply else "opt-in"
        return (
            f"{self.knob}: {_fmt(self.current)} -> {_fmt(self.proposed)} ({self.reason}) [{mode}]"
        )


def _fmt(value: Any) -> str:
    return "?" if value is None else str(value)


def _workers(window: Window) -> int:
    if window.context.num_workers is not None:
        return window.context.num_workers
    return window.sampler.num_worker_processes


def loader_rates(window: Window) -> tuple[float, float]:
    """(rate the device could consume, rate the loader delivers), samples/s.

    With 0 workers the loader runs only while the step waits, so its own rate is samples over
    the waiting time; with workers it runs alongside and delivers what the job gets.
    """
    device = window.device_samples_per_s
    wait = sum(window.data_wait_s)
    if _workers(window) == 0 and wait > 0:
        return device, sum(window.samples) / wait
    return device, window.samples_per_s


def _num_workers(ctx: JobContext, workers: int, proposed: int, reason: str) -> Recommendation:
    """The worker change; for an ``IterableDataset`` only a condition, never applied by itself.

    Each worker iterates the dataset, so more workers yield the stream more times unless the
    dataset splits it by ``get_worker_info()``.
    """
    if not ctx.iterable_dataset:
        return Recommendation("num_workers", workers, proposed, reason, True)
    condition = (
        "only if the IterableDataset splits its stream by "
        "torch.utils.data.get_worker_info(); otherwise every worker yields every sample"
    )
    return Recommendation("num_workers", workers, proposed, f"{reason}; {condition}", False)


def _loader_tail(ctx: JobContext, workers: int, proposed: int) -> list[Recommendation]:
    """Prefetch and persistence: knobs of a loader that already has workers."""
    recs: list[Recommendation] = []
    if workers == 0:  # they do nothing without workers; the next round, once workers pay
        return recs
    if proposed > 0 and (ctx.prefetch_factor or 2) < 4:
        recs.append(
            Recommendation(
                "prefetch_factor",
                ctx.prefetch_factor or 2,
                4,
                "absorb batch-to-batch variation in load time",
                True,
            )
        )
    if proposed > 0 and ctx.persistent_workers is False:
        recs.append(
            Recommendation(
                "persistent_workers", False, True, "no worker restart at every epoch", True
            )
        )
    return recs


def data_pipeline(window: Window) -> list[Recommendation]:
    """More workers (sized from the measured speedup), then prefetch, then pre-encoding."""
    ctx, workers = window.context, _workers(window)
    device_rate, loader_rate = loader_rates(window)
    speedup = device_rate / loader_rate if loader_rate > 0 else math.inf
    need = max(1, math.ceil(round(max(workers, 1) * speedup * 1.1, 6)))
    budget = ctx.cpu_worker_budget
    proposed = need if budget is None else min(need, budget)
    recs: list[Recommendation] = []
    if workers == 0:
        # Loading in the main process runs in series with the step; any worker overlaps it.
        proposed = max(1, proposed)
    if proposed > workers and (speedup > 1 or workers == 0):
        if speedup > 1:
            reason = f"loader must be {speedup:.1f}x faster: device takes {device_rate:.0f}/s, "
            reason += f"gets {loader_rate:.0f}/s"
            if workers == 0:
                reason += "; a worker also overlaps loading with the step"
        else:
            reason = (
                f"loading ({loader_rate:.0f}/s alone) is fast enough for the device "
                f"({device_rate:.0f}/s) but runs in series with the step; a worker overlaps it"
            )
        if budget is not None:
            reason += f"; CPU budget {budget} workers"
        recs.append(_num_workers(ctx, workers, proposed, reason))
    recs += _loader_tail(ctx, workers, max(proposed, workers))
    if budget is not None and need > budget and ctx.dataset != "TensorDataset":
        gpu = " or GPU decode (nvjpeg/DALI)" if ctx.device_type == "cuda" else ""
        recs.append(
            Recommendation(
                "decode",
                "CPU in workers",
                f"pre-encoded tensors{gpu}",
                f"needs ~{need} workers, CPU budget allows {budget}",
                False,
            )
        )
    return recs


def storage(window: Window) -> list[Recommendation]:
    """More reads in flight (idle workers cost little CPU), then local copies and shards."""
    ctx, workers = window.context, _workers(window)
    budget = ctx.cpu_worker_budget
    proposed = max(2 * workers, workers + 2)
    if budget is not None:
        # Waiting workers use little CPU, so the cap is a multiple of the CPU budget, of one
        # worker's at least (ranks that take every core still have room for reads in flight).
        proposed = min(proposed, max(th.IO_WORKER_FACTOR * max(budget, 1), workers))
    recs: list[Recommendation] = []
    if proposed > workers:
        reason = "workers wait on reads: more reads in flight hide latency"
        recs.append(_num_workers(ctx, workers, proposed, reason))
    if workers > 0 and (ctx.prefetch_factor or 2) < 8:
        recs.append(
            Recommendation(
                "prefetch_factor", ctx.prefetch_factor or 2, 8, "deeper read-ahead per worker", True
            )
        )
    recs.append(
        Recommendation(
            "dataset location",
            "network/slow disk",
            "local NVMe or /dev/shm",
            "copy or cache once, read locally",
            False,
        )
    )
    recs.append(
        Recommendation(
            "dataset format",
            "one file per sample",
            "sharded sequential files (tar/WebDataset)",
            "large sequential reads instead of many small ones",
            False,
        )
    )
    return recs


def bf16_ok(ctx: JobContext) -> bool:
    """Whether the GPU supports bf16 (compute capability >= 8.0)."""
    if ctx.compute_capability is None:
        return False
    try:
        return float(ctx.compute_capability) >= 8.0
    except ValueError:
        return False


def precision(ctx: JobContext, why: str) -> Recommendation | None:
    """32-bit -> bf16-mixed (or 16-mixed on pre-Ampere GPUs) on a CUDA device."""
    if ctx.device_type != "cuda" or ctx.precision not in (None, "32", "32-true"):
        return None
    gpu = f"{ctx.gpu_name or 'GPU'}, compute capability {ctx.compute_capability or '?'}"
    if bf16_ok(ctx):
        return Recommendation(
            "precision",
            ctx.precision or "32-true",
            "bf16-mixed",
            f"{gpu}, supports bf16; {why}",
            False,
        )
    return Recommendation(
        "precision", ctx.precision or "32-true", "16-mixed", f"{gpu}, no bf16; {why}", False
    )


def batch_growth(window: Window) -> Recommendation | None:
    """A larger batch when device memory has room (measured share in use)."""
    ctx, share = window.context, window.memory_share
    if ctx.batch_size is None or share is None or share >= th.MEMORY_HEADROOM_SHARE:
        return None
    factor = 2 ** int(math.log2(max(1.0, min(th.BATCH_GROWTH_MAX, 0.8 / max(share, 1e-3)))))
    if factor < 2:
        return None
    return Recommendation(
        "batch_size",
        ctx.batch_size,
        ctx.batch_size * factor,
        f"VRAM {share:.0%} used; scale the learning rate with it",
        False,
    )


def compute(window: Window) -> list[Recommendation]:
    """Bigger batch, lower precision, compile: all change the math, so opt-in."""
    ctx = window.context
    recs = [batch_growth(window), precision(ctx, "tensor cores at 2x the fp32 rate")]
    if ctx.compiled is not True:
        recs.append(
            Recommendation("torch.compile", False, True, "fuses elementwise kernels", False)
        )
    return [r for r in recs if r is not None]


def vram(window: Window) -> list[Recommendation]:
    """Same effective batch with half the activations, then checkpointing."""
    ctx = window.context
    recs: list[Recommendation] = []
    if ctx.batch_size is not None and ctx.batch_size > 1:
        half = ctx.batch_size // 2
        recs.append(
            Recommendation(
                "batch_size x accumulate_grad_batches",
                f"{ctx.batch_size} x 1",
                f"{half} x 2",
                "same effective batch, half the activation memory",
                False,
            )
        )
    recs.append(
        Recommendation(
            "activation checkpointing",
            False,
            True,
            "recompute activations in backward instead of storing them",
            False,
        )
    )
    rec = precision(ctx, "halves activation memory")
    if rec is not None:
        recs.append(rec)
    return recs


def kernel_launch(window: Window) -> list[Recommendation]:
    """Fewer, larger kernels: batch, CUDA graphs, more jobs per GPU."""
    ctx = window.context
    recs: list[Recommendation] = []
    share = window.memory_share
    if ctx.batch_size is not None:
        used = "?" if share is None else f"{share:.0%}"
        recs.append(
            Recommendation(
                "batch_size",
                ctx.batch_size,
                ctx.batch_size * 4,
                f"same launches, 4x the work each; VRAM {used} used",
                False,
            )
        )
    recs.append(
        Recommendation(
            "torch.compile mode",
            None,
            "reduce-overhead",
            "CUDA graphs replay the step's launches at once",
            False,
        )
    )
    recs.append(Recommendation("jobs per GPU", 1, 2, "the GPU idles between launches", False))
    return recs


def host_overhead(window: Window) -> list[Recommendation]:
    """Pinned memory and non-blocking copies first (free), then removing per-step syncs."""
    ctx, cap = window.context, window.capture
    recs: list[Recommendation] = []
    if ctx.pin_memory is not True:
        pageable = "" if cap is None else f"{cap.pageable_h2d_per_step:.1f} pageable copies/step; "
        recs.append(
            Recommendation(
                "pin_memory",
                ctx.pin_memory,
                True,
                f"{pageable}pinned copies can overlap compute",
                True,
            )
        )
    if _workers(window) > 0 and ctx.persistent_workers is False:
        recs.append(
            Recommendation(
                "persistent_workers", False, True, "no worker restart at every epoch", True
            )
        )
    if cap is not None and cap.syncs_per_step > th.SYNCS_PER_STEP:
        recs.append(
            Recommendation(
                "syncs per step",
                round(cap.syncs_per_step, 1),
                0,
                "remove .item()/.cpu()/print of tensors in the step; log with sync_dist off",
                False,
            )
        )
    return recs


def under_occupied(window: Window) -> list[Recommendation]:
    """Use the idle GPUs (DDP changes the global batch: opt-in), or pack jobs."""
    ctx = window.context
    free = list(ctx.unused_free_gpus)
    recs: list[Recommendation] = []
    if free:
        recs.append(
            Recommendation(
                "devices",
                ctx.world_size,
                ctx.world_size + len(free),
                f"GPUs {free} are free; DDP multiplies the global batch",
                False,
            )
        )
    recs.append(Recommendation("jobs per GPU", 1, 2, "the GPU is mostly idle", False))
    return recs
