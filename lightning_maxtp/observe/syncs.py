"""Device syncs a step asks for, counted and named by the line that asked.

A CUDA step that calls ``.item()``, ``.cpu()``, ``print(tensor)`` or logs with
``sync_dist=True`` makes the host wait for the device: the launch queue drains, and the GPU
idles until the host catches up. ``torch.cuda.set_sync_debug_mode("warn")`` makes torch warn at
each such call; ``SyncCounter`` turns that on for a few steps, records those warnings (each
names the Python line that made the call), and puts the mode back. ``SyncCount`` is the plain
result. Lines inside torch, Lightning or this library are counted under one name per package:
what a user can change is their own lines.
"""

from __future__ import annotations

import sys
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

__all__ = ["SyncCount", "SyncCounter", "source_of"]

_SYNC_WARNING = "synchronizing"
"""Torch's sync-debug warning says "called a synchronizing CUDA operation"."""
_LIBRARIES = ("lightning_maxtp", "lightning", "pytorch_lightning", "torch")
"""Packages whose own lines are counted under one name (the user cannot change them)."""


@dataclass(frozen=True)
class SyncCount:
    """Syncs over ``steps`` steps, with the source lines that made them, most frequent first."""

    steps: int
    count: int
    sources: tuple[tuple[str, int], ...] = ()
    """``("file.py:42", syncs)`` per line that asked (``"torch internals"``... for libraries)."""

    @property
    def per_step(self) -> float:
        """Syncs per step."""
        return self.count / self.steps if self.steps else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe view."""
        return {
            "steps": self.steps,
            "count": self.count,
            "per_step": self.per_step,
            "sources": [list(s) for s in self.sources],
        }

    def __str__(self) -> str:
        where = ", ".join(f"{line} ({n})" for line, n in self.sources[:3])
        return f"{self.per_step:.1f} device syncs/step" + (f" from {where}" if where else "")


def _roots() -> list[tuple[str, str]]:
    """``(package, its directory)`` of each library imported, the most nested first."""
    roots = []
    for package in _LIBRARIES:
        module = sys.modules.get(package)
        path = getattr(module, "__file__", None)
        if path:
            roots.append((package, str(PurePath(path).parent)))
    return roots


def source_of(filename: str, lineno: int) -> str:
    """``file.py:42`` for a user's line; ``"<package> internals"`` inside a library."""
    for package, root in _roots():
        if filename.startswith(root + "/"):
            return f"{package} internals"
    return f"{filename}:{lineno}"


class SyncCounter:
    """Counts device syncs between ``start`` and ``stop`` (CUDA only; see the module docstring).

    Args:
        cuda: The ``torch.cuda`` module (tests pass a fake with ``set_sync_debug_mode`` and
            ``get_sync_debug_mode``); ``None``: torch's, imported at ``start``.
    """

    def __init__(self, cuda: Any = None) -> None:
        self.cuda = cuda
        self.steps = 0
        self._before: Any = None
        self._records: list[warnings.WarningMessage] = []
        self._catcher: Any = None

    @property
    def running(self) -> bool:
        """Whether syncs are being counted now."""
        return self._catcher is not None

    def start(self) -> None:
        """Turn the sync warnings on and record them (idempotent)."""
        if self.running:
            return
        if self.cuda is None:
            import torch

            self.cuda = torch.cuda
        self._catcher = warnings.catch_warnings(record=True)
        self._records = self._catcher.__enter__()
        # Every sync, every time, and never as an error (``-W error`` would fail the step);
        # the user's filters go on deciding for their own warnings.
        warnings.filterwarnings("always", message=f".*{_SYNC_WARNING}")
        self._before = self.cuda.get_sync_debug_mode()
        self.cuda.set_sync_debug_mode("warn")
        self.steps = 0

    def step(self) -> None:
        """One more step counted."""
        if self.running:
            self.steps += 1

    def stop(self) -> SyncCount | None:
        """Put the mode and the warning filters back; the count (``None`` if not started)."""
        if not self.running:
            return None
        try:
            self.cuda.set_sync_debug_mode(self._before)
        finally:
            self._catcher.__exit__(None, None, None)
            self._catcher = None
        syncs = [r for r in self._records if _SYNC_WARNING in str(r.message)]
        lines = Counter(source_of(r.filename, r.lineno) for r in syncs)
        for r in self._records:  # the user's own warnings are not ours to swallow
            if _SYNC_WARNING not in str(r.message):
                warnings.warn_explicit(r.message, r.category, r.filename, r.lineno)
        return SyncCount(self.steps, len(syncs), tuple(lines.most_common()))
