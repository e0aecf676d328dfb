"""The private DataLoader state that switching a live loader's knobs touches.

* ``DataLoader._iterator``: the iterator a loader with ``persistent_workers=True`` keeps between
  epochs; it holds the worker processes, so it is shut down and dropped on a switch.
* ``_MultiProcessingDataLoaderIter._shutdown_workers()`` and ``._workers``: stop the worker
  processes now (not at garbage collection), and their processes for measuring memory.
* ``DataLoader.__multiprocessing_context`` (name-mangled): ``DataLoader`` refuses to set
  ``multiprocessing_context`` while ``num_workers`` is 0, yet a switch from 0 workers to some
  must put the user's context back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

__all__ = [
    "cached_iterator",
    "drop_cached_iterator",
    "set_multiprocessing_context",
    "shutdown_workers",
    "worker_processes",
]


def cached_iterator(loader: DataLoader[Any]) -> object | None:
    """The iterator ``loader`` keeps for its persistent workers, if any."""
    return getattr(loader, "_iterator", None)


def drop_cached_iterator(loader: DataLoader[Any]) -> None:
    """Forget the kept iterator: the next ``iter()`` starts new workers."""
    loader._iterator = None


def shutdown_workers(iterator: object | None) -> None:
    """Stop a multi-process iterator's workers now (nothing for other iterators; idempotent)."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def worker_processes(iterator: object) -> list[Any]:
    """The ``multiprocessing.Process`` objects of a multi-process iterator's workers."""
    return list(getattr(iterator, "_workers", ()))


def set_multiprocessing_context(loader: DataLoader[Any], context: Any) -> None:
    """Set ``multiprocessing_context`` without DataLoader's check against 0 workers."""
    object.__setattr__(loader, "_DataLoader__multiprocessing_context", context)
