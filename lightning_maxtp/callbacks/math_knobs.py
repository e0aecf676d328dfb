"""The knobs that change how the step computes, switched mid-fit and reversibly.

Each knob offers one change (``offer``: the value now, the value to try, why, or why not) and
sets either value at once (``set``): the next step runs with it.

- ``precision``: the strategy's precision plugin swapped for ``MixedPrecision`` (``bf16-mixed``
  where the device has bf16, ``16-mixed`` with a grad scaler otherwise; bf16 autocast on a CPU).
- ``channels_last``: the module's 4-D weights, and the 4-D float tensors of every batch after
  its transfer to the device (the module's ``on_after_batch_transfer``, wrapped).
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

__all__ = ["CUDA_ONLY", "MathKnobs"]

CUDA_ONLY = ("tf32", "cudnn_benchmark")
"""Knobs without an effect off CUDA."""

log = logging.getLogger(__name__)

_FUSED = ("Adam", "AdamW", "SGD", "Adagrad")
"""torch optimizers with a fused step (``fused=True``)."""


def _four_d(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p for p in module.parameters() if p.dim() == 4]


def _fused_groups(trainer: pl.Trainer) -> list[tuple[torch.optim.Optimizer, dict[str, Any]]]:
    """Param groups that can take ``fused=True`` now (floating params on a fused device)."""
    import torch
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    devices = set(_get_fused_kernels_supported_devices())
    groups = []
    for optimizer in trainer.optimizers:
        if type(optimizer).__name__ not in _FUSED or "fused" not in optimizer.defaults:
            continue
        for group in optimizer.param_groups:
            params = group["params"]
            if group.get("differentiable") or not params:
                continue
            if all(p.device.type in devices and torch.is_floating_point(p) for p in params):
                groups.append((optimizer, group))
    return groups


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
            weights = _four_d(self._module)
            return bool(weights) and all(
                w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous()
                for w in weights
            )
        if knob == "tf32":
            return torch.get_float32_matmul_precision() != "highest"
        if knob == "cudnn_benchmark":
            return bool(torch.backends.cudnn.benchmark)
        if knob == "compile":
            return any(getattr(m, "_compiled_call_impl", None) is not None
                       for m in self._submodules())  # fmt: skip
        if knob == "fused_optimizer":
            groups = _fused_groups(self.trainer)
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

        if device == "cuda" and not torch.cuda.is_bf16_supported():
            return "16-mixed"
        return "bf16-mixed"

    def _why_not_precision(self, device: str) -> str | None:
        from lightning.pytorch.plugins.precision import Precision
        from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

        assert self.trainer is not None
        strategy = self.trainer.strategy
        if str(self.trainer.precision) not in ("32-true", "32"):
            return f"the Trainer already runs precision={self.trainer.precision!r}"
        if not isinstance(strategy, SingleDeviceStrategy | DDPStrategy):
            return f"{type(strategy).__name__} keeps its own precision plugin"
        if type(strategy.precision_plugin) is not Precision:
            return f"custom precision plugin {type(strategy.precision_plugin).__name__}"
        if device not in ("cuda", "cpu"):
            return f"no mixed precision on {device}"
        return None

    def _why_not_channels_last(self, device: str) -> str | None:
        return None if _four_d(self._module) else "the module has no 4-D (convolution) weights"

    def _why_not_tf32(self, device: str) -> str | None:
        return None

    def _why_not_cudnn_benchmark(self, device: str) -> str | None:
        return None

    def _why_not_compile(self, device: str) -> str | None:
        if device == "cpu" and shutil.which("gcc") is None and shutil.which("cc") is None:
            return "no C compiler for inductor on the CPU"
        if device not in ("cuda", "cpu"):
            return f"no inductor backend on {device}"
        return None

    def _why_not_fused_optimizer(self, device: str) -> str | None:
        assert self.trainer is not None
        if not _fused_groups(self.trainer):
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
        else:  # a fresh plugin: a 16-mixed one makes its own grad scaler
            strategy.precision_plugin = MixedPrecision(value, self._device())  # type: ignore[arg-type]

    def _set_channels_last(self, value: bool) -> None:
        import torch

        module = self._module
        module.to(memory_format=torch.channels_last if value else torch.contiguous_format)
        if value and "on_after_batch_transfer" not in vars(module):
            original = module.on_after_batch_transfer

            def on_after_batch_transfer(batch: Any, dataloader_idx: int) -> Any:
                return _to_channels_last(original(batch, dataloader_idx))

            module.on_after_batch_transfer = on_after_batch_transfer  # type: ignore[method-assign]
        elif not value and "on_after_batch_transfer" in vars(module):
            del module.on_after_batch_transfer

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
                module._compiled_call_impl = None
            elif id(module) in self._compiled:
                module._compiled_call_impl = self._compiled[id(module)]
            else:  # compiled lazily, on the next call
                module.compile()
                self._compiled[id(module)] = module._compiled_call_impl

    def _set_fused_optimizer(self, value: bool) -> None:
        assert self.trainer is not None
        if not value:
            for optimizer, group, fused, foreach in self._fused_was:
                group["fused"], group["foreach"] = fused, foreach
                _steps_to(optimizer, group, fused=bool(fused))
            self._fused_was.clear()
            return
        for optimizer, group in _fused_groups(self.trainer):
            self._fused_was.append((optimizer, group, group.get("fused"), group.get("foreach")))
            group["fused"], group["foreach"] = True, False  # fused and foreach exclude each other
            _steps_to(optimizer, group, fused=True)

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
        module = self.trainer.lightning_module if self.trainer is not None else None
        if module is not None and "on_after_batch_transfer" in vars(module):
            del module.on_after_batch_transfer  # the weights stay channels_last


_REASONS = {
    "precision": "mixed precision: half-size activations and tensor-core math",
    "channels_last": "NHWC layout: convolutions without layout transposes",
    "tf32": "TF32 matmuls and convolutions on tensor cores",
    "cudnn_benchmark": "cuDNN picks the fastest convolution kernels for these shapes",
    "compile": "torch.compile fuses the step's kernels",
    "fused_optimizer": "one fused kernel per optimizer step instead of one per tensor",
}


def _to_channels_last(batch: Any) -> Any:
    import torch
    from lightning_utilities.core.apply_func import apply_to_collection

    def convert(t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 4 and torch.is_floating_point(t):
            return t.contiguous(memory_format=torch.channels_last)
        return t

    return apply_to_collection(batch, torch.Tensor, convert)


def _steps_to(optimizer: torch.optim.Optimizer, group: dict[str, Any], *, fused: bool) -> None:
    """Adam's ``step`` counters live on the CPU, except for a fused step (on the param's device)."""
    import torch

    for p in group["params"]:
        state = optimizer.state.get(p)
        if state and torch.is_tensor(state.get("step")):
            state["step"] = state["step"].to(p.device if fused else "cpu", torch.float32)
