"""``precision``: mixed precision, by swapping the strategy's precision plugin mid-fit.

``bf16-mixed`` where the device has bf16 (a CPU too, where it has bf16 kernels: bf16 autocast),
else ``16-mixed`` with a grad scaler (emulated bf16 on pre-Ampere GPUs is slower than fp16 with
a scaler; a CPU without the kernels is not offered it, ``cpu_bf16``). One plugin
per precision is kept and reused: a fresh ``16-mixed`` grad scaler would skip the first steps
after every switch back (its scale starts high and overflows). The Trainer's own plugin is put
back when the fit ends. Once kept it stays watched: a non-finite loss later undoes it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any, ClassVar

from typing_extensions import override

from lightning_maxtp._compat.torch_modules import cpu_bf16_kernels, steps_with_amp_scaling
from lightning_maxtp.knobs.base import BaseKnob, FitView, NotOffered, Offer

__all__ = ["BF16_CAPABILITY", "CPU_BF16_ENV", "Precision", "bf16_native", "cpu_bf16"]

log = logging.getLogger(__name__)

_WARNED: set[str] = set()
"""Bad values of ``CPU_BF16_ENV`` already warned about."""


BF16_CAPABILITY = (8, 0)
"""The compute capability from which a CUDA device has bf16 in hardware (Ampere on); below it
torch emulates bf16, slower than fp16 with a grad scaler."""


def bf16_native(compute_capability: str | None) -> bool:
    """Whether a CUDA device of this compute capability (``"8.0"``) has bf16 in hardware.

    The one bf16 rule: the knob's proposal and the diagnosis's recommendation
    (``knobs.advice.precision``) both read it. ``None`` or unreadable: no.
    """
    if compute_capability is None:
        return False
    try:
        major, minor = (int(part) for part in compute_capability.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= BF16_CAPABILITY


CPU_BF16_ENV = "LIGHTNING_MAXTP_CPU_BF16"
"""``1``: treat this CPU as having bf16 kernels, ``0``: as having none; unset: as torch says."""


def cpu_bf16() -> bool:
    """Whether a bf16 trial may run on this CPU (``CPU_BF16_ENV``, else torch's answer).

    Read mid-fit, when the math knobs are offered: a value other than ``0`` or ``1`` is logged
    as a warning naming it and torch's answer is used (an error then would end the user's fit).
    """
    value = os.environ.get(CPU_BF16_ENV)
    if value in ("0", "1"):
        return value == "1"
    if value is not None and value not in _WARNED:  # once: asked at every decision
        _WARNED.add(value)
        log.warning(
            "%s must be '0' or '1', got %r: ignored, torch's answer used; set it to 0 or 1, or "
            "unset it",
            CPU_BF16_ENV,
            value,
        )
    return cpu_bf16_kernels() is not False  # a torch that cannot say: as before, try it


class Precision(BaseKnob):
    """The strategy's precision plugin: ``32-true`` or a mixed precision."""

    name = "precision"
    reason = "mixed precision: half-size activations and tensor-core math"
    changes = (
        "the strategy's precision plugin: ``bf16-mixed`` where the device has bf16 (a CPU with "
        "bf16 kernels too), "
        "else ``16-mixed`` with a grad scaler; the Trainer's own plugin is put back when the fit "
        "ends"
    )
    guarded = True
    watched = True
    tried_for: ClassVar[Mapping[str, int]] = {"compute": 0, "healthy": 0, "vram": 0}
    context_field: ClassVar[str | None] = "precision"

    def __init__(self) -> None:
        self._original: Any = None
        self._plugins: dict[str, Any] = {}

    @override
    def current(self, fit: FitView) -> str:
        return str(fit.trainer.precision)

    @override
    def why_not(self, fit: FitView) -> str | None:
        from lightning.pytorch.plugins.precision import Precision as PlainPrecision

        trainer, device = fit.trainer, fit.device
        strategy = trainer.strategy
        if str(trainer.precision) not in ("32-true", "32"):
            return f"the Trainer already runs precision={trainer.precision!r}"
        if fit.sharded_by() is not None:
            return f"{type(strategy).__name__} keeps its own precision plugin"
        if type(strategy.precision_plugin) is not PlainPrecision:
            return f"custom precision plugin {type(strategy.precision_plugin).__name__}"
        if trainer.accumulate_grad_batches > 1:
            # A switch between two optimizer steps would unscale gradients summed unscaled.
            return "gradients accumulate over several batches"
        fused = any(steps_with_amp_scaling(o) for o in trainer.optimizers)
        if trainer.gradient_clip_val and fused:
            return "Lightning cannot clip gradients of a fused optimizer under mixed precision"
        if device not in ("cuda", "cpu"):
            return f"no mixed precision on {device}"
        if device == "cpu" and not cpu_bf16():
            # Emulated, it is several times slower: a trial would cost more than it could
            # ever win (13x slower a step here, cut short after 5 steps: 6 s of a 22 s fit).
            return (
                "this CPU has no bf16 kernels (no AVX-512): bf16 autocast would be emulated "
                f"(set {CPU_BF16_ENV}=1 to try it anyway)"
            )
        return None

    @override
    def offer(self, fit: FitView) -> Offer | NotOffered:
        why = self.why_not(fit)
        if why is not None:
            return NotOffered(why)
        return Offer(self.current(fit), self._proposal(fit.device), self.reason)

    @staticmethod
    def _proposal(device: str) -> str:
        import torch

        if device == "cuda":
            major, minor = torch.cuda.get_device_capability()
            if not bf16_native(f"{major}.{minor}"):  # the one rule: the advice reads it too
                return "16-mixed"
        return "bf16-mixed"

    @override
    def apply(self, fit: FitView, value: Any) -> None:
        from lightning.pytorch.plugins.precision import MixedPrecision

        strategy = fit.trainer.strategy
        if self._original is None:
            self._original = strategy.precision_plugin
        if value in ("32-true", "32"):
            strategy.precision_plugin = self._original
            return
        if value not in self._plugins:  # a 16-mixed one makes its own grad scaler
            self._plugins[value] = MixedPrecision(value, fit.device)
        strategy.precision_plugin = self._plugins[value]

    @override
    def restore(self, fit: FitView) -> None:
        if self._original is not None:
            fit.trainer.strategy.precision_plugin = self._original
            self._original = None
