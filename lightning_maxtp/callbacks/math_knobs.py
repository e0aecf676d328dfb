"""The knobs that change how the step computes, switched mid-fit and reversibly.

Each knob offers one change (``offer``: the value now, the value to try, why, or why not) and
sets either value at once (``set``): the next step runs with it.

- ``precision``: the strategy's precision plugin swapped for ``MixedPrecision`` (``bf16-mixed``
  where the device has bf16, ``16-mixed`` with a grad scaler otherwise; bf16 autocast on a CPU).
- ``channels_last``: the module's 4-D weights, and the 4-D float tensors of every batch after
  its transfer to the device (a step added to ``on_after_batch_transfer``, the DataModule's
  when it overrides the hook, else the module's).
- ``tf32``: ``torch.set_float32_matmul_precision("high")`` and cuDNN's TF32 flag (CUDA).
- ``cudnn_benchmark``: ``torch.backends.cudnn.benchmark`` (CUDA).
- ``compile``: ``torch.compile`` in place on the LightningModule's submodules; the compiled
  callables are kept, so switching back and forth compiles once.
- ``fused_optimizer``: ``fused=True`` on the param groups of the optimizers that have it.

Process-wide settings (TF32, cuDNN flags) and the Trainer's precision plugin are put back when
the fit ends (``restore``); what was kept on the module and its optimizer stays with them.
"""

from __future__ import annotations

import logging
import shutil
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import lightning.pytorch as pl
    import torch

from lightning_maxtp._compat.torch_modules import (
    compiled_call,
    is_compiled,
    set_compiled_call,
    steps_with_amp_scaling,
)
from lightning_maxtp.callbacks.math_state import (
    four_d,
    fused_groups,
    layouts,
    state_layout,
    steps_to,
    to_channels_last,
)
from lightning_maxtp.data.hooks import add_batch_step, hook_owner, remove_batch_step

__all__ = ["CUDA_ONLY", "MathKnobs"]

CUDA_ONLY = ("tf32", "cudnn_benchmark")
"""Knobs without an effect off CUDA."""

log = logging.getLogger(__name__)

_HOOK = "on_after_batch_transfer"
_CHANNELS_LAST = "lightning_maxtp.channels_last"
CHANNELS_LAST_ORDER = 100
"""After ``DeviceTransform``'s step (order 0), which turns uint8 batches into floats."""


class MathKnobs:
    """Offers, sets and restores the math knobs of one fit (see the module docstring).

    Args:
        allowed: The knob names the user allowed (``allow.resolve_allow``).
    """

    def __init__(self, allowed: tuple[str, ...]) -> None:
        self.allowed = allowed
        self.trainer: pl.Trainer | None = None
        self.in_force: dict[str, Any] = {}
        """Knobs whose value differs from the fit's start (kept, or a trial's), for the report."""
        self._start: dict[str, Any] = {}
        self._plugin: Any = None
        self._plugins: dict[str, Any] = {}
        """One plugin per mixed precision, reused: a fresh 16-mixed grad scaler would skip the
        first steps after every switch back (its scale starts high and overflows)."""
        self._globals: dict[str, Any] = {}
        self._compiled: dict[int, Any] = {}
        self._fused_was: list[tuple[torch.optim.Optimizer, dict[str, Any], Any, Any]] = []

    def bind(self, trainer: pl.Trainer) -> None:
        """The fit's Trainer (its strategy, module and optimizers are set up)."""
        self.trainer = trainer

    @property
    def _module(self) -> pl.LightningModule:
        assert self.trainer is not None
        return self.trainer.lightning_module

    def _device(self) -> str:
        assert self.trainer is not None
        return str(self.trainer.strategy.root_device.type)

    def _submodules(self) -> list[torch.nn.Module]:
        children = [c for c in self._module.children() if any(True for _ in c.parameters())]
        return children or [self._module]

    # -- reading ----------------------------------------------------------------------------

    def current(self, knob: str) -> Any:
        """The knob's value now."""
        import torch

        assert self.trainer is not None
        if knob == "precision":
            return str(self.trainer.precision)
        if knob == "channels_last":
            nhwc = layouts(four_d(self._module))
            return bool(nhwc) and all(nhwc)
        if knob == "tf32":
            return torch.get_float32_matmul_precision() != "highest"
        if knob == "cudnn_benchmark":
            return bool(torch.backends.cudnn.benchmark)
        if knob == "compile":
            return is_compiled(self._module)
        if knob == "fused_optimizer":
            groups = fused_groups(self.trainer)
            return bool(groups) and all(g.get("fused") for _, g in groups)
        raise ValueError(f"unknown math knob {knob!r}")

    def offer(self, knob: str) -> tuple[Any, Any, str] | str:
        """``(value now, value to try, why)``, or why the knob cannot be tried on this fit."""
        assert self.trainer is not None
        device = self._device()
        if knob in CUDA_ONLY and device != "cuda":
            return "CUDA only"
        if knob in self.in_force or (knob != "precision" and self.current(knob)):
            return "already on"  # precision is a string: the Trainer's own is checked below
        why = getattr(self, f"_why_not_{knob}")(device)
        if why is not None:
            return str(why)
        return self.current(knob), self._proposal(knob, device), _REASONS[knob]

    def _proposal(self, knob: str, device: str) -> Any:
        if knob != "precision":
            return True
        import torch

        # Emulated bf16 (pre-Ampere GPUs) is slower than fp16 with a scaler.
        if device == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
            return "16-mixed"
        return "bf16-mixed"

    def _why_not_precision(self, device: str) -> str | None:
        from lightning.pytorch.plugins.precision import Precision

        assert self.trainer is not None
        strategy = self.trainer.strategy
        if str(self.trainer.precision) not in ("32-true", "32"):
            return f"the Trainer already runs precision={self.trainer.precision!r}"
        if self._plain_strategy() is not None:
            return f"{type(strategy).__name__} keeps its own precision plugin"
        if type(strategy.precision_plugin) is not Precision:
            return f"custom precision plugin {type(strategy.precision_plugin).__name__}"
        if self.trainer.accumulate_grad_batches > 1:
            # A switch between two optimizer steps would unscale gradients summed unscaled.
            return "gradients accumulate over several batches"
        handles = any(steps_with_amp_scaling(o) for o in self.trainer.optimizers)
        if self.trainer.gradient_clip_val and handles:
            return "Lightning cannot clip gradients of a fused optimizer under mixed precision"
        if device not in ("cuda", "cpu"):
            return f"no mixed precision on {device}"
        return None

    def _plain_strategy(self) -> str | None:
        """Why the strategy keeps the module to itself (sharded), else ``None``."""
        from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

        assert self.trainer is not None
        strategy = self.trainer.strategy
        if isinstance(strategy, SingleDeviceStrategy | DDPStrategy):
            return None
        return f"{type(strategy).__name__} wraps the module's parameters"

    def _why_not_channels_last(self, device: str) -> str | None:
        if not layouts(four_d(self._module)):
            return "the module has no 4-D (convolution) weights whose layout can change"
        return self._plain_strategy()

    def _why_not_tf32(self, device: str) -> str | None:
        return None

    def _why_not_cudnn_benchmark(self, device: str) -> str | None:
        return None

    def _why_not_compile(self, device: str) -> str | None:
        if device == "cpu" and shutil.which("gcc") is None and shutil.which("cc") is None:
            return "no C compiler for inductor on the CPU"
        if device not in ("cuda", "cpu"):
            return f"no inductor backend on {device}"
        return self._plain_strategy()

    def _why_not_fused_optimizer(self, device: str) -> str | None:
        assert self.trainer is not None
        if not fused_groups(self.trainer):
            return "no optimizer with a fused step (Adam, AdamW, SGD, Adagrad on the device)"
        return None

    def original(self, knob: str) -> Any:
        """The knob's value when the fit started (before the first change)."""
        return self._start[knob] if knob in self._start else self.current(knob)

    # -- writing ----------------------------------------------------------------------------

    def set(self, knob: str, value: Any) -> None:
        """Switch ``knob`` to ``value`` (the next step runs with it)."""
        if knob not in self._start:
            self._start[knob] = self.current(knob)
        getattr(self, f"_set_{knob}")(value)
        if value == self._start[knob]:
            self.in_force.pop(knob, None)
        else:
            self.in_force[knob] = value
        log.debug("math knob %s = %r", knob, value)

    def _set_precision(self, value: str) -> None:
        from lightning.pytorch.plugins.precision import MixedPrecision

        assert self.trainer is not None
        strategy = self.trainer.strategy
        if self._plugin is None:
            self._plugin = strategy.precision_plugin
        if value in ("32-true", "32"):
            strategy.precision_plugin = self._plugin
            return
        if value not in self._plugins:  # a 16-mixed one makes its own grad scaler
            self._plugins[value] = MixedPrecision(value, self._device())  # type: ignore[arg-type]
        strategy.precision_plugin = self._plugins[value]

    def _set_channels_last(self, value: bool) -> None:
        import torch

        module, layout = self._module, torch.channels_last if value else torch.contiguous_format
        module.to(memory_format=layout)
        assert self.trainer is not None
        for optimizer in self.trainer.optimizers:
            state_layout(optimizer)
        owner = hook_owner(self.trainer, _HOOK)
        if value:  # after the device transform's step: it makes the floats converted here
            add_batch_step(owner, _HOOK, _CHANNELS_LAST, to_channels_last, CHANNELS_LAST_ORDER)
        else:
            remove_batch_step(owner, _HOOK, _CHANNELS_LAST)

    def _set_tf32(self, value: bool) -> None:
        import torch

        self._globals.setdefault("matmul", torch.get_float32_matmul_precision())
        self._globals.setdefault("cudnn_tf32", torch.backends.cudnn.allow_tf32)
        torch.set_float32_matmul_precision("high" if value else self._globals["matmul"])
        torch.backends.cudnn.allow_tf32 = True if value else self._globals["cudnn_tf32"]

    def _set_cudnn_benchmark(self, value: bool) -> None:
        import torch

        self._globals.setdefault("benchmark", torch.backends.cudnn.benchmark)
        torch.backends.cudnn.benchmark = bool(value)

    def _set_compile(self, value: bool) -> None:
        for module in self._submodules():
            if not value:
                set_compiled_call(module, None)
            elif id(module) in self._compiled:
                set_compiled_call(module, self._compiled[id(module)])
            else:  # compiled lazily, on the next call
                module.compile()
                self._compiled[id(module)] = compiled_call(module)

    def _set_fused_optimizer(self, value: bool) -> None:
        assert self.trainer is not None
        if not value:
            for optimizer, group, fused, foreach in self._fused_was:
                group["fused"], group["foreach"] = fused, foreach
                steps_to(optimizer, group, fused=bool(fused))
            self._fused_was.clear()
            return
        for optimizer, group in fused_groups(self.trainer):
            self._fused_was.append((optimizer, group, group.get("fused"), group.get("foreach")))
            group["fused"], group["foreach"] = True, False  # fused and foreach exclude each other
            steps_to(optimizer, group, fused=True)

    def restore(self) -> None:
        """The fit ended: process-wide flags and the precision plugin as they were (idempotent)."""
        import torch

        if self._plugin is not None and self.trainer is not None:
            self.trainer.strategy.precision_plugin = self._plugin
            self._plugin = None
        if "matmul" in self._globals:
            torch.set_float32_matmul_precision(self._globals["matmul"])
            torch.backends.cudnn.allow_tf32 = self._globals["cudnn_tf32"]
        if "benchmark" in self._globals:
            torch.backends.cudnn.benchmark = self._globals["benchmark"]
        self._globals.clear()
        if self.trainer is not None:  # the weights stay channels_last, the batches no longer
            remove_batch_step(hook_owner(self.trainer, _HOOK), _HOOK, _CHANNELS_LAST)


_REASONS = {
    "precision": "mixed precision: half-size activations and tensor-core math",
    "channels_last": "NHWC layout: convolutions without layout transposes",
    "tf32": "TF32 matmuls and convolutions on tensor cores",
    "cudnn_benchmark": "cuDNN picks the fastest convolution kernels for these shapes",
    "compile": "torch.compile fuses the step's kernels",
    "fused_optimizer": "one fused kernel per optimizer step instead of one per tensor",
}
