"""The fit loop's private state the batch-size search reads and puts back.

* ``_Loop`` and ``_BaseProgress`` (``lightning.pytorch.loops``): the loop counters are the
  ``_BaseProgress`` fields of the fit loop and its children. Steps counted during trials are put
  back from their ``state_dict()`` (``_Loop.load_state_dict`` would also mark the loops as
  restarting and queue dataloader states, so it is not used).
* ``_TrainingEpochLoop._batches_that_stepped``: the logging step counter, saved alongside.
* ``FitLoop._data_source`` (``_DataLoaderSource``): where the train loader comes from, to take one
  example batch before ``setup_data`` has run (``on_fit_start``), and whether the module's
  ``train_dataloader()`` builds it.
* ``FitLoop._combined_loader`` and ``setup_data()``: reset so that a new batch size is read by
  the user's ``train_dataloader()`` when the loaders were already built (as Lightning's
  ``BatchSizeFinder`` does in ``_reset_dataloaders``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import lightning.pytorch as pl

__all__ = [
    "batches_that_stepped",
    "loop_progress",
    "reset_train_loader",
    "set_batches_that_stepped",
    "train_loader_source",
]


def loop_progress(loop: Any) -> Iterator[tuple[str, Any]]:
    """``(dotted path, progress object)`` of every counter in ``loop`` and the loops it holds."""
    from lightning.pytorch.loops.loop import _Loop
    from lightning.pytorch.loops.progress import _BaseProgress

    seen: set[int] = set()

    def walk(node: Any, prefix: str) -> Iterator[tuple[str, Any]]:
        if id(node) in seen:
            return
        seen.add(id(node))
        for name, value in vars(node).items():
            if isinstance(value, _BaseProgress):
                yield prefix + name, value
            elif isinstance(value, _Loop):
                yield from walk(value, f"{prefix}{name}.")

    yield from walk(loop, "")


def batches_that_stepped(trainer: pl.Trainer) -> int:
    """The training epoch loop's logging step counter."""
    return int(trainer.fit_loop.epoch_loop._batches_that_stepped)


def set_batches_that_stepped(trainer: pl.Trainer, value: int) -> None:
    """Put the logging step counter back."""
    trainer.fit_loop.epoch_loop._batches_that_stepped = value


def train_loader_source(trainer: pl.Trainer) -> Any:
    """Where the train loader comes from: Lightning's ``_DataLoaderSource``.

    It has ``is_defined()``, ``is_module()``, ``instance`` and ``dataloader()``.
    """
    return trainer.fit_loop._data_source


def reset_train_loader(trainer: pl.Trainer) -> None:
    """Rebuild an already built train loader (``train_dataloader()`` is called again)."""
    loop = trainer.fit_loop
    if loop._combined_loader is not None:
        loop._combined_loader = None
        loop.setup_data()
