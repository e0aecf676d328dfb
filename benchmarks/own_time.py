"""The time a callback spends in its own hooks and its sampler, inside a real fit.

A whole-fit ratio on a job the callback leaves alone is its cost against the machine's noise,
and on 2 shared CPUs one fit lands up to 30 % off the next. This measures the cost itself in
the same fits: the wall time of every Lightning hook the callback runs (on the training
thread, so it delays the step) and the CPU time of the background sampler's readings (on its
own thread, so at most that much is taken from the step's cores). Timed inside a fit on a busy
machine, a hook is also charged for any preemption at its clock readings.

Not all of the callback's cost: the train loader's wrapper (its ``__next__``), the garbage
collector's callbacks and callbacks the tuner adds are not timed. The timing itself (two clock
readings a hook, about six hooks a step, and two a sampler reading) lands on the callback's
side of the comparison only: microseconds a step.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import lightning.pytorch as pl

from lightning_maxtp.observe import sampler as _sampler

__all__ = ["OwnTime", "counting_sampler"]

_HOOKS = tuple(
    name for name in dir(pl.Callback) if name.startswith("on_") or name in ("setup", "teardown")
)


class OwnTime:
    """Wraps one callback instance's hooks and adds up their wall time.

    Args:
        callback: The callback whose hooks are timed (its instance attributes are replaced;
            the class is untouched).
    """

    def __init__(self, callback: pl.Callback) -> None:
        self.hooks_s = 0.0
        """Seconds spent in the callback's hooks."""
        self.sampler_cpu_s = 0.0
        """CPU seconds of the sampler's readings during the fit (set by ``counting_sampler``)."""
        self._depth = 0
        for name in _HOOKS:
            hook = getattr(callback, name)
            setattr(callback, name, self._timed(hook))

    def _timed(self, hook: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(hook)
        def timed(*args: Any, **kwargs: Any) -> Any:
            # A hook that calls another of the callback's hooks is counted once, outermost.
            self._depth += 1
            start = time.perf_counter()
            try:
                return hook(*args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.hooks_s += time.perf_counter() - start

        return timed

    def share(self, fit_s: float) -> float:
        """Hooks plus sampler CPU as a share of a fit of ``fit_s`` seconds."""
        return (self.hooks_s + self.sampler_cpu_s) / fit_s if fit_s > 0 else float("nan")


@contextmanager
def counting_sampler(own: OwnTime) -> Iterator[None]:
    """Within the block, every sampler reading's thread CPU time is added to ``own``."""
    original = _sampler.Sampler.sample_once
    lock = threading.Lock()

    def sample_once(self: _sampler.Sampler) -> None:
        start = time.thread_time()
        try:
            original(self)
        finally:
            with lock:
                own.sampler_cpu_s += time.thread_time() - start

    _sampler.Sampler.sample_once = sample_once  # type: ignore[method-assign]
    try:
        yield
    finally:
        _sampler.Sampler.sample_once = original  # type: ignore[method-assign]
