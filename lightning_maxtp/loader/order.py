"""Sample order and randomness: tuning must not change which samples training sees, or when.

Two rules. Tuning iterates the user's loader, which draws shuffling and augmentation seeds from
torch's (or the loader's) generator; ``preserved_rng`` puts every such state back, so a seeded
run that tunes first sees the same samples as one that does not. And ``persistent_workers``
changes torch's draws from the second epoch on (a persistent iterator skips the per-epoch draw
of the workers' base seed), which reshuffles a sampler that shares that generator;
``persistence`` only turns it on where the order stays the same.
"""

from __future__ import annotations

import contextlib
import random
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from lightning_maxtp.loader.candidate import LoaderCandidate

if TYPE_CHECKING:
    import torch
    from torch.utils.data import DataLoader

__all__ = ["keeps_order_when_persistent", "persistence", "preserved_rng"]

PERSISTENT_MIN_STARTUP_SHARE = 0.01
"""Keep workers alive between epochs once restarting them costs 1 % of an epoch or more."""


def keeps_order_when_persistent(loader: DataLoader[Any]) -> bool:
    """Whether ``persistent_workers=True`` leaves the order of samples unchanged.

    A persistent iterator skips the per-epoch draw of the workers' base seed. A sampler that
    draws its shuffling seed from the same generator (torch's global one, or the loader's)
    then shuffles differently from the second epoch on. Samplers without randomness, a
    ``DistributedSampler`` (seeded by epoch) and samplers with a generator of their own are not
    affected.
    """
    from torch.utils.data import DistributedSampler, IterableDataset, SequentialSampler

    if isinstance(loader.dataset, IterableDataset):
        return True
    sampler = loader.sampler
    if loader.batch_sampler is not None:
        sampler = getattr(loader.batch_sampler, "sampler", sampler)
    if isinstance(sampler, SequentialSampler | DistributedSampler):
        return True
    generator = getattr(sampler, "generator", None)
    return generator is not None and generator is not loader.generator


def _generators(loader: DataLoader[Any]) -> list[torch.Generator]:
    import torch

    holders = [loader, loader.sampler, loader.batch_sampler]
    holders.append(getattr(loader.batch_sampler, "sampler", None))
    found: list[torch.Generator] = []
    for holder in holders:
        gen = getattr(holder, "generator", None)
        if isinstance(gen, torch.Generator) and all(gen is not g for g in found):
            found.append(gen)
    return found


@contextlib.contextmanager
def preserved_rng(loader: DataLoader[Any]) -> Iterator[None]:
    """Restore every random state that iterating ``loader`` advances, so tuning is invisible.

    Iterating draws shuffling seeds from the loader's (or torch's global) generator and runs
    random transforms in this process when there are no workers. A seeded run that tunes first
    must see the same samples as one that does not.
    """
    import torch

    torch_state = torch.random.get_rng_state()
    py_state = random.getstate()
    np = sys.modules.get("numpy")
    np_state = np.random.get_state() if np is not None else None
    generators = [(g, g.get_state()) for g in _generators(loader)]
    try:
        yield
    finally:
        torch.random.set_rng_state(torch_state)
        random.setstate(py_state)
        if np is not None:
            np.random.set_state(np_state)
        for gen, state in generators:
            gen.set_state(state)


def persistence(
    chosen: LoaderCandidate | None,
    batches_per_epoch: int | None,
    start_method: str,
    *,
    keeps_order: bool = True,
) -> tuple[bool, str]:
    """Whether to keep workers alive between epochs, and why.

    Yes when restarting them costs >= 1 % of an epoch at the measured rate, when the epoch
    length is unknown, or when workers are not forked (``spawn`` re-imports everything); but
    never when it would change the order of samples (``keeps_order`` false: the sampler draws
    its shuffling seed from the generator that a persistent iterator stops drawing from).
    """
    if chosen is None or chosen.num_workers == 0:
        return False, ""
    startup = chosen.startup_s
    if start_method != "fork":
        keep, why = True, f"{start_method!r} start-up takes {startup:.2f} s"
    elif batches_per_epoch is None or chosen.timed_batches == 0:
        keep, why = True, f"start-up {startup:.2f} s, epoch length unknown"
    else:
        epoch_s = batches_per_epoch * chosen.timed_s / chosen.timed_batches
        share = startup / max(epoch_s, 1e-9)
        keep = share >= PERSISTENT_MIN_STARTUP_SHARE
        why = f"start-up {startup:.2f} s is {share:.1%} of an epoch"
    if keep and not keeps_order:
        return False, (
            f"workers restart each epoch ({why}): persistent workers would change the "
            "shuffling order after the first epoch, because torch then draws one seed fewer "
            "per epoch from the generator the sampler uses; give the sampler its own "
            "`generator` to allow them"
        )
    return keep, f"{'persistent workers' if keep else 'workers restart each epoch'}: {why}"
