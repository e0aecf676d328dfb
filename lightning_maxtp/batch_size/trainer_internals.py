"""The Trainer state the batch-size search touches: loop counters, the train loader, callbacks.

The private Lightning names behind it (the loops' progress objects, the logging step counter,
the fit loop's data source and combined loader) are read through ``lightning_maxtp._compat``.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from lightning_maxtp._compat.lightning_loops import (
    batches_that_stepped,
    loop_progress,
    reset_train_loader,
    set_batches_that_stepped,
    train_loader_source,
)
from lightning_maxtp._compat.version import warn_if_lightning_unchecked

if TYPE_CHECKING:
    import lightning.pytorch as pl

__all__ = [
    "LoopCounters",
    "example_batch",
    "set_batch_size",
    "without_callbacks",
]


class LoopCounters:
    """The fit loop's progress counters, captured and put back exactly."""

    def __init__(self, trainer: pl.Trainer) -> None:
        warn_if_lightning_unchecked()
        self._trainer = trainer
        self._saved = {
            path: copy.deepcopy(progress.state_dict())
            for path, progress in loop_progress(trainer.fit_loop)
        }
        self._stepped = batches_that_stepped(trainer)

    def restore(self) -> None:
        """Load every counter back from the capture."""
        for path, progress in loop_progress(self._trainer.fit_loop):
            progress.load_state_dict(copy.deepcopy(self._saved[path]))
        set_batches_that_stepped(self._trainer, self._stepped)


@contextlib.contextmanager
def without_callbacks(trainer: pl.Trainer) -> Iterator[None]:
    """Hide the callbacks during trials, as BatchSizeFinder does.

    Hooks such as ``on_before_optimizer_step`` must not see the search's steps.
    """
    # ``Trainer.callbacks`` is a plain attribute set by its callback connector (untyped).
    saved = trainer.callbacks  # type: ignore[attr-defined]
    trainer.callbacks = []  # type: ignore[attr-defined]
    try:
        yield
    finally:
        trainer.callbacks = saved  # type: ignore[attr-defined]


def example_batch(trainer: pl.Trainer) -> tuple[Any, int | None]:
    """One batch of the train loader, as ``training_step`` would receive it, on the device.

    Returns:
        The batch and the length of the first loader's data set (``None`` if unsized).

    Raises:
        ValueError: If the Trainer has no train loader to take a batch from.
    """
    from lightning.pytorch.utilities import CombinedLoader

    source = train_loader_source(trainer)
    if not source.is_defined() or source.instance is None:
        raise ValueError(
            "`batch` is None and the Trainer has no train dataloader to take one from; pass "
            "`batch=next(iter(your_loader))`"
        )
    loaders = source.dataloader()
    combined = loaders if isinstance(loaders, CombinedLoader) else CombinedLoader(loaders)
    try:
        batch, _, _ = next(iter(combined))
    finally:
        combined.reset()  # shuts down worker processes the iterator started
    first = combined.flattened[0] if combined.flattened else None
    dataset = getattr(first, "dataset", None)
    try:
        length = len(dataset) if dataset is not None else None
    except TypeError:
        length = None
    return trainer.strategy.batch_to_device(batch), length


def read_batch_size(model: pl.LightningModule, batch_arg_name: str) -> int | None:
    """The batch size the user's loader reads (model, hparams or datamodule), if there is one."""
    from lightning.pytorch.utilities.parsing import lightning_getattr, lightning_hasattr

    if not lightning_hasattr(model, batch_arg_name):
        return None
    value = lightning_getattr(model, batch_arg_name)
    return value if isinstance(value, int) and value > 0 else None


def resize_reason(trainer: pl.Trainer, batch_arg_name: str) -> str | None:
    """Why the train loader's batch size cannot be changed (``None``: it can)."""
    from lightning.pytorch.utilities.parsing import lightning_hasattr

    if not train_loader_source(trainer).is_module():
        # The attribute may exist (hparams) yet the loader passed to fit() would never read it.
        return (
            "the train DataLoader was passed to `fit()`, which cannot be resized; build it in "
            "`train_dataloader()` of the LightningModule or a DataModule from an attribute "
            f"{batch_arg_name!r}"
        )
    if not lightning_hasattr(trainer.lightning_module, batch_arg_name):
        return (
            f"no attribute {batch_arg_name!r} on the model, its hparams or the datamodule; store "
            "the batch size there and read it in `train_dataloader()`, or pass `batch_arg_name=`"
        )
    return None


def set_batch_size(trainer: pl.Trainer, batch_arg_name: str, value: int) -> None:
    """Write the batch size where ``train_dataloader()`` reads it; rebuild a built loader.

    Raises:
        ValueError: If no model, hparams or datamodule attribute holds the batch size.
    """
    from lightning.pytorch.utilities.parsing import lightning_setattr

    model = trainer.lightning_module
    why = resize_reason(trainer, batch_arg_name)
    if why is not None:
        raise ValueError(f"cannot apply batch size {value}: {why}")
    lightning_setattr(model, batch_arg_name, value)
    reset_train_loader(trainer)
