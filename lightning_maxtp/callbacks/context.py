"""Read a running Trainer's settings into a ``JobContext`` (what recommendations need)."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lightning_maxtp._log import prefixed
from lightning_maxtp.knobs.base import FitView
from lightning_maxtp.knobs.registry import KNOBS, LOADER_SETTINGS, SETTINGS
from lightning_maxtp.loader.first import first_loader
from lightning_maxtp.observe.data_path import DataFacts
from lightning_maxtp.observe.window import JobContext
from lightning_maxtp.resources.probe import worker_ceiling, workers_per_process

if TYPE_CHECKING:
    import lightning.pytorch as pl

log = logging.getLogger(__name__)


def job_context(trainer: pl.Trainer, resources: Any = None) -> JobContext:
    """The job's device, precision, loader knobs, CPU budget and unused free GPUs.

    Args:
        trainer: A Trainer whose train dataloader is set up (``on_train_start`` or later).
        resources: A ``Resources`` from ``inspect_resources``; probed here when None.
    """
    import torch
    from torch.utils.data import IterableDataset

    device = trainer.strategy.root_device
    ctx: dict[str, Any] = {"device_type": device.type, "world_size": trainer.world_size}
    # Each knob's value as the knob reads it (precision, compiled, threads, the batch size...);
    # the loader's settings are read from the user's loader below, not through a switchable one.
    fit = FitView(trainer)
    for knob in (*KNOBS, *(k for k in SETTINGS if k.holder == "process")):
        if knob.context_field is not None:
            ctx[knob.context_field] = knob().current(fit)
    loader = first_loader(trainer.train_dataloader)
    batches = trainer.num_training_batches
    if isinstance(batches, int):  # inf for an unsized loader
        ctx["epoch_batches"] = batches
    if loader is not None:
        ctx |= {
            **{name: getattr(loader, name) for name in LOADER_SETTINGS},
            "dataset": type(loader.dataset).__name__,
            "iterable_dataset": isinstance(loader.dataset, IterableDataset),
        }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        ctx |= {
            "gpu_name": props.name,
            "compute_capability": f"{props.major}.{props.minor}",
            "gpu_memory_total_bytes": int(props.total_memory),
            "tf32_conv": bool(torch.backends.cudnn.allow_tf32),
        }
    try:
        if resources is None:
            from lightning_maxtp.resources.probe import inspect_resources

            resources = inspect_resources()
        # The ranks this node runs share its CPUs (Lightning's CPU DDP sets no LOCAL_WORLD_SIZE).
        ranks = trainer.num_devices
        ctx["cpu_worker_budget"] = workers_per_process(resources.cpu, ranks)
        ctx["cpu_worker_ceiling"] = worker_ceiling(
            resources.cpu, ranks, has_gpus=bool(resources.gpus)
        )
        ctx["cpus_per_rank"] = max(1, resources.cpu.effective // max(1, ranks))
        ctx["host_cpus"] = int(resources.cpu.logical or resources.cpu.effective)  # as CPU % counts
        used = set(trainer.device_ids) if device.type == "cuda" else set()
        ctx["unused_free_gpus"] = tuple(i for i in resources.advice.free_gpus if i not in used)
    except Exception as err:  # the probe is advisory; the measurements stand without it
        log.warning("maxtp: resource probe failed, no CPU budget in recommendations: %r", err)
    return JobContext(**ctx)


_OBSERVE = "lightning_maxtp.observe_batch"
SAMPLE_COST_BUDGET_S = 0.1
"""About the most the first step waits while a few samples are timed (what a sample costs to
load; their files' decode comes on top, usually a share of it): two to four samples of a
photo dataset, enough for the share of decoding in a sample, which is what the data path is
chosen by."""
_OBSERVE_ORDER = -100
"""Before every other added step: the batch as the loader delivered it."""


def _sample_costs(trainer: pl.Trainer) -> dict[str, Any]:
    """What a train sample costs in this process (a few samples, random state kept)."""
    from lightning_maxtp.loader.order import preserved_rng
    from lightning_maxtp.loader.sample_cost import file_samples, measure_sample_costs

    loader = first_loader(trainer.train_dataloader)
    # Only a dataset that lists its image files (ImageFolder's `samples`): indexing any other
    # in this process could open handles (HDF5, LMDB) that later forked workers would share.
    if loader is None or file_samples(loader.dataset) is None:
        return {}
    try:
        with preserved_rng(loader):
            costs = measure_sample_costs(loader.dataset, count=4, budget_s=SAMPLE_COST_BUDGET_S)
    except Exception as err:  # a sample, or the sampler's state: the diagnosis goes on
        text = (
            f"a sample's cost was not measured ({type(err).__name__}: {err}): the data path is "
            "diagnosed without it"
        )
        log.warning(prefixed("%s"), text)
        return {"unmeasured": text}
    if costs is None:
        return {}
    return {"per_sample_s": costs.per_sample_s, "decode_s": costs.decode_s, "files": costs.files}


def watch_first_batch(
    trainer: pl.Trainer,
    seen: Callable[[DataFacts], None],
    arrived: Callable[[float], None] | None = None,
) -> Callable[[], None]:
    """Call ``seen`` once with what the first train batch shipped and what a sample costs.

    ``arrived``, when given, is called first with the time the batch reached the hook
    (``time.perf_counter``): the fetch's end, before the timing below and any device copy.

    The batch is read in ``on_before_batch_transfer``, before any device-side step (decode,
    normalize) changes it, so bytes per sample and pixel dtype describe what crossed from the
    workers. Then, when the train dataset lists its image files (``samples``, as ImageFolder
    does), up to four samples and their file decode are timed in this process (under
    ``SAMPLE_COST_BUDGET_S``, random state kept). Returns the function that takes the observer
    away (it also goes by itself after the first batch).
    """
    from lightning_maxtp.data.hooks import add_batch_step, hook_owner, remove_batch_step
    from lightning_maxtp.loader.sample_cost import batch_facts

    hook = "on_before_batch_transfer"
    owner = hook_owner(trainer, hook)

    def observe(batch: Any) -> Any:
        remove_batch_step(owner, hook, _OBSERVE)
        if trainer.training:
            if arrived is not None:
                arrived(time.perf_counter())
            samples, nbytes, dtype = batch_facts(batch)
            facts = DataFacts(sample_bytes=nbytes // max(samples, 1), pixel_dtype=dtype)
            seen(dataclasses.replace(facts, **_sample_costs(trainer)))
        return batch

    def unwatch() -> None:
        remove_batch_step(owner, hook, _OBSERVE)

    add_batch_step(owner, hook, _OBSERVE, observe, _OBSERVE_ORDER)
    return unwatch
