"""What a fit's MFU is divided by and multiplied with: the device's peak, one batch's FLOPs.

Neither delays the fit's first step. ``FlopMeter`` reads the device's measured matmul peak from
the cache when training starts (``resources.peak``). A device the cache does not know is
measured by rank zero right after the first step, once there is a FLOP count to divide (a few
tenths of a second on a CPU, a second or two on a GPU, then cached for later fits): the time
belongs to no step, as the clock times the next one from the end of the measurement, and
under DDP every rank waits for rank zero there (one barrier per fit, measured or not: the
other ranks cannot tell whether rank zero's cache had the peak), so no rank's next step
carries the wait in its all-reduce. The FLOPs are
counted on the first training batch, run once under torch's ``FlopCounterMode`` (forward,
backward and optimizer step; its cost is the Python dispatch of each op: a few milliseconds
for a small conv net on a CPU, the price of one exact count). Later steps run without it. Rank
zero counts and measures (it is the rank that reports), but every rank leaves that first step
out of its windows: under DDP the ranks close their windows at the same steps, since each
window ends in collectives. A user who knows the count passes ``flops_per_batch``: nothing is
counted, and the first step is left out all the same (its end is where a missing peak is
measured, which the step must not carry).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from lightning_maxtp._checks import refuse_bool
from lightning_maxtp._compat.torch_modules import is_compiled
from lightning_maxtp._log import prefixed
from lightning_maxtp.observe.flops import counted_conv_flops, flop_counter

if TYPE_CHECKING:
    import lightning.pytorch as pl

__all__ = ["FlopMeter"]

log = logging.getLogger(__name__)


class FlopMeter:
    """The peak per dtype and the FLOPs per sample of one fit (see the module docstring).

    Args:
        enabled: ``False``: neither the peak nor the FLOPs (no MFU anywhere).
        flops_per_batch: The FLOPs of one training batch (forward and backward), when known:
            nothing is counted.

    Raises:
        ValueError: For a ``flops_per_batch`` that is not a positive number.
    """

    def __init__(self, *, enabled: bool = True, flops_per_batch: float | None = None) -> None:
        refuse_bool("flops_per_batch", flops_per_batch, "a number of FLOPs > 0 or None", 4.2e9)
        if flops_per_batch is not None and not (
            isinstance(flops_per_batch, int | float) and flops_per_batch > 0
        ):
            raise ValueError(
                f"`flops_per_batch` must be a positive number of FLOPs (forward and backward of "
                f"one batch) or None to count them, got {flops_per_batch!r}"
            )
        self.enabled = enabled
        self.flops_per_batch = flops_per_batch
        self.peaks: tuple[tuple[str, float], ...] = ()
        """The peak per dtype, ``(dtype, FLOP/s)``; ``()`` until read or measured (rank zero)."""
        self.flops_per_sample: float | None = None
        self.conv_share: float | None = None
        """Share of the counted FLOPs in convolutions (``None``: not counted here)."""
        self.notes: list[str] = []
        """What a user should know: the peak measured now, or why there is no MFU."""
        self._counter: Any = None
        self._samples = 1
        self._active = False
        """This rank counts and measures (rank zero, MFU on, nothing given up yet)."""
        self._skip_first = False
        """The fit's first batch is still to come and is left out of the windows."""
        self._first_end = False
        """The fit's first step is still to end (``after_first_step`` has work then)."""
        self._unmeasured: str | None = None
        """The device whose peak the cache lacked, to measure after the first step."""

    def start(self, trainer: pl.Trainer) -> tuple[tuple[str, float], ...]:
        """Training starts: the cached peak per dtype (``()`` when not cached, elsewhere or off).

        Never measures: a peak the cache lacks is measured after the first step
        (``after_first_step``).
        """
        self.abort()
        self.flops_per_sample, self.notes, self.peaks, self._unmeasured = None, [], (), None
        self._skip_first = self.enabled  # on every rank
        self._first_end = self.enabled
        self._active = self.enabled and trainer.is_global_zero
        if not self._active:
            return ()
        device = trainer.strategy.root_device
        if device.type not in ("cpu", "cuda"):
            self.notes.append(f"no MFU: no peak is measured on a {device.type} device")
            self._active = False
            return ()
        from lightning_maxtp.resources.peak import cached_peak

        name = "cpu" if device.type == "cpu" else f"cuda:{device.index or 0}"
        try:
            peak = cached_peak(name)
        except Exception as err:  # MFU is a reading; the fit goes on without it
            self._no_peak("read", err)
            return ()
        if peak is None:
            self._unmeasured = name
            return ()
        self.peaks = tuple((r.dtype, r.flops_per_s) for r in peak.rates)
        return self.peaks

    def _no_peak(self, done: str, err: Exception) -> None:
        """No peak to divide by (it could not be ``done``): logged, noted, no more counting."""
        log.warning(prefixed("the device's peak could not be %s, no MFU: %r"), done, err)
        self.notes.append(f"no MFU: the device's peak could not be {done} ({err!r})")
        self._active = False

    def after_first_step(self, trainer: pl.Trainer) -> bool:
        """After a step: when it is the fit's first to end, measure a peak the cache lacked.

        Rank zero measures (when it has a FLOP count to divide: a fit without one never pays
        for it) and caches it; under DDP every rank waits here for rank zero, measured or not,
        so that no rank's next step carries the wait. Call it after ``after_batch``, on every
        rank; it does nothing after the first step.

        Returns:
            Whether time passed here that belongs to no step: the next step is timed from now.
        """
        if not self._first_end:
            return False
        self._first_end = False
        measured = False
        if self._active and self._unmeasured is not None and self.flops_per_sample is not None:
            self._measure_peak()
            measured = True
        if trainer.world_size > 1:  # the others would wait inside their next step
            trainer.strategy.barrier("maxtp_peak")
            return True
        return measured

    def _measure_peak(self) -> None:
        """Measure the peak the cache lacked (rank zero, after the first step), and cache it."""
        from lightning_maxtp.resources.peak import measure_peak

        name, self._unmeasured = self._unmeasured, None
        assert name is not None  # only called with a device to measure
        started = time.perf_counter()
        try:
            peak = measure_peak(name)
        except Exception as err:  # MFU is a reading; the fit goes on without it
            self._no_peak("measured", err)
            return
        if not peak.cached:  # another process may have measured it since the fit started
            self.notes.append(
                f"this device's matmul peak was measured in {time.perf_counter() - started:.1f} s "
                "after the first step, a pause outside every step (cached for later fits; "
                "`maxtp inspect --peak` shows it)"
            )
        self.peaks = tuple((r.dtype, r.flops_per_s) for r in peak.rates)

    def before_batch(self, trainer: pl.Trainer, samples: int) -> bool:
        """Before a batch: whether this step is left out of the windows (the fit's first).

        A counter still open here belongs to a batch that never ended (its module's
        ``on_train_batch_start`` returned -1): see ``abandon``.
        """
        self.abandon()
        first, self._skip_first = self._skip_first, False
        if not self._active or self.flops_per_sample is not None:
            return first
        if self.flops_per_batch is not None:
            self.flops_per_sample = self.flops_per_batch / max(1, samples)
            return first
        why = self._uncountable(trainer)
        if why is not None:
            self.notes.append(f"no MFU: {why}; pass `flops_per_batch=`")
            self._active = False
            return first
        self._counter = flop_counter()
        self._counter.__enter__()
        self._samples = max(1, samples)
        return True

    @staticmethod
    def _uncountable(trainer: pl.Trainer) -> str | None:
        """Why this fit's step is not run under the counter (``None``: it is)."""
        from lightning_maxtp.knobs.base import FitView

        if is_compiled(trainer.lightning_module):
            return "the FLOPs of a compiled model are not counted"
        sharded = FitView(trainer).sharded_by()
        if sharded is not None:  # its collectives run inside the step: counting is not tried
            return f"FLOPs are not counted when {sharded}"
        return None

    def after_batch(self) -> float | None:
        """After a batch: the FLOPs per sample, once counted (``None`` before, or without)."""
        counter, self._counter = self._counter, None
        if counter is not None:
            counter.__exit__(None, None, None)
            flops = int(counter.get_total_flops())
            if flops > 0:
                self.flops_per_sample = flops / self._samples
                self.conv_share = counted_conv_flops(counter) / flops
            else:
                self.notes.append("no MFU: the step ran no matmul, convolution or attention")
                self._active = False
        return self.flops_per_sample

    def abandon(self) -> None:
        """A counted batch never ended: its count is dropped, and no later batch is counted.

        Counting another batch would leave one more step out on this rank than on the others.
        """
        if self._counter is not None:
            self.abort()
            self._active = False
            self.notes.append(
                "no MFU: the counted first batch never ended; pass `flops_per_batch=`"
            )

    def abort(self) -> None:
        """Leave an open counter and drop its count (a failed or abandoned step; idempotent)."""
        counter, self._counter = self._counter, None
        if counter is not None:
            counter.__exit__(None, None, None)
