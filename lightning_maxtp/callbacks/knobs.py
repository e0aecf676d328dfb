"""What a trial may change in a fit: the loader's knobs, the main process's threads, the math.

The loader's knobs switch through ``SwitchableLoader`` at a batch boundary; the math knobs
(``math_knobs``) at once, when ``allow`` permits them. On a CPU device the
training process's intra-op pools (torch's, and BLAS's through ``threadpoolctl``) share the cores
with busy workers, so their size is a same-math knob too (``intra_op_threads``); it is process
state, so it is put back when the fit ends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from lightning_maxtp.knobs.registry import KNOBS, MATH_KNOBS

if TYPE_CHECKING:
    from lightning_maxtp.callbacks.math_knobs import MathKnobs
    from lightning_maxtp.loader.switchable import SwitchableLoader

__all__ = ["THREADS", "Knobs", "MainThreads"]

THREADS = "intra_op_threads"
"""The knob name of the main process's intra-op pool size."""

log = logging.getLogger(__name__)


def _blas_threads() -> int | None:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    sizes = [p["num_threads"] for p in threadpool_info() if p.get("user_api") == "blas"]
    return max(sizes) if sizes else None


def _set_blas(threads: int) -> None:
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(limits=threads, user_api="blas")  # stays until set again


class MainThreads:
    """The training process's intra-op pools: set for a trial, put back at the fit's end."""

    def __init__(self) -> None:
        self.original: tuple[int, int | None] | None = None
        """``(torch threads, BLAS threads)`` before the first change (``None``: unchanged)."""
        self.restored_from: int | None = None
        """The changed size in force until ``restore`` put the original back (for the report)."""

    @staticmethod
    def current() -> int:
        """``torch.get_num_threads()`` now."""
        import torch

        return int(torch.get_num_threads())

    @property
    def changed(self) -> bool:
        """Whether the pool size differs from the one the fit started with."""
        return self.original is not None and self.current() != self.original[0]

    def set(self, threads: int) -> None:
        """Size torch's intra-op pool and the loaded BLAS pools to ``threads``."""
        import torch

        if threads < 1:
            raise ValueError(f"`intra_op_threads` must be >= 1, got {threads!r}")
        if self.original is None:
            self.original = (self.current(), _blas_threads())
        self.restored_from = None
        torch.set_num_threads(threads)
        _set_blas(threads)

    def restore(self) -> None:
        """Put the pools back as they were (idempotent)."""
        if self.original is None:
            return
        import torch

        threads, blas = self.original
        if self.changed:
            self.restored_from = self.current()
        torch.set_num_threads(threads)
        if blas is not None:
            _set_blas(blas)
        self.original = None


class Knobs:
    """Reads and requests the settings a trial changes, whichever part of the job holds them.

    Args:
        loader: Returns the fit's switchable train loader (``None``: none to switch); read on
            every call, since Lightning may reload the loader mid-fit.
        math: The fit's math knobs (``None``: none allowed).
    """

    def __init__(
        self, loader: Callable[[], SwitchableLoader | None], math: MathKnobs | None = None
    ) -> None:
        self._loader = loader
        self.threads = MainThreads()
        self.math = math

    def _loader_settings(self) -> dict[str, Any]:
        loader = self._loader()
        return loader.settings() if loader is not None else {}

    def settings(self) -> dict[str, Any]:
        """The settings in force for the report: the loader's, and the threads once changed."""
        settings = self._loader_settings()
        if self.threads.changed:
            settings[THREADS] = self.threads.current()
        elif self.threads.restored_from is not None:  # in force until the fit ended
            settings[THREADS] = self.threads.restored_from
        if self.math is not None:
            settings.update(self.math.in_force)
        return settings

    def context(self) -> dict[str, Any]:
        """The current values windows are diagnosed with (``JobContext`` fields)."""
        context = {**self._loader_settings(), THREADS: self.threads.current()}
        if self.math is not None and self.math.trainer is not None:
            for knob in KNOBS:
                if knob.context_field is not None:
                    context[knob.context_field] = self.math.current(knob.name)
        return context

    def current(self, keys: Iterable[str]) -> dict[str, Any]:
        """The current values of ``keys`` (loader, threads or math knobs)."""
        now = self.context()
        math = self.math
        return {k: math.current(k) if math is not None and k in MATH_KNOBS else now[k]
                for k in keys}  # fmt: skip

    def request(self, **settings: Any) -> None:
        """Apply ``settings``: threads and math at once, the loader's at its next batch boundary."""
        if self.math is not None:
            for knob in [k for k in settings if k in MATH_KNOBS]:
                self.math.set(knob, settings.pop(knob))
        threads = settings.pop(THREADS, None)
        if threads is not None:
            self.threads.set(int(threads))
        loader = self._loader()
        if settings and loader is not None:
            loader.request(**settings)
