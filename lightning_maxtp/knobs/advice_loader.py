"""The knobs' recommendations for the loader's bottleneck kinds (``data_pipeline``, ``storage``).

Workers are sized by the job model (``job_model``): the count it predicts finishes soonest, with
the gain it predicts, whether that is more workers or fewer. Without a model (the loader's cost
not measured: workers and no sampler) they are sized from the measured speedup within the
probe's CPU budget; past it, one more worker at a time up to the ceiling
(``resources.probe.worker_ceiling``). The closed loop judges either on real steps.
"""

from __future__ import annotations

import dataclasses
import math

from lightning_maxtp.knobs.advice import main_threads, modelled_workers, num_workers_change
from lightning_maxtp.knobs.loader_settings import PersistentWorkers, PrefetchFactor
from lightning_maxtp.observe import thresholds as th
from lightning_maxtp.observe.data_path import DataFacts, advise_data_path
from lightning_maxtp.observe.job_model import JobModel
from lightning_maxtp.observe.recommendation import Recommendation
from lightning_maxtp.observe.shares import loader_rates, step_takes_cores, workers_of
from lightning_maxtp.observe.window import JobContext, Window

__all__ = ["PREFETCH_MARGIN", "data_pipeline", "storage"]

PREFETCH_MARGIN = 1.2
"""Workers that deliver at least this many times what the step takes keep up on average: a
wait they leave is variation, which a deeper prefetch absorbs."""


def _predicted(window: Window, rec: Recommendation) -> Recommendation:
    """``rec`` (workers from none) with the gain the main process's own loading predicts.

    Loading in the main process while the step waits is the loader measured alone: each
    worker loads about as fast, beside the step instead of before it, up to what the device
    consumes. When the step takes every core (``step_takes_cores``) a worker hides only the
    loading's waits (reads), not its CPU work. Only from no workers, and only for a change the
    loop may make by itself.
    """
    if workers_of(window) != 0 or not rec.auto_apply or window.samples_per_s <= 0:
        return rec
    device_rate, loader_rate = loader_rates(window)
    expected = min(device_rate, loader_rate * int(rec.proposed)) / window.samples_per_s - 1
    if step_takes_cores(window):
        now = 1 / window.samples_per_s  # seconds per sample: computing, then loading
        wait = sum(window.data_wait_s) / max(1, sum(window.samples))
        reads = wait * max(0.0, 1 - (window.wait_cpu_share or 0.0))  # waits without CPU
        expected = min(expected, now / max(now - reads, 1e-12) - 1)
    return dataclasses.replace(rec, expected_gain=round(expected, 4))


def _no_core_for_workers(window: Window, rec: Recommendation) -> Recommendation:
    """``rec`` left to the user when a CPU step leaves no core for a worker to load on.

    Its predicted gain (``_predicted``) under ``MIN_GAIN`` (the diagnosis's 5 %, not the
    loop's ``min_gain``, which it does not know): the loader is then neither
    measured alone nor tried, since a worker could only take CPU from the step.
    """
    gain = rec.expected_gain
    if not step_takes_cores(window) or gain is None or gain >= th.MIN_GAIN or not rec.auto_apply:
        return rec
    ctx = window.context
    why = (
        f"{rec.reason}; but the step computes on all {ctx.cpus_per_rank} cores "
        f"({ctx.intra_op_threads} threads) {1 - window.data_wait_share:.0%} of the time and the "
        f"loading is CPU work: a worker would take the step's cores (predicted {gain:+.0%})"
    )
    return dataclasses.replace(rec, reason=why, auto_apply=False)


def _loader_tail(ctx: JobContext, workers: int, proposed: int) -> list[Recommendation]:
    """Prefetch and persistence of a loader that already has workers, without a job model.

    With one, the model weighs persistence, and a deeper prefetch is proposed only where it
    predicts one (``_variance_prefetch``).
    """
    recs: list[Recommendation] = []
    if workers == 0:  # they do nothing without workers; the next round, once workers pay
        return recs
    if proposed > 0 and (ctx.prefetch_factor or 2) < 4:
        recs.append(
            Recommendation(
                PrefetchFactor.name,
                ctx.prefetch_factor or 2,
                4,
                "absorb batch-to-batch variation in load time",
                True,
            )
        )
    if proposed > 0 and ctx.persistent_workers is False:
        recs.append(
            Recommendation(
                PersistentWorkers.name, False, True, "no worker restart at every epoch", True
            )
        )
    return recs


def data_pipeline(window: Window) -> list[Recommendation]:
    """More workers (the job model's count), then prefetch, then pre-encoding."""
    ctx, workers = window.context, workers_of(window)
    device_rate, loader_rate = loader_rates(window)
    speedup = device_rate / loader_rate if loader_rate > 0 else math.inf
    need = max(1, math.ceil(round(max(workers, 1) * speedup * 1.1, 6)))
    if speedup > 1:
        reason = f"loader must be {speedup:.1f}x faster: device takes {device_rate:.0f}/s, "
        reason += f"gets {loader_rate:.0f}/s"
    else:
        reason = (
            f"loading ({loader_rate:.0f}/s alone) is fast enough for the device "
            f"({device_rate:.0f}/s) but runs in series with the step"
        )
    recs: list[Recommendation] = []
    modelled = modelled_workers(window, reason)
    if modelled is False:  # no model: the rules of the CPU budget size the workers
        rule = _budgeted_workers(window, need, speedup, reason)
        recs += [rule] if rule is not None else []
        proposed = int(rule.proposed) if rule is not None else workers
        recs += _loader_tail(ctx, workers, max(proposed, workers))
    else:
        recs += [modelled] if modelled is not None else _variance_prefetch(window, 4)
    threads = main_threads(ctx, workers)
    if threads is not None:
        recs.append(threads)
    budget = ctx.cpu_worker_budget
    if budget is not None and need > budget and ctx.dataset != "TensorDataset":
        advice = _data_path(window, need, budget)
        recs += [advice] if advice is not None else []
    return recs


def _budgeted_workers(
    window: Window, need: int, speedup: float, reason: str
) -> Recommendation | None:
    """Without a job model: workers sized from the measured speedup within the CPU budget.

    Past the budget, one more worker at a time up to the ceiling, each kept only if real steps
    are faster with it (the main process of a data-bound job mostly waits).
    """
    ctx, workers = window.context, workers_of(window)
    budget, ceiling = ctx.cpu_worker_budget, ctx.cpu_worker_ceiling
    proposed = need if budget is None else min(need, budget)
    past = budget is not None and ceiling is not None and budget <= workers < min(need, ceiling)
    if past:
        proposed = workers + 1
    if workers == 0:  # loading in the main process runs in series with the step
        proposed = max(1, proposed)
    if proposed <= workers or not (speedup > 1 or workers == 0):
        return None
    if speedup <= 1:
        reason += "; a worker overlaps it"
    elif workers == 0:
        reason += "; a worker also overlaps loading with the step"
    if past:
        reason += (
            f"; past the CPU budget of {budget} workers one at a time, kept only if real "
            f"steps are faster (ceiling {ceiling})"
        )
    elif budget is not None:
        reason += f"; CPU budget {budget} workers"
    rec = _predicted(window, num_workers_change(ctx, workers, proposed, reason))
    return _no_core_for_workers(window, rec)


def _variance_prefetch(window: Window, depth: int) -> list[Recommendation]:
    """A deeper prefetch where the job model says the workers keep up yet the step waits.

    That wait is batch-to-batch variation in load time, which queued batches absorb: the
    workers in force deliver, by the model, at least ``PREFETCH_MARGIN`` times what the step
    takes, so the wait the window shows is the variation, and the gain is its share.
    """
    ctx, workers = window.context, workers_of(window)
    model = JobModel.from_window(window)
    if model is None or workers == 0 or (ctx.prefetch_factor or 2) >= depth:
        return []
    delivers = workers / model.load_s if model.load_s > 0 else float("inf")
    takes = 1 / model.step_s
    share = window.steady().data_wait_share
    if delivers < PREFETCH_MARGIN * takes or share < th.DATA_WAIT_SHARE:
        return []
    why = (
        f"the {workers} workers deliver {delivers:.0f} samples/s on average, the step takes "
        f"{takes:.0f}, yet it waits {share:.0%} of the time: variation a deeper queue absorbs"
    )
    rec = Recommendation(PrefetchFactor.name, ctx.prefetch_factor or 2, depth, why, True)
    return [dataclasses.replace(rec, expected_gain=round(share / (1 - share), 4))]


def _data_path(window: Window, need: int, budget: int) -> Recommendation | None:
    """The data path that fits (``observe.data_path``) once workers alone cannot close the gap."""
    ctx = window.context
    device_rate, loader_rate = loader_rates(window)
    facts = ctx.data_facts or DataFacts()
    advice = advise_data_path(
        facts, device_rate=device_rate, loader_rate=loader_rate, device_type=ctx.device_type
    )
    if advice is None:
        return None
    current = f"{facts.pixel_dtype + ' ' if facts.pixel_dtype else ''}batches made by workers"
    reason = f"needs ~{need} workers, CPU budget allows {budget}; {advice.reason}"
    return Recommendation("data path", current, advice.path, reason, False)


def storage(window: Window) -> list[Recommendation]:
    """More reads in flight (idle workers cost little CPU), then local copies and shards."""
    ctx, workers = window.context, workers_of(window)
    budget = ctx.cpu_worker_budget
    proposed = max(2 * workers, workers + 2)
    if budget is not None:
        # Waiting workers use little CPU, so the cap is a multiple of the CPU budget, of one
        # worker's at least (ranks that take every core still have room for reads in flight).
        proposed = min(proposed, max(th.IO_WORKER_FACTOR * max(budget, 1), workers))
    recs: list[Recommendation] = []
    reason = "workers wait on reads: more reads in flight hide latency"
    modelled = modelled_workers(window, reason)
    if modelled is not False:
        recs += [modelled] if modelled is not None else []
    elif proposed > workers:
        rec = _predicted(window, num_workers_change(ctx, workers, proposed, reason))
        recs.append(_no_core_for_workers(window, rec))
    if modelled is not False:
        recs += _variance_prefetch(window, 8) if modelled is None else []
    elif workers > 0 and (ctx.prefetch_factor or 2) < 8:
        recs.append(
            Recommendation(
                PrefetchFactor.name,
                ctx.prefetch_factor or 2,
                8,
                "deeper read-ahead per worker",
                True,
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
