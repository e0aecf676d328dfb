"""What to change for each bottleneck the diagnosis names: the knobs' recommendations.

Concrete values, not adjectives. The loader's kinds (``data_pipeline``, ``storage``) are in
``advice_loader``; ``advisor.ADVICE`` hands both to the diagnosis, which names no knob itself.
Knobs are named by their classes, so a renamed knob is renamed here too.

``auto_apply`` follows the knob tiers (``docs/knobs.md``): loader knobs and which GPUs are
used are the same math; batch size, accumulation, precision and compile change the
optimization and need an opt-in.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from lightning_maxtp.knobs.batch_size import BatchSize
from lightning_maxtp.knobs.compile import Compile
from lightning_maxtp.knobs.gc_freeze import GcFreeze
from lightning_maxtp.knobs.loader_settings import (
    NumWorkers,
    PersistentWorkers,
    PinMemory,
    PrefetchFactor,
)
from lightning_maxtp.knobs.precision import Precision, bf16_native
from lightning_maxtp.knobs.threads import IntraOpThreads
from lightning_maxtp.observe import thresholds as th
from lightning_maxtp.observe.job_model import JobModel
from lightning_maxtp.observe.recommendation import Recommendation
from lightning_maxtp.observe.shares import worker_cpu, workers_of
from lightning_maxtp.observe.window import JobContext, Window

__all__ = [
    "batch_growth",
    "busy_host",
    "collections",
    "compute",
    "fewer_workers",
    "host_overhead",
    "kernel_launch",
    "leaner_loader",
    "main_threads",
    "modelled",
    "modelled_workers",
    "num_workers_change",
    "precision",
    "under_occupied",
    "vram",
]


def num_workers_change(ctx: JobContext, workers: int, proposed: int, reason: str) -> Recommendation:
    """The worker change; for an ``IterableDataset`` only a condition, never applied by itself.

    Each worker iterates the dataset, so more workers yield the stream more times unless the
    dataset splits it by ``get_worker_info()``.
    """
    if not ctx.iterable_dataset:
        return Recommendation(NumWorkers.name, workers, proposed, reason, True)
    condition = (
        "only if the IterableDataset splits its stream by "
        "torch.utils.data.get_worker_info(); otherwise every worker yields every sample"
    )
    return Recommendation(NumWorkers.name, workers, proposed, f"{reason}; {condition}", False)


def modelled_workers(window: Window, why: str = "") -> Recommendation | Literal[False] | None:
    """The worker count, else the persistence, the job model predicts finishes soonest.

    A ``num_workers`` change when the best count differs from the one in force (with their
    persistence, when the model ranks the persistent count best: ``Recommendation.also``),
    else a ``persistent_workers`` change; either with the gain of the best setting.
    ``False`` when there is no model (the caller's own rules apply); ``None`` when the model
    predicts nothing beats the settings in force by ``MIN_GAIN`` (nothing to try).
    ``why``, the finding's own words, leads the reason.
    """
    model = JobModel.from_window(window)
    if model is None:
        return False
    choice = model.choose()
    workers, persistent = workers_of(window), bool(window.context.persistent_workers)
    if choice.workers == workers and (not workers or choice.persistent == persistent):
        return None
    # The gain of the setting the model ranks best: the workers first, their persistence (when
    # it differs) the next trial, as the knobs are tried one at a time.
    gain = choice.gain
    if gain < th.MIN_GAIN:
        return None
    reason = f"{why}; {choice.reason}" if why else choice.reason
    reason += f", {gain:+.0%} over the settings in force ({choice.now.samples_per_s:.0f} measured)"
    if choice.workers == workers:
        restarts = f"no worker restart at every epoch ({model.epoch_cost_s or 0:.2f} s an epoch)"
        rec = Recommendation(
            PersistentWorkers.name, persistent, True, f"{restarts}; {reason}", True
        )
    else:
        rec = num_workers_change(window.context, workers, choice.workers, reason)
        if choice.persistent and not persistent and choice.workers:
            # The gain is the persistent workers': restarted at every epoch they would not
            # give it (2 workers decoding JPEGs in 32-step epochs: +6-8 % against +47-52 %).
            rec = dataclasses.replace(rec, also=((PersistentWorkers.name, True),))
    return dataclasses.replace(rec, expected_gain=round(gain, 4))


def modelled(window: Window) -> list[Recommendation]:
    """The job model's worker change (``modelled_workers``), then what goes with it.

    Fewer workers bring the leaner loader (``leaner_loader``); empty without a model or when
    nothing beats the settings in force.
    """
    found = modelled_workers(window)
    if not isinstance(found, Recommendation):
        return []
    if int(found.proposed) > int(found.current):
        return [found]
    return [found, *leaner_loader(window)]


def main_threads(
    ctx: JobContext, workers: int, *, grow: bool = False, model: JobModel | None = None
) -> Recommendation | None:
    """On a CPU device: the main process's intra-op threads sized to the cores workers leave.

    Fewer when workers share the cores: torch sizes the main process's pool from the machine,
    and with busy workers beside it the step's threads and the workers' decoding take turns on
    the same cores. With ``grow`` (a compute-bound step), more when a pool set smaller by hand
    (``torch.set_num_threads``) leaves cores idle. Same math: the threads split the same
    operations. ``None`` off the CPU, or when the pool already fits.

    With a ``model`` of the job (a compute-bound window's), fewer threads only when it predicts
    them at least ``MODEL_GAIN`` faster (the least predicted gain the loop tries: two pairs of
    windows could not keep less): what the workers take is measured, not assumed from their
    count (4 workers beside a ResNet-18 step on 2 CPUs used 0.13 of a core, and one
    thread made the step 21 % slower).
    """
    cpus, threads = ctx.cpus_per_rank, ctx.intra_op_threads
    if ctx.device_type != "cpu" or cpus is None or threads is None:
        return None
    fits = max(1, cpus - workers)
    gain: float | None = None
    if workers and threads > fits:
        why = f"{workers} worker(s) share {cpus} CPUs with the step's {threads} threads"
        if model is not None:
            gain = model.threads_gain(fits, threads)
            if gain < th.MODEL_GAIN:
                return None
            why += f"; the job model predicts {gain:+.0%} ({model.load_cpu_s * 1e3:.2f} ms of "
            why += f"loading CPU a sample beside {model.step_s * 1e3:.2f} ms of step)"
    elif grow and threads < fits:
        why = f"the step computes on {threads} of the {fits} CPUs its workers leave"
    else:
        return None
    return Recommendation(IntraOpThreads.name, threads, fits, why, True, expected_gain=gain)


def fewer_workers(window: Window) -> Recommendation | None:
    """Fewer DataLoader workers when the step is compute-bound and they take CPU it could use.

    The count the job model predicts finishes soonest (``modelled_workers``),
    when it is fewer; without a model, these rules:

    Called for a compute-bound window: the loader keeps up, so what its workers cost is CPU the
    step could have. On a CPU device the step's threads and the workers take turns on the same
    cores, and loading in the main process costs the same CPU without the processes, so the
    proposal is none when the workers use less than a core (else half as many), when they use a
    quarter of a core or more, or the machine's CPUs are saturated. On a GPU host busy workers
    delay the step's kernel launches once the host's CPUs are busy (``HOST_CPU_BUSY``); there
    the proposal keeps what 1.25x the consumption needs: the workers' cores now, scaled by
    1.25, in workers of one core each. Either way the loop keeps the change only if real steps
    are faster.
    ``None`` without workers, when they use little CPU on a machine with CPUs to spare, or on
    an idle GPU host.
    """
    ctx, workers = window.context, workers_of(window)
    taken = worker_cpu(window)
    if taken is None:
        return None
    busy, system = taken
    modelled = _modelled_fewer(window, busy)
    if modelled is not False:
        return modelled
    saturated = system is not None and system >= th.SYSTEM_CPU_SATURATED
    if ctx.device_type == "cpu":
        # With every core busy, worker processes cost the step more than their own CPU time
        # (shipping batches between processes, cache and scheduler contention): measured on 2
        # CPUs, 4 workers using 0.17 cores left a ResNet-18 step 1.10x slower than none.
        # Loading that takes less than a core fits in the main process: none at once (workers
        # that cost more than their CPU time cost it at any count); else half as many.
        proposed = 0 if busy < 1.0 else workers // 2
        why = f"the step's threads share the CPUs with {workers} workers using {busy:.1f} cores"
        if saturated:
            why += f" (machine CPUs {system:.0f} % busy)"
    else:
        assert system is not None  # worker_cpu: a GPU host is busy
        proposed = math.ceil(round(1.25 * busy, 6))
        why = (
            f"host CPUs {system:.0f} % busy; {workers} workers use {busy:.1f} cores, "
            f"{proposed} keep 1.25x the consumption"
        )
    if proposed >= workers:
        return None
    return Recommendation(NumWorkers.name, workers, proposed, f"{why}; kept only if faster", True)


def busy_host(window: Window) -> list[Recommendation]:
    """Fewer workers (``fewer_workers``), when they take a busy GPU host's CPUs."""
    found = fewer_workers(window)
    return [] if found is None else [found]


def _modelled_fewer(window: Window, busy: float) -> Recommendation | Literal[False] | None:
    """The job model's worker count when it is fewer (``False``: no model, the rules decide)."""
    why = f"the step shares the CPUs with {workers_of(window)} workers using {busy:.1f} cores"
    rec = modelled_workers(window, why)
    if isinstance(rec, Recommendation) and int(rec.proposed) >= workers_of(window):
        return None  # more workers is the loader's finding, not a compute-bound step's
    return rec


def leaner_loader(window: Window) -> list[Recommendation]:
    """The loader's other knobs down, when its workers take CPU a compute-bound step could use.

    A prefetch deeper than the default 2 (the loader keeps up: batches queued beyond two per
    worker only hold RAM, and pinned memory on a GPU host); pinning off on a GPU host (a
    thread of the training process copies every batch once more, on CPUs the step's launches
    wait for); persistence off when the host's RAM runs short (idle workers hold their memory
    between epochs). Each is judged on real steps like any trial and kept only if faster.
    """
    taken = worker_cpu(window)
    if taken is None:
        return []
    ctx, (busy, system) = window.context, taken
    cpu = "" if system is None else f", machine CPUs {system:.0f} % busy"
    using = f"{workers_of(window)} workers use {busy:.1f} cores{cpu}"
    recs = []
    if ctx.prefetch_factor is not None and ctx.prefetch_factor > 2:
        why = f"the loader keeps up; {using}: fewer batches queued; kept only if faster"
        recs.append(Recommendation(PrefetchFactor.name, ctx.prefetch_factor, 2, why, True))
    if ctx.pin_memory and ctx.device_type == "cuda":
        why = f"{using}: pinning copies every batch once more in the training process"
        recs.append(
            Recommendation(PinMemory.name, True, False, f"{why}; kept only if faster", True)
        )
    ram = window.sampler.available_ram_bytes
    if ctx.persistent_workers and ram and min(ram) < th.HOST_RAM_LOW_BYTES:
        why = (
            f"{min(ram) / 2**30:.1f} GiB of host RAM left; {using}: idle workers hold "
            "theirs between epochs; kept only if faster"
        )
        recs.append(Recommendation(PersistentWorkers.name, True, False, why, True))
    return recs


def precision(ctx: JobContext, why: str) -> Recommendation | None:
    """32-bit -> bf16-mixed (or 16-mixed on pre-Ampere GPUs) on a CUDA device."""
    if ctx.device_type != "cuda" or ctx.precision not in (None, "32", "32-true"):
        return None
    gpu = f"{ctx.gpu_name or 'GPU'}, compute capability {ctx.compute_capability or '?'}"
    if bf16_native(ctx.compute_capability):
        return Recommendation(
            Precision.name,
            ctx.precision or "32-true",
            "bf16-mixed",
            f"{gpu}, supports bf16; {why}",
            False,
        )
    return Recommendation(
        Precision.name, ctx.precision or "32-true", "16-mixed", f"{gpu}, no bf16; {why}", False
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
        BatchSize.name,
        ctx.batch_size,
        ctx.batch_size * factor,
        f"VRAM {share:.0%} used; scale the learning rate with it",
        False,
    )


def compute(window: Window) -> list[Recommendation]:
    """Fewer busy workers, threads sized to the cores left, a leaner loader; then the opt-ins.

    The opt-in ones: a bigger batch, lower precision, compile.
    """
    ctx = window.context
    model = JobModel.from_window(window)
    recs = [fewer_workers(window), main_threads(ctx, workers_of(window), grow=True, model=model)]
    recs += leaner_loader(window)
    recs += [batch_growth(window), precision(ctx, "tensor cores at 2x the fp32 rate")]
    if ctx.compiled is not True:
        recs.append(
            Recommendation(
                Compile.name, False, True, "torch.compile fuses elementwise kernels", False
            )
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
                BatchSize.name,
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
    """Collections first (the ``gc`` knob), then pinned memory, persistent workers, fewer syncs."""
    ctx, cap = window.context, window.capture
    recs: list[Recommendation] = []
    if ctx.pin_memory is not True:
        pageable = "" if cap is None else f"{cap.pageable_h2d_per_step:.1f} pageable copies/step; "
        recs.append(
            Recommendation(
                PinMemory.name,
                ctx.pin_memory,
                True,
                f"{pageable}pinned copies can overlap compute",
                True,
            )
        )
    if workers_of(window) > 0 and ctx.persistent_workers is False:
        recs.append(
            Recommendation(
                PersistentWorkers.name, False, True, "no worker restart at every epoch", True
            )
        )
    syncs = window.syncs
    per_step = (
        syncs.per_step if syncs is not None else (None if cap is None else cap.syncs_per_step)
    )
    if per_step is not None and per_step > th.SYNCS_PER_STEP:
        where = ""
        if syncs is not None and syncs.sources:
            where = " at " + ", ".join(line for line, _ in syncs.sources[:3])
        recs.append(
            Recommendation(
                "syncs per step",
                round(per_step, 1),
                0,
                f"remove .item()/.cpu()/print of tensors in the step{where}; log with "
                "sync_dist off",
                False,
            )
        )
    return [*collections(window), *recs]


def collections(window: Window) -> list[Recommendation]:
    """The ``gc`` knob, when Python's collector takes a measurable share of the step."""
    gc = window.gc
    if gc is None or gc.share <= th.GC_SHARE or window.context.gc_tuned:
        return []
    why = (
        f"{gc.count} collections ({gc.gen2} full) take {gc.share:.0%} of step time: freeze the "
        "long-lived objects, collect less often; kept only if faster"
    )
    return [Recommendation(GcFreeze.name, False, True, why, True)]


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
