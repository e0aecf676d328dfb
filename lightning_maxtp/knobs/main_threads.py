"""``MainThreads``: the training process's intra-op pools, set for a trial and put back.

Torch's pool and the BLAS pools ``threadpoolctl`` finds, sized together; the knob that tries
them is ``threads.IntraOpThreads``.
"""

from __future__ import annotations

__all__ = ["MainThreads"]


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
        start, blas = self.original
        # Back to the fit's start (a reverted trial): the BLAS pools as they were then, which
        # need not be torch's size.
        _set_blas(blas if threads == start and blas is not None else threads)

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
