"""Can a loader's dataset reach workers that are not forked? Name what cannot be pickled.

Under ``spawn`` and ``forkserver`` every worker receives the dataset, the collate function and
``worker_init_fn`` pickled. An open file, a lock, a database handle or a lambda fails there with
an error deep inside multiprocessing; ``check_picklable`` finds the attribute responsible first
and says how to fix it. It pickles the way multiprocessing does but skips tensor and array data,
so a large in-memory dataset is neither copied nor moved to shared memory by the check.
"""

from __future__ import annotations

import io
import pickle
import sys
from collections.abc import Mapping
from multiprocessing.reduction import ForkingPickler
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

__all__ = ["check_picklable"]

_MAX_DEPTH = 6


class _Discard(io.RawIOBase):
    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        return len(b)


class _ProbePickler(ForkingPickler):
    """Pickles like multiprocessing does, but skips tensor and array data (no copies, no shm)."""

    def persistent_id(self, obj: Any) -> str | None:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor | torch.UntypedStorage):
            return "tensor"
        np = sys.modules.get("numpy")
        if np is not None and isinstance(obj, np.ndarray):
            return "ndarray"
        return None


def _pickle_error(obj: Any) -> Exception | None:
    try:
        _ProbePickler(_Discard(), pickle.HIGHEST_PROTOCOL).dump(obj)
    except Exception as exc:  # any failure here is what a worker start would hit
        return exc
    return None


def _children(obj: Any) -> list[tuple[str, Any]]:
    if isinstance(obj, Mapping):
        return [(f"[{k!r}]", v) for k, v in obj.items()]
    if isinstance(obj, list | tuple | set | frozenset):
        return [(f"[{i}]", v) for i, v in enumerate(obj)]
    func = getattr(obj, "func", None)
    if func is not None and hasattr(obj, "args"):  # functools.partial
        return [(".func", func), (".args", obj.args), (".keywords", obj.keywords)]
    state = getattr(obj, "__dict__", None)
    return [(f".{k}", v) for k, v in state.items()] if isinstance(state, dict) else []


def _offender(obj: Any, path: str, depth: int = 0) -> tuple[str, Any]:
    """The deepest attribute on ``path`` that cannot be pickled."""
    if depth < _MAX_DEPTH:
        for suffix, child in _children(obj):
            if _pickle_error(child) is not None:
                return _offender(child, path + suffix, depth + 1)
    return path, obj


def check_picklable(loader: DataLoader[Any], method: str) -> None:
    """Raise a ``ValueError`` naming what cannot be sent to workers started with ``method``.

    Only needed when workers are not forked: ``spawn`` and ``forkserver`` pickle the dataset,
    the collate function and ``worker_init_fn`` into every worker.
    """
    parts = {
        "loader.dataset": loader.dataset,
        "loader.collate_fn": loader.collate_fn,
        "loader.worker_init_fn": loader.worker_init_fn,
    }
    for name, obj in parts.items():
        error = _pickle_error(obj)
        if error is None:
            continue
        path, offender = _offender(obj, name)
        kind = type(offender)
        raise ValueError(
            f"`{path}` (a `{kind.__module__}.{kind.__qualname__}`) cannot be pickled, so "
            f"DataLoader workers started with {method!r} cannot receive it ({error}). Fix: "
            "create it inside the worker instead (on first use in `__getitem__`, or in a "
            "`worker_init_fn`), leave it out of the pickled state with `__getstate__`, define "
            "functions at module level rather than as lambdas or closures, or start workers "
            "with 'fork' (`multiprocessing_context='fork'`, Linux only)."
        ) from error
