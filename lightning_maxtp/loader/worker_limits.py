"""Oversubscription guard: a ``worker_init_fn`` that caps thread pools inside DataLoader workers.

Each worker is a process; a library that sizes its thread pool from the machine's core count
(OpenCV, OpenBLAS/MKL through numpy, OpenMP) starts that many threads in *every* worker, so N
workers x C threads fight over C cores. torch already sets its own intra-op pool to 1 in workers;
the others need telling. ``WorkerThreadLimit`` does that, then calls the user's own
``worker_init_fn`` (never replaces it). It is a module-level class so that it pickles under the
``spawn`` and ``forkserver`` start methods, as long as the user's function does.
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import os
import sys
from collections.abc import Callable
from typing import Any

__all__ = [
    "MORE_WORKERS_THAN_CPUS",
    "WorkerThreadLimit",
    "limit_threads",
    "start_method_of",
    "unwrap_worker_init_fn",
]

MORE_WORKERS_THAN_CPUS = r".*worker processes in total"
"""torch's warning when a DataLoader has more workers than CPUs (deliberate when reads wait)."""

log = logging.getLogger(__name__)

THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)
"""Read by OpenMP/BLAS libraries when they start; they cover libraries a worker loads later."""


def start_method_of(context: Any) -> str:
    """How workers with this ``multiprocessing_context`` start: ``fork``, ``spawn``..."""
    if context is not None:
        return str(context.get_start_method())
    # allow_none avoids fixing the default context as a side effect of asking.
    method = multiprocessing.get_start_method(allow_none=True)
    return method or multiprocessing.get_all_start_methods()[0]


def limit_threads(threads: int, openmp: int | None = None) -> None:
    """Cap the thread pools of this process to ``threads`` (called inside a worker).

    torch's intra-op pool and OpenCV are set directly; BLAS/OpenMP pools already loaded (numpy's
    OpenBLAS inherited from a forked parent, or loaded when the dataset unpickled) are set
    through ``threadpoolctl``; the environment variables cover libraries loaded afterwards. Only
    libraries already imported are touched, so nothing new is imported. ``openmp`` (default
    ``threads``) caps torch's intra-op pool and the OpenMP runtimes separately.
    """
    openmp = threads if openmp is None else openmp
    for name in THREAD_ENV_VARS:
        os.environ[name] = str(openmp if name == "OMP_NUM_THREADS" else threads)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(openmp)
    cv2 = sys.modules.get("cv2")
    if cv2 is not None and hasattr(cv2, "setNumThreads"):
        cv2.setNumThreads(threads)
    try:
        threadpoolctl = importlib.import_module("threadpoolctl")
    except ImportError:  # a dependency; an environment without it still trains, unlimited
        log.warning(
            "threadpoolctl is not installed, so BLAS/OpenMP pools already loaded in this "
            "worker keep one thread per CPU; `pip install threadpoolctl` to limit them"
        )
        return
    # Called without `with`: the limits stay for the worker's life (nothing restores them).
    threadpoolctl.threadpool_limits(limits={"blas": threads, "openmp": openmp})


class WorkerThreadLimit:
    """``worker_init_fn`` that limits thread pools, then runs the user's ``worker_init_fn``.

    Args:
        threads: Threads each pool may use in a worker (>= 1).
        user_fn: The loader's own ``worker_init_fn`` (``None`` if it had none); it runs after
            the limits, so a user who sets their own thread counts still wins.
        forked: Whether the workers are forked. A forked child inherits the parent's OpenMP
            (GNU libgomp) state; a parallel region with more than one thread then waits forever
            on a team that does not exist in the child. So torch's intra-op pool and OpenMP stay
            at one thread there (torch's own default for workers) and only BLAS pools get
            ``threads``.
    """

    def __init__(
        self, threads: int, user_fn: Callable[[int], Any] | None = None, *, forked: bool = False
    ) -> None:
        if threads < 1:
            raise ValueError(f"`threads` must be >= 1, got {threads!r}")
        self.threads = threads
        self.forked = forked
        self.user_fn = unwrap_worker_init_fn(user_fn)

    def __call__(self, worker_id: int) -> None:
        """Limit the thread pools, then run the user's own ``worker_init_fn``."""
        limit_threads(self.threads, openmp=1 if self.forked else self.threads)
        if self.user_fn is not None:
            self.user_fn(worker_id)

    def __repr__(self) -> str:
        return (
            f"WorkerThreadLimit(threads={self.threads}, user_fn={self.user_fn!r}, "
            f"forked={self.forked})"
        )


def unwrap_worker_init_fn(fn: Callable[[int], Any] | None) -> Callable[[int], Any] | None:
    """The user's function behind our wrapper, so that re-tuning never stacks two wrappers."""
    while isinstance(fn, WorkerThreadLimit):
        fn = fn.user_fn
    return fn
